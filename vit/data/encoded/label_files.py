"""Labels from a file beside the images (data=imagefolder data.labels=FILE), as real datasets bring them: one row per
image, read from CSV, TSV, JSON Lines or Parquet (by the file's extension).

- `image`: the image's path relative to data.root. An absolute path, or one that leads out of data.root (`../x.jpg`),
  is refused naming its row: the file would otherwise reach anywhere on the machine.
- `label` (one class name per image) or `labels` (several: the data module then hands over multi-hot targets). In JSON
  Lines and Parquet `labels` is a list; in CSV and TSV it is one cell whose separator is read from the whole column:
  `;` if any cell holds one, else `|` if any holds one, else whitespace. An image with no labels (an empty cell or
  list) is a negative of every class; in a `label` file an empty cell is an error.
- `split` (optional): train, val or test. Without it, or where it names no test rows, see `split_rows`.
- Other columns are ignored. Class names are the file's, sorted (numerically where every name is a whole number,
  so that labels 0..99 keep their order), and their index is the label.

Every fault is one DataError naming the file and the line (CSV, TSV, JSON Lines) or row (Parquet): text that is not
UTF-8, a missing column, an empty image or label cell, an unknown split, two rows naming one image with other labels
or splits (the same labels twice are read once, and counted in the log). The images the rows name are checked against
data.root by `check_images`: a missing one is an error; an image under data.root that no row names is an error too,
naming how many and the first, unless data.unlabeled=skip (then they are counted in the log). Nothing is dropped
unsaid.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from vit.data.encoded.held_out import hold_out
from vit.data.errors import DataError

log = logging.getLogger(__name__)

FORMATS = {".csv": "CSV", ".tsv": "TSV", ".jsonl": "JSON Lines", ".parquet": "Parquet"}
SPLITS = ("train", "val", "test")
SEPARATORS = (";", "|")  # of a CSV or TSV labels cell, the first any cell of the column holds; else whitespace
UNLABELED = ("error", "skip")  # data.unlabeled: what becomes of an image under data.root that no row names
LISTED = 5  # names given in a message; the rest are counted


@dataclass(frozen=True)
class LabelFile:
    """A label file read and checked: one entry per image, in the order of the file's first row for it."""

    path: Path
    images: list[str]  # relative to data.root, normalised (a/./b.jpg as a/b.jpg)
    labels: list[tuple[int, ...]]  # class indices, one for a `label` file
    splits: list[str] | None  # each image's, where the file has a split column
    places: list[str]  # 'line 7' or 'row 7': where each image's row is, for messages
    classes: list[str]
    multilabel: bool  # the file has a `labels` column: several labels an image

    def where(self, k: int) -> str:
        return f"{self.path} {self.places[k]}"


def read_label_file(path: str | Path) -> LabelFile:
    """The label file at `path` (see the module's docstring), read once per version of the file: the config counts
    its classes as it resolves, then the data module reads it again."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"label file not found: data.labels={path}")
    if path.suffix.lower() not in FORMATS:
        raise DataError(
            f"data.labels={path}: a label file is {', '.join(FORMATS)} (by its extension), not '{path.suffix}'"
        )
    stat = path.stat()
    return _read(path.resolve(), stat.st_size, stat.st_mtime_ns)


def count_label_classes(path: str) -> int:
    """The number of classes a label file names: data.num_classes and the model's follow it."""
    return len(read_label_file(path).classes)


@functools.lru_cache(maxsize=4)
def _read(path: Path, size: int, mtime_ns: int) -> LabelFile:
    suffix = path.suffix.lower()
    columns, places = _parquet(path) if suffix == ".parquet" else _text(path, suffix)
    if "image" not in columns:
        raise DataError(f"{path} has no column 'image' (each image's path under data.root); columns: {list(columns)}")
    kinds = [name for name in ("label", "labels") if name in columns]
    if len(kinds) != 1:
        has = "both 'label' and 'labels'" if kinds else "no column 'label' (one class) or 'labels' (several)"
        raise DataError(f"{path} has {has}; its columns: {list(columns)}")
    multilabel = kinds == ["labels"]
    name_sets = _label_sets(path, columns[kinds[0]], places, multilabel, suffix in (".csv", ".tsv"))
    splits = _splits(path, columns["split"], places) if "split" in columns else None
    images = [_relative(path, value, place) for value, place in zip(columns["image"], places, strict=True)]
    return _once_each(path, images, name_sets, splits, places, multilabel)


