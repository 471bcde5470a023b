import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import write_image_folder
from vit.data.encoded.imagefolder import ImageFolderDataModule

SIZE = 32  # images written at the model's size, with crop_pct=1: the evaluation transform leaves pixels as they are


def make(root, **kw):
    return ImageFolderDataModule(root=str(root), **{"num_classes": 3, "img_size": 32, "num_workers": 0, **kw})


def pixels(dm, images):
    """Normalised (B, C, H, W) back to 0..255."""
    mean, std = torch.tensor(dm.mean).view(-1, 1, 1), torch.tensor(dm.std).view(-1, 1, 1)
    return (images * std + mean) * 255


def jpeg_bytes(size=(40, 48)):
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def write_bad_files(folder):
    """A truncated JPEG, text with an image extension and a zero-byte file; returns their paths."""
    bad = [folder / "truncated.jpg", folder / "not_an_image.png", folder / "empty.jpeg"]
    data = jpeg_bytes()
    bad[0].write_bytes(data[: len(data) // 2])
    bad[1].write_text("<html>404 Not Found</html>")
    bad[2].write_bytes(b"")
    return sorted(str(path) for path in bad)


def test_splits_share_the_train_class_map(tmp_path):
    write_image_folder(tmp_path, {"ant": 6, "bee": 6, "cat": 6}, "train")
    write_image_folder(tmp_path, {"bee": 2, "cat": 3}, "val")  # 'ant' absent: indices must not shift
    dm = make(tmp_path, val_fraction=0.2, batch_size=4)
    dm.setup()
    assert dm.classes == ["ant", "bee", "cat"]
    assert sorted(dm.test_set.targets) == [1, 1, 2, 2, 2]
    assert len(dm.train_set) + len(dm.val_set) == 18 and len(dm.val_set) == 4
    images, labels = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)  # as the model reads them
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and labels.shape == (4,)
    images, labels = dm.on_after_batch_transfer(next(iter(dm.test_dataloader())), 0)
    assert images.shape == (5, 3, 32, 32) and labels.tolist() == [1, 1, 2, 2, 2]


def test_class_count_mismatch_names_the_key(tmp_path):
    write_image_folder(tmp_path, {"ant": 2, "bee": 2}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    with pytest.raises(ValueError, match=r"has 2 class folders but data\.num_classes=3"):
        make(tmp_path).setup()


def test_unknown_test_class_is_refused(tmp_path):
    write_image_folder(tmp_path, {"ant": 2, "bee": 2, "cat": 2}, "train")
    write_image_folder(tmp_path, {"dog": 1}, "val")
    with pytest.raises(ValueError, match=r"classes absent from train/: \['dog'\]"):
        make(tmp_path).setup()


def test_missing_split_names_the_path(tmp_path):
    write_image_folder(tmp_path / "imagenette", {"ant": 1}, "train")
    with pytest.raises(FileNotFoundError, match=r"split not found: .*train .*did you mean data\.root=.*imagenette\?"):
        make(tmp_path).setup()


def test_bad_files_are_one_error_naming_each(tmp_path):
    write_image_folder(tmp_path, {"ant": 4, "bee": 4, "cat": 4}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    bad = write_bad_files(tmp_path / "train" / "bee")
    with pytest.raises(ValueError, match=r"3 bad image file\(s\)") as error:
        make(tmp_path).setup()
    assert all(path in str(error.value) for path in bad) and "data.skip_bad_images=true" in str(error.value)
    assert "truncated" in str(error.value) and "0 bytes" in str(error.value)


def test_skipped_bad_files_are_warned_listed_and_labels_stay_with_their_images(tmp_path):
    write_image_folder(tmp_path, {"ant": 5, "bee": 5, "cat": 5}, "train", size=(SIZE, SIZE))
    # the helper colours by position in the dict, so 'ant' is listed: an empty folder, as if absent from val/
    write_image_folder(tmp_path, {"ant": 0, "bee": 3, "cat": 3}, "val", size=(SIZE, SIZE))
    bad = write_bad_files(tmp_path / "train" / "ant") + write_bad_files(tmp_path / "val" / "cat")
    dm = make(tmp_path, skip_bad_images=True, max_bad_fraction=0.4, val_fraction=0.4, crop_pct=1.0)
    with pytest.warns(UserWarning, match=r"leaving out 3 bad image file\(s\)") as record:
        dm.setup()
    messages = [str(w.message) for w in record]
    assert len(messages) == 2 and f"of 18 in {tmp_path / 'train'}" in messages[0] and "of 9" in messages[1]
    assert all(any(path in str(w.message) for w in record) for path in bad)
    assert dm.bad_images == bad
    assert len(dm.train_set) + len(dm.val_set) == 15 and len(dm.test_set) == 6
    for index in dm.train_set.indices:  # training batches are augmented: check the pairs they are drawn from
        path, label = dm.train_set.dataset.samples[index]
        assert dm.classes[label] in path
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        for batch in loader:
            images, labels = dm.on_after_batch_transfer(batch, 0)  # as the model reads them
            red = pixels(dm, images)[:, 0].mean(dim=(1, 2))
            assert torch.allclose(red, 40.0 * labels, atol=0.5)  # write_image_folder: red = 40 * class index


def test_more_bad_files_than_the_fraction_are_refused(tmp_path):
    write_image_folder(tmp_path, {"ant": 9, "bee": 9, "cat": 9}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    write_bad_files(tmp_path / "train" / "cat")
    with pytest.raises(ValueError, match=r"3 of the 30 image files in .*train are bad \(10\.0%\), more than "):
        make(tmp_path, skip_bad_images=True, max_bad_fraction=0.05).setup()


def test_hidden_files_and_folders_are_neither_classes_nor_images(tmp_path):
    write_image_folder(tmp_path, {"ant": 2, "bee": 2, "cat": 2}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    (tmp_path / "train" / ".git" / "objects").mkdir(parents=True)
    (tmp_path / "train" / ".git" / "objects" / "a.png").write_bytes(b"blob")
    (tmp_path / "train" / "ant" / ".thumbnails").mkdir()
    (tmp_path / "train" / "ant" / ".thumbnails" / "0.png").write_bytes(b"")
    (tmp_path / "train" / "bee" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tmp_path / "train" / "bee" / "._0.png").write_bytes(b"\0\5\26\7 AppleDouble fork")
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image extension: ignored as by torchvision")
    dm = make(tmp_path, val_fraction=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.setup()
    assert dm.classes == ["ant", "bee", "cat"] and dm.bad_images == []
    assert sorted(dm.train_set.dataset.targets) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("skip", [False, True])
def test_a_class_folder_without_images_is_an_error_naming_it(tmp_path, skip):
    write_image_folder(tmp_path, {"ant": 2, "cat": 2}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    (tmp_path / "train" / "bee").mkdir()
    if skip:  # left empty by skipping its only files
        write_bad_files(tmp_path / "train" / "bee")
    message = r"class folder\(s\) without usable images: \[.*train/bee'\]"
    with warnings.catch_warnings(), pytest.raises(ValueError, match=message):
        warnings.simplefilter("ignore")  # the skipping's own warning
        make(tmp_path, skip_bad_images=skip, max_bad_fraction=1.0).setup()


def test_unverified_bad_files_fail_when_read_naming_the_file(tmp_path):
    write_image_folder(tmp_path, {"ant": 2, "bee": 2, "cat": 2}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    (tmp_path / "val" / "ant" / "1.png").write_text("not a png")
    (tmp_path / "val" / "ant" / "2.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"1 bad image file\(s\).*\n.*2\.png: empty file"):
        make(tmp_path, verify_images=False).setup()  # zero-byte files are found without decoding
    (tmp_path / "val" / "ant" / "2.png").unlink()
    dm = make(tmp_path, verify_images=False)
    dm.setup()
    with pytest.raises(OSError, match=r"cannot read .*val/ant/1\.png \(UnidentifiedImageError"):
        next(iter(dm.test_dataloader()))


def test_valid_jpegs_under_8_pixels_a_side_pass_verification(tmp_path):
    """Verification decodes JPEGs at 1/8 scale; a 7 px side asked for a 0 px draft and the file was called bad."""
    write_image_folder(tmp_path, {"ant": 3, "bee": 3}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    narrow = tmp_path / "train" / "ant" / "narrow.jpg"
    narrow.write_bytes(jpeg_bytes(size=(7, 300)))
    dm = make(tmp_path, num_classes=2)
    dm.setup()
    assert str(narrow) in [path for path, _ in dm.train_set.dataset.samples] and dm.bad_images == []


def test_no_auto_augment_means_no_colour_augmentation(tmp_path):
    """With auto_augment null, timm's create_transform used to add its default ColorJitter(0.4)."""
    from torchvision.transforms import ColorJitter

    transforms = make(tmp_path, auto_augment=None)._transform(train=True).transform.transforms
    assert not any(isinstance(t, ColorJitter) for t in transforms)


def mode_images():
    """Each mode as a file: name -> (image, save options, the RGB it must become at (row, column) spots)."""
    gray = Image.new("L", (SIZE, SIZE), 100)
    la = Image.new("LA", (SIZE, SIZE), (200, 128))  # half-transparent over black: 100
    sixteen = np.full((SIZE, SIZE), 257 * 64, np.uint16)  # 64 in 8 bits; clipping would give 255
    sixteen[:, : SIZE // 2] = 65535
    cmyk = Image.new("CMYK", (SIZE, SIZE), (0, 128, 255, 0))
    rgba = Image.new("RGBA", (SIZE, SIZE), (200, 100, 50, 128))
    rgba.paste((255, 255, 255, 0), (0, 0, SIZE // 2, SIZE))  # hidden white: must not show
    palette = Image.new("P", (SIZE, SIZE), 1)
    palette.putpalette([255, 255, 255, 10, 20, 30] + [0] * 762)
    palette.paste(0, (0, 0, SIZE // 2, SIZE))
    rotated = Image.new("RGB", (SIZE, SIZE), (0, 0, 0))
    rotated.paste((255, 255, 255), (0, 0, SIZE // 2, SIZE // 2))  # top-left as stored
    exif = rotated.getexif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise: the white corner shows top-right
    left, right, top_right, bottom_left = (8, 4), (8, 28), (4, 28), (28, 4)
    return {
        "L.png": (gray, {}, {left: (100,) * 3}),
        "LA.png": (la, {}, {left: (100,) * 3}),
        "I16.png": (Image.fromarray(sixteen), {}, {left: (255,) * 3, right: (64,) * 3}),
        "CMYK.tif": (cmyk, {}, {left: (255, 127, 0)}),
        "RGBA.png": (rgba, {}, {left: (0, 0, 0), right: (100, 50, 25)}),
        "P.png": (palette, {"transparency": 0}, {left: (0, 0, 0), right: (10, 20, 30)}),
        "exif.jpg": (rotated, {"exif": exif.tobytes(), "quality": 95}, {top_right: (255,) * 3, bottom_left: (0,) * 3}),
    }


@pytest.mark.parametrize("in_chans", [3, 1])
@pytest.mark.parametrize("name", list(mode_images()))
def test_every_image_mode_reads_as_its_pixels_through_the_folder(tmp_path, name, in_chans):
    write_image_folder(tmp_path, {"ant": 2}, "train", size=(SIZE, SIZE))
    (tmp_path / "val" / "ant").mkdir(parents=True)
    image, options, expected = mode_images()[name]
    image.save(tmp_path / "val" / "ant" / name, **options)
    dm = make(tmp_path, num_classes=1, in_chans=in_chans, crop_pct=1.0)
    dm.setup()
    read = dm.test_set[0][0].float()  # (C, H, W) uint8, as a worker hands it over
    assert read.shape == (in_chans, SIZE, SIZE)
    tolerance = 3 if name.endswith(".jpg") else 0.5
    for (row, column), rgb in expected.items():
        want = rgb if in_chans == 3 else Image.new("RGB", (1, 1), rgb).convert("L").getpixel((0, 0))
        assert torch.allclose(read[:, row, column], torch.tensor(want, dtype=torch.float32), atol=tolerance)


def test_a_one_channel_model_gets_grayscale_normalised_by_one_mean_and_std(tmp_path):
    write_image_folder(tmp_path, {"ant": 4, "bee": 4, "cat": 4}, "train")
    write_image_folder(tmp_path, {"ant": 2}, "val")
    dm = make(tmp_path, in_chans=1, batch_size=4)
    dm.setup()
    assert len(dm.mean) == len(dm.std) == 1 and 0.4 < dm.mean[0] < 0.5 and 0.2 < dm.std[0] < 0.25
    assert len(dm.facts()["mean"]) == len(dm.facts()["std"]) == 1  # what checkpoints keep
    images, _ = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)  # RandAugment on 'L' images
    assert images.shape == (4, 1, 32, 32)


def test_channel_counts_other_than_one_or_three_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"data\.in_chans=4, but image folders decode to 1 .* or 3"):
        make(tmp_path, in_chans=4)


def test_flips_can_be_turned_off_and_the_default_experiment_composes_with_image_folders(tmp_path):
    from hydra.utils import instantiate
    from torchvision.transforms import RandomHorizontalFlip

    from tests.helpers import compose

    write_image_folder(tmp_path, {"ant": 1, "bee": 1}, "train")
    folder = [f"data.root={tmp_path}"]
    data = instantiate(compose("data=imagefolder", *folder, "data.flip=false").data)
    assert data.flip is False
    assert not any(isinstance(t, RandomHorizontalFlip) for t in data._transform(train=True).transform.transforms)
    data = instantiate(compose("data=imagefolder", *folder).data)  # the default experiment leaves them on
    assert any(isinstance(t, RandomHorizontalFlip) for t in data._transform(train=True).transform.transforms)
    data = instantiate(compose("experiment=imagenette", f"data.root={tmp_path}").data)
    assert any(isinstance(t, RandomHorizontalFlip) for t in data._transform(train=True).transform.transforms)


def test_a_training_pass_resumed_mid_epoch_with_two_workers_reads_what_the_whole_pass_read(tmp_path):
    """Crops, flips and RandAugment of each image follow the epoch and the image in workers too (noise images, so
    that every draw shows); the training split is a Subset of the folder's files (vit/data/loading.py)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("val", 2)):
        for k in range(2):
            (tmp_path / split / f"c{k}").mkdir(parents=True)
            for i in range(count):
                noise = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
                Image.fromarray(noise).save(tmp_path / split / f"c{k}" / f"{i}.png")

    def loader(state=None):
        torch.manual_seed(3)
        dm = make(tmp_path, num_classes=2, img_size=16, batch_size=4, num_workers=2, val_fraction=0.25)
        dm.setup()
        loader = dm.train_dataloader()
        if state:
            loader.load_state_dict(state)
        loader.sampler.set_epoch(1)
        return torch.cat([images for images, _ in loader])

    whole = loader()
    assert torch.equal(loader({"epoch": 1, "batches": 2}), whole[2 * 4 :])
