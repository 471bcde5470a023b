import pytest
import torch
import torch.nn.functional as F

from tests.helpers import perturb_, relative_error
from vit.model.attention import MultiHeadAttention, attention_reference
from vit.model.pos_embed import rope_2d


def make_attention(fused: bool = True, qkv_bias: bool = True) -> MultiHeadAttention:
    return perturb_(MultiHeadAttention(32, 4, qkv_bias, attn_dropout=0.0, dropout=0.0, fused=fused), std=0.2)


def test_weights_are_non_negative_and_rows_sum_to_one():
    _, weights = make_attention()(torch.randn(3, 10, 32) * 3, need_weights=True)
    assert weights.shape == (3, 4, 10, 10)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 10))


def test_reference_is_softmax_of_scaled_scores_times_values():
    q, k, v = torch.randn(3, 2, 6, 8).unbind(0)
    out, weights = attention_reference(q, k, v)
    scores = torch.einsum("hnd,hmd->hnm", q, k) / 8**0.5
    expected_w = scores.exp() / scores.exp().sum(-1, keepdim=True)
    torch.testing.assert_close(weights, expected_w)
    torch.testing.assert_close(out, expected_w @ v)


@pytest.mark.parametrize("with_rope", [False, True])
def test_fast_path_agrees_with_reference_path(with_rope):
    attn = make_attention().eval()
    x = torch.randn(2, 12, 32)
    rope = rope_2d((3, 4), 8) if with_rope else None
    fast, none = attn(x, rope)
    attn.fused = False
    slow, _ = attn(x, rope)
    assert none is None
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)  # fp32: only summation order differs


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """One entry per call of torch's fused attention kernel, which still computes."""
    calls = []
    fused_kernel = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused_kernel(*a, **k))
    return calls


def test_bf16_on_a_cpu_takes_the_written_out_path_and_stays_near_fp32(fused_calls):
    """torch's CPU flash kernel trains 2-4x slower in bf16 than the two products and softmax; fp32 keeps it."""
    attn, x = make_attention(), torch.randn(2, 12, 32, requires_grad=True)
    expected, _ = attn(x)
    assert fused_calls == [1]
    with torch.autocast("cpu", torch.bfloat16):
        out, _ = attn(x)
    assert fused_calls == [1] and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=5e-2, rtol=5e-2)  # bf16: 8 bits of mantissa
    out.float().sum().backward()
    assert x.grad is not None and x.grad.isfinite().all()


def test_multi_head_output_is_sum_over_heads_of_head_times_its_output_projection():
    attn = make_attention()
    x = torch.randn(2, 7, 32)
    out, weights = attn(x, need_weights=True)
    Wq, Wk, Wv = attn.qkv.weight.chunk(3)  # each (D, D), heads stacked along the output dim
    bq, bk, bv = attn.qkv.bias.chunk(3)
    Wo, total = attn.out_proj.weight, attn.out_proj.bias.expand(2, 7, 32)
    for h in range(4):
        rows = slice(8 * h, 8 * h + 8)
        Q, K, V = (x @ W[rows].T + b[rows] for W, b in ((Wq, bq), (Wk, bk), (Wv, bv)))  # (B, N, D_k)
        A = (Q @ K.transpose(1, 2) / 8**0.5).softmax(-1)
        torch.testing.assert_close(A, weights[:, h])
        H_h = A @ V  # (B, N, D_k)
        total = total + H_h @ Wo[:, rows].T  # H_h W_h⁽ᵒ⁾
    torch.testing.assert_close(out, total, atol=1e-5, rtol=1e-5)


def test_unparameterised_attention_returns_orthogonal_inputs_as_scale_grows():
    X = torch.linalg.qr(torch.randn(16, 16))[0][:6]  # 6 orthonormal rows in R^16
    errors = []
    for s in (1.0, 3.0, 10.0):
        Xs = s * X
        out, _ = attention_reference(Xs, Xs, Xs, scale=1.0)  # Softmax[X Xᵀ] X
        errors.append((out / s - X).abs().max().item())
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-6


def test_attention_is_permutation_equivariant():
    attn = make_attention()
    x, perm = torch.randn(2, 9, 32), torch.randperm(9)
    torch.testing.assert_close(attn(x[:, perm])[0], attn(x)[0][:, perm], atol=1e-5, rtol=1e-5)


def test_attention_dropout_only_in_training():
    attn = MultiHeadAttention(32, 4, True, attn_dropout=0.5, dropout=0.0, fused=True)
    x = torch.randn(2, 9, 32)
    attn.eval()
    torch.testing.assert_close(attn(x)[0], attn(x)[0])
    attn.train()
    assert not torch.allclose(attn(x)[0], attn(x)[0])


def test_compiled_bf16_training_on_a_cpu_keeps_attention_written_out():
    """Inductor's pattern matcher puts torch's CPU flash kernel back in place of the written-out attention of a
    one-head model such as the default one, whose bf16 backward then took 1.8x its whole step; the softmax hides it."""
    from torch._dynamo.utils import counters

    from vit.model.presets import create_model

    model = perturb_(create_model("vit_fashion_mnist", depth=1, embed_dim=32), std=0.2)
    x = torch.randn(4, 1, 28, 28)
    torch._dynamo.reset()
    counters.clear()
    # compiled afresh: a graph from inductor's caches would skip the pass whose count this reads
    with torch._inductor.config.patch(fx_graph_cache=False), torch.autocast("cpu", torch.bfloat16):
        expected, out = model(x), torch.compile(model)(x)
        grads = [torch.autograd.grad(y.float().sum(), model.parameters()) for y in (out, expected)]
    assert counters["inductor"]["fuse_attention"] == 0
    torch.testing.assert_close(out.float(), expected.float(), atol=3e-2, rtol=3e-2)
    # norm-wise: bf16 roundings, which differ with the thread count, moved single elements by 6% on one thread
    assert max(relative_error(g, e) for g, e in zip(*grads, strict=True)) < 5e-2
