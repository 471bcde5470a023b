"""The ViT families timm ships (DINOv2, registers, CLIP, SigLIP, DeiT, GAP, qk-norm): our model computes timm's
logits for the same weights, built from our config, from timm's hub folders and from bare files named after
an architecture. Random weights, fp32, eval; no hub is reached (timm builds each architecture itself)."""

from dataclasses import replace

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.models import save_for_hf

from tests.helpers import perturb_
from vit import ViTConfig
from vit.checkpoint import CheckpointError, load
from vit.interop.timm import build_timm, config_of_timm_model, from_timm, read_timm_module, timm_architecture, to_timm
from vit.model import VisionTransformer
from vit.model.presets import preset_config

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=7)

# each family's switches on a small model: ours -> timm's module -> ours must compute timm's logits
FAMILIES = {
    "dinov2_registers": dict(reg_tokens=4, pos_embed_prefix=False, layer_scale_init=1e-5),
    "clip": dict(embed_norm=True, patch_bias=False, act="quick_gelu", norm_eps=1e-5),
    "siglip_map": dict(pool="map", class_token=False, act="gelu_tanh"),
    "gap_fc_norm": dict(pool="avg", final_norm="pooled"),
    "gap_with_class_token": dict(pool="avg", class_token=True, final_norm="pooled"),
    "qk_norm_rms": dict(qk_norm=True, norm_layer="rmsnorm"),
    "eva_sub_norms_swiglu": dict(attn_norm=True, mlp_norm=True, act="swiglu", mlp_ratio=8 / 3),
    "no_proj_bias": dict(proj_bias=False, qkv_bias=False),
    "deit_distilled": dict(distill_token=True),
    "radio_no_final_norm": dict(final_norm="none", pool="avg"),
    "avg_over_prefix_too": dict(pool="avg", reg_tokens=2, pool_prefix=True),
}


def _compare(ours: torch.nn.Module, theirs: torch.nn.Module, size: tuple[int, int]) -> None:
    """Equal to 1e-5 of the outputs' scale (unit-scale outputs: 1e-5 absolute), on unit-scale inputs."""
    images = torch.randn(2, 3, *size)
    with torch.no_grad():
        expected = theirs.eval()(images)
        assert expected.abs().mean() > 0.05  # not two near-zero tensors
        scale = max(1.0, expected.abs().max().item())  # a 768-wide feature vector reaches ~10
        torch.testing.assert_close(ours.eval()(images), expected, atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_switches_compute_timms_logits(family):
    config = ViTConfig(**SMALL, **FAMILIES[family])
    ours = perturb_(VisionTransformer(config), std=0.05)
    theirs = build_timm(config)
    theirs.load_state_dict(to_timm(ours.state_dict(), config))  # strict: every key placed
    _compare(ours, theirs, config.img_size)
    read = config_of_timm_model(theirs)  # the module read back: every switch, the MLP width by its shape
    assert replace(read, mlp_ratio=config.mlp_ratio, layer_scale_init=config.layer_scale_init) == config
    assert read.mlp_hidden_dim == config.mlp_hidden_dim
    back = VisionTransformer(config)
    back.load_state_dict(from_timm(theirs.state_dict(), config))
    _compare(back, theirs, config.img_size)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(final_norm="pooled"), "final_norm='pooled'"),
        (dict(reg_tokens=2), "reg_tokens"),
        (dict(pos_embed_prefix=False), "prefix rows"),
        (dict(pos_embed="none"), "no position table"),
        (dict(pos_embed="learned+rope2d"), "rotary"),
        (dict(layer="res_post"), "res-post-norm"),
    ],
)
def test_a_distilled_model_timm_builds_differently_is_refused_not_converted(overrides, message):
    """timm's distilled head skips fc_norm (0.45 off when it was converted), and its table always has two prefix
    rows; the rest of what timm's VisionTransformer lacks is refused for the distilled class too."""
    config = ViTConfig(**SMALL, distill_token=True, **overrides)
    with pytest.raises(ValueError, match=message):
        build_timm(config)
    with pytest.raises(ValueError, match=message):
        to_timm(VisionTransformer(config).state_dict(), config)


