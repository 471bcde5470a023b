"""The base of the small datasets (Fashion-MNIST, CIFAR, synthetic): every image held in memory as uint8,
batches cut by one indexing op, augmented on the training device after transfer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vit.data.augment import BatchAugment
from vit.data.loading import SplitDataModule, make_loader


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


def _whole_batch(batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    return batch  # __getitems__ already built the batch


class InMemoryDataModule(SplitDataModule):
    """Subclasses implement `fetch()` (make the files present: unpack or download, read nothing) and
    `load(train)` -> (uint8 images (N, C, H, W), int64 labels (N,)), and set the dataset facts `mean`,
    `std` and `classes`."""

    name: str

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
    ):
        super().__init__()
        self.root, self.download = root, download
        self.num_classes, self.in_chans, self.img_size = num_classes, in_chans, img_size
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.val_size, self.split_seed = val_size, split_seed
        self.augment = BatchAugment(self.mean, self.std, crop_padding, flip)
        self.train_set = self.val_set = self.test_set = None

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
        images, labels = self._checked(*self.load(train=True), split="train")
        if not 0 < self.val_size < len(labels):
            raise ValueError(f"data.val_size={self.val_size} must be between 0 and the {len(labels)} training images")
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        val, train = order[: self.val_size], order[self.val_size :]
        self.train_set = TensorImages(images[train], labels[train])
        self.val_set = TensorImages(images[val], labels[val])
        self.test_set = TensorImages(*self._checked(*self.load(train=False), split="test"))

    def _checked(self, images: Tensor, labels: Tensor, split: str) -> tuple[Tensor, Tensor]:
        """Refuse data that does not fit the configured model, naming the key to change."""
        expected = (self.in_chans, self.img_size, self.img_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"{self.name} {split} images are {tuple(images.shape[1:])} (C, H, W) but data.in_chans/"
                f"data.img_size say {expected}"
            )
        if labels.min() < 0 or labels.max() >= self.num_classes:
            raise ValueError(
                f"{self.name} {split} labels span {labels.min().item()}..{labels.max().item()} but "
                f"data.num_classes={self.num_classes}"
            )
        return images, labels

    def _loader(self, dataset: TensorImages, batch_size: int, train: bool) -> DataLoader:
        return make_loader(dataset, batch_size, train, self.num_workers, self.split_seed, _whole_batch)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> tuple[Tensor, Tensor]:
        images, labels = batch
        self.augment.to(images.device)
        training = self.trainer is not None and self.trainer.training
        return self.augment(images, train=training), labels
