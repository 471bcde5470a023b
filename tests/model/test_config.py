import re
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from tests.helpers import tiny_config
from vit.model.config import POS_EMBEDS, ConfigError, Layer, ViTConfig, upgrade


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (dict(embed_dim=30, num_heads=4), "embed_dim=30 is not divisible by num_heads=4"),
        (dict(pos_embed="rope2d", embed_dim=24, num_heads=4), "head dim) must be divisible by 4"),
        (dict(pos_embed="sincos2d", embed_dim=30, num_heads=3), "embed_dim=30 must be divisible by 4"),
        (dict(img_size=3), "patch_size=4x4 is larger than img_size=3x3: not one whole patch fits"),
        (dict(img_size=(16, 3)), "img_size=16x3"),
        (dict(pos_embed="learnt"), "pos_embed='learnt' is not one of"),
        (dict(pool="cls"), "pool='cls' is not one of"),
        (dict(layer="sandwich"), "layer='sandwich' is not one of"),
        (dict(dropout=1.0), "dropout must be in [0, 1)"),
        (dict(depth=0), "depth must be a positive int"),
        (dict(img_size=(16, 16, 3)), "img_size must be an int or (height, width)"),
        (dict(img_size="16"), "img_size must be an int or (height, width), got '16'"),  # not (1, 6)
        (dict(img_size=[16.5, 16]), "img_size must be an int or (height, width)"),  # not truncated to 16
        (dict(layer_scale_init=0.0), "layer_scale_init must be positive"),
        (dict(num_classes=-1), "num_classes must be an int >= 0"),
        (dict(mlp_ratio=0.01), "gives the MLP no hidden unit"),  # Linear(D, 0): each MLP its fc2 bias alone
        (dict(mlp_ratio=-1.0), "gives the MLP no hidden unit"),
        (dict(pool="map", class_token=False, pool_mlp_ratio=0.01), "gives the pool's MLP no hidden unit"),
        # numbers as files and command lines give them: each was a TypeError, ValueError or OverflowError
        (dict(mlp_ratio="4"), "mlp_ratio must be a finite number, got '4'"),
        (dict(mlp_ratio=float("nan")), "mlp_ratio must be a finite number, got nan"),
        (dict(norm_eps=None), "norm_eps must be a finite number, got None"),
        (dict(dropout=[0.1]), "dropout must be a finite number, got [0.1]"),
        (dict(pos_temperature=float("inf")), "pos_temperature must be a finite number, got inf"),
        (dict(mlp_ratio=1e308), "mlp_ratio=1e+308 at embed_dim=32 gives the MLP no finite width"),
        (dict(rel_pos="mlp", rel_pos_dim=2.5), "rel_pos_dim must be a positive int, got 2.5"),
        (dict(pool="map", class_token=False, pool_heads="2"), "pool_heads must be a positive int, got '2'"),
    ],
)
def test_invalid_combinations_fail_naming_the_field(overrides, named):
    with pytest.raises(ConfigError) as err:
        tiny_config(**overrides)
    assert named in str(err.value)
    assert str(err.value).startswith("ViTConfig.")


def test_sizes_normalise_to_height_width_pairs():
    assert tiny_config(img_size=[16.0, 24.0]).img_size == (16, 24)  # whole floats, as a YAML may give them
    config = tiny_config(img_size=[16, 24], patch_size=4)
    assert config.img_size == (16, 24) and config.patch_size == (4, 4)
    assert config.grid_size == (4, 6) and config.num_patches == 24


@pytest.mark.parametrize(
    ("img_size", "patch_size", "grid"),
    [
        (384, 14, (27, 27)),  # SigLIP so400m at 384: the convolution leaves the last 6 pixels out
        ((18, 23), 4, (4, 5)),
        ((4, 7), (4, 7), (1, 1)),
        (224, 16, (14, 14)),
    ],
)
def test_the_grid_is_the_whole_patches_as_a_strided_convolution_takes_them(img_size, patch_size, grid):
    config = tiny_config(img_size=img_size, patch_size=patch_size)
    assert config.grid_size == grid and config.num_patches == grid[0] * grid[1]


