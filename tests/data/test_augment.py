import torch

from vit.data.augment import BatchAugment, random_crop


def test_eval_only_normalises():
    aug = BatchAugment(mean=(0.5,), std=(0.25,), crop_padding=4, flip=True)
    images = torch.randint(0, 256, (3, 1, 8, 8), dtype=torch.uint8)
    torch.testing.assert_close(aug(images, train=False), (images.float() / 255 - 0.5) / 0.25)


def test_random_crop_is_a_shifted_window_of_the_zero_padded_image_per_sample():
    images = torch.randint(1, 256, (64, 3, 6, 5), dtype=torch.uint8)  # no zeros inside the images
    crops = random_crop(images, padding=2)
    assert crops.shape == images.shape
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    offsets = set()
    for b in range(64):
        found = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(padded[b, :, dy : dy + 6, dx : dx + 5], crops[b])
        ]
        assert found, f"crop {b} is not a window of its padded image"
        offsets.add(found[0])
    assert len(offsets) > 10  # offsets are drawn per image, not once per batch


def test_flip_mirrors_about_half_the_images_and_nothing_else():
    aug = BatchAugment(mean=(0.0,), std=(1 / 255,), flip=True)
    images = torch.randint(0, 256, (200, 1, 4, 4), dtype=torch.uint8)
    out = aug(images, train=True)
    same = (out == images.float()).flatten(1).all(1)
    mirrored = (out == images.flip(-1).float()).flatten(1).all(1)
    assert (same | mirrored).all()
    assert 60 < mirrored.sum().item() < 140
