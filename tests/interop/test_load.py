import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import tiny_config, tiny_run, write_image_folder
from vit.checkpoint import CheckpointError, load, read
from vit.data.encoded.imagefolder import ImageFolderDataModule
from vit.data.facts import DATA_FACTS
from vit.data.memory.synthetic import SyntheticDataModule
from vit.interop.load import MODEL_PREFIX
from vit.model import VisionTransformer
from vit.training.module import ViTClassifier
from vit.training.run import train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    results = train(tiny_run(tmp_path_factory.mktemp("run"), "trainer.max_epochs=1"))
    return results["best_checkpoint"]


def test_load_gives_the_trained_model_and_the_data_it_was_trained_on(run):
    loaded = load(run)
    module = ViTClassifier.load_from_checkpoint(run, weights_only=True).eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), module(images), rtol=0, atol=0)
    assert not loaded.model.training
    assert loaded.mean == (0.5, 0.5, 0.5) and loaded.std == (0.25, 0.25, 0.25)  # synthetic data's, per channel
    assert loaded.classes == ("class_0", "class_1", "class_2", "class_3")
    assert torch.load(run, weights_only=True)[DATA_FACTS]["classes"] == list(loaded.classes)


def test_preprocess_covers_the_model_input_then_normalizes(run):
    loaded = load(run)
    image = Image.new("RGB", (48, 32), (255, 0, 128))  # wider than tall: resized to 24x16, centre-cropped
    x = loaded.preprocess(image)
    assert x.shape == (1, 3, 16, 16)
    expected = (torch.tensor([1.0, 0.0, 128 / 255]) - 0.5) / 0.25
    torch.testing.assert_close(x[0, :, 8, 8], expected)


def save_checkpoint(path: Path, config, facts: dict) -> Path:
    """A file in the layout of our Lightning checkpoints: the model's config, its weights, the data facts."""
    weights = {MODEL_PREFIX + k: v for k, v in VisionTransformer(config).state_dict().items()}
    torch.save({"hyper_parameters": {"model": config.to_dict()}, "state_dict": weights, DATA_FACTS: facts}, path)
    return path


def test_preprocess_frames_an_image_as_image_folder_evaluation_did(tmp_path):
    """Image folders evaluate on a bilinear resize to img_size / crop_pct and a centre crop; preprocess used
    to cover img_size with a bicubic resize, so prediction saw more of each image than evaluation had."""
    write_image_folder(tmp_path, {"ant": 2, "bee": 2}, "train")
    write_image_folder(tmp_path, {"ant": 1}, "val")
    data = ImageFolderDataModule(root=str(tmp_path), num_classes=2, img_size=32, crop_pct=0.8, num_workers=0)
    data.setup()
    path = save_checkpoint(tmp_path / "folder.ckpt", tiny_config(img_size=32, num_classes=2), data.facts())
    loaded = load(path)
    assert (loaded.crop_pct, loaded.interpolation) == (0.8, "bilinear")
    noise = np.random.default_rng(0).integers(0, 256, (45, 71, 3), dtype=np.uint8)  # wider than tall, odd sides
    image = Image.fromarray(noise)
    pixels = data._transform(train=False)(image)  # (3, 32, 32) uint8, normalised on the device
    evaluation, _ = data.on_after_batch_transfer((pixels[None], torch.zeros(1)), 0)
    torch.testing.assert_close(loaded.preprocess(image), evaluation, rtol=0, atol=1e-5)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("img_size", [24, 12])  # enlarging 16x16 images, as CIFAR at 224; shrinking them