def test_derived_sizes():
    config = tiny_config(pool="token")
    assert config.num_prefix_tokens == 1 and config.head_dim == 8 and config.mlp_hidden_dim == 128
    assert tiny_config(pool="avg").num_prefix_tokens == 0


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        tiny_config().depth = 3  # type: ignore[misc]


def test_dict_round_trip_uses_plain_containers():
    config = tiny_config(img_size=(16, 24))
    values = config.to_dict()
    assert values["img_size"] == [16, 24] and all(not isinstance(v, tuple) for v in values.values())
    assert ViTConfig.from_dict(values) == config


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown ViTConfig field.*emb_dim"):
        ViTConfig.from_dict({"emb_dim": 3})


def test_every_field_is_documented_in_the_options_table():
    """docs/model.md's table claims every ViTConfig field; a new field without a row fails here."""
    table = (Path(__file__).parents[2] / "docs" / "model.md").read_text()
    missing = [f.name for f in fields(ViTConfig) if f"| `{f.name}` |" not in table]
    assert not missing, f"docs/model.md lacks rows for {missing}"


# Configs as checkpoints and exports wrote them before each choice was one field, and the config each means now.
OLD_LAYOUTS = [
    (dict(pos_embed="learned", rope=True, rope_mixed=False), dict(pos_embed="learned+rope2d")),
    (dict(pos_embed="learned", rope=True, rope_mixed=True), dict(pos_embed="learned+rope_mixed")),
    (dict(pos_embed="rope2d", rope=False, rope_mixed=True), dict(pos_embed="rope_mixed")),
    (dict(pos_embed="rope2d", rope=False, rope_mixed=False), dict(pos_embed="rope2d")),
    (dict(pos_embed="none", rope=True, rope_mixed=False), dict(pos_embed="rope2d")),
    (dict(pos_embed="sincos2d", rope=False, rope_mixed=False), dict(pos_embed="sincos2d")),
    (
        dict(rope_axes="yx", rope_ref_grid=[16, 16], rope_grid="index", rope_grid_offset=1.0),
        dict(rope=dict(axes="yx", ref_grid=(16, 16), grid="index", offset=1.0)),
    ),
    (dict(norm="res_post", parallel=False), dict(layer="res_post")),
    (dict(norm="pre", parallel=True), dict(layer="parallel")),
    (dict(diff_attn=True), dict(attention="differential")),
    (dict(fc_norm=True, final_norm=True), dict(final_norm="pooled")),
    (dict(fc_norm=False, final_norm=False), dict(final_norm="none")),
    (dict(fc_norm=False, final_norm=True), dict(final_norm="tokens")),
    (dict(rel_pos="mlp", rel_pos_shared=True), dict(rel_pos="mlp_shared")),
    (dict(rel_pos="mlp", rel_pos_shared=False), dict(rel_pos="mlp")),
    (
        dict(
            pos_resample="bilinear", pos_resample_square=True, pos_resample_antialias=False, pos_resample_corners=True
        ),
        dict(pos_resample=dict(mode="bilinear", square=True, antialias=False, corners=True)),
    ),
    (dict(fused_attn=False, grad_checkpointing=True, naflex=True), {}),  # how it ran: not the network
]


@pytest.mark.parametrize(("old", "new"), OLD_LAYOUTS)
def test_an_older_layout_builds_the_config_it_means_now(old, new):
    base = tiny_config().to_dict()
    for field in ("rope", "pos_resample", "layer", "attention", "final_norm", "rel_pos", "pos_embed"):
        base.pop(field)
    assert ViTConfig.from_dict({**base, **old}) == ViTConfig.from_dict({**base, **new})


def test_todays_layout_passes_the_upgrade_unchanged():
    config = tiny_config(pos_embed="learned+rope_mixed", layer="parallel", final_norm="pooled", rel_pos="mlp_shared")
    assert ViTConfig.from_dict(config.to_dict()) == config
    assert upgrade(config.to_dict()) == config.to_dict()


def test_each_choice_list_is_written_once_and_checked_from_it():
    for field, values in (("layer", typing.get_args(Layer)), ("pos_embed", POS_EMBEDS)):
        for value in values:
            assert getattr(tiny_config(**{field: value}), field) == value
        with pytest.raises(ConfigError, match=re.escape(f"{field}='nope' is not one of {', '.join(values)}")):
            tiny_config(**{field: "nope"})
