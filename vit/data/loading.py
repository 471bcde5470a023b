"""DataLoaders for one process or many: under DDP every training sample is seen once per epoch across
ranks, and every evaluation sample exactly once (no padding duplicates, unlike DistributedSampler).

Training loaders are resumable mid-epoch: the order of an epoch is a pure function of (seed, epoch), and
the loader tells Lightning how many batches it has handed out, so a run restored from a checkpoint taken
after batch k of epoch e continues with batch k + 1 of the same order. Lightning saves and restores any
loader with state_dict/load_state_dict (its fit loop's `combined_loader` entry). In DataLoader workers each
sample's augmentation draws are seeded from the pass and the sample's index (SampleSeeded), so a resumed pass,
whose first batch goes to worker 0 whichever worker had it, draws what the whole pass drew.

data.sampler picks the training order (SAMPLERS): `uniform`, each epoch a permutation (EpochSampler), or `balanced`,
each epoch as many class-balanced draws with replacement (BalancedSampler), every class equally likely; both are
drawn from (seed, epoch) alone, shared among ranks and resumed alike."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, get_worker_info

from vit.data.class_balance import balanced_weights
from vit.data.errors import DataError
from vit.data.facts import data_facts

SAMPLERS = ("uniform", "balanced")  # data.sampler: the training order (see the module's docstring)


class ShardSampler(Sampler[int]):
    """Rank r of W takes indices r, r + W, r + 2W, ...: shards of unequal length that together hold each
    index once. Only for evaluation, where ranks need not step in lockstep (metrics sync at the end)."""

    def __init__(self, dataset: Dataset, rank: int, world_size: int):
        self.length, self.rank, self.world_size = len(dataset), rank, world_size  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))


def worker_count(requested: int | str) -> int:
    """DataLoader workers: a number as given, or 'auto': the CPUs this process may use, shared among the training
    processes of this machine (LOCAL_WORLD_SIZE, which torchrun sets; else all of the run's processes), so that
    decoding neither idles cores nor oversubscribes them."""
    if requested != "auto":
        if not isinstance(requested, int) or requested < 0:
            raise DataError(f"data.num_workers={requested!r}: give a whole number >= 0, or auto")
        return requested
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 0))
    if not local:
        local = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return max(1, cpus // local)


def epoch_seed(seed: int, epoch: int) -> int:
    """A generator seed for one epoch of a run: distinct per (seed, epoch), within torch's 64-bit range."""
    return (seed * 1_000_003 + epoch) % 2**63


def checked_sampler(sampler: str) -> str:
    """data.sampler, refused in one line unless it names one of SAMPLERS."""
    if sampler not in SAMPLERS:
        raise DataError(f"data.sampler={sampler!r}: give one of {', '.join(SAMPLERS)}")
    return sampler


class EpochSampler(Sampler[int]):
    """Training order: a permutation drawn from (seed, epoch) alone, never from the global random state;
    under DDP rank r of W takes positions r, r + W, ... of it, after trimming to a multiple of W so every
    rank steps equally often. `skip` leading indices of the epoch are left out (a resumed epoch). Subclasses
    draw another order of the same length (`_order`)."""

    def __init__(self, dataset: Dataset, seed: int, rank: int = 0, world_size: int = 1):
        self.length, self.seed, self.rank, self.world_size = len(dataset), seed, rank, world_size  # type: ignore[arg-type]
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls it at every epoch start
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length // self.world_size

    def __iter__(self) -> Iterator[int]:
        order = self._order(torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch)))
        mine = order[: len(self) * self.world_size][self.rank :: self.world_size]
        skip, self.skip = self.skip, 0  # one resumed epoch only
        return iter(mine[skip:].tolist())

    def _order(self, generator: torch.Generator) -> Tensor:
        return torch.randperm(self.length, generator=generator)


