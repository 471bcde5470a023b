"""DataLoaders for one process or many: under DDP every training sample is seen once per epoch across
ranks, and every evaluation sample exactly once (no padding duplicates, unlike DistributedSampler)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


class ShardSampler(Sampler[int]):
    """Rank r of W takes indices r, r + W, r + 2W, ...: shards of unequal length that together hold each
    index once. Only for evaluation, where ranks need not step in lockstep (metrics sync at the end)."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int):
        self.length, self.rank, self.world_size = len(dataset), rank, world_size  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))


def make_loader(
    dataset: Dataset,
    batch_size: int,
    train: bool,
    num_workers: int = 0,
    seed: int = 0,
    collate_fn: Callable[[Any], Any] | None = None,
    pin_memory: bool = False,
) -> DataLoader:
    """Training loaders shuffle and drop the last partial batch; evaluation loaders keep every sample.

    Trainers run with use_distributed_sampler=False, so the samplers chosen here are the ones used.
    """
    sampler: Sampler[int] | None = None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank, world = dist.get_rank(), dist.get_world_size()
        if train:
            sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=seed, drop_last=True)
        else:
            sampler = ShardSampler(dataset, rank, world)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train and sampler is None,
        sampler=sampler,
        drop_last=train,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )


class SplitDataModule(L.LightningDataModule):
    """The three loaders of a data module with train_set, val_set and test_set; subclasses say how a
    split becomes a loader in `_loader` and fill the sets in `setup`."""

    batch_size: int
    eval_batch_size: int
    mean: Sequence[float]  # per channel (one value for all), of pixels in [0, 1]
    std: Sequence[float]
    classes: Sequence[str] | None = None  # names in label order, where the dataset has them
    train_set: Any
    val_set: Any
    test_set: Any

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> DataLoader:
        raise NotImplementedError

    def facts(self) -> dict[str, Any]:
        """What a model trained on this data needs to read new images as training did; checkpoints keep it."""
        return {"mean": list(self.mean), "std": list(self.std), "classes": list(self.classes or []) or None}

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self.eval_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, self.eval_batch_size, train=False)
