"""Image folders (ImageNet subsets such as Imagenette): root/train/<class>/*.jpg and root/val/<class>/*.jpg,
decoded by DataLoader workers through `to_channels` (EXIF upright, transparency on black, 16-bit scaled, then
'RGB', or 'L' for a 1-channel model), or JPEGs on the training device (vit/data/encoded/decoding.py), then timm's
transforms (RandomResizedCrop, flip, RandAugment for training; resize and center crop for evaluation).

What a folder holds is decided once, in `setup`, before the held-out split is drawn, so that an index names
the same (file, label) pair for the whole run:

- Hidden entries (names starting with '.': `.git/`, `.DS_Store`, macOS `._photo.jpg` forks) are ignored at
  every depth, as are files without an image extension: they are neither classes nor images.
- The classes are the sub-folders of train/, sorted; their order gives the labels, and val/ is labelled with
  the same map. Their number is counted (vit/data/encoded/folders.py) as the config resolves, so that data.num_classes
  and the model's outputs come from the folder. A class absent from val/ is fine (the test set lacks it). A
  class in val/ but not in train/, or a train/ class left without images, is an error: dropping it would shift
  the label of every class after it.
- Bad images are zero-byte files (found by the scan, always) and files that do not decode (not an image
  despite the extension, truncated), found by a decode pass over every file when `verify_images` is on
  (JPEGs at 1/8 scale, which still reads every byte, so truncation shows). Without `skip_bad_images`, bad
  images are an error naming each; with it, each is left out with a warning naming it and listed in
  `bad_images`, and a split with more than `max_bad_fraction` of its files bad is refused.
- A file that fails to decode during training (verification off, or the file changed since) stops the run
  with an error naming it: leaving it out there would change the epoch in one worker, uncounted.

With `labels` (data.labels=FILE) the folder's layout does not matter: a label file names each image under root and
its class, or its several classes (vit/data/encoded/label_files.py, which also says how the splits are drawn), and
the classes are the file's. Bad images are judged as above, per split. A class left without training images is a
warning naming it (its label is the file's, so the labels after it do not shift); the counts read are logged.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.utils.data import Dataset, Subset
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from vit.data.encoded.bad_images import judge
from vit.data.encoded.base import EncodedImagesDataModule
from vit.data.encoded.folders import class_folders, split_folder
from vit.data.encoded.held_out import hold_out
from vit.data.encoded.images import problem
from vit.data.encoded.label_files import UNLABELED, check_images, read_label_file, split_rows
from vit.data.encoded.targets import multi_hot
from vit.data.errors import DataError
from vit.data.loading import worker_count

log = logging.getLogger(__name__)

Label = int | tuple[int, ...]  # a class index, or the class indices of an image of several labels


def image_files(folder: os.PathLike) -> list[str]:
    """Every image file under `folder`, at any depth, sorted; hidden files and folders left out at every depth."""
    paths = []
    for parent, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        paths += [
            os.path.join(parent, n)
            for n in names
            if not n.startswith(".") and has_file_allowed_extension(n, IMG_EXTENSIONS)
        ]
    return sorted(paths)


def _scan(folder: Path) -> dict[str, list[str]]:
    """Each class sub-folder's image files, classes and files sorted, hidden entries left out at every depth."""
    return {name: image_files(folder / name) for name in class_folders(folder)}


class ImageFiles(Dataset):
    """(path, label) pairs, decoded to `channels` and transformed when read; a label that is a tuple of class
    indices (several labels an image) is handed over as their multi-hot vector (K,)."""

    def __init__(self, samples: list[tuple[str, Label]], classes: list[str], channels: int, transform: Callable):
        self.samples, self.classes, self.channels, self.transform = samples, classes, channels, transform
        self.targets = [label for _, label in samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int | Tensor]:
        path, label = self.samples[index]
        target = multi_hot(label, len(self.classes)) if isinstance(label, tuple) else label
        try:
            image = self.transform.read(path, path)
        except Exception as err:
            raise OSError(
                f"cannot read {path} ({err.__class__.__name__}: {err}); data.verify_images=true finds such files "
                f"before training, and data.skip_bad_images=true then leaves them out"
            ) from err
        return self.transform(image), target