NARROW = dict(embed_dim=64, num_heads=4)  # a base or large tower's width: what is read is its layout, not its width
# timm architectures behind pretrained checkpoints, one per family, cut to two layers at a small image size
ARCHITECTURES = {
    "vit_small_patch14_dinov2": dict(img_size=56),
    "vit_small_patch14_reg4_dinov2": dict(img_size=56),
    "vit_base_patch16_clip_224": dict(img_size=32, **NARROW),
    "vit_base_patch16_clip_quickgelu_224": dict(img_size=32, **NARROW),
    "vit_base_patch16_siglip_224": dict(img_size=32, **NARROW),
    "vit_base_patch16_gap_224": dict(img_size=32, **NARROW),
    "vit_base_patch16_224.mae": dict(img_size=32, **NARROW),  # MAE's encoder as timm ships it: no head (num_classes 0)
    "deit3_small_patch16_224": dict(img_size=32),
    "deit_tiny_distilled_patch16_224": dict(img_size=32),
    "vit_medium_patch16_reg4_gap_256": dict(img_size=32, **NARROW),
    "vit_base_patch16_rope_reg1_gap_256": dict(img_size=64, **NARROW),  # an Eva: EVA's RoPE, registers, average pooling
    "aimv2_large_patch14_224": dict(img_size=56, **NARROW),  # RMSNorm on the patches, unpacked SwiGLU, no biases
    "vit_dwee_patch16_reg1_gap_256": dict(img_size=32),  # differential attention
    "vit_pwee_patch16_reg1_gap_256": dict(img_size=32),  # ViT-22B's parallel layers: parallel
    "vit_dpwee_patch16_reg1_gap_256": dict(img_size=32),  # both
}


@pytest.mark.parametrize("name", [n for n, args in ARCHITECTURES.items() if args is not None])
def test_a_timm_hub_folder_loads_with_its_architecture_and_timms_logits(name, tmp_path):
    theirs = perturb_(timm.create_model(name, pretrained=False, depth=2, **ARCHITECTURES[name]), std=0.05)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    loaded = load(tmp_path)  # nothing restated: config.json names the architecture and its arguments
    _compare(loaded.model, theirs, loaded.config.img_size)
    assert loaded.mean == tuple(theirs.pretrained_cfg["mean"])
    assert loaded.crop_pct == theirs.pretrained_cfg["crop_pct"]


# the relative-position family (no table; an MLP of patch offsets biases every layer's logits) and res-post-norm
RELPOS = {
    "vit_relpos_small_patch16_224": 16,  # a bias MLP per layer, average pooling, fc_norm
    "vit_relpos_medium_patch16_cls_224": 16,  # class token pooled
    "vit_relpos_medium_patch16_rpn_224": 16,  # res-post-norm blocks
    "vit_srelpos_small_patch16_224": 16,  # one bias MLP shared by every layer
    "vit_base_patch16_rpn_224": 16,  # timm's VisionTransformer with ResPostBlock (no bias)
}


@pytest.mark.parametrize("name", RELPOS)
def test_relative_position_and_res_post_norm_vits_load_with_timms_logits_on_a_wide_grid(name, tmp_path):
    p = RELPOS[name]
    theirs = perturb_(timm.create_model(name, pretrained=False, depth=2, img_size=(2 * p, 3 * p)), std=0.05)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    loaded = load(tmp_path)
    assert loaded.config.layer == ("res_post" if "rpn" in name else "pre")
    _compare(loaded.model, theirs, loaded.config.img_size)


@pytest.mark.parametrize(("kind", "says"), [("bias", "RelPosBias"), ("mlp_swin", "RelPosMlp in its 'swin' mode")])
def test_a_timm_architecture_we_cannot_hold_is_refused_by_name(kind, says, tmp_path):
    theirs = timm.create_model("vit_relpos_small_patch16_224", depth=1, img_size=32, rel_pos_type=kind)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    with pytest.raises(CheckpointError, match=rf"timm's vit_relpos_small_patch16_224 .*{says}"):
        load(tmp_path)


def test_a_bare_file_named_after_an_architecture_takes_heads_and_activation_from_it(tmp_path):
    # QuickGELU and 12 heads are in no tensor; a file named after the architecture says them
    theirs = perturb_(timm.create_model("vit_base_patch16_clip_quickgelu_224", pretrained=False, depth=1), std=0.05)
    path = tmp_path / "vit_base_patch16_clip_quickgelu_224.openai.safetensors"
    save_file(theirs.state_dict(), str(path))
    loaded = load(path)
    assert (loaded.config.act, loaded.config.num_heads, loaded.config.norm_eps) == ("quick_gelu", 12, 1e-5)
    _compare(loaded.model, theirs, (224, 224))


@pytest.mark.parametrize("name", ["vit_base_patch16_rpn_224", "vit_relpos_medium_patch16_rpn_224"])
def test_a_bare_res_post_norm_file_named_after_its_architecture_keeps_its_norm_placement(name, tmp_path):
    """Res-post-norm and pre-norm layers have the same keys: the name says which (read as pre-norm: 2.0 off)."""
    theirs = perturb_(timm.create_model(name, pretrained=False, depth=2, img_size=32), std=0.05)
    save_file(theirs.state_dict(), str(tmp_path / f"{name}.safetensors"))
    loaded = load(tmp_path / f"{name}.safetensors")
    assert loaded.config.layer == "res_post"
    _compare(loaded.model, theirs, (32, 32))