class BalancedSampler(EpochSampler):
    """Class-balanced training order (data.sampler=balanced): each epoch `length` draws with replacement, image i
    drawn with probability proportional to weights[i] (class_balance.balanced_weights: each class equally likely),
    from (seed, epoch) alone; shared among ranks and resumed as EpochSampler's permutation is.

    An image is drawn several times in an epoch. With `numbered`, its n-th draw of the epoch (n from 0) is handed out
    as index + n x length, which SampleSeeded reads back, so that each draw gets augmentation draws of its own rather
    than the first one's again."""

    def __init__(self, dataset: Dataset, weights: Tensor, seed: int, rank: int = 0, world_size: int = 1, *,
                 numbered: bool = False):  # fmt: skip
        super().__init__(dataset, seed, rank, world_size)
        if len(weights) != self.length:
            raise DataError(f"data.sampler=balanced: {len(weights)} labels for the {self.length} training images")
        self.cumulative, self.numbered = weights.double().cumsum(0), numbered

    def _order(self, generator: torch.Generator) -> Tensor:
        # inverting the cumulative weights: torch.multinomial refuses more than 2**24 images; an image of weight 0
        # takes no share of [0, total), so it is never drawn
        drawn = torch.rand(self.length, generator=generator, dtype=torch.float64) * self.cumulative[-1]
        order = torch.searchsorted(self.cumulative, drawn, right=True).clamp_(max=self.length - 1)
        return order + self.length * _drawn_before(order) if self.numbered else order


def _drawn_before(order: Tensor) -> Tensor:
    """For each entry of `order`, how many times its value came earlier in `order`."""
    position = torch.arange(len(order))
    by_value = torch.argsort(order, stable=True)  # equal values keep their order
    values = order[by_value]
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[1:] = values[1:] != values[:-1]
    first = torch.cummax(torch.where(starts, position, 0), dim=0).values  # where each run of equal values begins
    out = torch.empty_like(order)
    out[by_value] = position - first
    return out


def training_targets(dataset: Dataset) -> Any:
    """A training split's labels in index order, for balanced sampling: the dataset's `targets` (class indices,
    multi-hot vectors or label sets, see class_balance.memberships), through any torch Subset of it."""
    if isinstance(dataset, Subset):
        targets = training_targets(dataset.dataset)
        if isinstance(targets, (Tensor, np.ndarray)):
            return targets[np.asarray(dataset.indices)]
        if hasattr(targets, "take"):  # label sets stored flat
            return targets.take(list(dataset.indices))
        return [targets[k] for k in dataset.indices]
    if (targets := getattr(dataset, "targets", None)) is None:
        raise DataError(
            f"data.sampler=balanced: the training split ({type(dataset).__name__}) states no labels to balance; "
            f"use data.sampler=uniform"
        )
    return targets


def seed_draws(seed: int) -> None:
    """Seed every random stream an augmentation draws from in this process: torch's CPU generator, Python's and
    numpy's. Not torch.manual_seed: it also queues a seed for each lazy accelerator with a formatted stack trace,
    a cost a loader worker would pay every sample (benchmarks/NOTES.md change 28)."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


@contextlib.contextmanager
def own_draws(seed: int) -> Iterator[None]:
    """Draws seeded by `seed` (see seed_draws) within the block, and every random stream as it was after it: one
    sample's augmentation in the main process, the same whatever else draws there (a download thread included)
    and leaving the run's own draws (dropout, Mixup) as they were."""
    states = torch.default_generator.get_state(), random.getstate(), np.random.get_state()
    seed_draws(seed)
    try:
        yield
    finally:
        torch.default_generator.set_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])


