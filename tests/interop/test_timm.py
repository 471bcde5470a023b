"""Our model reproduces timm's VisionTransformer logits for the same weights, converted both ways."""

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT

from tests.helpers import perturb_, relative_error
from vit import ViTConfig, create_model
from vit.interop.timm import from_timm, timm_config, timm_kwargs, to_timm

CASES = {
    "ti16_224_class_token": ("vit_tiny_16", {}),
    "cifar_patch4_avg_pool": ("vit_cifar", dict(pool="avg")),
    "non_square_32x48": ("vit_cifar", dict(img_size=(32, 48), depth=2)),
    "sincos2d_layer_scale": ("vit_cifar", dict(pos_embed="sincos2d", layer_scale_init=0.5, depth=2)),
    "no_position_no_qkv_bias": ("vit_cifar", dict(pos_embed="none", qkv_bias=False, pool="avg", depth=2)),
    "norm_eps_1e-3": ("vit_cifar", dict(norm_eps=1e-3, depth=2)),
}


@pytest.mark.parametrize("case", CASES)
def test_same_weights_give_timms_logits_both_ways(case):
    name, overrides = CASES[case]
    ours = perturb_(create_model(name, **overrides), std=0.05).eval()
    theirs = TimmViT(**timm_kwargs(ours.config)).eval()
    theirs.load_state_dict(to_timm(ours.state_dict(), ours.config))  # strict: every key placed
    images = torch.randn(2, 3, *ours.config.img_size)
    with torch.no_grad():
        expected = theirs(images)
        assert expected.abs().mean() > 0.1  # the comparison is not between two near-zero tensors
        assert (ours(images) - expected).abs().max().item() <= 1e-5

        back = create_model(name, **overrides).eval()
        back.load_state_dict(from_timm(theirs.state_dict(), ours.config))
        assert (back(images) - expected).abs().max().item() <= 1e-5


def test_learned_table_layout_converts_to_timms_sequence():
    ours = create_model("vit_cifar", depth=1)
    converted = to_timm(ours.state_dict(), ours.config)["pos_embed"]
    assert converted.shape == (1, 65, 384)
    torch.testing.assert_close(converted[0, 0], ours.pos_embed.prefix[0])
    torch.testing.assert_close(converted[0, 1 + 2 * 8 + 3], ours.pos_embed.table[2, 3])  # row 2, column 3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(layer="post"), "post-norm"),
        (dict(pos_embed="rope2d"), "rotary"),
        (dict(pos_embed="learned+rope2d"), "rotary"),
    ],
)
def test_what_timm_cannot_express_is_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        timm_kwargs(create_model("vit_cifar", depth=1, **overrides).config)


def test_unplaceable_timm_keys_are_listed():
    ours = create_model("vit_cifar", depth=1, pool="avg")
    theirs = TimmViT(**{**timm_kwargs(ours.config), "fc_norm": True})
    with pytest.raises(ValueError, match=r"fc_norm\.bias, fc_norm\.weight"):
        from_timm(theirs.state_dict(), ours.config)


@pytest.mark.parametrize(("img_size", "prefix_rows"), [((32, 48), True), (40, False)])
def test_a_table_that_fits_a_grid_with_and_without_its_class_row_is_read_by_the_configs_grid(img_size, prefix_rows):
    """1 + 24 rows: a 4x6 grid after the class row, or 5x5 without one (timm's no_embed_class): the config's grid
    decides (OpenCLIP's rectangular towers were refused as ambiguous)."""
    written = create_model("vit_cifar", depth=1, img_size=(32, 48), patch_size=8, embed_dim=64, num_heads=4)
    state = to_timm(written.state_dict(), written.config)
    read = timm_config(state, ViTConfig(img_size=img_size, patch_size=8, embed_dim=64, num_heads=4))
    assert (read.pos_embed_prefix, read.grid_size) == (prefix_rows, (4, 6) if prefix_rows else (5, 5))


