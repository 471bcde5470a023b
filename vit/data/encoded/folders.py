"""An image folder's layout, read without opening an image: its split folders (root/train/, root/val/) and
its classes (the sub-folders of a split). Light, so that the config can count the classes when it resolves."""

from __future__ import annotations

import os
from pathlib import Path

from vit.data.errors import DataError


def split_folder(root: Path, split: str) -> Path:
    """root/split, or an error naming data.root, and the folder below it that holds the split, if one does."""
    path = root / split
    if path.is_dir():
        return path
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: data.root={root} does not exist")
    nested = sorted(p.parent for p in root.glob(f"*/{split}") if p.is_dir())
    hint = f"; did you mean data.root={nested[0]}?" if nested else ""
    raise FileNotFoundError(
        f"image folder split not found: {path} (data.root={root} must hold {split}/ with one sub-folder per "
        f"class){hint}"
    )


def class_folders(folder: Path) -> list[str]:
    """The class names: the folder's sub-folders, sorted, as torchvision's ImageFolder finds them but with hidden
    ones (.git/) left out. None is an error: a model of no classes would only fail later."""
    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DataError(f"{folder} holds no class folders: an image folder has one sub-folder of images per class")
    return classes


def count_classes(root: str, train_dir: str, labels: str | None = None) -> int:
    """The number of classes of an image folder, read from it (or from its label file, data.labels):
    data.num_classes and the model's follow it."""
    if labels is not None:
        from vit.data.encoded.label_files import count_label_classes  # imported by the runs that have one

        return count_label_classes(labels)
    return len(class_folders(split_folder(Path(root), train_dir)))
