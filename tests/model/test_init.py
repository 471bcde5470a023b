import torch

from tests.helpers import tiny_config
from vit.model import VisionTransformer
from vit.model.init import trunc_normal_


def test_trunc_normal_has_the_distribution_of_torchs():
    ours = trunc_normal_(torch.empty(200_000), std=0.02)
    theirs = torch.nn.init.trunc_normal_(torch.empty(200_000), std=0.02, a=-0.04, b=0.04)
    assert ours.abs().max().item() <= 0.04
    q = torch.linspace(0.01, 0.99, 25)
    torch.testing.assert_close(ours.quantile(q), theirs.quantile(q), atol=5e-4, rtol=0)


def test_initialisation_rules():
    model = VisionTransformer(tiny_config(embed_dim=64, pool="token"))
    w = model.layers[0].mlp.fc1.weight
    assert abs(w.std().item() - 0.0176) < 0.003  # N(0, 0.02) cut at ±2 std has std 0.88 * 0.02
    assert w.abs().max().item() <= 0.04
    assert torch.equal(model.layers[0].mlp.fc1.bias, torch.zeros(256))
    assert torch.equal(model.norm.weight, torch.ones(64)) and torch.equal(model.norm.bias, torch.zeros(64))
    assert model.cls_token.abs().max().item() < 1e-4
    assert 0.01 < model.pos_embed.table.std().item() < 0.03


def test_patch_embedding_is_lecun_normal():
    model = VisionTransformer(tiny_config(embed_dim=256, patch_size=4, in_chans=3))
    w = model.patch_embed.proj.weight  # fan_in = 3 * 4 * 4 = 48
    assert abs(w.std().item() - 48**-0.5) < 0.01
    assert w.abs().max().item() <= 2 * 48**-0.5 / 0.8796 + 1e-6
    assert torch.equal(model.patch_embed.proj.bias, torch.zeros(256))
