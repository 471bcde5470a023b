import pytest
import torch

from tests.helpers import write_image_folder
from vit.data import ImageFolderDataModule


def make(root, **kw):
    return ImageFolderDataModule(root=str(root), **{"num_classes": 3, "img_size": 32, "num_workers": 0, **kw})


def test_splits_share_the_train_class_map(tmp_path):
    write_image_folder(tmp_path, {"ant": 6, "bee": 6, "cat": 6}, "train")
    write_image_folder(tmp_path, {"bee": 2, "cat": 3}, "val")  # 'ant' absent: indices must not shift
    dm = make(tmp_path, val_fraction=0.2, batch_size=4)
    dm.setup()
    assert dm.classes == ["ant", "bee", "cat"]
    assert sorted(dm.test_set.targets) == [1, 1, 2, 2, 2]
    assert len(dm.train_set) + len(dm.val_set) == 18 and len(dm.val_set) == 4
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and labels.shape == (4,)
    images, labels = next(iter(dm.test_dataloader()))
    assert images.shape == (5, 3, 32, 32) and labels.tolist() == [1, 1, 2, 2, 2]


def test_class_count_mismatch_names_the_key(tmp_path):
    write_image_folder(tmp_path, {"ant": 2, "bee": 2}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    with pytest.raises(ValueError, match=r"has 2 class folders but data\.num_classes=3"):
        make(tmp_path).setup()


def test_unknown_test_class_is_refused(tmp_path):
    write_image_folder(tmp_path, {"ant": 2, "bee": 2, "cat": 2}, "train")
    write_image_folder(tmp_path, {"dog": 1}, "val")
    with pytest.raises(ValueError, match=r"classes absent from train/: \['dog'\]"):
        make(tmp_path).setup()


def test_missing_split_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"image folder split not found: .*train"):
        make(tmp_path).setup()
