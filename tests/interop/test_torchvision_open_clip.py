"""torchvision's ViTs and OpenCLIP's vision towers load with their own outputs: torchvision's logits, and an OpenCLIP
tower's image embedding (encode_image, not normalised) as our logits. Random weights, fp32, eval; no hub is reached.
tests/interop/test_torchvision.py holds the first torchvision tests (the named models' heads from their width, on the
meta device); these add what a config may not change, the older key names and a convolutional stem."""

import pytest
import torch
from torchvision.models.vision_transformer import ConvStemConfig
from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT

from tests.helpers import perturb_
from vit import ViTConfig
from vit.checkpoint import CheckpointError, load


def _compare(ours: torch.nn.Module, theirs, size: int, batch: int = 2) -> None:
    """Equal to 1e-5 of the outputs' scale on unit-scale images; `theirs` is a module or encode_image."""
    images = torch.randn(batch, 3, size, size)
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
