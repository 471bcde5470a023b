"""The datasets that `python -m vit.cli.shards` writes as shards (vit/data/shards/writer.py), read as splits of encoded
images: an image folder (with its label file, if given), a Hugging Face dataset or torchvision's CIFAR files.

Images are read as stored (JPEG, PNG, ...: the bytes the writer keeps), CIFAR's arrays encoded as PNG. A source has
a training split; a test split where it has one (an image folder's val/, CIFAR's test batch, a dataset's test split
or else its validation split); and a validation split only where a Hugging Face dataset has both a validation and a
test split. A Hugging Face split whose every label is -1, or without the label column, counts as absent. A label
file's splits are those data=imagefolder reads (vit/data/encoded/label_files.py): its val rows are the validation
split, its test rows (or those held out by the seed) the test split. Several labels an image (a label file's
`labels`, a Hugging Face Sequence(ClassLabel)) make a `multilabel` source, whose labels are tuples of class indices.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PIL import Image

from vit.data.encoded.folders import class_folders
from vit.data.encoded.imagefolder import _scan
from vit.data.encoded.label_files import UNLABELED, check_images, read_label_file, split_rows
from vit.data.encoded.targets import LabelSets
from vit.data.errors import DataError
from vit.data.memory.cifar import CIFAR10DataModule, CIFAR100DataModule

CIFAR_FOLDERS = {"cifar-10-batches-py": "cifar10", "cifar-100-python": "cifar100"}


@dataclass(frozen=True)
class Split:
    """Images of one split: image k's encoded bytes are read(keys[k]); its label and name (for messages)."""

    read: Callable[[Any], bytes]
    keys: list[Any]  # what `read` takes: a file's path, a dataset's row, an array's index
    labels: list[int] | list[tuple[int, ...]]  # a class index an image, or its class indices (several labels)
    names: list[str]
    sizes: list[int] | None = None  # each image's bytes as read, once they have been (vit.data.shards.writer.usable)

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, positions: list[int]) -> Split:
        pick = lambda values: None if values is None else [values[k] for k in positions]  # noqa: E731
        return replace(
            self, keys=pick(self.keys), labels=pick(self.labels), names=pick(self.names), sizes=pick(self.sizes)
        )


@dataclass(frozen=True)
class Source:
    """A dataset to write: its kind, classes, training split, and held-out splits where it has them."""

    kind: str
    classes: list[str] | None
    num_classes: int
    train: Split
    val: Split | None  # a validation split of its own (else one is held out from train)
    test: Split | None
    multilabel: bool = False  # several labels an image


def _file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def image_folder(root: Path) -> Source:
    """root/train/<class>/* and, where present, root/val/<class>/* (the test set, as for data=imagefolder)."""
    train_files = _scan(root / "train")
    classes = list(train_files)

    def split(files: dict[str, list[str]]) -> Split:
        unknown = sorted(set(files) - set(classes))
        if unknown:
            raise DataError(f"{root / 'val'} has classes absent from train/: {unknown}")
        pairs = [(path, classes.index(name)) for name, paths in files.items() for path in paths]
        return Split(_file, [p for p, _ in pairs], [k for _, k in pairs], [os.path.relpath(p, root) for p, _ in pairs])

    test = split(_scan(root / "val")) if (root / "val").is_dir() and class_folders(root / "val") else None
    return Source("image folder", classes, len(classes), split(train_files), None, test)


def label_file(root: Path, labels: str, val_fraction: float, split_seed: int, unlabeled: str) -> Source:
    """The images under root that a label file names, split as data=imagefolder splits them (split_rows)."""
    table = read_label_file(labels)
    check_images(table, root, unlabeled)
    rows = split_rows(table, val_fraction, split_seed)

    def split(positions: list[int]) -> Split | None:
        if not positions:
            return None
        targets = [table.labels[k] if table.multilabel else table.labels[k][0] for k in positions]
        return Split(
            _file, [str(root / table.images[k]) for k in positions], targets, [table.images[k] for k in positions]
        )

    kind = f"image folder with {table.path.name}"
    train, val, test = (split(rows[name]) for name in ("train", "val", "test"))
    return Source(kind, table.classes, len(table.classes), train, val, test, table.multilabel)


def cifar(root: Path, kind: str) -> Source:
    """torchvision's CIFAR files under root (cifar-10-batches-py/ or cifar-100-python/), each image as a PNG."""
    module_class = CIFAR10DataModule if kind == "cifar10" else CIFAR100DataModule
    module = module_class(str(root), module_class.class_count, in_chans=3, img_size=32, download=False)
    splits = []
    for train in (True, False):
        images, labels = module.load(train)  # (N, 3, 32, 32) uint8
        pixels = images.permute(0, 2, 3, 1).numpy()  # (N, 32, 32, 3), as PIL reads arrays
        name = "train" if train else "test"
        splits.append(
            Split(
                _Png(pixels),
                list(range(len(labels))),
                labels.tolist(),
                [f"{name} image {k}" for k in range(len(labels))],
            )
        )
    return Source(kind, module.classes, module_class.class_count, splits[0], None, splits[1])


