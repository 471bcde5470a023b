"""Fashion-MNIST (Xiao et al. 2017): 70k 28x28 grayscale images of 10 kinds of clothing."""

from __future__ import annotations

import gzip
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from torchvision.datasets import FashionMNIST
from torchvision.datasets.mnist import read_image_file, read_label_file

from vit.atomic import write_atomically
from vit.data.errors import DataError
from vit.data.memory.base import InMemoryDataModule

log = logging.getLogger(__name__)

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's package dataset-fashion-mnist


class FashionMNISTDataModule(InMemoryDataModule):
    """Looks for the data under `root` (torchvision's layout), then in Debian's package, then downloads it
    through torchvision when `download` is on and the machine is online."""

    name = "Fashion-MNIST"
    mean, std = (0.2860,), (0.3530,)  # over the 60k training images
    classes = FashionMNIST.classes
    class_count = len(classes)

    def fetch(self) -> None:
        root = Path(self.root)
        if _present(root):
            log.info("Fashion-MNIST: reading %s", _raw_dir(root))
            return
        if _unpack_debian(root):
            log.info("Fashion-MNIST: not in %s; unpacked Debian's copy (%s) there", _raw_dir(root), DEBIAN_DIR)
            return
        if not self.download:
            raise FileNotFoundError(_missing(root, "data.download=false"))
        try:
            FashionMNIST(str(root), train=True, download=True)  # fetches and checks the archives' md5
        except Exception as err:
            raise FileNotFoundError(_missing(root, f"the download failed ({err.__class__.__name__}: {err})")) from err

    def load(self, train: bool) -> tuple[Tensor, Tensor]:
        self.fetch()
        raw, split = _raw_dir(Path(self.root)), "train" if train else "t10k"  # torchvision's file names
        images = _read(raw / f"{split}-images-idx3-ubyte", read_image_file)  # (N, 28, 28) uint8
        labels = _read(raw / f"{split}-labels-idx1-ubyte", read_label_file)  # (N,)
        return images[:, None].contiguous(), labels.to(torch.int64)  # (N, 1, 28, 28) uint8, (N,)


def _missing(root: Path, tried: str) -> str:
    return (
        f"Fashion-MNIST not found: looked in {_raw_dir(root)} (torchvision's layout) and {DEBIAN_DIR} (Debian's "
        f"package), and {tried}. Install it with `apt-get install dataset-fashion-mnist`, or put the four idx "
        f"files in {_raw_dir(root)}, or set data.root to a folder that holds them."
    )


def _read(path: Path, reader: Callable[[str], Tensor]) -> Tensor:
    """One idx file, read by torchvision's reader (the one FashionMNIST uses), or an error naming it."""
    try:
        return reader(str(path))
    except Exception as err:
        raise DataError(
            f"{path} is not a readable Fashion-MNIST idx file ({err.__class__.__name__}: {err}); truncated or "
            f"corrupt? Delete it to have it unpacked from Debian's package or downloaded again"
        ) from err


def _raw_dir(root: Path) -> Path:
    return root / "FashionMNIST" / "raw"


def _present(root: Path) -> bool:
    names = [Path(name).stem for name, _ in FashionMNIST.resources]  # the unpacked idx files
    return all((_raw_dir(root) / name).is_file() for name in names)


def _unpack_debian(root: Path) -> bool:
    """Unpack Debian's gzipped idx files into torchvision's layout, atomically per file: runs started side by
    side (a sweep's jobs, two users) may unpack at once, each into a temporary file of its own."""
    sources = [DEBIAN_DIR / name for name, _ in FashionMNIST.resources]
    if not all(path.is_file() for path in sources):
        return False
    raw = _raw_dir(root)
    _make_folder(raw)
    for source in sources:
        target = raw / source.stem
        if target.is_file():
            continue
        write_atomically(target, lambda partial, source=source: _gunzip(source, partial))
    return True


def _make_folder(raw: Path) -> None:
    """raw and its parents, or one line naming what stops it: a link to nowhere (a data/ link left by another
    checkout), a file in the way, no permission."""
    try:
        raw.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        broken = next((p for p in (raw, *raw.parents) if p.is_symlink() and not p.exists()), None)
        why = f"{broken} links to {os.readlink(broken)}, which does not exist" if broken else err.strerror
        raise DataError(
            f"cannot unpack Fashion-MNIST into {raw}: {why}; set data.root to a folder it may write"
        ) from None


def _gunzip(source: Path, out: Path) -> None:
    with gzip.open(source, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
