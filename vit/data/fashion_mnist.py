"""Fashion-MNIST (Xiao et al. 2017): 70k 28x28 grayscale images of 10 kinds of clothing."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import torch
from torch import Tensor
from torchvision.datasets import FashionMNIST

from vit.atomic import write_atomically
from vit.data.memory import InMemoryDataModule

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's package dataset-fashion-mnist


class FashionMNISTDataModule(InMemoryDataModule):
    """Looks for the data under `root` (torchvision's layout), then in Debian's package, then downloads it
    through torchvision when `download` is on and the machine is online."""

    name = "Fashion-MNIST"
    mean, std = (0.2860,), (0.3530,)  # over the 60k training images
    classes = FashionMNIST.classes

    def fetch(self) -> None:
        root = Path(self.root)
        if not _present(root):
            _unpack_debian(root)
        if not _present(root):
            self._open(train=True)  # downloads, or says how to get the data

    def load(self, train: bool) -> tuple[Tensor, Tensor]:
        self.fetch()
        dataset = self._open(train)
        return dataset.data[:, None].contiguous(), dataset.targets.to(torch.int64)  # (N, 1, 28, 28) uint8, (N,)

    def _open(self, train: bool) -> FashionMNIST:
        root = Path(self.root)
        download = self.download and not _present(root)
        try:
            return FashionMNIST(str(root), train=train, download=download)
        except Exception as err:
            tried = f"the download failed ({err.__class__.__name__}: {err})" if download else "data.download=false"
            raise FileNotFoundError(
                f"Fashion-MNIST not found: looked in {root / 'FashionMNIST' / 'raw'} (torchvision's layout) and "
                f"{DEBIAN_DIR} (Debian's package), and {tried}. "
                f"Install it with `apt-get install dataset-fashion-mnist`, or put the four idx files in "
                f"{root / 'FashionMNIST' / 'raw'}, or set data.root to a folder that holds them."
            ) from err


def _raw_dir(root: Path) -> Path:
    return root / "FashionMNIST" / "raw"


def _present(root: Path) -> bool:
    names = [Path(name).stem for name, _ in FashionMNIST.resources]  # the unpacked idx files
    return all((_raw_dir(root) / name).is_file() for name in names)


def _unpack_debian(root: Path) -> None:
    """Unpack Debian's gzipped idx files into torchvision's layout, atomically per file: runs started side by
    side (a sweep's jobs, two users) may unpack at once, each into a temporary file of its own."""
    sources = [DEBIAN_DIR / name for name, _ in FashionMNIST.resources]
    if not all(path.is_file() for path in sources):
        return
    raw = _raw_dir(root)
    raw.mkdir(parents=True, exist_ok=True)
    for source in sources:
        target = raw / source.stem
        if target.is_file():
            continue
        write_atomically(target, lambda partial, source=source: _gunzip(source, partial))


def _gunzip(source: Path, out: Path) -> None:
    with gzip.open(source, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