def test_a_bare_file_whose_weights_differ_from_its_name_is_refused(tmp_path):
    other = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1, img_size=32)
    path = tmp_path / "vit_base_patch16_224.safetensors"
    save_file(other.state_dict(), str(path))
    with pytest.raises(CheckpointError, match=r"named after timm's vit_base_patch16_224 but .* width 384, not 768"):
        load(path)


@pytest.mark.parametrize(
    ("name", "built", "says"),
    [
        # timm's train.py --gp avg
        ("vit_base_patch16_224", dict(global_pool="avg"), "final_norm='pooled', not 'tokens'"),
        ("vit_base_patch16_gap_224", dict(class_token=True, global_pool="token"), "class_token=True, not False"),
    ],
)
def test_a_bare_file_built_with_other_pooling_than_its_name_is_refused(name, built, says, tmp_path):
    other = timm.create_model(name, pretrained=False, depth=1, img_size=32, **built)
    save_file(other.state_dict(), str(tmp_path / f"{name}.safetensors"))
    with pytest.raises(CheckpointError, match=rf"named after timm's {name} but .*{says}"):
        load(tmp_path / f"{name}.safetensors")


def test_a_headless_distilled_deit_gives_timms_features_its_two_tokens_averaged(tmp_path):
    name = "deit_tiny_distilled_patch16_224"
    theirs = perturb_(timm.create_model(name, pretrained=False, depth=1, img_size=32, num_classes=0), std=0.05)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    _compare(load(tmp_path).model, theirs, (32, 32))
    save_file(theirs.state_dict(), str(tmp_path / f"{name}.safetensors"))  # a bare file named after it
    _compare(load(tmp_path / f"{name}.safetensors").model, theirs, (32, 32))


@pytest.mark.parametrize(
    ("name", "built", "says"),
    [
        ("deit_tiny_distilled_patch16_224", dict(fc_norm=True), "distilled ViT with fc_norm, which timm .* never"),
        ("naflexvit_base_patch16_gap", dict(pos_embed_use_grid_sample=True), "grid-sampled positions"),
    ],
)
def test_a_timm_model_we_cannot_hold_is_refused_in_one_line(name, built, says, tmp_path):
    theirs = timm.create_model(name, pretrained=False, depth=1, img_size=28 if "14" in name else 32, **built)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    with pytest.raises(CheckpointError, match=rf"timm's {name} is not a ViT .*{says}"):
        load(tmp_path)


def test_a_gated_mlp_in_a_bare_file_is_not_read_as_a_plain_one(tmp_path):
    config = ViTConfig(**SMALL, act="swiglu")
    path = tmp_path / "weights.safetensors"
    save_file(to_timm(VisionTransformer(config).state_dict(), config), str(path))
    with pytest.raises(CheckpointError, match="MLP is gated"):
        load(path, config=ViTConfig(**SMALL))
    assert load(path, config=ViTConfig(**SMALL, act="swiglu")).config.act == "swiglu"


# our family presets and the timm architectures they follow; what they set apart from timm's, on purpose
PRESETS = {
    "dinov2_small_14": ("vit_small_patch14_dinov2", {}),
    "dinov2_small_14_reg4": ("vit_small_patch14_reg4_dinov2", {}),
    "clip_base_16": ("vit_base_patch16_clip_224", {}),
    "siglip_base_16": ("vit_base_patch16_siglip_224", {"act": "gelu_tanh"}),  # big_vision's GELU; timm's is exact
    "deit3_small_16": ("deit3_small_patch16_224", {}),
    "eva02_small_14": ("eva02_small_patch14_224", {}),
}


@pytest.mark.parametrize("preset", PRESETS)
def test_a_family_preset_is_the_architecture_timm_builds(preset):
    name, apart = PRESETS[preset]
    theirs, _ = read_timm_module(timm_architecture(name, num_classes=1000))  # on the meta device: no memory
    ours = preset_config(preset)
    assert replace(theirs, layer_scale_init=ours.layer_scale_init, **apart) == ours


def test_a_resnet_hybrid_is_refused_naming_its_stem(tmp_path):
    theirs = timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, depth=1, img_size=64)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    with pytest.raises(CheckpointError, match="its patch embedding is timm's HybridEmbed"):
        load(tmp_path)


