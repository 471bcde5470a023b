"""Other libraries' checkpoints, loaded by vit.checkpoint.load, compute what those libraries compute."""

from dataclasses import replace

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from tests.helpers import perturb_, write_vit_jax_npz
from vit.checkpoint import CheckpointError, load
from vit.config import ViTConfig
from vit.foreign import hugging_face_config

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


def test_hugging_face_folder_gives_transformers_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
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
    reference = transformers.ViTForImageClassification(config).eval()
    perturb_(reference)
    reference.save_pretrained(tmp_path)
    loaded = load(tmp_path)
    assert loaded.classes == tuple(f"kind{i}" for i in range(5))
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), reference(pixel_values=images).logits, atol=1e-5, rtol=1e-5)
    backbone = transformers.ViTModel(config).eval()
    backbone.save_pretrained(tmp_path / "backbone")  # no classifier, and a pooler we leave out
    folder = load(tmp_path / "backbone")
    assert folder.config.num_classes == 0 and folder.classes is None  # id2label names no outputs of a ViTModel
    hf_eps = replace(PRESET, norm_eps=config.layer_norm_eps)  # a bare file does not record it
    single_file = load(tmp_path / "backbone" / "model.safetensors", config=hf_eps)  # the pooler is left out here too
    with torch.no_grad():
        expected = backbone(pixel_values=images).last_hidden_state
        for features in (folder.model, single_file.model):
            torch.testing.assert_close(features.forward_features(images), expected, atol=1e-5, rtol=1e-5)


def test_a_folder_that_is_not_hugging_face_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"save_pretrained folder with config\.json"):
        load(tmp_path)
