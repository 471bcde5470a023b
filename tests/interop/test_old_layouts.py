"""Checkpoints and exports written before each architectural choice became one ViTConfig field still load and
compute what they did. The files in old_layouts/ were written by the code of that time (45c4a10) from tiny runs on a
folder of random images, with the logits they gave for two fixed inputs (expected.pt):

- old_layout.ckpt: a training checkpoint of `model.rope=true model.fc_norm=true model.rel_pos=mlp
  model.rel_pos_shared=true model.norm=res_post`, and old_layout.safetensors, its export;
- old_parallel_rope_mixed.ckpt: `model.pos_embed=rope2d model.rope_mixed=true model.parallel=true`;
- old_timm_folder: a plain model's `--format timm` export;
- old_naflex.ckpt: a `model.naflex=true data.max_tokens=16` run, its table resampled by `pos_resample=bilinear
  pos_resample_square=true`;
- old_lora.ckpt: `finetune=lora` from old_lora_start.ckpt (`model.diff_attn=true`), holding only what learned.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from vit.checkpoint import load
from vit.interop.frozen import FROZEN

OLD = Path(__file__).parent / "old_layouts"
EXPECTED = torch.load(OLD / "expected.pt", weights_only=True)


@pytest.mark.parametrize(
    ("name", "means"),
    [
        ("old_layout.ckpt", dict(pos_embed="learned+rope2d", final_norm="pooled", rel_pos="mlp_shared")),
        ("old_layout.safetensors", dict(pos_embed="learned+rope2d", layer="res_post")),
        ("old_parallel_rope_mixed.ckpt", dict(pos_embed="rope_mixed", layer="parallel")),
        ("old_timm_folder", dict(pos_embed="learned", layer="pre")),
        ("old_naflex.ckpt", dict(pos_resample=dict(mode="bilinear", antialias=True, corners=False, square=True))),
    ],
)
def test_an_older_checkpoint_or_export_loads_and_computes_what_it_did(name, means):
    loaded = load(OLD / name)
    saved = loaded.config.to_dict()
    assert {k: saved[k] for k in means} == means
    with torch.no_grad():
        assert torch.equal(loaded.model(EXPECTED["images"]), EXPECTED["logits"][name])


def test_an_older_naflex_run_still_reads_images_at_their_own_aspect_ratio():
    loaded = load(OLD / "old_naflex.ckpt")
    assert loaded.max_tokens == 16  # what model.naflex meant is the data's record


def test_an_older_lora_run_rebuilds_its_frozen_weights_from_its_start(tmp_path):
    """Its frozen rest comes from the pretrained file it names, an older layout too (diff_attn); the record names
    where that file was when the run was made, so the test moves both and says where it is now."""
    start = shutil.copy(OLD / "old_lora_start.ckpt", tmp_path / "start.ckpt")
    contents = torch.load(OLD / "old_lora.ckpt", weights_only=True)
    contents[FROZEN]["from"] = {"path": str(start)}
    torch.save(contents, tmp_path / "lora.ckpt")
    loaded = load(tmp_path / "lora.ckpt")
    assert loaded.config.attention == "differential" and loaded.config.table == "sincos2d"
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(EXPECTED["images"]), EXPECTED["logits"]["old_lora.ckpt"])
