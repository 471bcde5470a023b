"""Frozen-feature evaluation: the probe and the vote read the features' classes, and the command line computes
them from a checkpoint and a dataset without augmentation."""

import json
import re
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

import vit.cli.probe
from tests.helpers import perturb_, tiny_config
from vit.checkpoint import Loaded
from vit.cli.export import to_safetensors
from vit.cli.probe import main as probe
from vit.data.encoded.imagefolder import ImageFolderDataModule
from vit.model import VisionTransformer
from vit.training.probe import (
    WEIGHT_DECAYS,
    block_features,
    knn,
    knn_at,
    linear_probe,
    logistic_regression,
    sweep_linear,
)


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


def _tagged(n: int, classes: int = 4, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features that are the sum of the centres of the classes each holds (~0.3 of them), plus noise: multi-hot."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 3
    y = (torch.rand(n, classes, generator=g) < 0.3).float()
    return y @ centres + torch.randn(n, dim, generator=g), y


def test_several_labels_are_probed_class_by_class_and_scored_by_macro_map():
    train, test = _tagged(400), _tagged(200, seed=1)
    assert linear_probe(train, test, 4) > 0.95 and knn(train, test, 4) > 0.9
    shuffled = (train[0], train[1][torch.randperm(400, generator=torch.Generator().manual_seed(0))])
    assert linear_probe(shuffled, test, 4) < 0.5 and knn(shuffled, test, 4) < 0.5  # chance: each class's share, ~0.3
    swept = sweep_linear(train, test, 4, weight_decays=(1e-4, 1.0))
    assert set(swept["best"]) == {"weight_decay", "held_out_map", "test_map"}


def test_the_multi_label_probe_is_one_logistic_regression_per_class():
    """Fitted together, each class's weights are those of its own binary logistic regression with the same decay."""
    x, y = _tagged(200, classes=3)
    x = (x - x.mean(0)) / x.std(0)
    together = logistic_regression(x, y, 3, weight_decay=1e-2)
    for k in range(3):
        alone = logistic_regression(x, y[:, k : k + 1], 1, weight_decay=1e-2)
        torch.testing.assert_close(together.weight[k : k + 1], alone.weight, atol=2e-3, rtol=0)


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
    out_file = tmp_path / "probe.json"
    data = ["data=synthetic", "data.train_size=256", "data.test_size=128"]
    probe(["--checkpoint", str(path), "--blocks", "0", "--k", "5", "--out", str(out_file), *data])
    out = capsys.readouterr().out
    assert "32-dim features (pooled) of 192 training and 128 test images" in out  # 256 less 64 held out for validation
    results = json.loads(out_file.read_text())
    best, knn5 = results["linear"]["best"]["test_acc"], results["knn"]["accuracy"]["5"]
    assert best > 0.4 and knn5 > 0.4  # 4 classes: chance is 25%
    assert f"{best:.2%}" in out.splitlines()[-3] and out.splitlines()[-2].endswith(f"{knn5:.2%}")
    assert len([line for line in out.splitlines() if line.startswith("linear ")]) == len(WEIGHT_DECAYS) + 1
    # normalised with the file's mean and std (pixels to [-1, 1]), not synthetic data's std 0.25 (to [-2, 2])
    assert max(x.abs().max().item() for x in inputs) <= 1.0 < max(x.abs().max().item() * 2 for x in inputs)


def test_the_command_line_probes_data_of_several_labels_per_image_by_map(tmp_path, capsys, monkeypatch):
    # two decays, not seven: the weakest take L-BFGS hundreds of steps, seconds here that test nothing more
    monkeypatch.setattr(vit.cli.probe, "sweep_linear", partial(sweep_linear, weight_decays=(1e-2, 1.0)))
    model = perturb_(VisionTransformer(tiny_config(num_classes=4)))
    path = tmp_path / "model.safetensors"
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
    out_file = tmp_path / "probe.json"
    data = ["data=synthetic", "data.multilabel=true", "data.train_size=256", "data.test_size=128"]
    probe(["--checkpoint", str(path), "--blocks", "0", "--k", "5", "--out", str(out_file), *data])
    out = capsys.readouterr().out
    assert "probe    setting              held-out mAP  test mAP" in out
    results = json.loads(out_file.read_text())
    best, knn5 = results["linear"]["best"]["test_map"], results["knn"]["map"]["5"]
    assert best > 0.5 and knn5 > 0.5  # each class is in ~0.3 of the images: a score unrelated to them gets ~0.3
    assert f"{best:.2%}" in out.splitlines()[-3] and out.splitlines()[-2].endswith(f"{knn5:.2%}")


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
    assert str(exit.value) == f"error: image folder not found: data.root={tmp_path / 'nowhere'} does not exist"


@pytest.mark.parametrize(
    ("override", "says", "status"),
    [
        ("data.imgsize=20", r"^Could not override 'data\.imgsize'\.", 1),  # Hydra's exceptions were tracebacks
        ("data=synthetc", r"^In 'train': Could not find 'data/synthetc'", 1),
        (
            "data.in_chans=1",
            r"^config error: data\.in_chans=1, but \S+ reads 3-channel images: add data\.in_chans=3$",
            2,
        ),
        ("data=imagefolder", r"^config error: .*Missing mandatory value: data\.root", 2),  # was OmegaConf's traceback
    ],
)
def test_data_overrides_the_probe_cannot_use_are_one_line(tmp_path, capsys, override, says, status):
    """A 1-channel dataset against an RGB model ran: normalising with 3 means broadcast each image to 3 channels."""
    path = tmp_path / "model.safetensors"
    to_safetensors(Loaded(VisionTransformer(tiny_config(num_classes=4)), (0.5,) * 3, (0.5,) * 3, None, path), path)
    overrides = ["data=synthetic", "data.train_size=128", override] if override.startswith("data.") else [override]
    line, code = refusal(capsys, ["--checkpoint", str(path), *overrides])
    assert code == status and re.search(says, line), line


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["model.depth=abc", "optim.lr=nan"], r"^model\.depth: the probe reads the network in \S+ as it is; drop"),
        (["optim.lr=nan"], r"^optim\.lr=nan: must be a finite number$"),
        (["data.batch_size=-5"], r"^data\.batch_size=-5: must be a positive whole number$"),
        (["data.img_size=0"], r"^data\.img_size=0: must be a positive whole number$"),  # was torch's interpolation
        (["seed=-1"], r"^seed=-1: must be a whole number from 0 to 4294967295"),
    ],
)
def test_the_probe_checks_the_config_as_train_py_does(tmp_path, capsys, overrides, says):
    """It ran none of train.py's checks: model.depth=abc optim.lr=nan data.batch_size=-5 exited 0 with a result."""
    path = tmp_path / "model.safetensors"
    to_safetensors(Loaded(VisionTransformer(tiny_config(num_classes=4)), (0.5,) * 3, (0.5,) * 3, None, path), path)
    line, code = refusal(capsys, ["--checkpoint", str(path), "data=synthetic", "data.train_size=128", *overrides])
    assert code == 2 and re.search(says, line.removeprefix("config error: ")) and line.startswith("config error: ")