def _text(path: Path, suffix: str) -> tuple[dict[str, list[Any]], list[str]]:
    """The columns of a CSV, TSV or JSON Lines file, and each row's line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark, as spreadsheets write, is not part of the header
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(
            f"{path} line {line}: not UTF-8 text (byte {data[err.start]:#04x}); save the file as UTF-8"
        ) from None
    rows = _jsonl_rows(path, text) if suffix == ".jsonl" else _csv_rows(path, text, "\t" if suffix == ".tsv" else ",")
    columns: dict[str, list[Any]] = {}
    places = []
    for k, (place, row) in enumerate(rows):
        for name in [name for name in row if name not in columns]:
            columns[name] = [None] * k  # a key the earlier rows lacked: empty there
        for name, values in columns.items():
            values.append(row.get(name))
        places.append(place)
    if not places:
        raise DataError(f"{path} has no rows of images")
    return columns, places


def _csv_rows(path: Path, text: str, delimiter: str) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = [name.strip() for name in next(reader, [])]
    for row in reader:
        if not any(cell.strip() for cell in row):  # a blank line
            continue
        if len(row) != len(header):
            raise DataError(
                f"{path} line {reader.line_num}: {len(row)} cells, but the header names {len(header)} columns "
                f"({', '.join(header)})"
            )
        yield f"line {reader.line_num}", dict(zip(header, row, strict=True))


def _jsonl_rows(path: Path, text: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path} line {number}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number}: a JSON {type(row).__name__}, not an object of columns")
        yield f"line {number}", row


def _parquet(path: Path) -> tuple[dict[str, list[Any]], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        try:
            column.validate(full=True)  # a string column's bytes are UTF-8 (Parquet writers do not all check)
        except pa.ArrowInvalid:
            row = next(k for k, value in enumerate(column.cast(pa.binary()).to_pylist()) if _not_utf8(value))
            raise DataError(f"{path} row {row + 1}: column '{name}' is not UTF-8 text") from None
        columns[name] = column.to_pylist()
    if not table.num_rows:
        raise DataError(f"{path} has no rows of images")
    return columns, [f"row {k + 1}" for k in range(table.num_rows)]


def _not_utf8(value: bytes | None) -> bool:
    try:
        (value or b"").decode()
    except UnicodeDecodeError:
        return True
    return False


def _name(value: Any, path: Path, place: str, column: str) -> str:
    """A class name as the file writes it (a number is its digits); anything else is refused naming the row."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(f"{path} {place}: {column} holds {value!r}, not a class name")
    return str(value).strip()


def _label_sets(path: Path, cells: list[Any], places: list[str], multilabel: bool, text: bool) -> list[tuple[str, ...]]:
    """Each row's class names: a `label` cell's one, or a `labels` list, or a `labels` cell split by the column's
    separator (SEPARATORS)."""
    if not multilabel:
        names = [
            "" if cell is None else _name(cell, path, place, "label") for cell, place in zip(cells, places, strict=True)
        ]
        if (empty := next((k for k, name in enumerate(names) if not name), None)) is not None:
            raise DataError(
                f"{path} {places[empty]}: an empty label cell ({names.count('')} such row(s)); every row of a 'label' "
                f"file names its class (a file of several labels an image has a 'labels' column)"
            )
        return [(name,) for name in names]
    if text:
        separator = next((s for s in SEPARATORS if any(s in (cell or "") for cell in cells)), None)
        return [tuple(n.strip() for n in (cell or "").split(separator) if n.strip()) for cell in cells]
    sets = []
    for cell, place in zip(cells, places, strict=True):
        if cell is not None and not isinstance(cell, list):
            raise DataError(f"{path} {place}: labels holds {cell!r}, not a list of class names")
        sets.append(tuple(name for value in cell or [] if (name := _name(value, path, place, "labels"))))
    return sets


def _splits(path: Path, cells: list[Any], places: list[str]) -> list[str]:
    for cell, place in zip(cells, places, strict=True):
        if cell not in SPLITS:
            raise DataError(f"{path} {place}: split {cell!r} is not one of {', '.join(SPLITS)}")
    return cells


def _relative(path: Path, value: Any, place: str) -> str:
    """The image's path, normalised, within data.root."""
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{path} {place}: no image path (image={value!r})")
    if os.path.isabs(value):
        raise DataError(f"{path} {place}: image {value!r} is an absolute path; give it relative to data.root")
    normal = os.path.normpath(value)
    if normal == os.pardir or normal.startswith(os.pardir + os.sep) or normal == os.curdir:
        raise DataError(f"{path} {place}: image {value!r} is not a file within data.root")
    return normal


