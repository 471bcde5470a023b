"""Data that is missing, in the wrong place, broken or of the wrong shape fails with a message that names the
file or folder and the config key to change, when composed from the YAML the way train.py composes it."""

from __future__ import annotations

import re

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from tests.data.encoded.test_imagefolder import write_bad_files
from tests.helpers import compose, write_cifar, write_image_folder

EXPERIMENT = {  # data group -> the experiment that reads it
    "imagefolder": "imagenette",
    "cifar10": "cifar10",
    "cifar100": "cifar100",
    "fashion_mnist": "fashion_mnist",
}


def data_module(group: str, root, *overrides: str):
    """The data module of the experiment that reads this data group, as `python train.py experiment=...`."""
    cfg = compose(f"experiment={EXPERIMENT[group]}", f"data.root={root}", *overrides)
    return instantiate(cfg.data)


def read(dm) -> None:
    dm.prepare_data()
    dm.setup()


NOT_FOUND = {  # group -> extra overrides, and what the message must say it looked for
    "imagefolder": (["data.num_classes=3"], "train"),
    "cifar10": (["data.download=false"], "cifar-10-batches-py"),
    "cifar100": (["data.download=false"], "cifar-100-python"),
    "fashion_mnist": (["data.download=false"], "FashionMNIST/raw"),
}


@pytest.mark.parametrize("exists", [False, True], ids=["missing root", "root without the data"])
@pytest.mark.parametrize("group", list(NOT_FOUND))
def test_absent_data_names_where_it_looked_and_the_key(tmp_path, monkeypatch, group, exists):
    monkeypatch.setattr("vit.data.memory.fashion_mnist.DEBIAN_DIR", tmp_path / "no-debian-package")
    root = tmp_path / "data"
    if exists:
        root.mkdir()
    overrides, looked_for = NOT_FOUND[group]
    with pytest.raises(FileNotFoundError) as error:
        read(data_module(group, root, *overrides))
    message = str(error.value)
    assert str(root) in message and "data.root" in message
    assert looked_for in message or not exists  # a missing root is reported as such, before its contents


def test_a_nested_image_folder_is_suggested(tmp_path):
    write_image_folder(tmp_path / "imagenette2-320", {"ant": 1}, "train")
    with pytest.raises(FileNotFoundError, match=re.escape(f"did you mean data.root={tmp_path / 'imagenette2-320'}?")):
        read(data_module("imagefolder", tmp_path, "data.num_classes=1"))


def test_in_memory_data_of_other_channels_than_the_model_names_the_key(tmp_path):
    write_cifar(tmp_path)
    dm = data_module("cifar10", tmp_path, "data.download=false", "data.in_chans=1", "data.val_size=10")
    with pytest.raises(ValueError, match=r"CIFAR-10 train images .*3.* data\.in_chans"):
        read(dm)


def test_image_folders_refuse_channel_counts_they_cannot_decode_to(tmp_path):
    with pytest.raises(InstantiationException, match=r"data\.in_chans=4, but image folders decode to 1 .* or 3"):
        data_module("imagefolder", tmp_path, "data.num_classes=1", "data.in_chans=4")


def test_bad_images_through_the_config_error_or_are_skipped_counted_and_capped(tmp_path):
    write_image_folder(tmp_path, {"ant": 9, "bee": 9, "cat": 9}, "train")
    write_image_folder(tmp_path, {"ant": 2}, "val")
    bad = write_bad_files(tmp_path / "train" / "bee")
    with pytest.raises(ValueError, match=r"3 bad image file\(s\)[\s\S]*data\.skip_bad_images=true"):
        read(data_module("imagefolder", tmp_path, "data.num_classes=3", "data.num_workers=0"))
    skipping = ("data.num_classes=3", "data.num_workers=0", "data.skip_bad_images=true")
    with pytest.raises(ValueError, match=r"\(10\.0%\), more than data\.max_bad_fraction=0\.01"):
        read(data_module("imagefolder", tmp_path, *skipping))
    dm = data_module("imagefolder", tmp_path, *skipping, "data.max_bad_fraction=0.2")
    with pytest.warns(UserWarning, match="leaving out 3 bad image file"):
        read(dm)
    assert dm.bad_images == bad
