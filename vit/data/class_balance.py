"""Class-balanced sampling weights (data.sampler=balanced, vit/data/loading.py's BalancedSampler): image i weighs the
mean over its labels of 1 / (the images holding that label), so that with one label an image each class is drawn
equally often, 1/K of the draws, however rare it is; with several labels an image each label's share is evened out
as far as the images' label sets allow. Images holding no label (a multi-label set's negatives) are one group of
their own, drawn as often as a class: weighing them 0 would never show them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vit.data.errors import DataError


def memberships(targets: Any) -> tuple[Tensor, Tensor, int]:
    """A split's targets in index order as (image, class) pairs (two int64 (P,) tensors) and the number of images.
    `targets` is class indices (N,) or multi-hot vectors (N, K) as a tensor, an array or a list; a list whose items
    are a class index, a tuple of class indices, or a multi-hot tensor (K,); or label sets stored flat as `offsets`
    (N + 1,) and `indices` (vit/data/encoded/targets.py's LabelSets)."""
    if hasattr(targets, "offsets") and hasattr(targets, "indices"):  # image k holds indices[offsets[k]:offsets[k+1]]
        sizes = torch.as_tensor(np.diff(targets.offsets))
        images = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
        return images, torch.as_tensor(targets.indices, dtype=torch.int64), len(sizes)
    if not isinstance(targets, (Tensor, np.ndarray)) and _ragged(targets):
        pairs = torch.tensor([(i, int(k)) for i, item in enumerate(targets) for k in _classes_of(item)])
        pairs = pairs.long().reshape(-1, 2)  # (P, 2): image, class
        return pairs[:, 0], pairs[:, 1], len(targets)
    dense = torch.as_tensor(np.asarray(targets))
    if dense.dim() == 1:  # (N,) class indices
        return torch.arange(len(dense)), dense.long(), len(dense)
    if dense.dim() == 2:  # (N, K) multi-hot
        images, classes = dense.nonzero(as_tuple=True)
        return images, classes, len(dense)
    raise DataError(f"targets of shape {tuple(dense.shape)}: give class indices (N,) or multi-hot vectors (N, K)")


def _ragged(targets: Sequence[Any]) -> bool:
    """Whether a list's items are label sets (tuples of class indices) or tensors, not plain class indices."""
    return any(isinstance(item, (tuple, list, Tensor)) for item in targets)


def _classes_of(item: Any) -> Sequence[int]:
    """One image's class indices: a class index, a tuple of them, or a multi-hot tensor (K,)."""
    if isinstance(item, Tensor):
        return item.nonzero().flatten().tolist()
    return item if isinstance(item, (tuple, list)) else (item,)


def balanced_weights(targets: Any) -> Tensor:
    """(N,) float64: each image's weight, the mean over its labels of 1 / (the images holding that label); an image
    of no label weighs 1 / (the images of no label). Their sum is the number of classes present (+1 for unlabelled
    images), each class's images together weighing 1 where each holds one label."""
    images, classes, length = memberships(targets)
    if length == 0:
        raise DataError("data.sampler=balanced: the training split holds no images")
    if len(classes) and classes.min() < 0:
        raise DataError(f"data.sampler=balanced: a training label is {int(classes.min())}, not a class index")
    per_class = torch.bincount(classes).double()  # (K,): images holding each class
    labels = torch.bincount(images, minlength=length)  # (N,): labels each image holds
    weights = torch.zeros(length, dtype=torch.float64).index_add_(0, images, 1.0 / per_class[classes])
    weights /= labels.clamp(min=1)
    unlabelled = labels == 0
    weights[unlabelled] = 1.0 / max(1, int(unlabelled.sum()))
    return weights
