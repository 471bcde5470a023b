"""data=images: a folder of images without labels, in any layout, split three ways for task=mae."""

from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import compose
from vit.data.encoded.unlabeled import UnlabeledImagesDataModule
from vit.data.errors import DataError
from vit.model.config import ConfigError
from vit.training.run import train


def write_photos(root: Path, count: int = 40) -> set[str]:
    """`count` PNGs at three depths (no class folders), with a hidden file, a hidden folder and a text file beside
    them; returns the image paths that count."""
    images = set()
    for k in range(count):
        folder = root / ("" if k % 3 == 0 else f"2024/{k % 3}")
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20 + k, 24), (5 * k, 100, 200)).save(folder / f"{k}.png")
        images.add(str(folder / f"{k}.png"))
    (root / ".hidden").mkdir()
    Image.new("RGB", (8, 8)).save(root / ".hidden" / "x.png")
    Image.new("RGB", (8, 8)).save(root / ".thumb.png")
    (root / "notes.txt").write_text("not an image")
    return images


def _data(root: Path, **settings) -> UnlabeledImagesDataModule:
    data = UnlabeledImagesDataModule(root=str(root), num_classes=1, in_chans=3, img_size=16, batch_size=4, **settings)
    data.setup()
    return data


def test_every_image_at_any_depth_lands_in_exactly_one_split_drawn_by_the_seed(tmp_path):
    images = write_photos(tmp_path)
    data = _data(tmp_path, test_fraction=0.1, val_fraction=0.1)
    splits = [[path for path, _ in data._unaugmented(s).samples] for s in (data.train_set, data.val_set, data.test_set)]
    assert [len(s) for s in splits] == [32, 4, 4]  # 10% of 40 to test, then 10% of the 36 left to validate
    assert set().union(*map(set, splits)) == images and sum(map(len, splits)) == 40
    assert data.classes == ["image"] and {label for _, label in data._unaugmented(data.train_set).samples} == {0}
    again, other = _data(tmp_path, test_fraction=0.1, val_fraction=0.1), _data(tmp_path, split_seed=1)
    assert [p for p, _ in again.test_set.samples] == splits[2]
    assert [p for p, _ in other.test_set.samples] != splits[2][:2]


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        (lambda root: None, r"holds no image files"),
        (lambda root: write_photos(root, 2), r"^data\.test_fraction=0\.05 holds out 1 of 2 .*|leaving none to train"),
    ],
)
def test_a_folder_too_small_is_one_line(tmp_path, setup, said):
    setup(tmp_path)
    with pytest.raises(DataError, match=said):
        _data(tmp_path)


def test_settings_out_of_range_are_one_line(tmp_path):
    with pytest.raises(DataError, match=r"^data\.test_fraction=1\.0: the share of the images held out to test"):
        _data(tmp_path, test_fraction=1.0)
    with pytest.raises(DataError, match=r"^data\.root=.*missing: not a folder"):
        _data(tmp_path / "missing")


def _run(tmp_path: Path, *more: str):
    return compose("data=images", f"data.root={tmp_path / 'photos'}", "data.img_size=16", "data.num_workers=0",
                   "data.batch_size=4", "model.patch_size=4", "model.embed_dim=32", "model.depth=1",
                   "trainer.max_epochs=1", "callbacks.pos_embed_figure=null", f"output_dir={tmp_path / 'run'}",
                   *more)  # fmt: skip


@pytest.mark.parametrize("task", ["classify", "multilabel"])
def test_a_task_of_labels_refuses_images_without_them_naming_task_mae(tmp_path, task):
    write_photos(tmp_path / "photos")
    with pytest.raises(ConfigError, match=r"^data\.num_classes=1 in data\.root=.*: a classifier needs at least 2 "
                                          r"classes \(images without labels pretrain with task=mae\)$"):  # fmt: skip
        train(_run(tmp_path, f"task={task}"))
    # told of classes the folder does not have, the task finds out from the data
    with pytest.raises(ConfigError, match=r"^UnlabeledImagesDataModule has no labels to learn: pretrain .* task=mae$"):
        train(_run(tmp_path, f"task={task}", "data.num_classes=3"))


def test_mae_pretrains_on_images_without_labels(tmp_path):
    write_photos(tmp_path / "photos")
    results = train(_run(tmp_path, "task=mae"))
    assert results["global_steps"] == 9 and results["test_loss"] is not None  # 36 training images in batches of 4
