"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009): 60k 32x32 RGB images, in torchvision's on-disk format."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision.datasets import CIFAR10, CIFAR100

from vit.data.memory import InMemoryDataModule


class CIFAR10DataModule(InMemoryDataModule):
    """Reads `root`/cifar-10-batches-py (the python-pickle batches torchvision downloads and verifies)."""

    name = "CIFAR-10"
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
        with open(meta, "rb") as f:
            return list(pickle.load(f, encoding="latin1")[self.dataset_class.meta["key"]])

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


def _read_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file of torchvision's CIFAR format: a pickled dict with b'data' (N, 3072) uint8 and labels."""
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")  # the format is a pickle; torchvision reads it the same way
        return np.asarray(entry["data"], dtype=np.uint8), np.asarray(entry[label_key])
    except Exception as err:
        raise ValueError(f"{path} is not a CIFAR batch file ({err.__class__.__name__}: {err})") from err
