"""The base of the small datasets (Fashion-MNIST, CIFAR, synthetic): every image held in memory as uint8,
batches cut by one indexing op, augmented on the training device after transfer.

Images are kept at their stored size; a model of another input size (data.img_size, e.g. CIFAR at 224 for
an ImageNet checkpoint) gets them resized on the device, batch by batch, so memory holds only uint8 images.
`class_subset` keeps some of the classes, relabelled 0..k-1 in the order given: pretrain on some classes,
fine-tune on the others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vit.data.augment import INTERPOLATION, BatchAugment
from vit.data.errors import DataError
from vit.data.loading import SplitDataModule, checked_sampler, make_loader


class TensorImages(Dataset):
    """uint8 images (N, C, H, W) with labels (N,); a batch is fetched by one index, not N __getitem__ calls."""

    def __init__(self, images: Tensor, labels: Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
        index = torch.as_tensor(indices)
        return self.images[index], self.labels[index]

    @property
    def targets(self) -> Tensor:
        """The labels, by the name balanced sampling reads them under (vit/data/loading.py, torchvision's)."""
        return self.labels


def _whole_batch(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    return batch  # __getitems__ already built the batch


class InMemoryDataModule(SplitDataModule):
    """Subclasses implement `fetch()` (make the files present: unpack or download, read nothing) and
    `load(train)` -> (uint8 images (N, C, H, W), int64 labels (N,)), and set the dataset facts `mean`,
    `std` and `classes`."""

    name: str
    class_count: int | None = None  # the dataset's classes, a fact of it; None where num_classes makes them
    crop_pct = 1.0  # evaluation resizes whole images (square, as stored) to data.img_size, cropping nothing
    interpolation = INTERPOLATION

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
        train_subset: int | None = None,
    ):
        super().__init__()
        self.root, self.download, self.sampler = root, download, checked_sampler(sampler)
        self.num_classes, self.in_chans, self.img_size = num_classes, in_chans, img_size
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.val_size, self.split_seed = val_size, split_seed
        self.class_subset = list(class_subset) if class_subset is not None else None
        subset = self.class_subset
        if subset is not None and (len(set(subset)) != len(subset) or len(subset) != num_classes):
            raise DataError(
                f"data.class_subset={subset} must list data.num_classes={num_classes} distinct class indices"
            )
        if self.class_count is not None and subset is None and num_classes != self.class_count:
            raise DataError(
                f"data.num_classes={num_classes}, but {self.name} has {self.class_count} classes: leave "
                f"data.num_classes out, the config takes it from the dataset (or from data.class_subset)"
            )
        if train_subset is not None and (isinstance(train_subset, bool) or not isinstance(train_subset, int)
                                         or train_subset < 1):  # fmt: skip
            raise DataError(f"data.train_subset={train_subset!r}: a number of training images >= 1, or null for all")
        self.train_subset = train_subset
        self.augment = BatchAugment(self.mean, self.std, crop_padding, flip, size=img_size)
        self.train_set = self.val_set = self.test_set = None

    @classmethod
    def count_classes(cls, class_subset: Sequence[int] | None) -> int:
        """The classes a model of this data tells apart: the dataset's, or as many as class_subset keeps."""
        return cls.class_count if class_subset is None else len(class_subset)

    def normalize_with(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().normalize_with(mean, std)
        a = self.augment
        self.augment = BatchAugment(self.mean, self.std, a.crop_padding, a.flip, size=a.size)

    def facts(self) -> dict[str, Any]:
        facts = super().facts()
        if self.class_subset is not None and facts["classes"]:
            facts["classes"] = [facts["classes"][k] for k in self.class_subset]
        return facts

    def fetch(self) -> None:
        """Make the files present; nothing to do for data that needs no files."""

    def load(self, train: bool) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def prepare_data(self) -> None:
        """Runs once per node, before the processes of a multi-GPU run read the files."""
        self.fetch()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, labels = self.load(train=True)
        count = int(labels.max()) + 1  # the training split holds every class; the test split may lack some
        images, labels = self._checked(*self._subset(images, labels, count), split="train")
        if not 0 < self.val_size < len(labels):
            raise DataError(f"data.val_size={self.val_size} must be between 0 and the {len(labels)} training images")
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        val, train = order[: self.val_size], order[self.val_size :]
        if self.train_subset is not None:  # few labels: the first of the same seeded order, validation left as it is
            if self.train_subset > len(train):
                raise DataError(
                    f"data.train_subset={self.train_subset}: {self.name} has {len(train)} training images once "
                    f"data.val_size={self.val_size} are held out"
                )
            train = train[: self.train_subset]
        self.train_set = TensorImages(images[train], labels[train])
        self.val_set = TensorImages(images[val], labels[val])
        self.test_set = TensorImages(*self._checked(*self._subset(*self.load(train=False), count), split="test"))

    def _subset(self, images: Tensor, labels: Tensor, count: int) -> tuple[Tensor, Tensor]:
        """Keep the images of class_subset, labelled by their position in it; the dataset has `count` classes."""
        if self.class_subset is None:
            return images, labels
        if not all(0 <= k < count for k in self.class_subset):
            raise DataError(f"data.class_subset={self.class_subset}: {self.name} has classes 0..{count - 1} only")
        relabel = torch.full((max(count, int(labels.max()) + 1),), -1, dtype=torch.int64)
        relabel[self.class_subset] = torch.arange(len(self.class_subset))
        keep = relabel[labels] >= 0
        return images[keep], relabel[labels[keep]]

    def _checked(self, images: Tensor, labels: Tensor, split: str) -> tuple[Tensor, Tensor]:
        """Refuse data that does not fit the configured model, naming the key to change. Any image size is
        fine: batches are resized to data.img_size on the device."""
        if images.shape[1] != self.in_chans:
            raise DataError(
                f"{self.name} {split} images have {images.shape[1]} channel(s) (shape {tuple(images.shape[1:])}, "
                f"C, H, W) but data.in_chans={self.in_chans}"
            )
        if labels.min() < 0 or labels.max() >= self.num_classes:
            raise DataError(
                f"{self.name} {split} labels span {labels.min().item()}..{labels.max().item()} but "
                f"data.num_classes={self.num_classes}"
            )
        return images, labels

    def _loader(self, dataset: TensorImages, batch_size: int, train: bool) -> DataLoader:
        return make_loader(dataset, batch_size, train, self.num_workers, _whole_batch, sampler=self.sampler)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> tuple[Tensor, Tensor]:
        images, labels = batch
        self.augment.to(images.device)
        training = self.trainer is not None and self.trainer.training
        return self.as_precision(self.augment(images, train=training)), labels  # (B, C, H, W)