@dataclass(frozen=True)
class _Png:
    """Image k of an (N, H, W, 3) uint8 array, encoded as PNG."""

    pixels: Any

    def __call__(self, k: int) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(self.pixels[k]).save(buffer, "PNG")
        return buffer.getvalue()


def hf_dataset(root: str, image_column: str | None, label_column: str | None) -> Source:
    """A Hugging Face dataset as data=hf reads it (vit/data/encoded/hf_source.py): train, validation and test splits."""
    from vit.data.encoded.hf_source import (  # datasets is imported by the writes that read one
        UNLABELLED,
        class_count,
        class_names,
        encoded_images,
        is_multilabel,
        labels,
        open_dataset,
        outside,
        split_named,
    )
    from vit.data.encoded.hf_source import image_column as find_image_column
    from vit.data.encoded.hf_source import label_column as find_label_column

    splits = open_dataset(root)
    names = {split: split_named(splits, split) for split in ("train", "validation", "test")}  # the dataset's own names
    if names["train"] not in splits:
        raise DataError(f"{root} has no split 'train'; its splits: {list(splits)}")
    image = find_image_column(splits, image_column)
    label = find_label_column(splits, label_column, names["train"])
    count = class_count(splits, label)
    read = {}
    for name, stored in names.items():
        if stored not in splits:
            continue
        targets = labels(splits[stored], label)
        sets = isinstance(targets, LabelSets)
        if name != "train" and not sets and (targets == UNLABELLED).all():
            continue
        if len(wrong := outside(targets, count)):
            held = targets.classes_of(wrong[0]).tolist() if sets else targets[wrong[0]]
            raise DataError(f"split '{stored}' row {wrong[0]} has label {held}, outside 0..{count - 1}")
        rows = list(range(len(targets)))
        listed = [tuple(sorted(set(targets.classes_of(r).tolist()))) for r in rows] if sets else targets.tolist()
        read[name] = Split(
            _Row(encoded_images(splits[stored], image)), rows, listed, [f"{stored} row {r}" for r in rows]
        )
    val, test = read.get("validation"), read.get("test")
    if test is None:
        val, test = None, val  # its validation split is the test set, and validation is held out, as data=hf does
    classes = class_names(splits, label)
    return Source("Hugging Face dataset", classes, count, read["train"], val, test, is_multilabel(splits, label))


@dataclass(frozen=True)
class _Row:
    """A row's encoded image: its bytes, or the bytes of the file it names."""

    images: Any  # the split's image column, undecoded

    def __call__(self, row: int) -> bytes:
        value = self.images[row][self.images.column_names[0]]
        if value is None:
            return b""  # judged bad like an empty file
        return value["bytes"] if value["bytes"] is not None else _file(value["path"])


def open_source(
    src: str,
    kind: str = "auto",
    image_column: str | None = None,
    label_column: str | None = None,
    labels: str | None = None,
    held_out: tuple[float, int] = (0.05, 0),
    unlabeled: str = "error",
) -> Source:
    """SRC as `kind` (image folder, hf, cifar10, cifar100), or for 'auto' as its layout says; an image folder with a
    label file (`labels`: its test split held out by `held_out`, the fraction and seed, where the file names none;
    `unlabeled`: what becomes of an image it does not name), whatever its layout."""
    from vit.data.encoded.hf_source import HUB_NAME  # datasets is imported by the writes that read one

    path = Path(src).expanduser()
    if labels is not None:
        if kind not in ("auto", "imagefolder"):
            raise DataError(f"a label file labels an image folder, not a source of kind {kind!r}")
        if unlabeled not in UNLABELED:
            raise DataError(f"unlabeled={unlabeled!r}: give one of {', '.join(UNLABELED)}")
        return label_file(path, labels, *held_out, unlabeled)
    if kind == "auto" and not path.exists() and not HUB_NAME.fullmatch(src):  # else named as hf's data.root
        raise FileNotFoundError(f"{src} does not exist (nor is it a Hugging Face hub name)")
    if kind == "auto":
        folder = next((f for f in CIFAR_FOLDERS if (path / f).is_dir()), None)
        if folder is None and path.name in CIFAR_FOLDERS:
            folder, path = path.name, path.parent
        # a save_to_disk DatasetDict has train/ too, holding its state.json
        folder_layout = (path / "train").is_dir() and not (path / "train" / "state.json").is_file()
        kind = CIFAR_FOLDERS[folder] if folder else "imagefolder" if folder_layout else "hf"
    if kind in ("cifar10", "cifar100"):
        return cifar(path, kind)
    if kind == "imagefolder":
        if not path.is_dir():
            raise FileNotFoundError(f"image folder not found: {src} does not exist")
        return image_folder(path)
    if kind == "hf":
        return hf_dataset(src, image_column, label_column)
    raise DataError(f"source kind {kind!r}: give auto, imagefolder, hf, cifar10 or cifar100")
