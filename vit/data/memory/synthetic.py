"""Synthetic images for tests and benchmarks: each class a fixed random pattern, each image the pattern
plus noise, so a model can learn it in a few steps and no file is read."""

from __future__ import annotations

import torch
from torch import Tensor

from vit.data.memory.base import InMemoryDataModule


class SyntheticDataModule(InMemoryDataModule):
    name = "synthetic"
    mean, std = (0.5,), (0.25,)

    def __init__(self, *args, train_size: int = 512, test_size: int = 128, noise: float = 0.5, seed: int = 0, **kwargs):
        self.train_size, self.test_size, self.noise, self.seed = train_size, test_size, noise, seed
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
        labels = torch.randint(0, self.num_classes, (n,), generator=g)
        images = (1 - self.noise) * patterns[labels] + self.noise * torch.rand(n, *size, generator=g)
        return (images * 255).round().to(torch.uint8), labels
