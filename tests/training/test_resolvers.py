"""The class count comes from the data for every data group, through the config's resolvers, and reaches the
model: nobody types data.num_classes. A count typed by hand that disagrees with the data is one line naming both."""

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT, compose, one_epoch, run_train_py, write_image_folder
from vit.checkpoint import load
from vit.data.errors import DataError
from vit.model.config import ConfigError
from vit.training.checks import check_config
from vit.training.run import train

CLASSES = {"ant": 4, "bee": 4, "cat": 4}
# facts of the datasets, as their papers give them (the mosaics are Fashion-MNIST's images)
DATASETS = {"fashion_mnist": 10, "fashion_mnist_multilabel": 10, "cifar10": 10, "cifar100": 100}
FOLDER_RUN = one_epoch("imagefolder", 16, "data.val_fraction=0.25")  # TINY's model on the folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An image folder of three classes; beside them in train/, a hidden folder and a file, which are not classes."""
    root = tmp_path / "folder"
    write_image_folder(root, CLASSES, "train", size=(16, 16))
    write_image_folder(root, {"ant": 1, "cat": 1}, "val", size=(16, 16))
    (root / "train" / ".git").mkdir()
    (root / "train" / "notes.txt").write_text("not a class")
    return root


def test_every_data_group_is_one_whose_class_count_is_tested_here():
    """A new data group fails here until its class count is read from its data, and tested below."""
    groups = {p.stem for p in (ROOT / "conf" / "data").glob("*.yaml")}
    # synthetic makes its classes: a setting; images has none (one, which task=mae does not read)
    assert groups == {*DATASETS, "imagefolder", "hf", "stream", "synthetic", "images"}


@pytest.mark.parametrize(("group", "count"), DATASETS.items())
def test_a_dataset_gives_its_class_count_or_its_subsets(group, count):
    cfg = compose(f"data={group}")
    assert cfg.data.num_classes == cfg.model.num_classes == count
    cfg = compose(f"data={group}", "data.class_subset=[4,0,7]")
    assert cfg.data.num_classes == cfg.model.num_classes == 3


def test_an_image_folder_run_builds_a_model_of_its_class_folders(folder, tmp_path):
    cfg = compose(*FOLDER_RUN, f"data.root={folder}", f"output_dir={tmp_path / 'out'}")
    assert cfg.data.num_classes == cfg.model.num_classes == 3  # counted when the config resolves
    loaded = load(train(cfg)["best_checkpoint"])
    assert loaded.config.num_classes == loaded.model.head.out_features == 3
    assert list(loaded.classes) == sorted(CLASSES)  # the names, from the same folders


@pytest.mark.slow  # a train.py process: ~8 s; the in-process refusals of typed counts: the tests below
def test_train_py_refuses_a_typed_class_count_that_the_folder_disagrees_with_in_one_line(folder, tmp_path):
    run = run_train_py(*FOLDER_RUN, f"data.root={folder}", "data.num_classes=5", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: {folder / 'train'} has 3 class folders but data.num_classes=5: leave data.num_classes out, "
        "the config reads it from the folder"
    )
    assert "Traceback" not in run.stderr


def test_a_typed_model_class_count_that_disagrees_with_the_data_is_named_before_any_work(folder, tmp_path):
    cfg = compose(*FOLDER_RUN, f"data.root={folder}", "model.num_classes=5", f"output_dir={tmp_path}")
    where = re.escape(f"data.root={folder}")
    with pytest.raises(ConfigError, match=rf"^model\.num_classes=5, but the data in {where} has 3 classes"):
        check_config(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.num_classes=12"], r"^data\.num_classes=12, but CIFAR-10 has 10 classes: leave data\.num_classes out"),
        (["data.class_subset=[1,2]", "data.num_classes=3"], r"^data\.class_subset=\[1, 2\] must list data\.num_cl"),
    ],
)
def test_a_typed_dataset_class_count_that_disagrees_is_the_data_modules_one_line(tmp_path, overrides, message):
    """Refused as the module is built, before any file is read; Hydra's wrapping of the error is taken off."""
    cfg = compose("data=cifar10", "data.root=/nonexistent", "data.download=false", "model=vit_cifar", *overrides)
    cfg.output_dir = str(tmp_path)
    with pytest.raises(DataError, match=message):
        train(cfg)


def test_an_image_folder_without_its_root_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"Missing mandatory value: data\.root"):
        check_config(compose("data=imagefolder", f"output_dir={tmp_path}"))


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda root: None, FileNotFoundError, r"^image folder not found: data\.root=.* does not exist$"),
        (lambda root: (root / "train").mkdir(parents=True), DataError, r"train holds no class folders"),
    ],
    ids=["no folder", "no classes"],
)
def test_an_image_folder_that_cannot_be_counted_is_the_datas_own_error(tmp_path, make, error, message):
    make(tmp_path / "folder")
    cfg = compose("data=imagefolder", f"data.root={tmp_path / 'folder'}", f"output_dir={tmp_path}")
    with pytest.raises(error, match=message):
        check_config(cfg)
