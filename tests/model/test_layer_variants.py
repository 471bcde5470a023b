"""The layer variants later families add, each a ViTConfig field: grouped-query attention (kv_heads) and LayerScale
on the attention branch alone (layer_scale_attn_only) against the model they are special cases of; differential
attention (attention='differential') and ViT-22B's parallel layer (layer='parallel') against their formulas."""

import math

import pytest
import torch

from tests.helpers import perturb_, tiny_config
from tests.model.test_flops import counted
from vit.model import VisionTransformer
from vit.model.config import ConfigError
from vit.model.flops import forward_flops
from vit.model.layer import TransformerLayer


def _as_multi_head(state: dict, groups: dict[int, int], heads: int, head_dim: int, tiled: bool = False) -> dict:
    """A grouped-query model's weights as plain multi-head attention's: each key and value head's rows repeated for
    the H / G query heads that read it, head h reading group h // (H / G); `tiled`: group h % G instead (wrong)."""
    out = dict(state)
    for layer, g in groups.items():
        for name in ("weight", "bias"):
            key = f"layers.{layer}.attn.qkv.{name}"
            q, k, v = state[key].split((heads * head_dim, g * head_dim, g * head_dim))
            k, v = (t.reshape(g, head_dim, *t.shape[1:]) for t in (k, v))
            if tiled:
                k, v = (t.repeat(heads // g, *[1] * (t.dim() - 1)) for t in (k, v))
            else:
                k, v = (t.repeat_interleave(heads // g, 0) for t in (k, v))
            out[key] = torch.cat((q, k.flatten(0, 1), v.flatten(0, 1)))
    return out


@pytest.mark.parametrize("kv_heads", [1, 2, (2, 1), (4, 2)])
@pytest.mark.parametrize("pos_embed", ["learned", "rope2d"])
def test_grouped_query_attention_is_multi_head_attention_with_each_groups_keys_repeated(kv_heads, pos_embed):
    torch.manual_seed(0)
    grouped = perturb_(VisionTransformer(tiny_config(kv_heads=kv_heads, pos_embed=pos_embed))).eval()
    plain = VisionTransformer(tiny_config(pos_embed=pos_embed)).eval()
    groups = {layer: grouped.config.kv_heads_of(layer) for layer in range(2)}
    assert [grouped.layers[i].attn.qkv.out_features for i in range(2)] == [(4 + 2 * g) * 8 for g in groups.values()]
    plain.load_state_dict(_as_multi_head(grouped.state_dict(), groups, heads=4, head_dim=8))
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(grouped(images), plain(images), atol=1e-5, rtol=0)
        torch.testing.assert_close(grouped.forward_packed(list(images), 40), plain(images), atol=1e-5, rtol=0)
    if any(1 < g < 4 for g in groups.values()):  # which group a head reads matters: h % G is another model
        plain.load_state_dict(_as_multi_head(grouped.state_dict(), groups, heads=4, head_dim=8, tiled=True))
        with torch.no_grad():
            assert not torch.allclose(grouped(images), plain(images), atol=1e-3)


def test_grouped_query_flops_are_torchs_count():
    model = VisionTransformer(tiny_config(kv_heads=(2, 1)))
    model.set_fused_attn(False)
    assert forward_flops(model.config) == counted(model)
    assert forward_flops(model.config) < forward_flops(tiny_config())


def test_layer_scale_on_attention_alone_leaves_the_mlp_branch_unscaled():
    torch.manual_seed(0)
    alone = perturb_(TransformerLayer(tiny_config(layer_scale_init=0.1, layer_scale_attn_only=True), 0.0)).eval()
    both = TransformerLayer(tiny_config(layer_scale_init=0.1), 0.0).eval()
    assert "ls2.gamma" not in alone.state_dict()
    both.load_state_dict({**alone.state_dict(), "ls2.gamma": torch.ones(32)})  # a gain of one is no gain
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(alone(x)[0], both(x)[0])


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (dict(kv_heads=3), "each must be a positive int dividing num_heads=4"),
        (dict(kv_heads=(4, 2, 1)), "kv_heads has 3 entries, one a layer, but depth=2"),
        (dict(kv_heads=2, pos_embed="rope_mixed"), "rope_mixed turns each head's keys"),
        (dict(layer_scale_attn_only=True), "layer_scale_init is null"),
    ],
)
def test_bad_grouping_or_layer_scale_is_one_line_naming_the_field(fields, says):
    with pytest.raises(ConfigError, match=says):
        tiny_config(**fields)


def test_a_per_layer_grouping_survives_the_round_trip_through_a_dict():
    config = tiny_config(kv_heads=[2, 1])
    assert config.kv_heads == (2, 1) and type(config).from_dict(config.to_dict()) == config


def test_differential_attention_is_its_formula():
    torch.manual_seed(0)
    layer = perturb_(TransformerLayer(tiny_config(attention="differential"), 0.0, index=3)).eval()
    a, x = layer.attn, torch.randn(2, 5, 32)
    q, k, v = (x @ a.qkv.weight.T + a.qkv.bias).chunk(3, dim=-1)
    heads = lambda t: t.reshape(2, 5, 4, 8).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    maps = [(q[..., i : i + 4] @ k[..., i : i + 4].transpose(-1, -2) / 2).softmax(-1) for i in (0, 4)]  # √(D_k/2)
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * 3)
    lam = (a.lambda_q1 @ a.lambda_k1).exp() - (a.lambda_q2 @ a.lambda_k2).exp() + lam_init
    out = (maps[0] - lam * maps[1]) @ v
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * a.sub_norm.weight * (1 - lam_init)
    expected = out.transpose(1, 2).reshape(2, 5, 32) @ a.out_proj.weight.T + a.out_proj.bias
    with torch.no_grad():
        got, weights = a(x, need_weights=True)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(weights, maps[0] - lam * maps[1])  # rows sum to 1 - λ
        torch.testing.assert_close(a(x)[0], expected)  # the fused path too


def test_a_parallel_layer_is_its_formula():
    torch.manual_seed(0)
    layer = perturb_(TransformerLayer(tiny_config(layer="parallel", layer_scale_init=0.1), 0.0)).eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        y = layer.norm1(x)
        expected = x + layer.ls1(layer.attn(y)[0] + layer.mlp(y))
        torch.testing.assert_close(layer(x)[0], expected)
        torch.testing.assert_close(layer.forward_first_token(x), expected[:, :1])
    assert isinstance(layer.norm2, torch.nn.Identity) and isinstance(layer.ls2, torch.nn.Identity)


@pytest.mark.parametrize("fields", [dict(attention="differential"), dict(layer="parallel", layer_scale_init=0.1)])
def test_the_new_layers_count_their_flops_pack_and_learn(fields):
    torch.manual_seed(0)
    model = perturb_(VisionTransformer(tiny_config(**fields)))
    model.set_fused_attn(False)
    assert forward_flops(model.config) == counted(model)
    images = [torch.randn(3, 16, 16), torch.randn(3, 8, 16), torch.randn(3, 16, 12)]
    with torch.no_grad():
        alone = torch.cat([model.eval()(image[None]) for image in images])
        torch.testing.assert_close(model.forward_packed(images, 20), alone, atol=1e-5, rtol=0)
    model.train().forward_packed(images, 20).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
