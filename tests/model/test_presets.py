"""Contract tests over every preset in conf/model/: what any registered model must do."""

import re
from dataclasses import fields

import pytest
import torch
from omegaconf import OmegaConf

from vit import ConfigError, ViTConfig, create_model, list_presets, preset_config
from vit.model.config import Resampling, RopeGrid
from vit.model.presets import conf_dir

PRESETS = list_presets()

# Every preset's architecture, written out: (img_size, patch_size, in_chans, num_classes, embed_dim, depth,
# num_heads, mlp_ratio, pos_embed, pool). Dosovitskiy et al. 2021 Table 1, and DeiT (Touvron et al. 2021) for
# Ti and S; the CIFAR and Fashion-MNIST models from benchmarks/RESULTS.md.
ARCHITECTURE = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio")
ARCHITECTURE += ("pos_embed", "pool", "class_token")
TABLE = {
    "vit_tiny_16": ((224, 224), (16, 16), 3, 1000, 192, 12, 3, 4.0, "learned", "token", True),
    "vit_small_16": ((224, 224), (16, 16), 3, 1000, 384, 12, 6, 4.0, "learned", "token", True),
    "vit_base_16": ((224, 224), (16, 16), 3, 1000, 768, 12, 12, 4.0, "learned", "token", True),
    "vit_large_16": ((224, 224), (16, 16), 3, 1000, 1024, 24, 16, 4.0, "learned", "token", True),
    "vit_huge_14": ((224, 224), (14, 14), 3, 1000, 1280, 32, 16, 4.0, "learned", "token", True),
    "vit_giant_14": ((224, 224), (14, 14), 3, 1000, 1408, 40, 16, 48 / 11, "learned", "token", True),
    "dinov2_giant_14": ((518, 518), (14, 14), 3, 1000, 1536, 40, 24, 8 / 3, "learned", "token", True),
    "eva02_large_14": ((224, 224), (14, 14), 3, 1000, 1024, 24, 16, 8 / 3, "learned", "avg", True),
    "vit_cifar": ((32, 32), (4, 4), 3, 10, 384, 7, 6, 2.0, "learned", "token", True),
    "vit_fashion_mnist": ((28, 28), (7, 7), 1, 10, 64, 4, 1, 2.0, "learned", "avg", False),
    "dinov2_small_14": ((518, 518), (14, 14), 3, 1000, 384, 12, 6, 4.0, "learned", "token", True),
    "dinov2_small_14_reg4": ((518, 518), (14, 14), 3, 1000, 384, 12, 6, 4.0, "learned", "token", True),
    "clip_base_16": ((224, 224), (16, 16), 3, 1000, 768, 12, 12, 4.0, "learned", "token", True),
    "siglip_base_16": ((224, 224), (16, 16), 3, 1000, 768, 12, 12, 4.0, "learned", "map", False),
    "deit3_small_16": ((224, 224), (16, 16), 3, 1000, 384, 12, 6, 4.0, "learned", "token", True),
    "eva02_small_14": ((224, 224), (14, 14), 3, 1000, 384, 12, 6, 8 / 3, "learned", "avg", True),
}
# the families' switches, as timm's architectures of the same names set them (tests/interop/test_timm_families.py
# checks the switches compute timm's function)
EVA_ROPE = RopeGrid(axes="yx", ref_grid=(16, 16))
FAMILY = {
    "dinov2_small_14": dict(layer_scale_init=1e-5),
    "dinov2_small_14_reg4": dict(layer_scale_init=1e-5, reg_tokens=4, pos_embed_prefix=False),
    "clip_base_16": dict(patch_bias=False, embed_norm=True, norm_eps=1e-5),
    "siglip_base_16": dict(act="gelu_tanh"),
    "deit3_small_16": dict(layer_scale_init=1e-6, pos_embed_prefix=False),
    "eva02_small_14": dict(act="swiglu", pos_embed="learned+rope2d", rope=EVA_ROPE, final_norm="pooled"),
    "dinov2_giant_14": dict(layer_scale_init=1e-5, act="swiglu"),
    "eva02_large_14": dict(act="swiglu", pos_embed="learned+rope2d", rope=EVA_ROPE, final_norm="pooled", mlp_norm=True),
}
# and what every preset shares: no regularisation (experiments add it), timm's norm and position settings, the
# classic ViT's layer (none of the later families' switches)
SHARED = {
    "reg_tokens": 0,
    "distill_token": False,
    "pos_embed_prefix": True,
    "pos_resample": Resampling(),
    "patch_bias": True,
    "patch_norm": False,
    "embed_norm": False,
    "norm_layer": "layernorm",
    "qk_norm": False,
    "attn_norm": False,
    "mlp_norm": False,
    "act": "gelu",
    "proj_bias": True,
    "qkv_bias": True,
    "pos_temperature": 10000.0,
    "layer": "pre",
    "attention": "softmax",
    "norm_eps": 1e-6,
    "dropout": 0.0,
    "attn_dropout": 0.0,
    "drop_path": 0.0,
    "head_dropout": 0.0,
    "layer_scale_init": None,
    "layer_scale_attn_only": False,
    "kv_heads": None,
    "rope": RopeGrid(),
    "rel_pos": "none",
    "rel_pos_dim": 512,
    "final_norm": "tokens",
    "pool_heads": None,
    "pool_prefix": False,
    "pool_mlp_ratio": None,
}
# (parameters at 224 px, from the papers: ViT-g/14's 1,011M without its head; DINOv2-g's and EVA-02-L's as timm's
# vit_giant_patch14_dinov2 and eva02_large_patch14_224 count them at 1000 classes)
PAPER_PARAMETERS = {
    "vit_tiny_16": 5.7e6,
    "vit_small_16": 22.1e6,
    "vit_base_16": 86.6e6,
    "vit_large_16": 304.3e6,
    "vit_huge_14": 632e6,
    "vit_giant_14": 1011e6,
    "dinov2_giant_14": 1138e6,
    "eva02_large_14": 304.3e6,
}