class ImageFolderDataModule(EncodedImagesDataModule):
    """train/ provides the class map that every split shares; the held-out validation split comes from
    train/ (fixed seed), and val/ is the test set, as for Imagenette whose labelled val/ is its test set.
    `bad_images` lists the files left out (with `skip_bad_images`), after `setup`. With `labels`, a label file says
    the images, classes and splits instead, and `unlabeled` what becomes of an image no row names (error or skip);
    `multilabel` says, after `setup`, whether targets are multi-hot vectors."""

    name, sources = "image folder", "image folders"

    def __init__(
        self,
        *,
        root: str,
        val_fraction: float = 0.05,
        split_seed: int = 0,
        train_dir: str = "train",
        test_dir: str = "val",
        verify_images: bool = True,
        skip_bad_images: bool = False,
        max_bad_fraction: float = 0.01,
        labels: str | None = None,
        unlabeled: str = "error",
        **shared: Any,  # EncodedImagesDataModule's settings
    ):
        super().__init__(root=Path(root).expanduser(), **shared)
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self.train_dir, self.test_dir = train_dir, test_dir
        self.verify_images = verify_images
        self.skip_bad_images, self.max_bad_fraction = skip_bad_images, max_bad_fraction
        if unlabeled not in UNLABELED:
            raise DataError(f"data.unlabeled={unlabeled!r}: give one of {', '.join(UNLABELED)}")
        self.labels, self.unlabeled = labels, unlabeled
        self.classes: list[str] = []

    def _usable(self, samples: list[tuple[str, Label]], where: str) -> tuple[list[tuple[str, Label]], list[str]]:
        """The (path, label) pairs of the files that can be trained on, and the bad files left out."""
        paths = [path for path, _ in samples]
        start, threads = time.perf_counter(), max(1, worker_count(self.num_workers))
        size = max(1, min(256, len(paths) // (4 * threads)))  # few tasks, but enough to keep every thread busy
        chunks = [paths[i : i + size] for i in range(0, len(paths), size)]
        with ThreadPoolExecutor(threads) as pool:  # PIL decodes without holding the GIL
            found = pool.map(lambda chunk: [(p, problem(p, self.in_chans, self.verify_images)) for p in chunk], chunks)
            problems = {path: reason for chunk in found for path, reason in chunk if reason is not None}
        if self.verify_images:
            log.info(f"decoded {len(paths)} files in {where} in {time.perf_counter() - start:.1f} s")
        judge(problems, len(paths), where, self.skip_bad_images, self.max_bad_fraction, noun="image file")
        return [(path, label) for path, label in samples if path not in problems], sorted(problems)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if self.labels is not None:
            self._setup_from_label_file()
            return
        train_folder, test_folder = split_folder(self.root, self.train_dir), split_folder(self.root, self.test_dir)
        train_files, test_files = _scan(train_folder), _scan(test_folder)
        self.classes = list(train_files)
        if len(self.classes) != self.num_classes:
            raise DataError(
                f"{train_folder} has {len(self.classes)} class folders but data.num_classes={self.num_classes}: "
                f"leave data.num_classes out, the config reads it from the folder"
            )
        unknown = sorted(set(test_files) - set(self.classes))
        if unknown:
            raise DataError(f"{test_folder} has classes absent from {self.train_dir}/: {unknown}")
        train, train_bad = self._usable(self._labelled(train_files), str(train_folder))
        test, test_bad = self._usable(self._labelled(test_files), str(test_folder))
        seen = {label for _, label in train}
        empty = [str(train_folder / name) for k, name in enumerate(self.classes) if k not in seen]
        if empty:
            raise DataError(
                f"class folder(s) without usable images: {empty}. Every class in {self.train_dir}/ needs images "
                f"(dropping one would shift the labels after it): add images, or remove the folder"
            )
        if not test:
            raise DataError(f"{test_folder} holds no usable images in its class folders")
        self.bad_images = train_bad + test_bad
        train_idx, val_idx = hold_out(len(train), self.val_fraction, self.split_seed)
        self.train_set = Subset(self._dataset(train, True), train_idx)
        self.val_set = Subset(self._dataset(train, False), val_idx)  # same files, evaluation transform
        self.test_set = self._dataset(test, False)

    def _labelled(self, files: dict[str, list[str]]) -> list[tuple[str, int]]:
        """Each class folder's files with the folder's label."""
        return [(path, self.classes.index(name)) for name, paths in files.items() for path in paths]

    def _setup_from_label_file(self) -> None:
        """The splits of the images a label file names (module docstring), each judged for bad images."""
        table = read_label_file(self.labels)
        if len(table.classes) != self.num_classes:
            raise DataError(
                f"{table.path} names {len(table.classes)} classes but data.num_classes={self.num_classes}: leave "
                f"data.num_classes out, the config reads it from the file"
            )
        check_images(table, self.root, self.unlabeled)
        self.classes, self.multilabel = table.classes, table.multilabel
        rows = split_rows(table, self.val_fraction, self.split_seed)
        read, self.bad_images = {}, []
        for split, positions in rows.items():
            samples = [(str(self.root / table.images[k]), self._label(table.labels[k])) for k in positions]
            read[split], bad = self._usable(samples, f"split {split} of {table.path}") if samples else ([], [])
            self.bad_images += bad
        if not read["test"]:
            raise DataError(f"split test of {table.path} holds no usable images")
        if not read["val"]:
            kept, held = hold_out(len(read["train"]), self.val_fraction, self.split_seed)
            read["train"], read["val"] = [read["train"][k] for k in kept], [read["train"][k] for k in held]
        trained = Counter(k for _, label in read["train"] for k in (label if self.multilabel else (label,)))
        if absent := [name for k, name in enumerate(self.classes) if not trained[k]]:
            log.warning(f"{table.path}: no training image of class(es) {absent}: the model learns nothing of them")
        counts = ", ".join(f"{split} {len(samples)}" for split, samples in read.items())
        log.info(f"{table.path}: {len(table.images)} images of {len(self.classes)} classes; {counts}")
        self.train_set = self._dataset(read["train"], True)
        self.val_set, self.test_set = self._dataset(read["val"], False), self._dataset(read["test"], False)

    def _label(self, indices: tuple[int, ...]) -> Label:
        """A file's class indices as an image's label: its one index, or the tuple (several labels an image)."""
        return indices if self.multilabel else indices[0]

    def _unaugmented(self, dataset: Any) -> Any:
        """The training split's files through the evaluation transform, as the validation split reads them."""
        if isinstance(dataset, Subset) and isinstance(dataset.dataset, ImageFiles):
            return Subset(self._dataset(dataset.dataset.samples, False), dataset.indices)
        if isinstance(dataset, ImageFiles):
            return self._dataset(dataset.samples, False)
        return dataset

    def _dataset(self, samples: list[tuple[str, Label]], train: bool) -> ImageFiles:
        return ImageFiles(samples, self.classes, self.in_chans, self._transform(train))
