"""Other libraries' checkpoints, loaded by vit.checkpoint.load, compute what those libraries compute."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from tests.helpers import perturb_, write_vit_jax_npz
from vit.checkpoint import CheckpointError, load
from vit.interop.files import read_safetensors
from vit.interop.hugging_face import hugging_face_config
from vit.model.config import ViTConfig

PRESET = ViTConfig(img_size=32, patch_size=8, in_chans=3, num_classes=10, embed_dim=64, depth=2, num_heads=4)


def _timm(**kwargs):
    values = dict(img_size=32, patch_size=8, num_classes=7, embed_dim=64, depth=2, num_heads=4, mlp_ratio=3.0)
    return perturb_(timm.models.vision_transformer.VisionTransformer(**{**values, **kwargs})).eval()


@pytest.mark.parametrize("suffix", [".pth", ".safetensors", ".bin"])
@pytest.mark.parametrize("kwargs", [{}, {"class_token": False, "global_pool": "avg", "fc_norm": False}])
def test_timm_state_dict_gives_timm_logits(tmp_path, suffix, kwargs):
    reference = _timm(**kwargs)
    path = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        save_file(reference.state_dict(), str(path))
    else:
        torch.save({"state_dict": reference.state_dict()} if suffix == ".pth" else reference.state_dict(), path)
    loaded = load(path, config=PRESET)  # heads from the preset; classes, MLP width, pooling from the weights
    assert loaded.config.num_classes == 7 and loaded.config.mlp_ratio == 3.0
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), reference(images), atol=1e-5, rtol=1e-5)


def test_an_mlp_width_that_hidden_over_dim_misses_by_a_float_step_is_kept(tmp_path):
    reference = _timm(embed_dim=56, mlp_ratio=2.18)  # 56 * (122 / 56) == 121.99...: int() gave 121
    assert reference.blocks[0].mlp.fc1.out_features == 122
    torch.save(reference.state_dict(), tmp_path / "w.pth")
    loaded = load(tmp_path / "w.pth", config=PRESET)
    assert loaded.config.mlp_hidden_dim == 122
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), reference(images), atol=1e-5, rtol=1e-5)
    values = dict(hidden_size=56, intermediate_size=122, num_hidden_layers=1, num_attention_heads=4)
    assert hugging_face_config(values, has_head=False).mlp_hidden_dim == 122


def test_timm_without_a_class_token_position_gives_timm_logits(tmp_path):
    reference = _timm(no_embed_class=True, init_values=0.1)  # DeiT III: the class token gets no position
    torch.save(reference.state_dict(), tmp_path / "w.pth")
    loaded = load(tmp_path / "w.pth", config=PRESET)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), reference(images), atol=1e-5, rtol=1e-5)


def test_original_jax_npz_gives_timm_logits(tmp_path):
    reference = _timm()  # sizes (width 64, depth 2, MLP 3x, 4x4 grid, 7 classes) come from the arrays
    path = tmp_path / "ViT-tiny.npz"
    write_vit_jax_npz(reference, path)
    loaded = load(path, config=PRESET)
    assert (loaded.config.num_classes, loaded.config.mlp_ratio, loaded.config.grid_size) == (7, 3.0, (4, 4))
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), reference(images), atol=1e-5, rtol=1e-5)


def test_an_npz_with_arrays_we_would_drop_is_refused_naming_them(tmp_path):
    path = tmp_path / "ViT-21k.npz"
    write_vit_jax_npz(_timm(), path)
    arrays = dict(np.load(path))
    extra = {"pre_logits/kernel": np.zeros((64, 64), np.float32), "pre_logits/bias": np.zeros(64, np.float32)}
    np.savez(path, **arrays, **extra)  # the representation layer (Dense + tanh) of ImageNet-21k checkpoints
    with pytest.raises(CheckpointError, match=r"ViT-21k\.npz: .*no place for.*pre_logits/bias, pre_logits/kernel"):
        load(path, config=PRESET)


def test_an_npz_that_is_not_a_vit_is_named(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, **{"params/embedding/kernel": np.zeros((2, 2, 3, 4))})
    with pytest.raises(CheckpointError, match=r"other\.npz: not a ViT \.npz.*big_vision"):
        load(path, config=PRESET)


def test_timm_state_dict_needs_a_preset_for_its_heads(tmp_path):
    path = tmp_path / "w.pth"
    torch.save(_timm().state_dict(), path)
    with pytest.raises(CheckpointError, match=r"w\.pth: a timm state dict does not record the number of heads"):
        load(path)


def _hugging_face_config(transformers):
    return transformers.ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_labels=5,
        id2label={i: f"kind{i}" for i in range(5)},
        label2id=None,
    )


HF_CLASSIC, HF_CURRENT = "encoder.layer.0.attention.attention.query.weight", "layers.0.attention.q_proj.weight"
# How a Hugging Face ViT's weights reach us, and how the first query weight is spelled there: transformers 5
# names modules anew in memory; save_pretrained writes the classic names back unless told not to.
HF_FORMS = {
    "save_pretrained": HF_CLASSIC,
    "save_pretrained/model.safetensors": HF_CLASSIC,  # the weights file alone
    "save_pretrained_new_names": HF_CURRENT,
    "state_dict.pth": HF_CURRENT,
    "state_dict.safetensors": HF_CURRENT,
}


def _hand_over(model, form, folder):
    """`model`'s weights written as `form` says; the path to load and the keys written."""
    if form.startswith("save_pretrained"):
        model.save_pretrained(folder, save_original_format=form != "save_pretrained_new_names")
        written = set(read_safetensors(folder / "model.safetensors")[0])
        return (folder / "model.safetensors" if form.endswith(".safetensors") else folder), written
    path = folder / f"weights{Path(form).suffix}"
    (save_file if path.suffix == ".safetensors" else torch.save)(model.state_dict(), path)
    return path, set(model.state_dict())


