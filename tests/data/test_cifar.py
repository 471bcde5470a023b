import pytest
import torch

from tests.helpers import write_cifar
from vit.data import CIFAR10DataModule, CIFAR100DataModule


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


def test_labels_beyond_num_classes_are_refused(tmp_path):
    write_cifar(tmp_path)
    dm = make(CIFAR10DataModule, tmp_path, num_classes=3)
    with pytest.raises(ValueError, match=r"labels span 0\.\.9 but data.num_classes=3"):
        dm.setup()
