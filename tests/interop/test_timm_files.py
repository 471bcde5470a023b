"""timm hub folders: pretrained_cfg read as timm's resolve_data_config reads it, images framed as timm's
transform frames them, and config.json entries of the wrong kind refused in one line naming the key. Random weights
built by timm, fp32; no hub is reached."""

import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.models import save_for_hf

from vit.checkpoint import CheckpointError, load

SMALL = dict(embed_dim=64, depth=1, num_heads=4, patch_size=8, img_size=32, num_classes=5)


def _folder(tmp_path, pretrained_cfg=None, drop=(), top=None, **model_args):
    """A timm hub folder of a small ViT, its config.json edited; returns the pretrained_cfg written."""
    save_for_hf(timm.create_model("vit_base_patch16_224", pretrained=False, **SMALL | model_args), str(tmp_path))
    values = json.loads((tmp_path / "config.json").read_text())
    for key in drop:
        values["pretrained_cfg"].pop(key)
    values["pretrained_cfg"].update(pretrained_cfg or {})
    values.update(top or {})
    (tmp_path / "config.json").write_text(json.dumps(values))
    return values["pretrained_cfg"]


def _refused_in_one_line(path, refusal):
    with pytest.raises(CheckpointError, match=refusal) as refused:
        load(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("drop", "edit"),
    [
        (("mean", "std"), {}),  # timm normalises with ImageNet's statistics, not [-1, 1]
        (("crop_pct",), {}),  # timm crops 0.875, not nothing
        ((), dict(mean=None, std=[], crop_pct=0)),  # null, empty, 0: timm's defaults too
    ],
)
def test_preprocessing_a_folder_leaves_out_is_timms_default(tmp_path, drop, edit):
    written = _folder(tmp_path, edit, drop)
    expected = resolve_data_config(pretrained_cfg=written)
    loaded = load(tmp_path)
    assert loaded.mean == pytest.approx(expected["mean"]) and loaded.std == pytest.approx(expected["std"])
    assert (loaded.crop_pct, loaded.interpolation) == (expected["crop_pct"], expected["interpolation"])


@pytest.mark.parametrize(
    ("mode", "img_size"),
    [("center", 32), ("squash", 32), ("center", (32, 48)), ("squash", (32, 48))],  # 35 of timm's checkpoints squash
)
def test_an_image_is_preprocessed_as_timms_transform_frames_it(tmp_path, mode, img_size):
    """'squash' was read as 'center' (pixels 0.84-1.4 apart); a non-square input's resize rounded down where timm's
    ResizeKeepRatio rounds (one row apart at 130x61, logits 0.35)."""
    written = _folder(tmp_path, dict(crop_mode=mode, crop_pct=0.9), img_size=img_size)
    transform = create_transform(**resolve_data_config(pretrained_cfg=written))
    for width, height in ((61, 130), (130, 61), (47, 47)):
        image = Image.fromarray(np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8))
        torch.testing.assert_close(load(tmp_path).preprocess(image), transform(image)[None], atol=1e-6, rtol=0)


def test_a_border_crop_mode_loads_for_fine_tuning_but_preprocessing_is_refused(tmp_path):
    """timm pads the resized image to the input; the network itself computes as timm's, so it still fine-tunes."""
    _folder(tmp_path, dict(crop_mode="border"))
    loaded = load(tmp_path)
    with pytest.raises(CheckpointError, match="crop_mode 'border'") as refused:
        loaded.preprocess(Image.new("RGB", (40, 30)))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("top", "pretrained_cfg", "model_args", "said"),
    [
        (dict(model_args=[1, 2]), {}, {}, r"config\.json: model_args=\[1, 2\] is not a JSON object"),
        (dict(architecture=None), {}, {}, r"config\.json: architecture=None is not a name"),
        (dict(pretrained_cfg="x"), {}, {}, r"config\.json: pretrained_cfg='x' is not a JSON object"),
        ({}, dict(label_names="abcde"), {}, r"label_names='abcde' is not a list of names"),
        ({}, {}, dict(patch_size=0), r"timm cannot build vit_base_patch16_224 with .*'patch_size': 0"),
        ({}, {}, dict(num_heads=0), r"timm cannot build vit_base_patch16_224 with .*'num_heads': 0"),
        ({}, {}, dict(norm_layer="nope"), r"timm cannot build vit_base_patch16_224 with .*'norm_layer': 'nope'"),
    ],
)
def test_a_config_entry_of_the_wrong_kind_is_one_line_naming_it(tmp_path, top, pretrained_cfg, model_args, said):
    _folder(tmp_path, pretrained_cfg, top=top)
    if model_args:
        values = json.loads((tmp_path / "config.json").read_text())
        values["model_args"].update(model_args)
        (tmp_path / "config.json").write_text(json.dumps(values))
    _refused_in_one_line(tmp_path, said)
