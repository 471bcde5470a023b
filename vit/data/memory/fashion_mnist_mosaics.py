"""Fashion-MNIST mosaics: a multi-label dataset made in memory of Fashion-MNIST's own images, so that tagging trains
and is measured on a CPU with nothing to download.

A mosaic is 2x2 cells of 28x28 pixels (56x56, grayscale) holding 1 to 4 items (as many, equally often) of distinct
classes in random cells, the empty cells black; its target is the multi-hot vector (10,) of the classes it holds,
so each class is in a quarter of the mosaics. Sizes, by default: 60,000 training mosaics made of the 55,000 training
images left after holding out data.val_size=5,000, 5,000 validation mosaics of those held-out images, and 10,000 test
mosaics of the 10,000 test images alone: no image is in two splits' mosaics. Within a split, each class's images are
taken in a shuffled order, every one before any is taken twice (each training image is in ~2.7 mosaics, each held-out
or test image in 2.5). The mosaics are a function of data.seed, data.split_seed and the split alone: the same on
every run and every process. data.class_subset keeps the images of those classes before mosaics are made."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.data.errors import DataError
from vit.data.memory.base import TensorImages
from vit.data.memory.fashion_mnist import FashionMNISTDataModule

GRID = 2  # cells a side
CELLS = GRID * GRID
SPLITS = ("train", "val", "test")  # each split's mosaics are drawn from a generator of their own


class FashionMNISTMosaicsDataModule(FashionMNISTDataModule):
    """Reads Fashion-MNIST as FashionMNISTDataModule does (data.root, Debian's package, a download); the labels it
    hands out are multi-hot float (B, K). Augmented on the device as Fashion-MNIST is (flips, crops): mirroring a
    mosaic swaps its columns, which holds the same classes."""

    name = "Fashion-MNIST mosaics"
    mean, std = (0.1781,), (0.3111,)  # over the 60,000 training mosaics of seed 0
    multilabel = True

    def __init__(
        self,
        root: str,
        num_classes: int,
        in_chans: int,
        img_size: int,
        batch_size: int = 128,
        eval_batch_size: int = 1000,
        val_size: int = 5000,
        split_seed: int = 0,
        crop_padding: int = 0,
        flip: bool = False,
        download: bool = True,
        num_workers: int = 0,
        class_subset: Sequence[int] | None = None,
        sampler: str = "uniform",
        train_size: int = 60000,
        test_size: int = 10000,
        seed: int = 0,
    ):
        """train_size: the training mosaics; test_size: the test mosaics; val_size: the training images held out,
        and as many validation mosaics made of them; seed: the mosaics' draws (split_seed: which images are held
        out)."""
        self.train_size, self.test_size, self.seed = train_size, test_size, seed
        super().__init__(
            root=root,
            num_classes=num_classes,
            in_chans=in_chans,
            img_size=img_size,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            val_size=val_size,
            split_seed=split_seed,
            crop_padding=crop_padding,
            flip=flip,
            download=download,
            num_workers=num_workers,
            class_subset=class_subset,
            sampler=sampler,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = self.load(train=True)
        count = int(labels.max()) + 1
        images, labels = self._checked(*self._subset(images, labels, count), split="train")
        if not 0 < self.val_size < len(labels):
            raise DataError(f"data.val_size={self.val_size} must be between 0 and the {len(labels)} training images")
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        val, train = order[: self.val_size], order[self.val_size :]
        test = self._checked(*self._subset(*self.load(train=False), count), split="test")
        sources = {"train": (images[train], labels[train]), "val": (images[val], labels[val]), "test": test}
        sizes = {"train": self.train_size, "val": self.val_size, "test": self.test_size}
        made = {
            split: TensorImages(*mosaics(*sources[split], self.num_classes, sizes[split], self._generator(split)))
            for split in SPLITS
        }
        self.train_set, self.val_set, self.test_set = made["train"], made["val"], made["test"]

    def _generator(self, split: str) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * len(SPLITS) + SPLITS.index(split))


def mosaics(
    images: Tensor, labels: Tensor, num_classes: int, count: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """`count` mosaics of `images` (N, C, h, w) uint8 with labels (N,) in 0..num_classes-1: uint8 (count, C, 2h, 2w)
    and their multi-hot float targets (count, num_classes). Each holds 1 to 4 items of distinct classes (fewer where
    the images have fewer classes) in random cells; each class's images are taken in a shuffled order, cycled."""
    present = labels.bincount(minlength=num_classes)  # (K,)
    # classes in random order per mosaic, those without images last: the first `items` of a row are its classes
    order = torch.rand(count, num_classes, generator=generator) + (present == 0)  # (M, K)
    slots = min(CELLS, num_classes)
    classes = order.argsort(dim=1)[:, :slots]  # (M, 4)
    items = torch.randint(1, CELLS + 1, (count,), generator=generator).clamp(max=int((present > 0).sum()))
    cells = torch.rand(count, CELLS, generator=generator).argsort(dim=1)[:, :slots]  # (M, 4): each slot's cell
    filled = torch.arange(slots) < items[:, None]  # (M, 4): the slots that hold an item
    slot_classes = classes[filled]  # (S,) in mosaic order
    # the j-th item of class c takes the (j mod n_c)-th image of c's shuffled images
    seen = F.one_hot(slot_classes, num_classes).cumsum(dim=0)  # (S, K): items of each class so far
    nth = seen[torch.arange(len(slot_classes)), slot_classes] - 1
    shuffled = torch.rand(len(labels), generator=generator).argsort()
    by_class = shuffled[labels[shuffled].argsort(stable=True)]  # image indices grouped by class, shuffled within
    starts = present.cumsum(dim=0) - present  # (K,)
    picked = by_class[starts[slot_classes] + nth % present[slot_classes]]  # (S,)
    N, C, h, w = count, *images.shape[1:]
    out = torch.zeros(N, C, GRID * h, GRID * w, dtype=images.dtype)
    grid = out.view(N, C, GRID, h, GRID, w).permute(0, 2, 4, 1, 3, 5)  # (M, 2, 2, C, h, w), a view of out
    rows = torch.arange(N)[:, None].expand(N, slots)[filled]
    grid[rows, cells[filled] // GRID, cells[filled] % GRID] = images[picked]  # cell 2r + c at row r, column c
    targets = torch.zeros(N, num_classes).scatter_(1, classes, filled.float())  # distinct classes: no two writes meet
    return out, targets
