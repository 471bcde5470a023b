"""What a Hugging Face `datasets` dataset holds, read without decoding an image: its splits, its image and label
columns, its classes. Light (no Lightning), so that the config can count the classes as it resolves.

data.root is, in the order tried: a folder written by `save_to_disk` (a Dataset or a DatasetDict), any other
folder or file `load_dataset` reads (parquet or arrow files, the splits named by their file names: train.parquet,
data/test-00000-of-00001.parquet), or a hub name such as `owner/name`, fetched only when online.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Image, LargeList, List, Value, load_dataset, load_from_disk

from vit.data.encoded.targets import LabelSets
from vit.data.errors import DataError

IMAGE_COLUMNS = ("image", "img")  # tried in this order when data.image_column is null
LABEL_COLUMNS = ("label", "labels")  # likewise for data.label_column
SAVED = ("dataset_dict.json", "state.json")  # save_to_disk writes one: a DatasetDict's, or a Dataset's
FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow"}  # a single file as data.root: its split 'train'
HUB_NAME = re.compile(r"\w[\w.-]*(/\w[\w.-]*)?")  # 'cifar10', 'owner/name'; a missing path of another form is an error
ENCODED = ("binary", "large_binary", "string", "large_string")  # image columns stored as bytes or file paths
STORED_IMAGE = {"bytes", "path"}  # the fields of an Image column's storage: parquet written without datasets keeps them
UNLABELLED = -1  # the label of rows without one (ImageNet-1k's test split on the hub)
# each split's other names, as datasets reads them in file names (datasets.data_files.SPLIT_KEYWORDS); a folder
# written by save_to_disk keeps whichever name it was given
SPLIT_NAMES = (("train", "training"), ("validation", "valid", "dev", "val"), ("test", "testing", "eval", "evaluation"))


def open_dataset(root: str, cache_dir: str | None = None) -> dict[str, Dataset]:
    """The splits at data.root by name; a single Dataset is the split 'train'. `cache_dir`: where `load_dataset`
    keeps what it converts to arrow (parquet files, downloads); None is datasets' own (HF_DATASETS_CACHE)."""
    path = Path(root).expanduser()
    if not path.exists() and not HUB_NAME.fullmatch(root):
        raise FileNotFoundError(f"Hugging Face dataset not found: data.root={root} does not exist")
    saved = path.is_dir() and any((path / name).is_file() for name in SAVED)
    empty = _empty_saved_splits(path) if saved else []
    if empty:
        raise DataError(f"split '{empty[0]}' of data.root={root} has no rows")
    try:
        if saved:
            opened = load_from_disk(str(path))
        elif path.is_file() and path.suffix in FILE_BUILDERS:
            opened = load_dataset(FILE_BUILDERS[path.suffix], data_files={"train": str(path)}, cache_dir=cache_dir)
        else:
            opened = load_dataset(str(path) if path.exists() else root, cache_dir=cache_dir)
    except Exception as err:  # whatever datasets raises for files it cannot read, or a hub it cannot reach
        what = (
            "datasets cannot read it" if path.exists() else "no such folder, and the Hugging Face hub did not give it"
        )
        reason = (str(err).splitlines() or [""])[0]
        raise DataError(f"data.root={root}: {what} ({err.__class__.__name__}: {reason})") from err
    return dict(opened) if isinstance(opened, DatasetDict) else {"train": opened}


def _empty_saved_splits(path: Path) -> list[str]:
    """The splits of a save_to_disk folder that hold no rows: it writes no file for them, and load_from_disk then
    fails with an IndexError."""
    states = [path / "state.json"] if (path / "state.json").is_file() else sorted(path.glob("*/state.json"))
    names = ["train" if state.parent == path else state.parent.name for state in states]
    return [name for name, state in zip(names, states, strict=True) if not _data_files(state)]


def _data_files(state: Path) -> list:
    """The arrow files a split's state.json lists; a file cut short or not save_to_disk's is a DataError naming it."""
    try:
        files = json.loads(state.read_text())["_data_files"]
        if not isinstance(files, list):
            raise TypeError(f"_data_files is {type(files).__name__}, not a list")
    except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = f"no key {err}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise DataError(
            f"{state}: not a readable save_to_disk state file ({reason}); write the dataset again with save_to_disk"
        ) from None
    return files


def split_named(splits: dict[str, Dataset], name: str) -> str:
    """`name`, or where the dataset has no such split, its first other name that it has ('valid' for 'validation'):
    else a dataset's own validation split named otherwise would go unused, and rows held out of training replace it."""
    if name in splits:
        return name
    others = next((names for names in SPLIT_NAMES if name in names), ())
    return next((other for other in others if other in splits), name)


def pick_column(splits: dict[str, Dataset], key: str, given: str | None, defaults: tuple[str, ...]) -> str:
    """The column data.`key` names, or else the first of `defaults` that every split has; an error names the split
    that lacks it and lists the columns it has."""
    candidates = (given,) if given else defaults
    for name in candidates:
        if all(name in split.column_names for split in splits.values()):
            return name
    where = next((n for n, s in splits.items() if not set(candidates) & set(s.column_names)), next(iter(splits)))
    wanted = " or ".join(f"'{name}'" for name in candidates)
    raise DataError(
        f"split '{where}' of the dataset has no {key.removesuffix('_column')} column {wanted}; its columns: "
        f"{splits[where].column_names}. Name it with data.{key}=..."
    )


