"""Image folders (ImageNet subsets such as Imagenette): root/train/<class>/*.jpg and root/val/<class>/*.jpg,
decoded by DataLoader workers with timm's transforms (RandomResizedCrop, flip, RandAugment for training;
resize and center crop for evaluation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from torch import Generator
from torch.utils.data import DataLoader, Subset, random_split
from torchvision.datasets import ImageFolder

from vit.data.loading import SplitDataModule, make_loader


class ImageFolderDataModule(SplitDataModule):
    """train/ provides the class map that every split shares; the held-out validation split comes from
    train/ (fixed seed), and val/ is the test set, as for Imagenette whose labelled val/ is its test set."""

    name = "image folder"
    mean, std = IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    def __init__(
        self,
        root: str,
        num_classes: int,
        in_chans: int = 3,
        img_size: int = 224,
        batch_size: int = 128,
        eval_batch_size: int = 256,
        val_fraction: float = 0.05,
        split_seed: int = 0,
        num_workers: int = 2,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        crop_pct: float = 0.875,
        train_dir: str = "train",
        test_dir: str = "val",
    ):
        super().__init__()
        self.root, self.num_classes, self.in_chans, self.img_size = (
            Path(root),
            num_classes,
            in_chans,
            img_size,
        )
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self.auto_augment, self.crop_pct = auto_augment, crop_pct
        self.train_dir, self.test_dir = train_dir, test_dir
        self.classes: list[str] = []
        self.train_set = self.val_set = self.test_set = None

    def _transform(self, train: bool) -> Any:
        return create_transform(
            self.img_size,
            is_training=train,
            auto_augment=self.auto_augment if train else None,
            crop_pct=self.crop_pct,
            mean=self.mean,
            std=self.std,
        )

    def _folder(self, split: str, train: bool) -> ImageFolder:
        path = self.root / split
        if not path.is_dir():
            raise FileNotFoundError(
                f"image folder split not found: {path} (data.root={self.root} must hold {self.train_dir}/ and "
                f"{self.test_dir}/ with one sub-folder per class)"
            )
        return ImageFolder(str(path), transform=self._transform(train))

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train, train_eval = self._folder(self.train_dir, True), self._folder(self.train_dir, False)
        test = self._folder(self.test_dir, False)
        self.classes = train.classes
        if len(self.classes) != self.num_classes:
            raise ValueError(
                f"{self.root / self.train_dir} has {len(self.classes)} class folders but "
                f"data.num_classes={self.num_classes}"
            )
        unknown = sorted(set(test.classes) - set(self.classes))
        if unknown:
            raise ValueError(f"{self.root / self.test_dir} has classes absent from {self.train_dir}/: {unknown}")
        # one class map for every split: re-index the test folder's samples by the train folder's classes
        test.samples = [(path, self.classes.index(test.classes[label])) for path, label in test.samples]
        test.targets = [label for _, label in test.samples]
        test.class_to_idx, test.classes = train.class_to_idx, self.classes
        n_val = max(1, round(self.val_fraction * len(train)))
        train_idx, val_idx = random_split(
            range(len(train)), [len(train) - n_val, n_val], generator=Generator().manual_seed(self.split_seed)
        )
        self.train_set = Subset(train, list(train_idx))
        self.val_set = Subset(train_eval, list(val_idx))  # same files as train, evaluation transform
        self.test_set = test

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> DataLoader:
        return make_loader(
            dataset, batch_size, train, self.num_workers, self.split_seed, pin_memory=torch.cuda.is_available()
        )
