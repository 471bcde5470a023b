"""torchvision's ViTs and OpenCLIP's vision towers load with their own outputs: torchvision's logits, and an OpenCLIP
tower's image embedding (encode_image, not normalised) as our logits. Random weights, fp32, eval; no hub is reached.
tests/interop/test_torchvision.py holds the first torchvision tests (the named models' heads from their width, on the
meta device); these add what a config may not change, the older key names and a convolutional stem."""

import inspect

import open_clip
import pytest
import timm
import torch
from open_clip.modified_resnet import ModifiedResNet
from open_clip.transformer import QuickGELU
from open_clip.transformer import VisionTransformer as OpenClipViT
from torchvision.models.vision_transformer import ConvStemConfig
from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT

from tests.helpers import perturb_
from vit import ViTConfig
from vit.checkpoint import CheckpointError, load


def _compare(ours: torch.nn.Module, theirs, size: int | tuple[int, int], batch: int = 2) -> None:
    """Equal to 1e-5 of the outputs' scale on unit-scale images; `theirs` is a module or encode_image."""
    images = torch.randn(batch, 3, *((size, size) if isinstance(size, int) else size))
    with torch.no_grad():
        expected = theirs(images)
        assert expected.abs().mean() > 0.05  # not two near-zero tensors
        scale = max(1.0, expected.abs().max().item())
        torch.testing.assert_close(ours.eval()(images), expected, atol=1e-5 * scale, rtol=0)


def _save(state: dict[str, torch.Tensor], path):
    torch.save(state, path)
    return path


# torchvision ---------------------------------------------------------------------------------------------------


def _torchvision(**kwargs) -> TorchvisionViT:
    values = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=5)
    return perturb_(TorchvisionViT(**values | kwargs), std=0.05).eval()


def test_a_config_gives_a_torchvision_vit_its_heads_alone(tmp_path):
    # pooling, activation and eps are torchvision's whatever the config says: the file is torchvision's ViT
    theirs = _torchvision()
    path = _save(theirs.state_dict(), tmp_path / "vit.pth")
    loaded = load(path, config=ViTConfig(num_heads=4, pool="avg", act="quick_gelu", norm_eps=1e-5))
    assert (loaded.config.pool, loaded.config.act, loaded.config.norm_eps) == ("token", "gelu", 1e-6)
    _compare(loaded.model, theirs, 32)


def test_torchvisions_older_mlp_names_load(tmp_path):
    # state dicts saved before torchvision 0.13 name MLPBlock's Linear layers linear_1 and linear_2
    theirs = _torchvision()
    old = {
        k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v
        for k, v in theirs.state_dict().items()
    }
    assert any("mlp.linear_2." in k for k in old)
    _compare(load(_save(old, tmp_path / "vit.pth"), config=ViTConfig(num_heads=4)).model, theirs, 32)


def test_a_torchvision_convolutional_stem_is_refused_by_name(tmp_path):
    theirs = _torchvision(conv_stem_configs=[ConvStemConfig(out_channels=16, kernel_size=3, stride=8)])
    with pytest.raises(CheckpointError, match=r"convolutional stem \(conv_stem_configs\)"):
        load(_save(theirs.state_dict(), tmp_path / "vit.pth"), config=ViTConfig(num_heads=4))


# OpenCLIP ------------------------------------------------------------------------------------------------------

SMALL_TOWER = dict(image_size=32, patch_size=8, width=64, layers=2, heads=4, mlp_ratio=4.0, output_dim=16)
CUSTOM_BLOCKS = "qk_norm" in inspect.signature(OpenClipViT).parameters  # open_clip 3's custom attention blocks

# each variant's tower arguments, and the config that says what its weights do not (heads, act, pooling)
TOWERS = {
    "gelu": ({}, {}),
    "quick_gelu": (dict(act_layer=QuickGELU), dict(act="quick_gelu")),
    "layer_scale": (dict(ls_init_value=0.1), {}),
    "no_ln_pre": (dict(no_ln_pre=True), {}),
    "avg": (dict(pool_type="avg"), dict(pool="avg")),
    "avg_ln_after_pool": (dict(pool_type="avg", final_ln_after_pool=True), dict(pool="avg", final_norm="pooled")),
    "custom_block_norms": (dict(qk_norm=True, scale_attn_inner=True, scale_fc=True), {}),
}