def refusal(capsys, args: list[str]) -> tuple[str, int]:
    """The probe's refusal as a user sees it: its line on stderr and its exit status (SystemExit(text) prints the
    text and exits with 1)."""
    with pytest.raises(SystemExit) as refused:
        probe(args)
    code = refused.value.code
    return (code, 1) if isinstance(code, str) else (capsys.readouterr().err.strip(), code)


@pytest.mark.parametrize("k", ["0", "-3", "2.5"])
def test_a_k_that_is_not_a_positive_whole_number_is_refused_before_loading(k, capsys):
    """The same rule and words as predict's --top-k (vit.cli.predict.positive); the checkpoint is never opened."""
    with pytest.raises(SystemExit) as refused:
        probe(["--checkpoint", "/nonexistent.safetensors", "--k", k])
    assert refused.value.code == 2
    assert f"argument --k: {k!r} is not a positive whole number" in capsys.readouterr().err


def test_knn_at_several_k_is_knn_at_each():
    train, test = _clusters(300, 5), _clusters(100, 5, seed=2)
    train = (train[0], torch.where(torch.arange(300) % 3 == 0, (train[1] + 1) % 5, train[1]))  # noisy labels: k matters
    many = knn_at(train, test, 5, (1, 10, 50, 1000))
    assert many == {k: knn(train, test, 5, k=k) for k in (1, 10, 50, 1000)}
    assert len(set(many.values())) > 1


