"""data.max_tokens on the sources past one folder: a Hugging Face dataset and shards of non-square images give
batches of each image at its own aspect ratio (a list), and train.py trains on them with data.max_tokens (the image
folder's runs are in tests/training/test_naflex.py)."""

import io

import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image
from PIL import Image as PILImage

from tests.helpers import compose, one_epoch
from vit.checkpoint import load
from vit.data.encoded.hf import HFDataModule
from vit.data.encoded.stream import StreamDataModule
from vit.data.native_size import budget_grid
from vit.data.shards.writer import write_shards
from vit.training.run import train

SHAPES = [(16, 48), (48, 16), (32, 32), (24, 40)]  # (width, height) in pixels: 1:3, 3:1, 1:1, 3:5


def _picture(k: int) -> PILImage.Image:
    return PILImage.new("RGB", SHAPES[k % len(SHAPES)], (20 * k, 255 - 20 * k, 90))


def _hf(root) -> None:
    def split(first: int, count: int) -> Dataset:
        rows = range(first, first + count)
        stored = []
        for k in rows:
            buffer = io.BytesIO()
            _picture(k).save(buffer, "PNG")
            stored.append({"bytes": buffer.getvalue(), "path": None})
        return Dataset.from_dict(
            {"image": stored, "label": [k % 4 for k in rows]},
            features=Features({"image": Image(), "label": ClassLabel(names=["a", "b", "c", "d"])}),
        )

    DatasetDict(train=split(0, 8), validation=split(8, 4), test=split(12, 4)).save_to_disk(root)


def _shards(root) -> None:
    folder = root / "folder"
    for k in range(16):
        where = folder / ("train" if k < 12 else "val") / "abcd"[k % 4]
        where.mkdir(parents=True, exist_ok=True)
        _picture(k).save(where / f"{k}.png")
    write_shards(str(folder), str(root / "out"), val_fraction=1 / 3, workers=1)


@pytest.fixture(params=["hf", "stream"])
def source(request, tmp_path):
    """(data=..., its root) of 16 images of the four SHAPES."""
    if request.param == "hf":
        _hf(tmp_path / "saved")
        return "hf", tmp_path / "saved"
    _shards(tmp_path)
    return "stream", tmp_path / "out"


def test_each_image_keeps_its_aspect_ratio_within_the_budget(source):
    kind, root = source
    cls = HFDataModule if kind == "hf" else StreamDataModule
    values = dict(num_classes=4, img_size=32, batch_size=4, eval_batch_size=4, num_workers=0, crop_pct=1.0)
    dm = cls(root=str(root), max_tokens=16, auto_augment=None, **values)
    dm.patch_size = (8, 8)  # the network's, as the run gives it
    dm.setup()
    grids = {tuple(8 * n for n in budget_grid(h, w, (8, 8), 16)) for w, h in SHAPES}  # each shape's budget grid
    for loader in (dm.train_dataloader(), dm.test_dataloader()):
        images, labels = dm.on_after_batch_transfer(next(iter(loader)), 0)
        assert isinstance(images, list) and len(images) == len(labels) == 4
        sizes = {tuple(image.shape[-2:]) for image in images}
        assert sizes <= grids and len(sizes) > 1  # each on its own grid, not squashed to one square


def test_train_py_trains_on_them_at_their_own_aspect_ratio(source, tmp_path):
    kind, root = source
    settings = ["data.max_tokens=16", "data.num_classes=4", "data.auto_augment=null"]
    results = train(compose(*one_epoch(kind, 32, f"data.root={root}", *settings), f"output_dir={tmp_path / 'run'}"))
    assert results["global_steps"] == 2 and results["test_acc"] is not None  # 8 training images in batches of 4
    loaded = load(results["best_checkpoint"])
    assert loaded.max_tokens == 16
