import pickle

import numpy as np
import pytest
import torch

from tests.helpers import write_cifar
from vit.data.memory.cifar import CIFAR10DataModule, CIFAR100DataModule


def make(cls, root, **kw):
    defaults = dict(root=str(root), num_classes=10 if cls is CIFAR10DataModule else 100, in_chans=3, img_size=32)
    return cls(**{**defaults, "download": False, "val_size": 10, **kw})


@pytest.mark.parametrize(("cls", "kind"), [(CIFAR10DataModule, "cifar-10"), (CIFAR100DataModule, "cifar-100")])
def test_reads_torchvisions_on_disk_format(tmp_path, cls, kind):
    test_batch = write_cifar(tmp_path, kind)
    dm = make(cls, tmp_path)
    images, labels = dm.load(train=False)
    assert images.dtype == torch.uint8 and images.shape == (20, 3, 32, 32)
    row = torch.from_numpy(test_batch["data"][3])
    assert torch.equal(images[3, 0].flatten(), row[:1024])  # red plane first, row-major
    assert torch.equal(images[3, 2].flatten(), row[2048:])
    label_key = "labels" if kind == "cifar-10" else "fine_labels"
    assert labels.tolist() == [int(v) for v in test_batch[label_key]]
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) == (100 if kind == "cifar-10" else 20)


def test_missing_files_name_the_folder_and_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cifar-10-batches-py \(missing data_batch_1.*data.root"):
        make(CIFAR10DataModule, tmp_path).load(train=True)


def test_a_corrupt_batch_file_is_named(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="test_batch is not a CIFAR batch file"):
        make(CIFAR10DataModule, tmp_path).load(train=False)


def test_a_class_count_other_than_the_datasets_is_refused_naming_both(tmp_path):
    with pytest.raises(ValueError, match=r"data\.num_classes=3, but CIFAR-10 has 10 classes"):
        make(CIFAR10DataModule, tmp_path, num_classes=3)


def test_labels_beyond_the_datasets_classes_are_refused(tmp_path):
    write_cifar(tmp_path)
    test_file = tmp_path / "cifar-10-batches-py" / "test_batch"
    batch = pickle.loads(test_file.read_bytes())
    batch["labels"][0] = 12
    test_file.write_bytes(pickle.dumps(batch))
    with pytest.raises(ValueError, match=r"test labels span 0\.\.12 but data.num_classes=10"):
        make(CIFAR10DataModule, tmp_path).setup()


def test_a_class_subset_keeps_those_images_relabelled_in_the_order_given(tmp_path):
    test_batch = write_cifar(tmp_path)
    dm = make(CIFAR10DataModule, tmp_path, num_classes=3, class_subset=[7, 2, 5])
    dm.setup()
    rows = torch.from_numpy(test_batch["data"]).reshape(-1, 3, 32, 32)
    original = torch.tensor([int(v) for v in test_batch["labels"]])
    keep = torch.isin(original, torch.tensor([7, 2, 5]))
    assert torch.equal(dm.test_set.images, rows[keep])
    assert dm.test_set.labels.tolist() == [[7, 2, 5].index(k) for k in original[keep].tolist()]
    train_labels = torch.cat((dm.train_set.labels, dm.val_set.labels))
    assert set(train_labels.tolist()) <= {0, 1, 2}


def test_a_class_subset_may_hold_a_class_absent_from_the_test_split(tmp_path):
    """The relabelling table was sized by each split's own largest label: a test split without class 9
    made class_subset=[3, 9] an error."""
    write_cifar(tmp_path, per_file=40)
    test_file = tmp_path / "cifar-10-batches-py" / "test_batch"
    batch = pickle.loads(test_file.read_bytes())
    batch["labels"] = [k % 9 for k in range(len(batch["labels"]))]  # classes 0..8 only
    test_file.write_bytes(pickle.dumps(batch))
    dm = make(CIFAR10DataModule, tmp_path, num_classes=2, class_subset=[3, 9])
    dm.setup()
    assert dm.test_set.labels.tolist() == [0] * batch["labels"].count(3)
    assert set(dm.train_set.labels.tolist()) == {0, 1}


@pytest.mark.parametrize(
    ("subset", "message"),
    [([1, 1, 2], "3 distinct class indices"), ([1, 2], "num_classes=3"), ([1, 2, 10], r"classes 0\.\.9 only")],
)
def test_a_wrong_class_subset_is_refused_naming_the_key(tmp_path, subset, message):
    write_cifar(tmp_path)
    with pytest.raises(ValueError, match=rf"data\.class_subset=.*{message}"):
        make(CIFAR10DataModule, tmp_path, num_classes=3, class_subset=subset).setup()


def test_another_img_size_resizes_batches_on_the_device(tmp_path):
    write_cifar(tmp_path)
    dm = make(CIFAR10DataModule, tmp_path, img_size=48)
    dm.setup()
    batch = next(iter(dm.test_dataloader()))
    images, labels = dm.on_after_batch_transfer(batch, 0)
    assert dm.test_set.images.shape[-2:] == (32, 32)  # memory keeps the stored size
    assert images.shape == (len(labels), 3, 48, 48)


class _RunsCode:
    """A pickle payload: unpickling it calls os.system, as a hostile data file would."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_batches_pickled_either_way_are_read(tmp_path, protocol):
    # Python 2 wrote the real files; protocol 2 from Python 3 pickles bytes through _codecs.encode
    test_batch = write_cifar(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"batch_label": b"test", b"data": test_batch["data"], b"labels": [1] * 20}, f, protocol)
    images, labels = make(CIFAR10DataModule, tmp_path).load(train=False)
    assert torch.equal(images.flatten(1), torch.from_numpy(test_batch["data"])) and labels.tolist() == [1] * 20


@pytest.mark.parametrize("file", ["test_batch", "batches.meta"])
def test_a_batch_that_would_run_code_is_refused_and_nothing_runs(tmp_path, file):
    write_cifar(tmp_path)
    marker = tmp_path / "ran"
    with open(tmp_path / "cifar-10-batches-py" / file, "wb") as f:
        pickle.dump({"data": _RunsCode(marker), "labels": [], "label_names": _RunsCode(marker)}, f)
    dm = make(CIFAR10DataModule, tmp_path)
    with pytest.raises(ValueError, match=rf"{file} is not a CIFAR batch file .*refused: it asks for posix.system"):
        dm.load(train=False) if file == "test_batch" else dm.classes
    assert not marker.exists()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"data": np.zeros((20, 3000), np.uint8), "labels": [0] * 20}, r"'data' is uint8 \(20, 3000\)"),
        ({"data": np.zeros((20, 3072), np.uint8), "labels": [0] * 19}, r"20 images but 'labels' holds int64 \(19,\)"),
        ({"data": np.zeros((20, 3072), np.uint8)}, "no labels entry"),
        ([1, 2, 3], "holds a list, not a dict"),
    ],
)
def test_a_malformed_batch_is_named_with_what_is_wrong(tmp_path, entry, message):
    write_cifar(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump(entry, f)
    with pytest.raises(ValueError, match=rf"test_batch.*{message}"):
        make(CIFAR10DataModule, tmp_path).load(train=False)
