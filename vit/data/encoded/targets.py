"""Several labels per image: each image's set of class indices, handed to the loader as the multi-hot float vector
(K,) a multi-label loss takes (batched (B, K)); one label per image stays an int. Image folders with a label file
(vit/data/encoded/label_files.py), Hugging Face datasets whose label column is a Sequence(ClassLabel) and shards
written from either keep their sets here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


def multi_hot(indices: Sequence[int] | np.ndarray | Tensor, num_classes: int) -> Tensor:
    """Class indices -> (K,) float32, 1 at each (an empty set: all zeros, an image of none of the classes)."""
    target = torch.zeros(num_classes)
    target[torch.as_tensor(indices, dtype=torch.int64)] = 1.0
    return target


@dataclass(frozen=True)
class LabelSets:
    """Image k's class indices are indices[offsets[k] : offsets[k + 1]]: two flat arrays rather than a list of lists,
    so that a million images' sets are two arrays to copy into each loader worker, not a million Python objects."""

    offsets: np.ndarray  # (N + 1,) int64
    indices: np.ndarray  # (offsets[-1],) int64
    num_classes: int

    @classmethod
    def of(cls, sets: Sequence[Sequence[int]], num_classes: int) -> LabelSets:
        offsets = np.zeros(len(sets) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(s) for s in sets])
        flat = np.fromiter((k for s in sets for k in s), dtype=np.int64, count=int(offsets[-1]))
        return cls(offsets, flat, num_classes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def classes_of(self, k: int) -> np.ndarray:
        return self.indices[self.offsets[k] : self.offsets[k + 1]]

    def __getitem__(self, k: int) -> Tensor:
        return multi_hot(self.classes_of(k), self.num_classes)

    def take(self, positions: Sequence[int]) -> LabelSets:
        return LabelSets.of([self.classes_of(k) for k in positions], self.num_classes)


def target(labels: Any, k: int) -> int | Tensor:
    """Image k's target: its int label, or where `labels` are LabelSets its multi-hot vector."""
    return labels[k] if isinstance(labels, LabelSets) else int(labels[k])