@pytest.mark.parametrize("head", [True, False], ids=["ViTForImageClassification", "ViTModel"])
@pytest.mark.parametrize("form", HF_FORMS)
def test_hugging_face_weights_give_transformers_outputs(tmp_path, form, head):
    transformers = pytest.importorskip("transformers", minversion=None if HF_FORMS[form] == HF_CLASSIC else "5")
    torch.manual_seed(0)
    config = _hugging_face_config(transformers)
    model_class = transformers.ViTForImageClassification if head else transformers.ViTModel  # a pooler we leave out
    reference = perturb_(model_class(config)).eval()
    path, written = _hand_over(reference, form, tmp_path)
    assert HF_FORMS[form] in {key.removeprefix("vit.") for key in written}  # the spelling this case is about
    loaded = load(path, config=replace(PRESET, norm_eps=config.layer_norm_eps))  # a bare file does not record eps
    if path.is_dir():  # config.json names the classes of a classifier; a ViTModel has none
        assert loaded.classes == (tuple(f"kind{i}" for i in range(5)) if head else None)
    assert loaded.config.num_classes == (5 if head else 0)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        if head:
            actual, expected = loaded.model(images), reference(pixel_values=images).logits
        else:
            actual, expected = loaded.model.forward_features(images), reference(pixel_values=images).last_hidden_state
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_hugging_face_weights_we_would_drop_are_refused_naming_them(tmp_path):
    transformers = pytest.importorskip("transformers")
    masked = transformers.ViTForMaskedImageModeling(_hugging_face_config(transformers))
    torch.save(masked.state_dict(), tmp_path / "mim.pth")  # a mask token and a pixel decoder: no classifier
    with pytest.raises(
        CheckpointError,
        match=r"mim\.pth: .*no place for: decoder\.0\.bias, decoder\.0\.weight, vit\.embeddings\.mask_token$",
    ):
        load(tmp_path / "mim.pth", config=PRESET)


def test_a_folder_that_is_not_hugging_face_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"save_pretrained folder with config\.json"):
        load(tmp_path)
