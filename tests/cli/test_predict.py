"""`python -m vit.cli.predict` on a timm state dict, with the preset it needs, and on a model without a classifier
(a feature extractor such as Hugging Face's ViTModel), which it refuses, on images Pillow refuses, and on a model of
several labels per image, whose classes it lists by their thresholds."""

import re
from dataclasses import replace

import pytest
import torch
from PIL import Image

from tests.helpers import perturb_, tiny_config, write_timm
from vit.checkpoint import Loaded
from vit.cli.export import to_safetensors
from vit.cli.predict import main as predict
from vit.cli.predict import read_image
from vit.interop.loaded import MULTILABEL
from vit.model import VisionTransformer


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "image.png"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(path)
    return str(path)


def test_a_timm_file_is_classified_with_the_preset_named(tmp_path, image, capsys):
    checkpoint = write_timm(tmp_path / "timm.safetensors")
    with pytest.raises(SystemExit, match=r"timm\.safetensors: a timm state dict does not record the number of heads"):
        predict(["--checkpoint", checkpoint, image])
    predict(["--checkpoint", checkpoint, "--preset", "vit_fashion_mnist", "--top-k", "2", image])
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{image}: class ") and line.count("%") == 2
    with pytest.raises(SystemExit, match=r"unknown model preset 'no_such'; known: .*vit_fashion_mnist"):
        predict(["--checkpoint", checkpoint, "--preset", "no_such", image])


def test_a_model_without_a_classifier_is_refused(exported, image):
    checkpoint = exported("backbone.safetensors", num_classes=0)  # e.g. a Hugging Face ViTModel
    with pytest.raises(SystemExit, match=r"backbone\.safetensors: the model has no classification head"):
        predict(["--checkpoint", checkpoint, image])


def test_an_image_pillow_refuses_is_one_line_and_the_others_are_classified(
    exported, image, tmp_path, monkeypatch, capsys
):
    small = tmp_path / "small.png"
    Image.new("RGB", (10, 10)).save(small)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # over twice this, Pillow refuses a decompression bomb
    with pytest.raises(SystemExit) as exit:
        predict(["--checkpoint", exported(), image, str(small)])
    assert exit.value.code == 1
    out, err = capsys.readouterr()
    assert re.fullmatch(rf"{re.escape(image)}: not a readable image: Image size \(1200 pixels\) .*bomb.*\n", err)
    assert out.startswith(f"{small}: class ")


@pytest.mark.parametrize("top_k", ["0", "-1", "two"])
def test_top_k_must_be_a_positive_whole_number(tmp_path, image, top_k, capsys):
    with pytest.raises(SystemExit) as exit:
        predict(["--checkpoint", "unused.ckpt", "--top-k", top_k, image])
    assert exit.value.code == 2  # argparse's usage error, before any file is read
    assert f"argument --top-k: {top_k!r} is not a positive whole number" in capsys.readouterr().err


def test_a_multi_label_model_lists_each_class_that_reaches_its_threshold(tmp_path, image, capsys):
    """Each class's own sigmoid against its own threshold: the two least probable classes are set to just reach
    theirs, the two most probable to just miss theirs, so neither a softmax nor one threshold for all gives this."""
    model = perturb_(VisionTransformer(tiny_config(num_classes=4))).eval()
    path = tmp_path / "tags.safetensors"
    plain = Loaded(model, (0.5,) * 3, (0.5,) * 3, ("cat", "dog", "sky", "sea"), path)
    with torch.no_grad():
        probabilities = plain.logits(plain.preprocess(read_image(image))).sigmoid()[0].tolist()
    order = sorted(range(4), key=lambda k: probabilities[k])
    reach = order[:2]
    assert probabilities[order[1]] < probabilities[order[2]]  # apart: no one threshold splits them this way
    thresholds = tuple(p if k in reach else min(1.0, p + 1e-3) for k, p in enumerate(probabilities))
    to_safetensors(replace(plain, task=MULTILABEL, thresholds=thresholds), path)
    predict(["--checkpoint", str(path), "--top-k", "1", image])  # top-k is single-label's
    listed = ", ".join(f"{plain.classes[k]} {probabilities[k]:.1%}" for k in reversed(reach))
    assert capsys.readouterr().out == f"{image}: {listed}\n"
    to_safetensors(replace(plain, task=MULTILABEL, thresholds=(1.0,) * 4), path)
    predict(["--checkpoint", str(path), image])
    assert capsys.readouterr().out == f"{image}: no class reaches its threshold\n"
