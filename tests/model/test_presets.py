"""Contract tests over every preset in conf/model/: what any registered model must do."""

from dataclasses import fields

import pytest
import torch
from omegaconf import OmegaConf

from vit import ConfigError, ViTConfig, create_model, list_presets, preset_config
from vit.model.presets import conf_dir

PRESETS = list_presets()

# Dosovitskiy et al. 2021 Table 1, and DeiT (Touvron et al. 2021) for Ti and S: (D, depth, heads, parameters)
PAPER = {
    "vit_tiny_16": (192, 12, 3, 5.7e6),
    "vit_small_16": (384, 12, 6, 22.1e6),
    "vit_base_16": (768, 12, 12, 86.6e6),
    "vit_large_16": (1024, 24, 16, 304.3e6),
}


def test_presets_exist():
    assert {
        "vit_tiny_16",
        "vit_small_16",
        "vit_base_16",
        "vit_large_16",
        "vit_cifar",
        "vit_fashion_mnist",
    } <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_yaml_keys_equal_config_fields(name):
    keys = set(OmegaConf.load(conf_dir() / "model" / f"{name}.yaml")) - {"_target_"}
    assert keys == {f.name for f in fields(ViTConfig)}


# ViT-L is the same code at 24 layers and 1024 wide: the slow run (CI's test-slow) builds it too
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "vit_large_16" else n for n in PRESETS]
)
def test_preset_builds_runs_and_every_parameter_learns(name):
    model = create_model(name)
    c = model.config
    images = torch.randn(1, c.in_chans, *c.img_size)
    logits = model(images)
    assert logits.shape == (1, c.num_classes)
    logits.square().mean().backward()
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not no_grad, f"parameters without gradient: {no_grad}"


@pytest.mark.parametrize(("name", "paper"), PAPER.items())
def test_paper_variants_have_the_papers_sizes(name, paper):
    c = preset_config(name)
    dim, depth, heads, params = paper
    assert (c.embed_dim, c.depth, c.num_heads, c.img_size, c.patch_size) == (
        dim,
        depth,
        heads,
        (224, 224),
        (16, 16),
    )
    with torch.device("meta"):
        n = sum(p.numel() for p in create_model(name).parameters())
    assert n == pytest.approx(params, rel=0.01)


def test_create_model_applies_overrides():
    model = create_model("vit_cifar", num_classes=100, pos_embed="sincos2d", pool="avg")
    assert model.config.num_classes == 100 and model.config.pos_embed == "sincos2d" and model.cls_token is None


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown model preset 'vit_huge_99'.*vit_base_16"):
        create_model("vit_huge_99")


def test_bad_override_names_the_field_and_the_preset():
    with pytest.raises(ConfigError, match=r"vit_cifar.*ViTConfig\.embed_dim=100 is not divisible by num_heads=6"):
        create_model("vit_cifar", embed_dim=100)
