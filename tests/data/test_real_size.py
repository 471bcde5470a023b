"""Each source of encoded images once at the size of a real folder, where a failure on one image in a thousand shows:
5,000 generated images of many sizes and aspect ratios (thumbnails and strips among them), RGB, grayscale and a few
RGBA and palette images, JPEG and PNG, trained for one epoch with the data configs' own augmentation (RandAugment)
and a one-layer model: data=imagefolder (square, and NaFlex at each image's own aspect ratio, and with a CSV label
file of several labels an image), data=hf (a saved dataset of the same images) and data=stream (shards written by
`python -m vit.cli.shards`)."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from PIL import Image

from tests.helpers import TINY, compose
from tests.reliability.faults import recorded_labels
from vit.data.encoded.held_out import hold_out
from vit.training.run import train

pytestmark = pytest.mark.slow  # each run reads all 5,000 images: 10-60 s on two cores

CLASSES = 10
TRAIN_PER_CLASS, VAL_PER_CLASS = 450, 50  # 5,000 images: train/ and val/, as an ImageNet-style folder
TRAIN_IMAGES = CLASSES * TRAIN_PER_CLASS
BATCH = 64
# (width, height): about one image in 50 is a thumbnail smaller than two patches or a long strip
ODD_SIZES = [(12, 12), (9, 30), (120, 20), (20, 120), (200, 40)]


def _image(rng: np.random.Generator, label: int) -> tuple[Image.Image, str]:
    """An image of a class, tinted by its label, and the format it is saved in."""
    odd = rng.random() < 0.02
    width, height = ODD_SIZES[rng.integers(len(ODD_SIZES))] if odd else rng.integers(24, 65, size=2)
    tint = np.array([25 * label, 255 - 25 * label, (90 * label) % 256], dtype=np.int16)
    noise = rng.integers(-60, 61, size=(int(height), int(width), 3), dtype=np.int16)
    image = Image.fromarray(np.clip(tint + noise, 0, 255).astype(np.uint8))
    mode = rng.choice(["RGB", "L", "RGBA", "P"], p=[0.72, 0.25, 0.015, 0.015])
    image = image.quantize(64) if mode == "P" else image.convert(mode)
    return image, "JPEG" if mode in ("RGB", "L") and rng.random() < 0.6 else "PNG"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """root/train/c<label>/ and root/val/c<label>/ of the 5,000 images (~3 s)."""
    root = tmp_path_factory.mktemp("real_size") / "folder"
    rng = np.random.default_rng(0)
    for split, count in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for label in range(CLASSES):
            where = root / split / f"c{label}"
            where.mkdir(parents=True)
            for k in range(count):
                image, kind = _image(rng, label)
                suffix = {"JPEG": (".jpg", ".JPEG", ".jpeg")[k % 3], "PNG": ".png"}[kind]
                image.save(where / f"{k}{suffix}", kind)
    return root


def _trained(data: str, root: Path, tmp_path: Path, *more: str) -> tuple[DictConfig, dict, list[int]]:
    """One epoch of TINY's model on 32-pixel images (patches of 8) in batches of BATCH, the augmentation as the data
    config sets it, decoded by the workers data.num_workers=auto starts: the config, the results and the labels
    trained on."""
    witness = f"+callbacks.witness={{_target_: tests.reliability.faults.RecordLabels, folder: {tmp_path / 'seen'}}}"
    model = [o for o in TINY if not o.startswith(("data=", "model.patch_size"))]
    data_settings = [f"data.root={root}", "data.img_size=32", f"data.batch_size={BATCH}", "data.eval_batch_size=256"]
    cfg = compose(
        f"data={data}",
        *data_settings,
        *model,
        "model.patch_size=8",
        "trainer=cpu",
        "trainer.max_epochs=1",
        "callbacks.pos_embed_figure=null",
        witness,
        f"output_dir={tmp_path / 'run'}",
        *more,
    )
    assert cfg.data.auto_augment.startswith("rand-")  # the default augmentation, RandAugment
    results = train(cfg)
    [(_, batches)] = recorded_labels(str(tmp_path / "seen")).items()
    return cfg, results, [label for _, labels in batches for label in labels]


def _check_epoch(results: dict, labels: list[int], training: int, held_out: int) -> None:
    """Every whole batch of the `training` images trained (the last partial one is dropped), each class among them;
    the `held_out` images validated, and the test set tested."""
    assert len(labels) == training // BATCH * BATCH and results["global_steps"] == training // BATCH
    assert sorted(set(labels)) == list(range(CLASSES))
    assert results["val_samples"] == held_out and results["test_acc"] is not None
    assert results["bad_images"] == 0


def _held_out(cfg: DictConfig) -> int:
    """The images of train/ that data=imagefolder and data=hf hold out to validate (data.val_fraction)."""
    return len(hold_out(TRAIN_IMAGES, cfg.data.val_fraction, cfg.data.split_seed)[1])


@pytest.mark.parametrize(
    "naflex",
    [[], ["data.max_tokens=16"]],
    ids=["square", "naflex"],
)
def test_an_image_folder_of_5000_images_trains_an_epoch(folder, tmp_path, naflex):
    cfg, results, labels = _trained("imagefolder", folder, tmp_path, *naflex)
    _check_epoch(results, labels, TRAIN_IMAGES - _held_out(cfg), _held_out(cfg))


def test_a_saved_hugging_face_dataset_of_5000_images_trains_an_epoch(folder, tmp_path):
    from datasets import ClassLabel, Dataset, DatasetDict, Features
    from datasets import Image as ImageFeature

    def split(name: str) -> Dataset:
        paths = sorted((folder / name).glob("*/*"))
        return Dataset.from_dict(
            {
                "image": [{"bytes": path.read_bytes(), "path": None} for path in paths],
                "label": [int(path.parent.name[1:]) for path in paths],
            },
            features=Features({"image": ImageFeature(), "label": ClassLabel(names=[f"c{k}" for k in range(CLASSES)])}),
        )

    saved = tmp_path / "saved"
    DatasetDict(train=split("train"), validation=split("val")).save_to_disk(str(saved))
    cfg, results, labels = _trained("hf", saved, tmp_path, f"data.cache_dir={tmp_path / 'hf_cache'}")
    _check_epoch(results, labels, TRAIN_IMAGES - _held_out(cfg), _held_out(cfg))


def test_shards_of_5000_images_written_by_the_shards_command_train_an_epoch(folder, tmp_path):
    out = tmp_path / "shards"
    command = [sys.executable, "-m", "vit.cli.shards", str(folder), str(out), "--chunk-bytes", "1MB"]
    written = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert written.returncode == 0, written.stderr[-3000:]
    assert len(list((out / "train").glob("chunk-*.bin"))) > 1  # several shards, as a real set has
    splits = json.loads((out / "shards.json").read_text())["splits"]
    _, results, labels = _trained("stream", out, tmp_path)
    _check_epoch(results, labels, splits["train"], splits["val"])


def test_the_generated_folder_mixes_what_real_folders_hold(folder):
    """The fixture's own promise: sizes, aspect ratios, modes and formats mixed."""
    paths = sorted(folder.rglob("*.*"))
    assert len(paths) == CLASSES * (TRAIN_PER_CLASS + VAL_PER_CLASS)
    kinds, ratios = set(), set()
    for path in paths:
        with Image.open(path) as image:
            kinds.add((image.format, image.mode))
            ratios.add(round(image.width / image.height, 1))
    assert {("JPEG", "RGB"), ("JPEG", "L"), ("PNG", "RGB"), ("PNG", "L"), ("PNG", "RGBA"), ("PNG", "P")} <= kinds
    assert min(ratios) <= 0.2 and max(ratios) >= 5 and len(ratios) > 20