def test_the_sweep_chooses_on_the_held_out_part_and_refits_on_all():
    def mostly_class_0(n, seed):  # so that a probe regularised to nothing but its bias says 0 and scores ~80%
        x, y = _clusters(n, 3, seed=seed)
        keep = (y == 0) | (torch.arange(n) % 8 == 0)
        return x[keep], y[keep]

    train, test = mostly_class_0(600, 3), mostly_class_0(300, 4)
    swept = sweep_linear(train, test, 3, weight_decays=(1e4, 1e-4, 1e-2))
    best = swept["best"]
    assert swept["settings"][0]["held_out_acc"] < best["held_out_acc"] == 1.0
    assert best["weight_decay"] == 1e-4  # the first of the equals
    assert best["test_acc"] == linear_probe(train, test, 3, best["weight_decay"])


def test_block_features_are_the_last_layers_normed_class_tokens_and_the_mean_patch():
    model = perturb_(VisionTransformer(tiny_config(depth=3))).eval()
    images, labels = torch.randn(4, 3, 16, 16), torch.arange(4)
    x, y = block_features(model, [(images, labels)], blocks=2, avgpool=True)
    with torch.no_grad():
        tokens, layers = model.forward_intermediates(images, norm=True, output_fmt="NLC", return_prefix_tokens=True)
    expected = torch.cat([layers[1][1][:, 0], layers[2][1][:, 0], layers[2][0].mean(1)], dim=-1)
    assert x.shape == (4, 3 * 32) and torch.equal(y, labels)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(x[:, 32:64], tokens[:, 0])  # the last layer's normed class token


def test_blocks_beyond_the_networks_depth_are_refused_before_any_image_is_read(tmp_path, monkeypatch, capsys):
    """--blocks 1000000000 grew to 21 GB building the index set of a billion layers, until the kernel killed it."""
    path = tmp_path / "model.safetensors"
    to_safetensors(Loaded(VisionTransformer(tiny_config(num_classes=4)), (0.5,) * 3, (0.5,) * 3, None, path), path)
    monkeypatch.setattr(vit.cli.probe, "compose", _never)  # the config and the data come after the check
    line, code = refusal(capsys, ["--checkpoint", str(path), "--blocks", "1000000000", "data=synthetic"])
    said = "error: blocks=1000000000: the network has 2 layer(s): give 1 to 2, or 0 for the pooled features"
    assert (line, code) == (said, 1)
    with pytest.raises(ValueError, match=r"^blocks=1000000000: the network has 2 layer"):  # the library's own guard
        block_features(VisionTransformer(tiny_config()), iter(_never, None), blocks=10**9)  # batches never read


def _never(*args, **kwargs):
    raise AssertionError("reached")


@pytest.mark.parametrize("out", ["folder", "file.json/probe.json"])
def test_an_out_that_cannot_be_written_is_refused_before_the_checkpoint_is_read(tmp_path, capsys, out):
    """The traceback came after the features were computed, and they were lost."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.json").write_text("")
    line, code = refusal(capsys, ["--checkpoint", str(tmp_path / "absent.safetensors"), "--out", str(tmp_path / out)])
    error = "IsADirectoryError: [Errno 21] Is a directory" if out == "folder" else "FileExistsError: [Errno 17] File"
    assert code == 1 and line.startswith(f"--out {tmp_path / out}: could not be written ({error}"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.json", "folder"] and not any(
        (tmp_path / "folder").iterdir()
    )
