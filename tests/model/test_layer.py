import pytest
import torch
import torch.nn.functional as F

from tests.helpers import perturb_, tiny_config
from vit.model.layer import TransformerLayer


def by_hand_attention(layer, x, bias=0.0):
    a = layer.attn
    B, N, D = x.shape
    q, k, v = (x @ a.qkv.weight.T + a.qkv.bias).chunk(3, dim=-1)
    split = lambda t: t.reshape(B, N, a.num_heads, a.head_dim).transpose(1, 2)  # noqa: E731
    A = (split(q) @ split(k).transpose(-1, -2) / a.head_dim**0.5 + bias).softmax(-1)
    heads = (A @ split(v)).transpose(1, 2).reshape(B, N, D)
    return heads @ a.out_proj.weight.T + a.out_proj.bias


def by_hand_mlp(layer, x):
    m = layer.mlp
    return F.gelu(x @ m.fc1.weight.T + m.fc1.bias) @ m.fc2.weight.T + m.fc2.bias


def ln(norm, x):
    mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def test_pre_norm_layer_is_the_formula():
    layer = perturb_(TransformerLayer(tiny_config(layer="pre"), drop_path=0.0)).eval()
    X = torch.randn(2, 5, 32)
    Z = X + by_hand_attention(layer, ln(layer.norm1, X))  # Z = X + MHA(LN(X))
    expected = Z + by_hand_mlp(layer, ln(layer.norm2, Z))  # X̃ = Z + MLP(LN(Z))
    torch.testing.assert_close(layer(X)[0], expected, atol=1e-5, rtol=1e-5)


def test_post_norm_layer_is_the_formula():
    layer = perturb_(TransformerLayer(tiny_config(layer="post"), drop_path=0.0)).eval()
    X = torch.randn(2, 5, 32)
    Z = ln(layer.norm1, X + by_hand_attention(layer, X))  # Z = LN(X + MHA(X))
    expected = ln(layer.norm2, Z + by_hand_mlp(layer, Z))  # X̃ = LN(Z + MLP(Z))
    torch.testing.assert_close(layer(X)[0], expected, atol=1e-5, rtol=1e-5)


def test_res_post_norm_layer_is_the_formula():
    layer = perturb_(TransformerLayer(tiny_config(layer="res_post"), drop_path=0.0)).eval()
    X = torch.randn(2, 5, 32)
    Z = X + ln(layer.norm1, by_hand_attention(layer, X))  # Z = X + LN(MHA(X))
    expected = Z + ln(layer.norm2, by_hand_mlp(layer, Z))  # X̃ = Z + LN(MLP(Z))
    torch.testing.assert_close(layer(X)[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_a_relative_position_bias_is_added_to_each_heads_logits(fused):
    """softmax(Q Kᵀ / √D_k + B) V, by torch's fused kernel and by the explicit path alike."""
    layer = perturb_(TransformerLayer(tiny_config(), drop_path=0.0)).eval()
    layer.attn.fused = fused
    X, B = torch.randn(2, 5, 32), torch.randn(4, 5, 5)  # (H, N, N)
    Z = X + by_hand_attention(layer, ln(layer.norm1, X), B)
    expected = Z + by_hand_mlp(layer, ln(layer.norm2, Z))
    torch.testing.assert_close(layer(X, bias=B)[0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer.forward_first_token(X, bias=B), expected[:, :1], atol=1e-5, rtol=1e-5)


def test_layer_scale_multiplies_each_branch():
    layer = perturb_(TransformerLayer(tiny_config(layer_scale_init=1e-3), drop_path=0.0)).eval()
    X = torch.randn(2, 5, 32)
    g1, g2 = layer.ls1.gamma, layer.ls2.gamma
    Z = X + g1 * by_hand_attention(layer, ln(layer.norm1, X))
    expected = Z + g2 * by_hand_mlp(layer, ln(layer.norm2, Z))
    torch.testing.assert_close(layer(X)[0], expected, atol=1e-5, rtol=1e-5)


def test_drop_path_drops_whole_samples_in_training_only():
    layer = perturb_(TransformerLayer(tiny_config(), drop_path=0.5))
    X = torch.randn(64, 5, 32)
    layer.eval()
    torch.testing.assert_close(layer(X)[0], layer(X)[0])
    layer.train()
    out = layer(X)[0]
    # a sample with both branches dropped comes out exactly as it went in; with p=0.5, about 1 in 4
    untouched = (out == X).flatten(1).all(dim=1).sum().item()
    assert 4 <= untouched <= 32


@pytest.mark.parametrize("form", ["pre", "post", "res_post", "parallel"])
def test_first_token_alone_is_the_first_row_of_the_whole_layer(form):
    layer = perturb_(TransformerLayer(tiny_config(layer=form, layer_scale_init=0.5), drop_path=0.0)).eval()
    X = torch.randn(2, 5, 32)
    first = layer.forward_first_token(X)
    assert first.shape == (2, 1, 32)
    torch.testing.assert_close(first, layer(X)[0][:, :1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(first, layer(X[:, :1])[0], atol=1e-3)  # the other tokens' keys and values count