def _labels_of(label: int, k: int) -> list[int]:
    """Image k of class folder c<label>: its class, with the next one for every third image; every fiftieth of none."""
    return [] if k % 50 == 49 else sorted({label, (label + 1) % CLASSES} if k % 3 == 0 else {label})


class RecordTargets(L.Callback):
    """A witness of several labels an image: the training split's targets as the data module holds them, and each
    training batch's multi-hot targets (B, K), saved in `folder` when the fit ends."""

    def __init__(self, folder: str):
        self.folder, self.batches = folder, []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.batches.append(batch[1].cpu())

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = trainer.datamodule
        read = [tuple(label) for _, label in data.train_set.samples + data.val_set.samples]
        os.makedirs(self.folder, exist_ok=True)
        torch.save({"read": read, "batches": self.batches}, os.path.join(self.folder, "targets.pt"))


def test_an_image_folder_with_a_csv_of_several_labels_an_image_trains_an_epoch(folder, tmp_path):
    """The 5,000 images named by a CSV file (image,labels,split: train/'s images train, val/'s test), one to two
    classes an image joined by ';', some of none; task=multilabel, whose batches are multi-hot (B, K)."""
    rows, expected = ["image,labels,split"], []
    for path in sorted(folder.glob("*/*/*")):
        names = ";".join(f"c{c}" for c in _labels_of(int(path.parent.name[1:]), int(path.stem)))
        split = "train" if path.parts[-3] == "train" else "test"
        rows.append(f"{path.relative_to(folder).as_posix()},{names},{split}")
        if split == "train":
            expected.append(tuple(_labels_of(int(path.parent.name[1:]), int(path.stem))))
    labels = tmp_path / "labels.csv"
    labels.write_text("\n".join(rows) + "\n")
    witness = f"+callbacks.witness={{_target_: {__name__}.RecordTargets, folder: {tmp_path / 'seen'}}}"
    model = [o for o in TINY if not o.startswith(("data=", "model.patch_size"))]
    cfg = compose(
        "data=imagefolder",
        f"data.root={folder}",
        f"data.labels={labels}",
        "task=multilabel",
        "data.img_size=32",
        f"data.batch_size={BATCH}",
        "data.eval_batch_size=256",
        *model,
        "model.patch_size=8",
        "trainer=cpu",
        "trainer.max_epochs=1",
        "callbacks.pos_embed_figure=null",
        witness,
        f"output_dir={tmp_path / 'run'}",
    )
    assert cfg.data.num_classes == CLASSES and cfg.data.auto_augment.startswith("rand-")
    results = train(cfg)
    seen = torch.load(tmp_path / "seen" / "targets.pt")
    trained = [tuple(c for c in range(CLASSES) if target[c]) for target in torch.cat(seen["batches"]).tolist()]
    assert Counter(seen["read"]) == Counter(expected)  # train/'s rows, none lost: validation is held out of them
    training = TRAIN_IMAGES - _held_out(cfg)
    assert len(trained) == training // BATCH * BATCH and results["global_steps"] == training // BATCH
    assert not Counter(trained) - Counter(expected)  # each batch's targets are rows' labels (the last partial dropped)
    assert all(t.dtype == torch.float32 and t.shape == (BATCH, CLASSES) for t in seen["batches"])
    assert results["val_samples"] == _held_out(cfg) and results["test_map"] is not None and results["bad_images"] == 0
    saved = torch.load(results["best_checkpoint"], weights_only=True)
    assert saved["data_facts"]["multilabel"] is True and saved["data_facts"]["classes"] == [f"c{k}" for k in range(10)]