def test_preprocess_frames_an_image_as_in_memory_evaluation_did(tmp_path, channels, img_size):
    """In-memory data (Fashion-MNIST, CIFAR) resize uint8 batches on the device; prediction resizes image
    files with PIL, whose filter the data facts name. Evaluation used torch's bicubic, which differs from
    PIL's (another cubic, no antialiasing when enlarging, no 8-bit clipping between passes) by up to 30 grey
    levels. Now both give the same 8-bit pixels, but for PIL's fixed-point arithmetic: one grey level at most."""
    data = SyntheticDataModule("data", num_classes=2, in_chans=channels, img_size=img_size)
    path = save_checkpoint(
        tmp_path / "memory.ckpt", tiny_config(img_size=img_size, in_chans=channels, num_classes=2), data.facts()
    )
    loaded = load(path)
    noise = torch.randint(0, 256, (1, channels, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    evaluation, _ = data.on_after_batch_transfer((noise, torch.zeros(1)), 0)  # (1, C, img_size, img_size)
    image = Image.fromarray(noise[0].permute(1, 2, 0).squeeze(-1).numpy())  # mode L or RGB, 16x16
    one_level = 1 / (255 * data.std[0])
    torch.testing.assert_close(loaded.preprocess(image), evaluation, rtol=0, atol=one_level + 1e-5)


def test_a_checkpoint_gives_back_the_data_facts_training_wrote(tmp_path):
    """Data modules and loaded checkpoints build the facts with one function (vit.data.loading.data_facts), so
    what a checkpoint gives back, and an export copies, is what training wrote, key for key."""
    data = SyntheticDataModule("data", num_classes=2, in_chans=1, img_size=16)
    path = save_checkpoint(tmp_path / "m.ckpt", tiny_config(in_chans=1, num_classes=2), data.facts())
    assert load(path).facts() == data.facts() == torch.load(path, weights_only=True)[DATA_FACTS]
    assert list(data.facts()) == [
        *("mean", "std", "classes", "crop_pct", "crop_mode", "interpolation", "max_tokens", "input_size", "multilabel")
    ]


def test_checkpoints_without_framing_facts_cover_the_input_with_bicubic(run, tmp_path):
    contents = torch.load(run, weights_only=True)
    assert (contents[DATA_FACTS]["crop_pct"], contents[DATA_FACTS]["interpolation"]) == (1.0, "bicubic")  # in memory
    for key in ("crop_pct", "crop_mode", "interpolation"):
        del contents[DATA_FACTS][key]  # as in files written before they were recorded
    torch.save(contents, tmp_path / "old.ckpt")
    loaded = load(tmp_path / "old.ckpt")
    assert (loaded.crop_pct, loaded.crop_mode, loaded.interpolation) == (1.0, "center", "bicubic")


@pytest.mark.parametrize(("key", "value"), [("crop_pct", 0.0), ("crop_pct", 1.5), ("interpolation", "cubic")])
def test_framing_facts_that_cannot_be_used_name_the_file_and_the_key(tmp_path, key, value):
    facts = {"crop_pct": 0.875, "interpolation": "bilinear", key: value}
    path = save_checkpoint(tmp_path / "odd.ckpt", tiny_config(), facts)
    with pytest.raises(CheckpointError, match=rf"odd\.ckpt: {DATA_FACTS}\.{key}='?{value}'? is not"):
        load(path)


def _set(contents, where, value):
    *path, last = where.split("/")
    for key in path:
        contents = contents[key]
    contents[last] = value


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("hyper_parameters", [1, 2], r"hyper_parameters is a list, not a mapping"),
        ("hyper_parameters/model", [1, 2], r"hyper_parameters\.model is a list, not a mapping"),
        ("state_dict", [1, 2], r"state_dict is a list, not a mapping"),
        (DATA_FACTS, [1, 2], rf"{DATA_FACTS} is a list, not a mapping"),
        (f"{DATA_FACTS}/classes", ["a", "b"], rf"{DATA_FACTS}\.classes names 2 classes, the model has 4"),
        (f"{DATA_FACTS}/classes", list("abcdef"), rf"{DATA_FACTS}\.classes names 6 classes, the model has 4"),
        (f"{DATA_FACTS}/crop_pct", "0.9", rf"{DATA_FACTS}\.crop_pct='0\.9' is not a number"),
        (f"{DATA_FACTS}/mean", "abc", rf"{DATA_FACTS}\.mean='abc' is not a list of numbers"),
        (f"{DATA_FACTS}/std", [0.0], rf"{DATA_FACTS}\.std=\[0\.0\] must be finite and > 0$"),  # NaN logits, no word
        (f"{DATA_FACTS}/mean", [float("nan")], rf"{DATA_FACTS}\.mean=\[nan\] must be finite$"),
        (f"{DATA_FACTS}/crop_mode", 3, rf"{DATA_FACTS}\.crop_mode=3 is not a name$"),
    ],
)
def test_a_malformed_entry_is_named_not_a_traceback(run, tmp_path, where, value, says):
    """Files written by hand or by other code: each was an IndexError, TypeError or AttributeError in a reader
    (a short class list only when predict named a class past its end)."""
    contents = torch.load(run, weights_only=True)
    _set(contents, where, value)
    torch.save(contents, tmp_path / "odd.ckpt")
    with pytest.raises(CheckpointError, match=rf"odd\.ckpt: .*{says}"):
        load(tmp_path / "odd.ckpt")


def test_a_truncated_checkpoint_is_an_error_naming_the_file(run, tmp_path):
    broken = tmp_path / "broken.ckpt"
    data = Path(run).read_bytes()
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"broken\.ckpt: not a readable checkpoint"):
        load(broken)
    with pytest.raises(CheckpointError, match=r"absent\.ckpt: no such checkpoint file"):
        load(tmp_path / "absent.ckpt")


class Payload:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['VIT_PWNED']).touch()",))


def test_a_checkpoint_that_would_run_code_is_refused_and_the_code_never_runs(run, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("VIT_PWNED", str(marker))
    contents = torch.load(run, weights_only=True)
    contents["hyper_parameters"]["extra"] = Payload()
    evil = tmp_path / "evil.ckpt"
    torch.save(contents, evil)
    with pytest.raises(CheckpointError, match=r"evil\.ckpt: refused"):
        load(evil)
    assert not marker.exists()
    with open(evil, "wb") as f:  # a bare pickle, not torch's zip format
        pickle.dump(Payload(), f, protocol=2)
    with pytest.raises(CheckpointError, match=r"evil\.ckpt"):
        read(evil)
    assert not marker.exists()


def test_a_checkpoint_of_something_else_is_refused_with_what_is_missing(tmp_path):
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, other)
    with pytest.raises(CheckpointError, match=r"other\.ckpt: not a ViT checkpoint of a known kind"):
        load(other)


def test_weights_that_do_not_fit_the_described_model_are_listed(run, tmp_path):
    contents = torch.load(run, weights_only=True)
    del contents["state_dict"]["model.head.bias"]
    contents["state_dict"]["model.extra"] = torch.zeros(1)
    bad = tmp_path / "bad.ckpt"
    torch.save(contents, bad)
    with pytest.raises(CheckpointError, match=r"bad\.ckpt: .*missing \['head.bias'\], unexpected \['extra'\]"):
        load(bad)