def _tower(**kwargs) -> OpenClipViT:
    return perturb_(OpenClipViT(**SMALL_TOWER | kwargs), std=0.05).eval()


@pytest.mark.parametrize("variant", TOWERS)
def test_an_open_clip_tower_loads_with_its_image_embedding_as_logits(variant, tmp_path):
    tower_args, config_args = TOWERS[variant]
    if "qk_norm" in tower_args and not CUSTOM_BLOCKS:
        pytest.skip("this open_clip builds no custom attention blocks")
    theirs = _tower(**tower_args)
    loaded = load(_save(theirs.state_dict(), tmp_path / "tower.pth"), config=ViTConfig(num_heads=4, **config_args))
    assert (loaded.config.norm_eps, loaded.config.num_classes) == (1e-5, 16)
    _compare(loaded.model, theirs, 32)


def test_a_clip_state_dict_loads_its_visual_tower_only(tmp_path):
    # the text tower's transformer.resblocks.* and positional_embedding must not be read as the image tower's
    vision = dict(image_size=32, patch_size=8, width=64, layers=2, head_width=16)
    text = dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)
    clip = perturb_(open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text, quick_gelu=True), std=0.05).eval()
    loaded = load(_save(clip.state_dict(), tmp_path / "clip.pt"), config=ViTConfig(num_heads=4, act="quick_gelu"))
    _compare(loaded.model, clip.encode_image, 32)


@pytest.mark.parametrize("weights", ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"])
def test_an_open_clip_hub_folder_loads_with_its_architecture_and_preprocessing(tmp_path, weights):
    """open_clip_config.json (what open_clip's save_for_hf writes) gives heads, QuickGELU and the mean and std."""
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors.torch import save_file

    model_cfg = dict(
        embed_dim=16,
        quick_gelu=True,
        vision_cfg=dict(image_size=32, patch_size=8, width=64, layers=2, head_width=16),
        text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1),
    )
    clip = perturb_(open_clip.CLIP(**model_cfg), std=0.05).eval()
    clip.visual.image_mean, clip.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    folder = tmp_path / "clip-tiny"
    folder.mkdir()
    save_config_for_hf(clip, folder / "open_clip_config.json", model_config=model_cfg)
    if weights.endswith(".safetensors"):
        save_file(clip.state_dict(), folder / weights)
    else:
        torch.save(clip.state_dict(), folder / weights)
    theirs, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}")  # open_clip's own reader
    loaded = load(folder)
    assert (loaded.config.num_heads, loaded.config.act) == (4, "quick_gelu")
    normalize = preprocess.transforms[-1]
    assert (loaded.mean, loaded.std) == (tuple(normalize.mean), tuple(normalize.std)) != (0.5,) * 3
    _compare(loaded.model, theirs.eval().encode_image, 32)
    (folder / weights).unlink()
    with pytest.raises(CheckpointError, match=r"open_clip_config.json has no weights beside it"):
        load(folder)


def test_a_rectangular_open_clip_hub_folder_loads_its_grid_from_its_config(tmp_path):
    """A 32x48 tower at patch 8 has 1 + 24 position rows, which also fit a 5x5 grid without a class row: the
    config's image size decides (open_clip always has the class row), where it was refused as ambiguous."""
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors.torch import save_file

    model_cfg = dict(
        embed_dim=16,
        vision_cfg=dict(image_size=(32, 48), patch_size=8, width=64, layers=2, head_width=16),
        text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1),
    )
    clip = perturb_(open_clip.CLIP(**model_cfg), std=0.05).eval()
    clip.visual.image_mean, clip.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    save_config_for_hf(clip, tmp_path / "open_clip_config.json", model_config=model_cfg)
    save_file(clip.state_dict(), tmp_path / "open_clip_model.safetensors")
    loaded = load(tmp_path)
    assert loaded.config.img_size == (32, 48)
    _compare(loaded.model, clip.encode_image, (32, 48))