def _fetches_whole_batches(dataset: Dataset) -> bool:
    """Whether a batch is one fetch (`__getitems__`), as in-memory data's is, augmented on the device after it:
    its workers draw nothing. torch's Subset has `__getitems__` too, but fetches its dataset's samples one by one."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return hasattr(dataset, "__getitems__")


class SampleSeeded(Dataset):
    """In a DataLoader worker, each sample's random draws (its augmentation) come from the pass's seed and the
    sample's index alone, not from the worker's running stream: a pass resumed mid-epoch hands its first batch to
    worker 0, whichever worker had it before, so draws that followed the worker would differ from the whole run's."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, draw: int) -> Any:
        info = get_worker_info()
        if info is not None:  # the main process's draws are the run's own, which checkpoints keep
            seed_draws(epoch_seed(info.seed - info.id, draw))  # worker i's seed is the pass's base seed + i
        return self.dataset[draw % len(self)]  # the index itself, or a BalancedSampler's numbered draw of it


class ResumableLoader(DataLoader):
    """A training DataLoader that counts the batches and samples it hands out in the current epoch; its state_dict
    is (epoch, batches, samples), and load_state_dict makes the next pass start after those samples (a run resumed
    with another data.batch_size reads each of the epoch's samples once still). The loader's own generator
    (for worker seeds) is reseeded from (seed, epoch) at each pass, so the global random state is untouched.

    Lightning rebuilds a loader to swap its sampler (trainer.overfit_batches puts in a SequentialSampler),
    calling this constructor with the arguments it was given and `sampler=` replaced: hence keyword-only.
    A sampler other than an EpochSampler has no epoch or seed, so its passes are neither reseeded nor resumed."""

    def __init__(self, dataset: Dataset, batch_size: int, *, sampler: Sampler[int], **kwargs: Any):
        super().__init__(dataset, batch_size, sampler=sampler, drop_last=True, generator=torch.Generator(), **kwargs)
        self.batches = self.samples = 0
        self._resume: dict[str, int] | None = None

    def __iter__(self) -> Iterator[Any]:
        sampler, resume = self.sampler, self._resume
        self.batches, self.samples, self._resume = 0, 0, None
        if isinstance(sampler, EpochSampler):
            if resume is not None and resume["epoch"] == sampler.epoch:  # Lightning sets the epoch before iterating
                self.batches = resume["batches"]
                self.samples = resume.get("samples", self.batches * self.batch_size)  # type: ignore[operator]
                sampler.skip = self.samples
            self.generator.manual_seed(epoch_seed(sampler.seed, sampler.epoch))  # type: ignore[union-attr]
            if hasattr(self.dataset, "set_epoch"):  # a dataset that seeds its own draws (make_loader)
                self.dataset.set_epoch(sampler.epoch)
        for batch in super().__iter__():
            self.batches += 1
            self.samples += self.batch_size  # type: ignore[operator]
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": getattr(self.sampler, "epoch", 0), "batches": self.batches, "samples": self.samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = dict(state)