def test_a_table_that_is_square_with_and_without_its_prefix_rows_is_refused_where_the_config_does_not_decide():
    # 5 prefix rows (class token, 4 registers) + 2x2 patches = 9 rows = 3x3: a grid of 224 px at patch 8 is neither
    written = create_model("vit_cifar", depth=1, img_size=16, patch_size=8, embed_dim=64, num_heads=4, reg_tokens=4)
    state = to_timm(written.state_dict(), written.config)
    with pytest.raises(ValueError, match="a position table of 9 rows fits a grid with and without its 5 prefix rows"):
        timm_config(state, ViTConfig(img_size=224, patch_size=8, embed_dim=64, num_heads=4))
    assert timm_config(state, written.config).grid_size == (2, 2)  # the config's grid decides


def test_a_table_square_only_against_the_configs_prefix_rows_is_refused_not_read_as_that_square():
    # a class row + 2x4 patches = 9 rows: 3x3 without the class row, which the config does not say (0.31 off on EVA-02)
    written = create_model("vit_cifar", depth=1, img_size=(16, 32), patch_size=8, embed_dim=64, num_heads=4)
    state = to_timm(written.state_dict(), written.config)
    with pytest.raises(ValueError, match="9 rows is square only without rows for its 1 prefix token"):
        timm_config(state, ViTConfig(img_size=224, patch_size=8, embed_dim=64, num_heads=4))
    assert timm_config(state, written.config).grid_size == (2, 4)  # the config's grid decides


def test_wrong_grid_is_refused_with_shapes():
    small = create_model("vit_cifar", depth=1)
    big = create_model("vit_cifar", depth=1, img_size=48)
    with pytest.raises(ValueError, match=r"shape \(1, 65, 384\), expected \(1, 145, 384\) for a 12x12 grid"):
        from_timm(to_timm(small.state_dict(), small.config), big.config)


def test_a_learned_table_is_not_silently_dropped_for_a_fixed_one():
    learned = perturb_(create_model("vit_cifar", depth=1))
    sincos = create_model("vit_cifar", depth=1, pos_embed="sincos2d")
    with pytest.raises(ValueError, match="would discard"):
        from_timm(to_timm(learned.state_dict(), learned.config), sincos.config)


def test_a_head_count_that_does_not_divide_a_bare_files_width_says_the_file_lacks_it_and_how_to_give_it(tmp_path):
    from tests.helpers import write_timm
    from vit.checkpoint import CheckpointError, load
    from vit.model.presets import preset_config

    path = write_timm(tmp_path / "timm.safetensors")  # width 64; vit_tiny_16 has 3 heads
    lacks = r"does not record the number of heads, and the 3 given do not divide its width 64: "
    with pytest.raises(CheckpointError, match=lacks + r".*--preset NAME.*model\.num_heads=H"):
        load(path, config=preset_config("vit_tiny_16"))
    assert load(path, config=preset_config("vit_tiny_16", embed_dim=64, num_heads=4)).config.num_heads == 4


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_under_cpu_bf16_autocast_ours_is_about_as_close_to_fp32_as_timms_own(pool):
    """Our residual stream is bf16 under autocast (timm's promotes to fp32 where an fp32 parameter joins it): the
    price is bounded, as on CUDA (tests/test_gpu.py): within twice timm's distance from the fp32 logits."""
    ours = perturb_(create_model("vit_cifar", pool=pool, num_classes=10), std=0.05).eval()
    theirs = TimmViT(**timm_kwargs(ours.config)).eval()
    theirs.load_state_dict(to_timm(ours.state_dict(), ours.config))
    images = torch.randn(8, 3, *ours.config.img_size)
    with torch.no_grad():
        expected = theirs(images)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours_bf16, theirs_bf16 = ours(images), theirs(images)
    ours_error, theirs_error = relative_error(ours_bf16, expected), relative_error(theirs_bf16, expected)
    assert ours_error < min(2e-2, 2 * theirs_error + 1e-3)