def _named_vit_b_32(tmp_path):
    """ViT-B-32-quickgelu's tower cut to one layer, saved as a CLIP state dict named after the open_clip model."""
    sizes = dict(image_size=224, patch_size=32, width=768, layers=1, heads=12, mlp_ratio=4.0, output_dim=512)
    theirs = perturb_(OpenClipViT(**sizes, act_layer=QuickGELU), std=0.02).eval()
    state = {f"visual.{k}": v for k, v in theirs.state_dict().items()}
    return theirs, _save(state, tmp_path / "ViT-B-32-quickgelu.openai.pt")


def test_a_file_named_after_an_open_clip_model_needs_no_config(tmp_path):
    theirs, path = _named_vit_b_32(tmp_path)
    loaded = load(path)  # 12 heads (768 / head_width 64) and QuickGELU from open_clip's ViT-B-32-quickgelu config
    assert (loaded.config.num_heads, loaded.config.act, loaded.config.norm_eps) == (12, "quick_gelu", 1e-5)
    _compare(loaded.model, theirs, 224, batch=1)
    with pytest.raises(CheckpointError, match="8 heads were given, but open_clip's ViT-B-32-quickgelu has 12"):
        load(path, config=ViTConfig(num_heads=8))
    small = _save(_tower().state_dict(), tmp_path / "ViT-B-32.laion2b_s34b_b79k.pt")
    with pytest.raises(
        CheckpointError, match=r"named after open_clip's ViT-B-32 but .* width 64, not a ViT of width 768"
    ):
        load(small)


def test_the_loader_reads_open_clip_files_without_open_clip_installed(tmp_path, monkeypatch):
    theirs, path = _named_vit_b_32(tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "open_clip", None)  # `import open_clip` now raises ImportError
    with pytest.raises(CheckpointError, match="records neither its heads nor its activation"):
        load(path)
    _compare(load(path, config=ViTConfig(num_heads=12, act="quick_gelu")).model, theirs, 224, batch=1)


def _timm_trunk() -> dict[str, torch.Tensor]:
    """The state dict of open_clip's TimmModel tower: a timm ViT under 'trunk.', a projection under 'head.'."""
    trunk = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32, num_classes=0)
    return {f"trunk.{k}": v for k, v in trunk.state_dict().items()} | {"head.proj.weight": torch.zeros(16, 192)}


REFUSED = {
    "modified_resnet": (
        lambda: ModifiedResNet(layers=(1, 1, 1, 1), output_dim=16, heads=2, image_size=64, width=16).state_dict(),
        "ModifiedResNet",
    ),
    "timm_trunk": (_timm_trunk, r"a timm model .* load them as timm's"),
    "attentional_pool": (
        lambda: OpenClipViT(
            **SMALL_TOWER, attentional_pool=True, attn_pooler_queries=4, attn_pooler_heads=2
        ).state_dict(),
        r"attentional pooling",
    ),
    "scaled_cosine_attention": (
        lambda: OpenClipViT(**SMALL_TOWER, scaled_cosine_attn=True, scale_attn=True).state_dict(),
        r"a norm after attention \(scale_attn\); scaled cosine attention",
    ),
}


@pytest.mark.parametrize("kind", REFUSED)
def test_an_open_clip_tower_we_cannot_hold_is_refused_by_name(kind, tmp_path):
    build, message = REFUSED[kind]
    if kind == "scaled_cosine_attention" and not CUSTOM_BLOCKS:
        pytest.skip("this open_clip builds no custom attention blocks")
    state = {f"visual.{k}": v for k, v in build().items()}
    with pytest.raises(CheckpointError, match=message):
        load(_save(state, tmp_path / "clip.pt"), config=ViTConfig(num_heads=4))
