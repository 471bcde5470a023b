import pickle
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.helpers import tiny_run
from vit.checkpoint import CheckpointError, load, read
from vit.module import DATA_FACTS, ViTClassifier
from vit.training import train


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
