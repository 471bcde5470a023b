"""torchvision's ViT state dicts load with torchvision's logits; the width says the named models' heads."""

import pytest
import torch
import torchvision

from tests.helpers import perturb_
from vit import ViTConfig
from vit.checkpoint import CheckpointError, load
from vit.interop.torchvision import from_torchvision


def _small(**kwargs):
    values = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=5)
    return torchvision.models.vision_transformer.VisionTransformer(**values | kwargs)


def test_a_torchvision_state_dict_gives_torchvisions_logits(tmp_path):
    theirs = perturb_(_small(), std=0.05).eval()
    path = tmp_path / "vit.pth"
    torch.save(theirs.state_dict(), path)
    loaded = load(path, config=ViTConfig(num_heads=4))  # a small width: its heads are given
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = theirs(images)
        assert expected.abs().mean() > 0.05
        torch.testing.assert_close(loaded.model(images), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("name", "heads"), [("vit_b_16", 12), ("vit_l_32", 16), ("vit_h_14", 16)])
def test_the_named_models_heads_come_from_their_width(name, heads):
    with torch.device("meta"):  # the architecture only: no memory for ViT-H's 630M weights
        state = getattr(torchvision.models, name)().state_dict()
    config, _, _ = from_torchvision(state, None)
    assert (config.num_heads, config.num_classes, config.norm_eps) == (heads, 1000, 1e-6)


def test_a_representation_layer_and_an_unknown_width_are_refused(tmp_path):
    path = tmp_path / "pre_logits.pth"
    torch.save(_small(representation_size=32).state_dict(), path)
    with pytest.raises(CheckpointError, match=r"heads\.pre_logits"):
        load(path, config=ViTConfig(num_heads=4))
    path = tmp_path / "narrow.pth"
    torch.save(_small().state_dict(), path)
    with pytest.raises(CheckpointError, match="width 64 is none of vit_b/l/h"):
        load(path)
