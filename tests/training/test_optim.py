import math
from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from tests.helpers import CONF_DIR, tiny_config
from vit.model import VisionTransformer
from vit.model.config import ConfigError
from vit.training.optim import OptimConfig, param_groups, warmup_cosine


def test_weight_decay_only_on_weight_matrices():
    model = VisionTransformer(tiny_config(pool="token", pos_embed="learned"))
    decay, no_decay = param_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert "layers.0.attn.qkv.weight" in decayed and "head.weight" in decayed and "patch_embed.proj.weight" in decayed
    assert not {n for n in decayed if n.endswith(".bias") or "norm" in n or "pos_embed" in n or n == "cls_token"}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_warmup_then_cosine():
    f = warmup_cosine(warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    values = [f(s) for s in range(10, 111)]
    assert values == sorted(values, reverse=True)


def test_yaml_keys_equal_optim_config_fields():
    assert set(OmegaConf.load(CONF_DIR / "optim" / "adamw.yaml")) == {f.name for f in fields(OptimConfig)}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lr": "fast"}, r"key: optim\.lr"),
        ({"lrate": 1.0}, r"key: optim\.lrate"),
        ({"lr": -1.0}, r"optim\.lr must be positive"),
        ({"betas": [0.9]}, r"optim\.betas must be two numbers"),
    ],
)
def test_bad_values_name_the_key(values, message):
    with pytest.raises(ConfigError, match=message):
        OptimConfig.from_dict(values)


def test_layer_decay_gives_each_depth_its_rate():
    model = VisionTransformer(tiny_config(depth=3))
    groups = param_groups(model, 0.05, lr=1.0, layer_decay=0.5)
    names = {id(p): n for n, p in model.named_parameters()}
    rate = {names[id(p)]: g["lr"] for g in groups for p in g["params"]}
    assert rate["head.weight"] == rate["norm.weight"] == 1.0  # depth + 1 = 4: 0.5^0
    assert rate["layers.2.mlp.fc1.weight"] == 0.5 and rate["layers.0.attn.qkv.bias"] == 0.125
    assert rate["patch_embed.proj.weight"] == rate["pos_embed.table"] == 0.0625  # 0.5^4
    assert len(rate) == len(list(model.parameters()))
    decay = {names[id(p)] for g in groups if g["weight_decay"] for p in g["params"]}
    assert "layers.1.attn.qkv.weight" in decay and "layers.1.attn.qkv.bias" not in decay


def test_frozen_parameters_get_no_group():
    model = VisionTransformer(tiny_config())
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head."))
    assert sum(len(g["params"]) for g in param_groups(model, 0.05)) == 2
