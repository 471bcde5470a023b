import gzip
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.datasets import FashionMNIST

from vit.data.errors import DataError
from vit.data.memory.fashion_mnist import DEBIAN_DIR, FashionMNISTDataModule, _unpack_debian


@pytest.mark.skipif(not DEBIAN_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_loads_debians_files_into_torchvisions_layout(tmp_path):
    dm = FashionMNISTDataModule(root=str(tmp_path), num_classes=10, in_chans=1, img_size=28, download=False)
    images, labels = dm.load(train=True)
    assert images.shape == (60000, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.unique().tolist() == list(range(10)) and (labels.bincount() == 6000).all()
    assert (tmp_path / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (55000, 5000, 10000)
    mean = images.float().mean() / 255
    assert abs(mean.item() - dm.mean[0]) < 1e-3  # the normalisation constants fit the data


@pytest.mark.skipif(not DEBIAN_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_a_log_line_says_which_copy_is_read(tmp_path, caplog):
    caplog.set_level("INFO", logger="vit.data.memory.fashion_mnist")
    dm = FashionMNISTDataModule(root=str(tmp_path), num_classes=10, in_chans=1, img_size=28, download=False)
    dm.fetch()
    raw = tmp_path / "FashionMNIST" / "raw"
    assert caplog.messages == [f"Fashion-MNIST: not in {raw}; unpacked Debian's copy ({DEBIAN_DIR}) there"]
    caplog.clear()
    dm.fetch()
    assert caplog.messages == [f"Fashion-MNIST: reading {raw}"]


def test_absent_everywhere_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr("vit.data.memory.fashion_mnist.DEBIAN_DIR", tmp_path / "nowhere")
    dm = FashionMNISTDataModule(root=str(tmp_path), num_classes=10, in_chans=1, img_size=28, download=False)
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist") as error:
        dm.load(train=True)
    assert "data.download=false" in str(error.value) and "download failed" not in str(error.value)


def fake_debian(folder: Path) -> dict[str, bytes]:
    """Debian's four gzipped files, of random bytes; returns what each unpacks to, by file name."""
    folder.mkdir()
    contents = {}
    for name, _ in FashionMNIST.resources:
        contents[Path(name).stem] = os.urandom(1000) + name.encode()
        with gzip.open(folder / name, "wb") as f:
            f.write(contents[Path(name).stem])
    return contents


@pytest.mark.parametrize("kind", ["a link to nowhere", "a file"])
def test_a_root_that_cannot_hold_the_files_is_named_in_one_line(tmp_path, monkeypatch, kind):
    """A data/ link to a folder that is gone used to end the run in a FileExistsError traceback."""
    monkeypatch.setattr("vit.data.memory.fashion_mnist.DEBIAN_DIR", tmp_path / "debian")
    fake_debian(tmp_path / "debian")
    root = tmp_path / "data"
    if kind == "a file":
        root.write_text("not a folder")
    else:
        root.symlink_to(tmp_path / "gone")
    dm = FashionMNISTDataModule(root=str(root), num_classes=10, in_chans=1, img_size=28, download=False)
    with pytest.raises(DataError, match="cannot unpack Fashion-MNIST into") as error:
        dm.prepare_data()
    why = f"{root} links to {tmp_path / 'gone'}, which does not exist" if kind != "a file" else "Not a directory"
    assert why in str(error.value) and "\n" not in str(error.value)


def write_idx(path: Path, array: np.ndarray) -> None:
    """uint8 data in the idx format of the MNIST files: magic (0, 0, 8 = uint8, dimensions), big-endian sizes."""
    sizes = b"".join(n.to_bytes(4, "big") for n in array.shape)
    path.write_bytes(bytes([0, 0, 8, array.ndim]) + sizes + array.astype(np.uint8).tobytes())


def write_fashion_mnist(raw: Path, train: int = 6, test: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """The four idx files in `raw`, with random images and labels; returns the test split's."""
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("t10k", test)):
        images, labels = rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n)
        write_idx(raw / f"{split}-images-idx3-ubyte", images)
        write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
    return images, labels


def test_reads_the_idx_files_in_torchvisions_layout(tmp_path):
    images, labels = write_fashion_mnist(tmp_path / "FashionMNIST" / "raw")
    dm = FashionMNISTDataModule(root=str(tmp_path), num_classes=10, in_chans=1, img_size=28, download=False)
    read_images, read_labels = dm.load(train=False)
    assert read_images.shape == (4, 1, 28, 28) and read_images.dtype == torch.uint8
    assert read_images[:, 0].tolist() == images.tolist() and read_labels.tolist() == labels.tolist()


def test_a_present_but_truncated_file_is_named_with_the_cause(tmp_path):
    """It used to be reported as 'Fashion-MNIST not found ... data.download=false' though the files are there."""
    raw = tmp_path / "FashionMNIST" / "raw"
    write_fashion_mnist(raw)
    images = raw / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:1000])  # as a full disk leaves it
    dm = FashionMNISTDataModule(root=str(tmp_path), num_classes=10, in_chans=1, img_size=28, download=True)
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte is not a readable Fashion-MNIST idx file") as error:
        dm.load(train=True)
    assert str(images) in str(error.value) and "shape '[6, 28, 28]' is invalid" in str(error.value)
    assert "not found" not in str(error.value)


def test_runs_side_by_side_unpack_debians_files_at_once(tmp_path, monkeypatch):
    """Two runs that start together (a sweep's jobs) used to share one temporary file: one renamed it
    away while the other still wrote it. Both now copy at the same moment and both get whole files."""
    debian = tmp_path / "debian"
    contents = fake_debian(debian)
    monkeypatch.setattr("vit.data.memory.fashion_mnist.DEBIAN_DIR", debian)
    both_copying = threading.Barrier(2, timeout=10)
    copy = shutil.copyfileobj

    def copy_together(src, dst):
        both_copying.wait()  # neither has renamed yet: the moment the old code broke
        copy(src, dst)

    monkeypatch.setattr("vit.data.memory.fashion_mnist.shutil.copyfileobj", copy_together)
    root = tmp_path / "data"
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(_unpack_debian, root) for _ in range(2)]:
            done.result()
    raw = root / "FashionMNIST" / "raw"
    assert {path.name: path.read_bytes() for path in raw.iterdir()} == contents  # no temporary files left