def make_loader(
    dataset: Dataset,
    batch_size: int,
    train: bool,
    num_workers: int | str = 0,
    collate_fn: Callable[[Any], Any] | None = None,
    pin_memory: bool = False,
    sampler: str = "uniform",
) -> DataLoader:
    """Training loaders shuffle by (seed, epoch), or draw class-balanced (sampler='balanced'), drop the last
    partial batch (a split too small for one batch per process is refused) and resume mid-epoch; evaluation
    loaders keep every sample in order.

    Trainers run with use_distributed_sampler=False, so the samplers chosen here are the ones used. The
    training order follows the run's seed (torch.initial_seed(), set by seed_everything on every rank).
    """
    rank, world = 0, 1
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    num_workers = worker_count(num_workers)
    workers = dict(num_workers=num_workers, persistent_workers=num_workers > 0)
    if train:
        # workers that draw augmentations seed each sample (SampleSeeded), unless the dataset seeds its own draws
        # (`seeds_draws`: from the epoch, which the loader gives it with set_epoch); in the main process draws are the
        # run's own
        own = getattr(dataset, "seeds_draws", False)
        seeded = num_workers > 0 and not _fetches_whole_batches(dataset) and not own
        order = EpochSampler(dataset, torch.initial_seed(), rank, world)
        if checked_sampler(sampler) == "balanced":
            weights = balanced_weights(training_targets(dataset))
            order = BalancedSampler(dataset, weights, torch.initial_seed(), rank, world, numbered=seeded or own)
        if len(order) < batch_size:  # the last partial batch is dropped: the epoch would have no step
            raise DataError(
                f"data.batch_size={batch_size}, but the training split holds {order.length} images for {world} "
                f"process(es), {len(order)} each, so not one training step would run. Lower data.batch_size to "
                f"at most {len(order)}, or train on more images"
            )
        if num_workers == 0 or _fetches_whole_batches(dataset):
            return ResumableLoader(
                dataset, batch_size, sampler=order, collate_fn=collate_fn, pin_memory=pin_memory, **workers
            )
        return ResumableLoader(
            SampleSeeded(dataset) if seeded else dataset,
            batch_size,
            sampler=order,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            num_workers=num_workers,  # not persistent: each pass's workers get that pass's base seed (and epoch)
        )
    shards = ShardSampler(dataset, rank, world) if world > 1 else None
    # an own generator: starting an evaluation pass draws no number from the global random state, so
    # validation never shifts the random numbers training draws (exact resume relies on it)
    return DataLoader(
        dataset,
        batch_size,
        sampler=shards,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        generator=torch.Generator(),
        **workers,
    )


class SplitDataModule(L.LightningDataModule):
    """The three loaders of a data module with train_set, val_set and test_set; subclasses say how a
    split becomes a loader in `_loader` and fill the sets in `setup`."""

    batch_size: int
    eval_batch_size: int
    mean: Sequence[float]  # per channel (one value for all), of pixels in [0, 1]
    std: Sequence[float]
    classes: Sequence[str] | None = None  # names in label order, where the dataset has them
    sampler = "uniform"  # data.sampler: the training order, one of SAMPLERS
    crop_pct: float  # evaluation resizes an image so that its centre (H, W) crop takes this fraction of it
    crop_mode = "center"  # timm's name for that framing: aspect kept, the centre cropped ('squash': imports only)
    max_tokens: int | None = None  # images at their own aspect ratio within this many patches (encoded sources)
    input_size: tuple[int, int] | None = None  # evaluation's (H, W): the model's img_size (imports state their own)
    patch_size: tuple[int, int] | None = None  # the network's, which those images are fitted to: the run sets it
    interpolation: str  # of that resize: a PIL filter name ("bilinear", "bicubic")
    train_set: Any
    val_set: Any
    test_set: Any

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> DataLoader:
        raise NotImplementedError

    def facts(self) -> dict[str, Any]:
        """What a model trained on this data needs to read new images as evaluation did; checkpoints keep it."""
        return data_facts(self)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self.eval_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, self.eval_batch_size, train=False)

    def normalize_with(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Normalise every split with this mean and std (a pretrained model's), not the data's own; call before
        `setup`. Checkpoints record them, as they do the data's."""
        self.mean, self.std = tuple(mean), tuple(std)

    def as_precision(self, images: Tensor) -> Tensor:
        """Images made on the device by on_after_batch_transfer, converted as Lightning converts inputs (bf16 or
        fp64 for the "*-true" precisions): its conversion ran before that hook, on uint8 or encoded bytes."""
        return images if self.trainer is None else self.trainer.precision_plugin.convert_input(images)

    def evaluation_loader(self, split: str) -> DataLoader:
        """A split read as evaluation reads it, in order, training split included (no augmentation): features
        for a linear probe or k-NN. Batches still pass on_after_batch_transfer, as a trainer's do."""
        return self._loader(self._unaugmented(getattr(self, f"{split}_set")), self.eval_batch_size, train=False)

    def _unaugmented(self, dataset: Any) -> Any:
        """`dataset` without its training augmentation; in-memory data augments batches, not samples."""
        return dataset
