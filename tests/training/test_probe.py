"""Frozen-feature evaluation: the probe and the vote read the features' classes, and the command line computes
them from a checkpoint and a dataset without augmentation."""

import re

import numpy as np
import pytest
import torch
from PIL import Image

import vit.cli.probe
from tests.helpers import perturb_, tiny_config
from vit.checkpoint import Loaded
from vit.cli.export import to_safetensors
from vit.cli.probe import main as probe
from vit.data.imagefolder import ImageFolderDataModule
from vit.model import VisionTransformer
from vit.training.probe import knn, linear_probe


def _clusters(n: int, classes: int, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 3
    y = torch.randint(0, classes, (n,), generator=g)
    return centres[y] + torch.randn(n, dim, generator=g), y


def test_separable_features_are_read_and_shuffled_labels_are_not():
    train, test = _clusters(400, 5), _clusters(200, 5, seed=1)
    assert linear_probe(train, test, 5) > 0.95 and knn(train, test, 5) > 0.95
    shuffled = (train[0], train[1][torch.randperm(400, generator=torch.Generator().manual_seed(0))])
    assert linear_probe(shuffled, test, 5) < 0.5 and knn(shuffled, test, 5) < 0.5  # chance is 0.2


def test_knn_votes_by_similarity_weight():
    # two training points of class 1 faintly similar, one of class 0 very similar: the weighted vote picks 0
    x = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.6, -0.8]])
    y = torch.tensor([0, 1, 1])
    assert knn((x, y), (torch.tensor([[1.0, 0.05]]), torch.tensor([0])), classes=2, k=3) == 1.0


def test_knn_weights_do_not_overflow_at_a_low_temperature():
    # exp(1 / 0.005) and exp(0.8 / 0.005) are both inf in fp32: the vote tied and went to class 0
    x = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6]])
    y = torch.tensor([1, 0, 0])
    assert knn((x, y), (torch.tensor([[1.0, 0.0]]), torch.tensor([1])), classes=2, k=3, T=0.005) == 1.0


def test_an_image_folders_training_split_is_read_without_augmentation(tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("a", "b"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(4):  # noise, so that any crop, flip or colour change shows
                Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(
                    tmp_path / split / name / f"{i}.png"
                )
    data = ImageFolderDataModule(root=tmp_path, num_classes=2, img_size=32, val_fraction=0.25, auto_augment="rand-m9")
    data.setup("fit")
    first, second = (torch.cat([x for x, _ in data.evaluation_loader("train")]) for _ in range(2))
    assert torch.equal(first, second)  # augmentation (random crops, RandAugment) would differ between passes


def test_the_command_line_probes_a_checkpoint_on_a_dataset(tmp_path, capsys, monkeypatch):
    model = perturb_(VisionTransformer(tiny_config(num_classes=4)))
    path = tmp_path / "model.safetensors"
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
    inputs = []
    real_features = vit.cli.probe.features
    monkeypatch.setattr(vit.cli.probe, "features", lambda m, batches: real_features(m, _seen(batches, inputs)))
    probe(["--checkpoint", str(path), "--k", "5", "data=synthetic", "data.train_size=256", "data.test_size=128"])
    out = capsys.readouterr().out
    assert "32-dim features of 192 training and 128 test images" in out  # 256 less the 64 held out for validation
    accuracies = [float(a) for a in re.findall(r"([\d.]+)% test accuracy", out)]
    assert len(accuracies) == 2 and all(a > 40 for a in accuracies)  # 4 classes: chance is 25%
    # normalised with the file's mean and std (pixels to [-1, 1]), not synthetic data's std 0.25 (to [-2, 2])
    assert max(x.abs().max().item() for x in inputs) <= 1.0 < max(x.abs().max().item() * 2 for x in inputs)


def _seen(batches, inputs):
    for images, labels in batches:
        inputs.append(images)
        yield images, labels


def test_a_missing_image_folder_is_one_line_naming_it(tmp_path):
    model = VisionTransformer(tiny_config(num_classes=4))
    path = tmp_path / "model.safetensors"
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
    with pytest.raises(SystemExit) as exit:
        probe(["--checkpoint", str(path), "data=imagefolder", f"data.root={tmp_path / 'nowhere'}"])
    assert str(exit.value) == f"image folder not found: data.root={tmp_path / 'nowhere'} does not exist"


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("data.imgsize=20", r"^Could not override 'data\.imgsize'\."),  # Hydra's exceptions were tracebacks
        ("data=synthetc", r"^In 'train': Could not find 'data/synthetc'"),
        ("data.in_chans=1", r"^data\.in_chans=1, but \S+ reads 3-channel images: add data\.in_chans=3$"),
        ("data=imagefolder", r"^Missing mandatory value: data\.root$"),  # was OmegaConf's traceback
    ],
)
def test_data_overrides_the_probe_cannot_use_are_one_line(tmp_path, override, says):
    """A 1-channel dataset against an RGB model ran: normalising with 3 means broadcast each image to 3 channels."""
    path = tmp_path / "model.safetensors"
    to_safetensors(Loaded(VisionTransformer(tiny_config(num_classes=4)), (0.5,) * 3, (0.5,) * 3, None, path), path)
    overrides = ["data=synthetic", "data.train_size=128", override] if override.startswith("data.") else [override]
    with pytest.raises(SystemExit) as refused:
        probe(["--checkpoint", str(path), *overrides])
    assert re.search(says, str(refused.value)), refused.value


@pytest.mark.parametrize("k", ["0", "-3", "2.5"])
def test_a_k_that_is_not_a_positive_whole_number_is_refused_before_loading(k, capsys):
    """The same rule and words as predict's --top-k (vit.cli.predict.positive); the checkpoint is never opened."""
    with pytest.raises(SystemExit) as refused:
        probe(["--checkpoint", "/nonexistent.safetensors", "--k", k])
    assert refused.value.code == 2
    assert f"argument --k: {k!r} is not a positive whole number" in capsys.readouterr().err