def _sorted_names(names: set[str]) -> list[str]:
    if all(name.isdecimal() for name in names):
        return sorted(names, key=lambda name: (int(name), name))
    return sorted(names)


def _once_each(
    path: Path,
    images: list[str],
    name_sets: list[tuple[str, ...]],
    splits: list[str] | None,
    places: list[str],
    multilabel: bool,
) -> LabelFile:
    """One entry per image: rows repeating an image with the same labels and split are read once (and counted);
    with others they are an error naming both rows."""
    first: dict[str, int] = {}
    repeated = 0
    for k, image in enumerate(images):
        if image not in first:
            first[image] = k
            continue
        j = first[image]
        if set(name_sets[j]) != set(name_sets[k]):
            differ = f"labels {list(name_sets[j])} and {list(name_sets[k])}"
        elif splits is not None and splits[j] != splits[k]:
            differ = f"splits {splits[j]} and {splits[k]}"
        else:
            repeated += 1
            continue
        raise DataError(f"{path} {places[j]} and {places[k]} both name image {image!r}, with {differ}: keep one row")
    if repeated:
        log.info(f"{path}: {repeated} repeated row(s) of an image with the same labels, read once")
    keep = list(first.values())
    classes = _sorted_names({name for k in keep for name in name_sets[k]})
    if not classes:
        raise DataError(f"{path} names no classes")
    index = {name: k for k, name in enumerate(classes)}
    return LabelFile(
        path=path,
        images=[images[k] for k in keep],
        labels=[tuple(sorted({index[name] for name in name_sets[k]})) for k in keep],
        splits=None if splits is None else [splits[k] for k in keep],
        places=[places[k] for k in keep],
        classes=classes,
        multilabel=multilabel,
    )


def image_files(root: Path) -> list[str]:
    """Every image file under root, relative to it, sorted; hidden entries (.git/, .DS_Store) left out at every depth,
    as image folders' scan leaves them out."""
    found = []
    for parent, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [
            os.path.relpath(os.path.join(parent, n), root)
            for n in names
            if not n.startswith(".") and has_file_allowed_extension(n, IMG_EXTENSIONS)
        ]
    return sorted(found)


def check_images(table: LabelFile, root: Path, unlabeled: str) -> None:
    """Every image the file names is a file under root, and every image under root has a row (or, with
    unlabeled='skip', those without one are counted in the log and left out)."""
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: data.root={root} does not exist")
    found = image_files(root)
    present = set(found)
    # a named file the scan passes over (no image extension, a hidden name) is the user's to train on: looked up alone
    missing = [k for k, image in enumerate(table.images) if image not in present and not (root / image).is_file()]
    if missing:
        k = missing[0]
        raise DataError(
            f"{table.where(k)}: image {table.images[k]!r} is not a file under data.root={root} ({len(missing)} "
            f"missing image(s) in all)"
        )
    named = set(table.images)
    others = [image for image in found if image not in named]
    if not others:
        return
    first = ", ".join(others[:LISTED]) + (", ..." if len(others) > LISTED else "")
    if unlabeled == "error":
        raise DataError(
            f"{len(others)} image(s) under data.root={root} have no row in {table.path} ({first}): add their rows, "
            f"or set data.unlabeled=skip to leave them out"
        )
    log.info(f"leaving out {len(others)} image(s) under data.root={root} without a row in {table.path} ({first})")


def split_rows(table: LabelFile, fraction: float, seed: int) -> dict[str, list[int]]:
    """The file's positions by split. The file's `split` column says, where it has one; as data=hf does, where the
    file names no test rows its val rows are the test set. Where it names neither (or has no split column), the test
    set is held out of the training rows first: `fraction` of them (data.val_fraction), drawn from `seed` (held_out.py)
    over the file's rows, so that it follows from the file alone. 'val' is left empty where the file names none: the
    data module then holds validation out of the usable training images, as it does for class folders."""
    splits = table.splits or ["train"] * len(table.images)
    rows = {name: [k for k, split in enumerate(splits) if split == name] for name in SPLITS}
    if not rows["test"]:
        rows["test"], rows["val"] = rows["val"], []
    if not rows["train"]:
        raise DataError(f"{table.path} names no training images (split train)")
    if not rows["test"]:
        kept, held = hold_out(len(rows["train"]), fraction, seed)
        rows["test"] = sorted(rows["train"][k] for k in held)
        rows["train"] = sorted(rows["train"][k] for k in kept)
    return rows
