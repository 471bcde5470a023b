"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009): 60k 32x32 RGB images, in torchvision's on-disk format."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import CIFAR10, CIFAR100

from vit.data.errors import DataError
from vit.data.memory.base import InMemoryDataModule


class CIFAR10DataModule(InMemoryDataModule):
    """Reads `root`/cifar-10-batches-py (the python-pickle batches torchvision downloads and verifies)."""

    name = "CIFAR-10"
    class_count = 10
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    dataset_class = CIFAR10
    label_key = "labels"

    def _files(self, train: bool) -> list[Path]:
        cls = self.dataset_class
        return [Path(self.root) / cls.base_folder / name for name, _ in (cls.train_list if train else cls.test_list)]

    @property
    def classes(self) -> list[str] | None:
        """Names from the dataset's meta file (absent from the small files tests write)."""
        meta = Path(self.root) / self.dataset_class.base_folder / self.dataset_class.meta["filename"]
        if not meta.is_file():
            return None
        try:
            return [str(name) for name in _unpickle(meta)[self.dataset_class.meta["key"]]]
        except (KeyError, TypeError) as err:
            raise DataError(f"{meta} is not a CIFAR meta file (no list of names under {err})") from None

    def fetch(self) -> None:
        files = self._files(train=True) + self._files(train=False)
        if all(f.is_file() for f in files):
            return
        if not self.download:
            raise FileNotFoundError(_missing(self.name, files))
        try:
            self.dataset_class(self.root, train=True, download=True)  # fetches and checks the archive's md5
        except Exception as err:
            raise FileNotFoundError(f"{_missing(self.name, files)}; download failed: {err}") from err

    def load(self, train: bool) -> tuple[Tensor, Tensor]:
        self.fetch()
        files = self._files(train)
        images, labels = zip(*(_read_batch(f, self.label_key) for f in files), strict=True)
        images = torch.from_numpy(np.concatenate(images)).reshape(-1, 3, 32, 32)  # rows are [R | G | B] planes
        return images, torch.from_numpy(np.concatenate(labels)).to(torch.int64)


class CIFAR100DataModule(CIFAR10DataModule):
    """Reads `root`/cifar-100-python; labels are the 100 fine classes."""

    name = "CIFAR-100"
    class_count = 100  # the fine labels
    mean, std = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    dataset_class = CIFAR100
    label_key = "fine_labels"


def _missing(name: str, files: list[Path]) -> str:
    folder = files[0].parent
    absent = ", ".join(f.name for f in files if not f.is_file())
    return (
        f"{name} not found in {folder} (missing {absent}); set data.root to the folder that holds "
        f"{folder.name}/, or enable data.download on a machine that is online"
    )


# The only globals a CIFAR file's pickle needs: numpy's constructors of arrays, dtypes and scalars (by the names
# numpy 1 and 2 pickle them under) and the bytes of a Python 3 protocol-2 pickle. Anything else, e.g. os.system,
# is refused before it can run.
_NUMPY_GLOBALS = {
    (module, name)
    for package in ("numpy.core", "numpy._core")
    for module, name in (
        (f"{package}.multiarray", "_reconstruct"),
        (f"{package}.multiarray", "scalar"),
        (f"{package}.numeric", "_frombuffer"),
    )
} | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _ArraysOnly(pickle.Unpickler):
    """An unpickler that builds plain containers and numpy arrays only: nothing in a data file runs."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _NUMPY_GLOBALS:
            raise pickle.UnpicklingError(f"refused: it asks for {module}.{name}, which could run code")
        return super().find_class(module, name)


def _unpickle(path: Path) -> dict:
    """A CIFAR file (a pickled dict, written by Python 2) without running anything it names; ValueError names it."""
    try:
        with open(path, "rb") as f:
            entry = _ArraysOnly(f, encoding="latin1").load()
    except Exception as err:
        raise DataError(f"{path} is not a CIFAR batch file ({err.__class__.__name__}: {err})") from None
    if not isinstance(entry, dict):
        raise DataError(f"{path} is not a CIFAR batch file (it holds a {type(entry).__name__}, not a dict)")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}


def _read_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file of torchvision's CIFAR format: a pickled dict with 'data' (N, 3072) uint8 and labels (N,)."""
    entry = _unpickle(path)
    missing = [key for key in ("data", label_key) if key not in entry]
    if missing:
        raise DataError(f"{path} is not a CIFAR batch file (no {', '.join(missing)} entry)")
    data, labels = np.asarray(entry["data"]), np.asarray(entry[label_key])
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.dtype != np.uint8:
        raise DataError(f"{path}: 'data' is {data.dtype} {tuple(data.shape)}; CIFAR rows are uint8 (N, 3072)")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: {len(data)} images but '{label_key}' holds {labels.dtype} {tuple(labels.shape)}")
    return data, labels