def label_column(splits: dict[str, Dataset], given: str | None, train: str | None = None) -> str:
    """The column of labels (pick_column) among the splits that have one: a split with none (a test split without
    labels) is unlabelled, as one whose every label is UNLABELLED is; the training split `train` must have it."""
    candidates = (given,) if given else LABEL_COLUMNS
    labelled = {name: split for name, split in splits.items() if set(candidates) & set(split.column_names)}
    if train in splits and train not in labelled:
        labelled = {train: splits[train]}  # for the error naming it
    return pick_column(labelled or splits, "label_column", given, LABEL_COLUMNS)


def image_column(splits: dict[str, Dataset], given: str | None) -> str:
    """The column of images (Image, encoded bytes, file paths, or {'bytes', 'path'} records), checked in every
    split."""
    column = pick_column(splits, "image_column", given, IMAGE_COLUMNS)
    for name, split in splits.items():
        feature = split.features[column]
        encoded = isinstance(feature, Value) and feature.dtype in ENCODED
        stored = isinstance(feature, dict) and set(feature) == STORED_IMAGE  # Image(decode=False) casts it as it is
        if not (isinstance(feature, Image) or encoded or stored):
            raise DataError(
                f"column '{column}' of split '{name}' holds {feature}, not images (Image, encoded bytes, file paths or "
                f"{{'bytes', 'path'}} records): name the image column with data.image_column=..."
            )
    return column


def encoded_images(split: Dataset, column: str) -> Dataset:
    """The split's image column alone and undecoded: each row's {'bytes': ..., 'path': ...}, however it is stored."""
    return split.select_columns([column]).cast_column(column, Image(decode=False))


def _indices(feature: Any) -> bool:
    """Whether a feature holds class indices: a ClassLabel, or integers (signed or not: uint8 is common)."""
    return isinstance(feature, ClassLabel) or (isinstance(feature, Value) and feature.dtype.startswith(("int", "uint")))


def _sets(feature: Any) -> bool:
    """Whether a feature holds a set of class indices per row (Sequence(ClassLabel), a list of integers)."""
    return isinstance(feature, (List, LargeList)) and _indices(feature.feature)


def _class_label(feature: Any) -> ClassLabel | None:
    """The ClassLabel that names a label column's classes: the column's own, or that of its sequences."""
    return feature.feature if _sets(feature) and isinstance(feature.feature, ClassLabel) else feature


def is_multilabel(splits: dict[str, Dataset], column: str) -> bool:
    """Whether the label column holds several labels a row (a Sequence(ClassLabel) or a list of integers)."""
    return any(_sets(split.features.get(column)) for split in splits.values())


def labels(split: Dataset, column: str) -> np.ndarray | LabelSets:
    """The split's labels as integers, or where the column holds several a row as LabelSets (`num_classes` left 0:
    the caller's count); a column of anything else is an error naming it. A split without the column has none:
    every row UNLABELLED."""
    if column not in split.column_names:
        return np.full(len(split), UNLABELLED, dtype=np.int64)
    feature = split.features[column]
    if _sets(feature):  # a missing list is a row of no labels: a negative of every class
        return LabelSets.of([row or () for row in split[column]], 0)
    if not _indices(feature):
        raise DataError(
            f"label column '{column}' holds {feature}, not class indices (ClassLabel or integers, or a Sequence of "
            f"them for several labels a row)"
        )
    return np.asarray(split[column], dtype=np.int64)


def outside(targets: np.ndarray | LabelSets, count: int) -> np.ndarray:
    """The rows holding a label outside 0..count-1, in order."""
    if isinstance(targets, LabelSets):
        bad = np.flatnonzero((targets.indices < 0) | (targets.indices >= count))
        return np.unique(np.searchsorted(targets.offsets, bad, side="right") - 1)
    return np.flatnonzero((targets < 0) | (targets >= count))


def class_names(splits: dict[str, Dataset], column: str) -> list[str] | None:
    """The names of the label column's classes in label order, where it is a ClassLabel (or a Sequence of one).
    Splits that have one must name the same classes in the same order: else a label would mean one class in
    training and another in testing."""
    named = {
        name: list(f.names)
        for name, s in splits.items()
        if isinstance(f := _class_label(s.features.get(column)), ClassLabel)
    }
    if not named:
        return None
    (first, names), *others = named.items()
    for name, theirs in others:
        if theirs != names:
            raise DataError(
                f"splits '{first}' and '{name}' name the classes of label column '{column}' differently ({len(names)} "
                f"classes from {names[:3]}, {len(theirs)} from {theirs[:3]}): one label would mean two classes"
            )
    return names


def class_count(splits: dict[str, Dataset], column: str) -> int:
    """The ClassLabel's number of names, or for plain integer labels the largest in any split, plus one."""
    names = class_names(splits, column)
    if names is not None:
        return len(names)
    found = [flat for s in splits.values() if len(flat := _flat(labels(s, column)))]
    largest = max((int(flat.max()) for flat in found), default=UNLABELLED)
    if largest == UNLABELLED:
        raise DataError(f"the dataset has no labelled rows (label column '{column}', splits {list(splits)})")
    return largest + 1


def _flat(targets: np.ndarray | LabelSets) -> np.ndarray:
    return targets.indices if isinstance(targets, LabelSets) else targets


def count_classes(root: str, given: str | None, cache_dir: str | None = None) -> int:
    """The number of classes of the dataset at data.root (`given`: data.label_column): data.num_classes and the
    model's follow it."""
    splits = open_dataset(root, cache_dir)
    return class_count(splits, label_column(splits, given))