# timm's Eva class: EVA-01 (no rope) and EVA-02 (learned table + rope in EVA's layout, SwiGLU, sub-norms)
EVA = {
    "eva02_tiny_patch14_224": dict(img_size=56),  # ref grid 16: rope positions scaled by 16 / 4
    "eva02_small_patch14_224": dict(img_size=224),  # at its reference grid
    "eva02_base_patch14_224": dict(img_size=56, **NARROW),
    "eva02_base_patch16_clip_224": dict(img_size=64, **NARROW),
    "eva_giant_patch14_224": dict(img_size=56, **NARROW),
    "eva02_enormous_patch14_clip_224": dict(img_size=56, **NARROW),  # post-norm blocks: res_post
    # DINOv3: half-split rotation (heads reordered at loading), centred positions, registers, no table
    "vit_small_patch16_dinov3": dict(img_size=64),
    "vit_small_patch16_dinov3_qkvb": dict(img_size=48, global_pool="token"),
    # rope ViTs (Heo et al. 2024): columns first ('xy' indexing), temperature 100; Perception Encoder's spatial
    # tower: rope positions offset by one and scaled to a 32x32 grid, ln_pre, no final norm
    "vit_small_patch16_rope_ape_224": dict(img_size=64),
    "vit_pe_spatial_tiny_patch16_512": dict(img_size=64),
    "vit_pe_core_tiny_patch16_384": dict(img_size=64),  # attention pooling with its own heads and MLP width
    # Sapiens 2: DINOv3's rope, RMSNorm, LayerScale on attention alone, grouped-query keys in its middle layers
    "vit_large_patch16_sapiens2": dict(img_size=(64, 48), embed_dim=64, num_heads=4, num_kv_heads=(4, 2)),
}


@pytest.mark.parametrize("name", EVA)
def test_an_eva_hub_folder_loads_with_timms_logits(name, tmp_path):
    theirs = perturb_(timm.create_model(name, pretrained=False, depth=2, **EVA[name]), std=0.05)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    loaded = load(tmp_path)
    _compare(loaded.model, theirs, loaded.config.img_size)


@pytest.mark.parametrize("indexing", ["xy", "ij"])
@pytest.mark.parametrize("name", ["vit_small_patch16_rope_mixed_224", "vit_small_patch16_rope_mixed_ape_224"])
def test_rope_mixed_loads_its_learned_frequencies_with_timms_logits_on_a_wide_grid(name, indexing, tmp_path):
    """RoPE-Mixed (naver's rope-vit): per-layer, per-head frequencies, with and without a learned table, on a 2x3
    grid (a transposed x and y would show), for either coordinate order ('ij': the first frequency turns with rows)."""
    args = dict(img_size=(32, 48), rope_grid_indexing=indexing)
    theirs = perturb_(timm.create_model(name, pretrained=False, depth=2, **args), std=0.05)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    loaded = load(tmp_path)
    assert loaded.config.rotary == "rope_mixed" and loaded.model.rope.freqs.shape == (2, 2, 6, 32)
    _compare(loaded.model, theirs, loaded.config.img_size)


def test_a_folder_whose_config_disagrees_with_its_weights_is_one_clear_error(tmp_path):
    import json

    theirs = timm.create_model("vit_small_patch16_224", pretrained=False, depth=1, img_size=32)
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_args"]["mlp_ratio"] = 2.0  # the weights' MLP is 4 x 384 wide
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"weights do not match .*size mismatch for layers\.0\.mlp\.fc1\.weight"):
        load(tmp_path)


def test_a_gated_mlp_that_gates_with_its_second_half_is_refused():
    from timm.layers import GluMlp

    theirs = build_timm(ViTConfig(**SMALL, act="swiglu"))
    for block in theirs.blocks:  # timm's GluMlp default: x1 * SiLU(x2), the reverse of SwiGLU's packing
        block.mlp = GluMlp(64, block.mlp.fc1.out_features, act_layer=torch.nn.SiLU, gate_last=True)
    with pytest.raises(ValueError, match="gates with its second half"):
        config_of_timm_model(theirs)


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("vit_pwee_patch16_reg1_gap_256", dict(fuse_out_proj=True)),  # one W_o on [heads; MLP hidden], split
        ("vit_pwee_patch16_reg1_gap_256", dict(qkv_bias=False)),  # fc1's bias held apart (mlp_bias)
        ("vit_dpwee_patch16_reg1_gap_256", dict(qkv_bias=False)),
        ("vit_dwee_patch16_reg1_gap_256", dict(qk_norm=True)),  # each half of a head normalised
    ],
)
def test_parallel_and_differential_layers_in_each_form_compute_timms_logits(name, settings):
    from functools import partial

    from timm.models.vision_transformer import DiffParallelScalingBlock, ParallelScalingBlock

    block = {
        "vit_pwee_patch16_reg1_gap_256": ParallelScalingBlock,
        "vit_dpwee_patch16_reg1_gap_256": DiffParallelScalingBlock,
    }
    if "fuse_out_proj" in settings:
        settings = dict(block_fn=partial(block[name], fuse_out_proj=True))
    theirs = perturb_(timm.create_model(name, pretrained=False, depth=2, img_size=32, **settings), std=0.05)
    config, rename = read_timm_module(theirs)
    ours = VisionTransformer(config)
    ours.load_state_dict(from_timm(rename(theirs.state_dict()), config))
    _compare(ours, theirs, config.img_size)
