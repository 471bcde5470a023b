import lightning as L
import pytest
import torch

from vit.data.errors import DataError
from vit.data.memory.synthetic import SyntheticDataModule


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [
        ("bf16-true", torch.bfloat16),
        ("64-true", torch.float64),
        ("32-true", torch.float32),
        ("bf16-mixed", torch.float32),
    ],
)
def test_augmented_images_reach_the_model_in_the_precisions_dtype(precision, dtype):
    """Lightning converts a batch to the precision's dtype before on_after_batch_transfer, while in-memory
    batches are still uint8; the float images the hook makes must be converted too (bf16-true and 64-true
    runs crashed on float32 images)."""
    data = SyntheticDataModule("data", num_classes=4, in_chans=3, img_size=16, val_size=64)
    data.setup()
    batch = next(iter(data.test_dataloader()))
    assert data.on_after_batch_transfer(batch, 0)[0].dtype == torch.float32  # no trainer: no conversion
    data.trainer = L.Trainer(precision=precision, accelerator="cpu", logger=False, enable_progress_bar=False)
    images, labels = data.on_after_batch_transfer(batch, 0)
    assert images.dtype == dtype and labels.dtype == torch.int64


def test_normalize_with_puts_another_mean_and_std_on_every_split_and_in_the_facts():
    """Fine-tuning normalises as the pretrained model's data did: the batches the model gets, not only the facts."""
    data = SyntheticDataModule("data", num_classes=4, in_chans=3, img_size=16, val_size=64)
    data.normalize_with((0.1, 0.2, 0.3), (0.5, 0.25, 0.125))
    data.setup()
    images, _ = next(iter(data.test_dataloader()))
    got, _ = data.on_after_batch_transfer((images, torch.zeros(len(images), dtype=torch.int64)), 0)
    mean, std = torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1), torch.tensor([0.5, 0.25, 0.125]).view(1, 3, 1, 1)
    torch.testing.assert_close(got, (images / 255 - mean) / std, rtol=1e-5, atol=1e-5)
    assert (data.facts()["mean"], data.facts()["std"]) == ([0.1, 0.2, 0.3], [0.5, 0.25, 0.125])


def test_train_subset_keeps_the_first_training_images_of_the_seeded_order_and_validation_as_it_was():
    def data(**kw):
        module = SyntheticDataModule("data", num_classes=4, in_chans=3, img_size=16, val_size=64, **kw)
        module.setup()
        return module

    whole, few = data(), data(train_subset=100)
    assert len(whole.train_set) == 448 and len(few.train_set) == 100
    assert torch.equal(few.train_set.images, whole.train_set.images[:100])  # the same draw, cut short
    assert torch.equal(few.val_set.images, whole.val_set.images) and torch.equal(
        few.test_set.images, whole.test_set.images
    )
    with pytest.raises(
        DataError, match=r"^data\.train_subset=449: synthetic has 448 training images once data\.val_size=64"
    ):
        data(train_subset=449)
    for bad in (0, True, 1.5):
        with pytest.raises(DataError, match=rf"^data\.train_subset={bad!r}: a number of training images >= 1, or null"):
            data(train_subset=bad)
