"""Synthetic images for tests and benchmarks: each class a fixed random pattern, each image the pattern
plus noise, so a model can learn it in a few steps and no file is read. With `multilabel`, each image holds any
number of classes, each on its own: grey with each of their patterns' departures from grey added (clipped to
[0, 1]), plus noise; its targets multi-hot."""

from __future__ import annotations

import torch
from torch import Tensor

from vit.data.errors import DataError
from vit.data.memory.base import InMemoryDataModule

LABEL_RATE = 0.3  # multilabel: the chance that an image holds a class, each class drawn on its own


class SyntheticDataModule(InMemoryDataModule):
    name = "synthetic"
    mean, std = (0.5,), (0.25,)

    def __init__(
        self,
        *args,
        train_size: int = 512,
        test_size: int = 128,
        noise: float = 0.5,
        seed: int = 0,
        multilabel: bool = False,
        **kwargs,
    ):
        self.train_size, self.test_size, self.noise, self.seed = train_size, test_size, noise, seed
        self.multilabel = multilabel  # targets (N, K) multi-hot float, not (N,) class indices
        super().__init__(*args, **kwargs)  # one mean and std, broadcast over any number of channels

    @property
    def classes(self) -> list[str]:
        return [f"class_{k}" for k in range(self.num_classes)]

    def load(self, train: bool) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        size = (self.in_chans, self.img_size, self.img_size)
        patterns = torch.rand(self.num_classes, *size, generator=g)  # same for both splits
        g.manual_seed(self.seed + (1 if train else 2))
        n = self.train_size if train else self.test_size
        if self.multilabel:
            labels = (torch.rand(n, self.num_classes, generator=g) < LABEL_RATE).float()  # (N, K)
            pattern = (0.5 + torch.einsum("nk,kchw->nchw", labels, patterns - 0.5)).clamp(0, 1)  # (N, C, H, W)
        else:
            labels = torch.randint(0, self.num_classes, (n,), generator=g)
            pattern = patterns[labels]
        images = (1 - self.noise) * pattern + self.noise * torch.rand(n, *size, generator=g)
        return (images * 255).round().to(torch.uint8), labels

    def _subset(self, images: Tensor, labels: Tensor, count: int) -> tuple[Tensor, Tensor]:
        """Multi-hot targets keep every image, their columns in class_subset's order (the data has num_classes)."""
        if not self.multilabel or self.class_subset is None:
            return super()._subset(images, labels, count)
        if not all(0 <= k < self.num_classes for k in self.class_subset):
            raise DataError(
                f"data.class_subset={self.class_subset}: {self.name} has classes 0..{self.num_classes - 1} only"
            )
        return images, labels[:, self.class_subset]
