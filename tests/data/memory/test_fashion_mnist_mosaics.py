from pathlib import Path

import numpy as np
import pytest
import torch

from tests.data.memory.test_fashion_mnist import write_idx
from tests.helpers import needs_fashion_mnist
from vit.data.errors import DataError
from vit.data.memory.fashion_mnist import FashionMNISTDataModule
from vit.data.memory.fashion_mnist_mosaics import FashionMNISTMosaicsDataModule, mosaics

K = 10


def tiles(count: int, classes: int = K, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` distinct random 1x4x3 images, labelled 0, 1, ..., classes - 1, 0, 1, ..."""
    images = torch.randint(1, 256, (count, 1, 4, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return images, torch.arange(count) % classes


def cells(made: torch.Tensor) -> torch.Tensor:
    """Mosaics (M, C, 2h, 2w) -> their cells (M, 4, C * h * w), cell 2r + c at row r, column c."""
    M, C, H, W = made.shape
    grid = made.view(M, C, 2, H // 2, 2, W // 2).permute(0, 2, 4, 1, 3, 5)
    return grid.reshape(M, 4, -1)


def sources(made: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Which of `images` each cell of the mosaics is: (M, 4), -1 for an empty (black) cell; fails on any other."""
    flat = cells(made)
    match = (flat[:, :, None, :] == images.reshape(1, 1, len(images), -1)).all(-1)  # (M, 4, N)
    empty = (flat == 0).all(-1)
    assert (match.sum(-1) + empty == 1).all(), "a cell that is neither black nor one of the images"
    return torch.where(empty, -1, match.int().argmax(-1))


def test_each_mosaic_holds_one_to_four_items_of_distinct_classes_that_its_targets_name():
    images, labels = tiles(40)
    made, targets = mosaics(images, labels, K, 2000, torch.Generator().manual_seed(0))
    assert made.shape == (2000, 1, 8, 6) and made.dtype == torch.uint8
    assert targets.shape == (2000, K) and targets.dtype == torch.float32
    source = sources(made, images)
    items = (source >= 0).sum(1)
    assert items.min() == 1 and items.max() == 4
    assert all(425 < n < 575 for n in items.bincount()[1:])  # each number of items about as often: 500 of 2000
    for row, target in zip(source, targets, strict=True):
        held = labels[row[row >= 0]]
        assert len(held.unique()) == len(held)  # distinct classes
        assert target.nonzero().flatten().tolist() == sorted(held.tolist())
    assert (source >= 0).float().mean(0).sub(2.5 / 4).abs().max() < 0.04  # items in every cell alike
    assert targets.mean(0).sub(0.25).abs().max() < 0.04  # every class in a quarter of the mosaics


def test_each_class_s_images_are_all_used_before_any_is_used_twice():
    images, labels = tiles(40)
    source = sources(*mosaics(images, labels, K, 30, torch.Generator().manual_seed(1))[:1], images)
    uses = source[source >= 0].bincount(minlength=len(images))
    for k in range(K):
        mine = uses[labels == k]
        assert mine.max() - mine.min() <= 1, (k, mine.tolist())


def test_the_same_generator_seed_gives_the_same_mosaics_and_another_seed_others():
    images, labels = tiles(40)
    first, again, other = (mosaics(images, labels, K, 50, torch.Generator().manual_seed(s)) for s in (3, 3, 4))
    assert first[0].equal(again[0]) and first[1].equal(again[1])
    assert not first[0].equal(other[0])


def test_images_of_fewer_than_four_classes_fill_fewer_cells():
    """A small held-out split may lack classes: a mosaic then holds only classes it has images of."""
    images, labels = tiles(6, classes=2)
    made, targets = mosaics(images, labels, K, 50, torch.Generator().manual_seed(0))
    assert targets[:, 2:].sum() == 0 and targets.sum(1).max() == 2 and targets.sum(1).min() == 1
    assert ((sources(made, images) >= 0).sum(1) == targets.sum(1)).all()


def write_raw(root: Path, train: int = 60, test: int = 20) -> dict[str, np.ndarray]:
    """Fashion-MNIST's four idx files with distinct random images, every class in each split; the images by split."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng, written = np.random.default_rng(0), {}
    for split, n in (("train", train), ("t10k", test)):
        written[split] = rng.integers(1, 256, (n, 28, 28))
        write_idx(raw / f"{split}-images-idx3-ubyte", written[split])
        write_idx(raw / f"{split}-labels-idx1-ubyte", np.arange(n) % K)
    return written


def module(root: Path, **settings) -> FashionMNISTMosaicsDataModule:
    small = dict(num_classes=K, val_size=20, train_size=30, test_size=12, flip=True)
    return FashionMNISTMosaicsDataModule(str(root), in_chans=1, img_size=56, download=False, **{**small, **settings})


def test_each_split_s_mosaics_are_made_of_that_split_s_images_alone(tmp_path):
    written = write_raw(tmp_path)
    data = module(tmp_path)
    data.setup()
    train_images = torch.from_numpy(written["train"]).to(torch.uint8)[:, None]
    test_images = torch.from_numpy(written["t10k"]).to(torch.uint8)[:, None]
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (30, 20, 12)
    assert data.train_set.images.shape[1:] == (1, 56, 56) and data.test_set.labels.shape == (12, K)
    used = {
        split: set(sources(dataset.images, train_images).flatten().tolist()) - {-1}
        for split, dataset in (("train", data.train_set), ("val", data.val_set))
    }
    assert used["train"] and used["val"] and not used["train"] & used["val"]
    assert len(used["val"]) <= 20 and len(used["train"] | used["val"]) > 20
    sources(data.test_set.images, test_images)  # every cell of a test mosaic is a test image (or black)
    with pytest.raises(AssertionError, match="neither black nor one of the images"):
        sources(data.test_set.images, train_images)


def test_mosaics_follow_data_seed_and_split_seed_alone(tmp_path):
    write_raw(tmp_path)
    built = []
    for seed, split_seed in ((0, 0), (0, 0), (1, 0), (0, 1)):
        built.append(module(tmp_path, seed=seed, split_seed=split_seed))
        built[-1].setup()
    first, same, other_seed, other_split = built
    for split in ("train_set", "val_set", "test_set"):
        assert getattr(first, split).images.equal(getattr(same, split).images)
        assert getattr(first, split).labels.equal(getattr(same, split).labels)
        assert not getattr(other_seed, split).images.equal(getattr(same, split).images)
    assert not other_split.val_set.images.equal(same.val_set.images)
    assert other_split.test_set.images.equal(same.test_set.images)  # the held-out images are training images


def test_batches_carry_multi_hot_targets_and_the_facts_say_multi_label(tmp_path):
    write_raw(tmp_path)
    data = module(tmp_path, batch_size=8)
    data.setup()
    images, targets = next(iter(data.test_dataloader()))
    assert images.shape == (12, 1, 56, 56) and targets.shape == (12, K) and targets.dtype == torch.float32
    facts = data.facts()
    assert facts["classes"] == list(FashionMNISTDataModule.classes) and facts["multilabel"] is True
    assert (facts["mean"], facts["std"]) == ([0.1781], [0.3111])


def test_a_class_subset_makes_mosaics_of_those_classes_relabelled(tmp_path):
    write_raw(tmp_path)
    data = module(tmp_path, num_classes=3, class_subset=[7, 2, 9], val_size=6)
    data.setup()
    assert data.facts()["classes"] == [FashionMNISTDataModule.classes[k] for k in (7, 2, 9)]
    assert data.train_set.labels.shape == (30, 3) and data.train_set.labels.sum(1).max() == 3


def test_a_held_out_split_larger_than_the_training_images_is_one_line(tmp_path):
    write_raw(tmp_path)
    with pytest.raises(DataError, match=r"^data\.val_size=60 must be between 0 and the 60 training images$"):
        module(tmp_path, val_size=60).setup()


@needs_fashion_mnist
def test_the_normalisation_constants_fit_the_training_mosaics(tmp_path):
    data = FashionMNISTMosaicsDataModule(
        str(tmp_path), num_classes=K, in_chans=1, img_size=56, download=False, test_size=1
    )
    data.setup()
    assert (len(data.train_set), len(data.val_set)) == (60000, 5000)
    counts = data.train_set.images.flatten().bincount(minlength=256).double()  # of each grey level: no float copy
    level = torch.arange(256, dtype=torch.float64) / 255
    mean = (counts * level).sum() / counts.sum()
    std = ((counts * (level - mean) ** 2).sum() / counts.sum()).sqrt()
    assert abs(mean.item() - data.mean[0]) < 1e-4 and abs(std.item() - data.std[0]) < 1e-4
