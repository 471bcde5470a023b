"""Hugging Face `datasets` image classification data (vit/data/encoded/hf_source.py says what data.root may be), read
as image folders are: each row's encoded image decoded in workers or on the device (vit/data/encoded/decoding.py), the
same timm transforms and ImageNet normalisation, the same bad-image policy, and checkpoints of the same facts.

The splits are the dataset's, chosen once in `setup` so that an index names the same row for the whole run:

- Each split is found by its name, or else by another that datasets gives it ('valid', 'val' or 'dev' for
  'validation'; 'training'; 'testing', 'eval' or 'evaluation' for 'test').
- Training reads data.train_split. Validation reads data.val_split where the dataset has a test split too;
  otherwise val_fraction of the training rows is held out (split_seed), as for image folders.
- Testing reads data.test_split, or else data.val_split (the dataset's held-out labelled data, as Imagenette's
  val/ is its test set), or else, where the dataset has neither, the held-out validation rows; a log line says
  which. A split whose every label is -1 (ImageNet-1k's test split on the hub), or without the label column, has
  none, and counts as absent.
- The classes are the label column's ClassLabel names (None for plain integer labels) and their number is read
  as the config resolves; a label outside them is an error naming its split and row. A label column of sequences
  (Sequence(ClassLabel), or lists of integers) gives each row several labels: `multilabel`, and multi-hot targets.
- Bad images are rows whose image does not decode (empty, truncated, not an image), found by a decode pass over
  every row when `verify_images` is on, and named by split and row; without `skip_bad_images` they are an
  error, with it each is left out with a warning and listed in `bad_images`, up to `max_bad_fraction` of a split.
  A row that fails to decode during training stops the run with an error naming it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from datasets import Dataset as HFDataset
from torch.utils.data import Dataset

from vit.data.encoded.bad_images import judge
from vit.data.encoded.base import EncodedImagesDataModule
from vit.data.encoded.held_out import hold_out
from vit.data.encoded.hf_source import (
    UNLABELLED,
    class_count,
    class_names,
    encoded_images,
    image_column,
    is_multilabel,
    label_column,
    labels,
    open_dataset,
    outside,
    split_named,
)
from vit.data.encoded.images import problem
from vit.data.encoded.targets import LabelSets, target
from vit.data.errors import DataError
from vit.data.loading import worker_count

log = logging.getLogger(__name__)


def _source(value: dict[str, Any] | None) -> bytes | str | None:
    """A row's undecoded image ({'bytes', 'path'}) as what `decode` reads: its bytes, else its file's path."""
    if value is None:
        return None
    return value["bytes"] if value["bytes"] is not None else value["path"]


@dataclass(eq=False)
class HFImages(Dataset):
    """Some rows of one split as (image, label) pairs, the image decoded to `channels` and transformed when read."""

    images: HFDataset  # the split's image column, undecoded (hf_source.encoded_images)
    labels: np.ndarray | LabelSets  # the split's labels, by row (several a row: their sets)
    rows: np.ndarray  # the rows read, by position (an array: workers each get a copy)
    split: str  # the split's name, for messages
    channels: int
    transform: Callable

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Any, int | torch.Tensor]:
        row = int(self.rows[index])
        try:
            source = _source(self.images[row][self.images.column_names[0]])
            image = self.transform.read(source, f"row {row} of split '{self.split}'")
        except Exception as err:
            raise OSError(
                f"cannot read row {row} of split '{self.split}' ({err.__class__.__name__}: {err}); "
                f"data.verify_images=true finds such rows before training, and data.skip_bad_images=true then "
                f"leaves them out"
            ) from err
        return self.transform(image), target(self.labels, row)

    @property
    def targets(self) -> np.ndarray | LabelSets:
        """The labels of the rows read, in index order (what balanced sampling weighs, vit/data/loading.py)."""
        return self.labels.take(self.rows) if isinstance(self.labels, LabelSets) else self.labels[self.rows]

    def subset(self, positions: list[int]) -> HFImages:
        """The rows at these positions, as a dataset of their own."""
        return replace(self, rows=self.rows[positions])


class HFDataModule(EncodedImagesDataModule):
    """A Hugging Face dataset's splits (see the module's docstring for which serves what). `bad_images` lists the
    rows left out (with `skip_bad_images`), after `setup`."""

    name, sources = "Hugging Face dataset", "Hugging Face datasets' images"

    def __init__(
        self,
        *,
        root: str,
        image_column: str | None = None,
        label_column: str | None = None,
        train_split: str = "train",
        val_split: str = "validation",
        test_split: str = "test",
        val_fraction: float = 0.05,
        split_seed: int = 0,
        cache_dir: str | None = None,
        verify_images: bool = True,
        skip_bad_images: bool = False,
        max_bad_fraction: float = 0.01,
        **shared: Any,  # EncodedImagesDataModule's settings
    ):
        super().__init__(root=root, **shared)
        self.image_column, self.label_column = image_column, label_column
        self.train_split, self.val_split, self.test_split = train_split, val_split, test_split
        self.val_fraction, self.split_seed, self.cache_dir = val_fraction, split_seed, cache_dir
        self.verify_images = verify_images
        self.skip_bad_images, self.max_bad_fraction = skip_bad_images, max_bad_fraction
        self.classes: list[str] | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = open_dataset(self.root, self.cache_dir)
        self.train_split, self.val_split, self.test_split = (
            split_named(splits, name) for name in (self.train_split, self.val_split, self.test_split)
        )
        if self.train_split not in splits:
            raise DataError(
                f"data.root={self.root} has no split '{self.train_split}' (data.train_split); "
                f"its splits: {list(splits)}"
            )
        image = image_column(splits, self.image_column)
        label = label_column(splits, self.label_column, self.train_split)
        count = class_count(splits, label)
        if count != self.num_classes:
            raise DataError(
                f"data.root={self.root} has {count} classes in its label column '{label}' but "
                f"data.num_classes={self.num_classes}: leave data.num_classes out, the config reads it from the data"
            )
        self.classes, self.multilabel = class_names(splits, label), is_multilabel(splits, label)
        read = {}
        for name in (n for n in (self.train_split, self.val_split, self.test_split) if n in splits):
            targets = labels(splits[name], label)
            if isinstance(targets, LabelSets):
                targets = replace(targets, num_classes=count)
            elif name != self.train_split and (targets == UNLABELLED).all():
                log.info(f"split '{name}' of data.root={self.root} has no labels (all {UNLABELLED}): not used")
                continue
            read[name] = self._usable(splits[name], image, targets, name)
        self.bad_images = sorted(bad for _, found in read.values() for bad in found)
        self._assign({name: dataset for name, (dataset, _) in read.items()})

    def _assign(self, sets: dict[str, HFImages]) -> None:
        """train_set, val_set and test_set from the splits read (see the module's docstring), said in a log line."""
        train, val, test = sets[self.train_split], sets.get(self.val_split), sets.get(self.test_split)
        said = f"training on split '{self.train_split}'"
        if test is None and val is not None:
            val, test = None, val
            said = f"testing on split '{self.val_split}', as there is no split '{self.test_split}'; " + said
        if val is None:
            kept, held = hold_out(len(train), self.val_fraction, self.split_seed)
            train, val = train.subset(kept), self._unaugmented(train.subset(held))  # evaluation's transform
            said += f" less {len(held)} rows held out for validation (data.val_fraction)"
        if test is None:
            test = val
            said += f", which are the test set too: there is no split '{self.test_split}' or '{self.val_split}'"
        log.info(f"data.root={self.root}: {said}; {len(train)}, {len(val)} and {len(test)} rows")
        self.train_set, self.val_set, self.test_set = train, val, test

    def _usable(
        self, split: HFDataset, column: str, targets: np.ndarray | LabelSets, name: str
    ) -> tuple[HFImages, list[str]]:
        """The split's rows that can be trained on, as a dataset, and the names of the bad rows left out."""
        if len(split) == 0:
            raise DataError(f"split '{name}' of data.root={self.root} has no rows")
        wrong = outside(targets, self.num_classes)
        if len(wrong):
            held = targets.classes_of(wrong[0]).tolist() if isinstance(targets, LabelSets) else targets[wrong[0]]
            raise DataError(
                f"split '{name}' row {wrong[0]} has label {held}, outside the {self.num_classes} "
                f"classes 0..{self.num_classes - 1} ({len(wrong)} such row(s))"
            )
        images = encoded_images(split, column)
        problems = self._problems(images, name) if self.verify_images else {}
        named = {f"{name} row {row}": why for row, why in problems.items()}
        where = f"split '{name}' of data.root={self.root}"
        judge(named, len(split), where, self.skip_bad_images, self.max_bad_fraction, noun="image row")
        usable = np.ones(len(split), dtype=bool)
        usable[list(problems)] = False
        transform = self._transform(train=name == self.train_split)
        return HFImages(images, targets, np.flatnonzero(usable), name, self.in_chans, transform), sorted(named)

    def _problems(self, images: HFDataset, name: str) -> dict[int, str]:
        """Row -> why, for each row whose image does not decode; rows read in chunks, decoded by threads."""
        start, threads = time.perf_counter(), max(1, worker_count(self.num_workers))
        size = max(1, min(256, len(images) // (4 * threads)))  # few tasks, but enough to keep every thread busy
        column = images.column_names[0]

        def check(first: int) -> list[tuple[int, str | None]]:
            found = []
            for row, value in enumerate(images[first : first + size][column], start=first):
                source = _source(value)
                found.append((row, "no image (null)" if source is None else problem(source, self.in_chans, True)))
            return found

        with ThreadPoolExecutor(threads) as pool:  # PIL decodes without holding the GIL
            found = [pair for chunk in pool.map(check, range(0, len(images), size)) for pair in chunk]
        log.info(f"decoded the {len(images)} images of split '{name}' in {time.perf_counter() - start:.1f} s")
        return {row: why for row, why in found if why is not None}

    def _unaugmented(self, dataset: Any) -> Any:
        """The training rows through the evaluation transform, as the validation rows read them."""
        return replace(dataset, transform=self._transform(False)) if isinstance(dataset, HFImages) else dataset