def test_the_table_lists_every_preset():
    assert set(TABLE) == set(PRESETS)
    assert set(ARCHITECTURE) | set(SHARED) == {f.name for f in fields(ViTConfig)}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_the_table(name):
    expected = {**dict(zip(ARCHITECTURE, TABLE[name], strict=True)), **SHARED, **FAMILY.get(name, {})}
    config = preset_config(name)
    assert {f.name: getattr(config, f.name) for f in fields(ViTConfig)} == expected


@pytest.mark.parametrize("name", PRESETS)
def test_preset_states_only_fields_that_differ_from_the_defaults(name):
    stated = OmegaConf.to_container(OmegaConf.load(conf_dir() / "model" / f"{name}.yaml"))
    declared = {f.name: f.default for f in fields(ViTConfig)}  # class_token's None resolves against the pool
    assert set(stated) <= set(declared)
    assert [k for k, v in stated.items() if v == declared[k]] == []


# At a 2 x 2 patch grid: the tokens set the cost, not the code (timm parity runs ViT-Ti at 224 px). ViT-L, the
# same code at 24 layers and 1024 wide, takes 8 s to initialise: the slow run (CI's test-slow) builds it too. The
# presets past ViT-L (for trainer=fsdp) are the same code again at 0.3-1.1B parameters: their shapes are checked
# above and by their parameter counts, on the meta device.
LARGE = ("vit_huge_14", "vit_giant_14", "dinov2_giant_14", "eva02_large_14")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "vit_large_16" else n for n in PRESETS if n not in LARGE]
)
def test_preset_builds_runs_and_every_parameter_learns(name):
    model = create_model(name, img_size=[2 * side for side in preset_config(name).patch_size])
    c = model.config
    images = torch.randn(1, c.in_chans, *c.img_size)
    logits = model(images)
    assert logits.shape == (1, c.num_classes)
    logits.square().mean().backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not no_grad, f"parameters without gradient: {no_grad}"


@pytest.mark.parametrize(("name", "parameters"), PAPER_PARAMETERS.items())
def test_paper_variants_have_the_papers_parameter_counts(name, parameters):
    with torch.device("meta"):
        n = sum(p.numel() for p in create_model(name).parameters())
    assert n == pytest.approx(parameters, rel=0.01)


def test_create_model_applies_overrides():
    model = create_model("vit_cifar", num_classes=100, pos_embed="sincos2d", pool="avg")
    assert model.config.num_classes == 100 and model.config.pos_embed == "sincos2d" and model.cls_token is None


@pytest.mark.parametrize("name", ["vit_huge_99", "../train", "model/vit_cifar"])  # a path read conf/train.yaml
def test_unknown_preset_lists_the_known_ones(name):
    with pytest.raises(ConfigError, match=rf"unknown model preset '{re.escape(name)}'.*vit_base_16"):
        create_model(name)


def test_bad_override_names_the_field_and_the_preset():
    with pytest.raises(ConfigError, match=r"vit_cifar.*ViTConfig\.embed_dim=100 is not divisible by num_heads=6"):
        create_model("vit_cifar", embed_dim=100)
