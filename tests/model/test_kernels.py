"""Each kernel of vit/model/kernels.py against its reference, forward and backward, in each dtype it serves, and each
dispatch policy's decisions. CUDA variants are marked gpu and skip where no CUDA device is present."""

import pytest
import torch

from tests.helpers import relative_error
from vit.model import kernels
from vit.model.attention import attend_heads, attention_reference

F32, BF16 = torch.float32, torch.bfloat16
CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
)
TOLERANCE = {F32: 1e-5, BF16: 2e-2}  # relative, against the reference in fp64 (bf16: 8 bits of mantissa, CUDA kernels)


@pytest.fixture
def compiling(monkeypatch):
    """Set what torch.compiler.is_compiling answers, as while torch.compile traces."""
    return lambda answer: monkeypatch.setattr(torch.compiler, "is_compiling", lambda: answer)


def calls_of(monkeypatch, name: str) -> list[int]:
    """One entry per call of kernels.<name>, which still computes."""
    calls, kernel = [], getattr(kernels, name)
    monkeypatch.setattr(kernels, name, lambda *a: calls.append(1) or kernel(*a))
    return calls


def grads(out: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The gradient of <out, G> for a fixed random G: every output element weighted differently. The graph is kept:
    rope's phases feed both the kernel and its reference."""
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(out.device)
    return list(torch.autograd.grad(out.double().mul(g).sum(), inputs, retain_graph=True))


def skip_unserved(device: str, dtype: torch.dtype) -> None:
    if device == "cuda" and dtype == BF16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")


# --- softmax_rows and the opaque softmax ---


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_the_opaque_softmax_is_torchs_softmax_bit_for_bit_forward_and_backward(dtype):
    """Its backward calls torch's private torch._softmax_backward_data: this pins that call's contract, the same
    gradient as Tensor.softmax's own backward and the closed form w ⊙ (g − Σ_j g_j w_j), in the weights' dtype."""
    scores = (torch.randn(2, 3, 5, 7) * 3).to(dtype).requires_grad_()  # not square: the axis must be the last
    g = torch.randn(2, 3, 5, 7).to(dtype)
    got, expected = kernels.opaque_softmax(scores), scores.softmax(-1)
    (got_grad,), (expected_grad,) = (torch.autograd.grad(y, scores, g) for y in (got, expected))
    assert got.dtype == got_grad.dtype == dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(got_grad, expected_grad, rtol=0, atol=0)
    w, g = expected.double(), g.double()
    assert relative_error(got_grad, w * (g - (g * w).sum(-1, keepdim=True))) < TOLERANCE[dtype]


def test_the_opaque_softmax_passes_torchs_checks_of_a_custom_op():
    scores = torch.randn(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(kernels.opaque_softmax, (scores,))
    torch.library.opcheck(kernels.opaque_softmax, (scores.detach().bfloat16().requires_grad_(),))


@pytest.mark.parametrize(
    ("dtype", "compiled", "grad", "opaque"),
    [(BF16, True, True, True), (BF16, True, False, False), (BF16, False, True, False), (F32, True, True, False)],
    ids=["compiled bf16 training", "compiled bf16 inference", "eager bf16 training", "compiled fp32 training"],
)
def test_softmax_rows_hides_the_softmax_from_inductor_only_in_compiled_cpu_bf16_training(
    monkeypatch, compiling, dtype, compiled, grad, opaque
):
    compiling(compiled)
    calls = calls_of(monkeypatch, "opaque_softmax")
    scores = torch.randn(2, 4, 6).to(dtype)
    with torch.set_grad_enabled(grad):
        out = kernels.softmax_rows(scores)
    assert bool(calls) == opaque
    torch.testing.assert_close(out, scores.softmax(-1), rtol=0, atol=0)


# --- fused attention against attention_reference ---


@pytest.mark.parametrize(
    ("device", "dtype", "compiled", "grad", "fused"),
    [
        ("cpu", F32, False, True, True),
        ("cpu", BF16, False, True, False),  # the CPU flash kernel's bf16 backward is slow
        ("cpu", BF16, False, False, False),
        ("cpu", BF16, True, True, False),
        ("cpu", BF16, True, False, True),  # compiled inference: inductor's fused kernel wins
        ("meta", BF16, False, True, True),  # any other device
    ],
)
def test_fused_attention_serves_all_but_bf16_on_a_cpu_outside_compiled_inference(
    compiling, device, dtype, compiled, grad, fused
):
    compiling(compiled)
    with torch.set_grad_enabled(grad):
        assert kernels.fused_attention_serves(torch.empty(2, dtype=dtype, device=device)) is fused


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("queries", [9, 1], ids=["self-attention", "one query (attention pooling)"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no bias", "relative position bias"])
def test_fused_attention_is_attention_reference_forward_and_backward(monkeypatch, device, dtype, queries, with_bias):
    """attend_heads both ways, torch's fused kernel and written out, against attention_reference in fp64."""
    skip_unserved(device, dtype)
    shapes = [(2, 3, queries, 8), (2, 3, 9, 8), (2, 3, 9, 8)] + ([(3, queries, 9)] if with_bias else [])  # q, k, v, B
    inputs = [torch.randn(shape, device=device).to(dtype).requires_grad_() for shape in shapes]
    q, k, v, *bias = inputs
    expected, _ = attention_reference(*(t.double() for t in (q, k, v)), bias=bias[0].double() if bias else None)
    expected_grads = grads(expected, inputs)
    for serves in (True, False):
        monkeypatch.setattr(kernels, "fused_attention_serves", lambda v, serves=serves: serves)
        out, _ = attend_heads(q, k, v, 0.0, fused=True, bias=bias[0] if bias else None)
        assert out.dtype == dtype
        assert relative_error(out, expected) < TOLERANCE[dtype], serves
        for got, want in zip(grads(out, inputs), expected_grads, strict=True):
            assert relative_error(got, want) < TOLERANCE[dtype], serves


# --- rotary position embedding ---


@pytest.mark.parametrize("compiled", [False, True], ids=["eager: complex", "compiled: multiply-add"])
def test_rope_is_the_complex_product_eager_and_the_multiply_add_compiled(monkeypatch, compiling, compiled):
    compiling(compiled)
    complex_calls = calls_of(monkeypatch, "rope_complex")
    multiply_add_calls = calls_of(monkeypatch, "rope_multiply_add")
    cos, sin = torch.randn(2, 6, 8).unbind(0)
    kernels.rope(torch.randn(2, 6, 8), cos, sin)
    assert (len(complex_calls), len(multiply_add_calls)) == ((0, 1) if compiled else (1, 0))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("form", ["rope_complex", "rope_multiply_add"])
def test_each_rope_form_turns_each_pair_as_the_reference_forward_and_backward(device, dtype, form):
    """q a strided view of the fused QKV as attention's, in the autocast dtype; the phases fp32 as the model's
    buffers, with a gradient as RoPE-Mixed learns them."""
    skip_unserved(device, dtype)
    angles = torch.randn(36, 8, device=device, requires_grad=True)  # one per pair
    qkv = torch.randn(2, 36, 3, 4, 16, device=device).to(dtype).requires_grad_()
    q = qkv.permute(2, 0, 3, 1, 4)[0]  # (B, H, N, d)
    cos, sin = angles.repeat_interleave(2, dim=-1).cos(), angles.repeat_interleave(2, dim=-1).sin()  # (N, d)
    got = getattr(kernels, form)(q, cos, sin)
    expected = kernels.rope_reference(q.double(), cos.double(), sin.double())
    assert got.dtype == dtype
    assert relative_error(got, expected) < TOLERANCE[dtype]
    for a, b in zip(grads(got, [qkv, angles]), grads(expected, [qkv, angles]), strict=True):
        assert relative_error(a, b) < TOLERANCE[dtype]


def test_the_rope_reference_is_a_rotation_of_each_pair():
    """(x_2i, x_2i+1) times the 2 x 2 rotation matrix of the pair's angle, one pair at a time."""
    x, theta = torch.randn(5, 6, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    cos, sin = theta.repeat_interleave(2, dim=-1).cos(), theta.repeat_interleave(2, dim=-1).sin()
    got = kernels.rope_reference(x, cos, sin)
    for n in range(5):
        for i in range(3):
            c, s = theta[n, i].cos(), theta[n, i].sin()
            rotation = torch.stack((torch.stack((c, -s)), torch.stack((s, c))))
            torch.testing.assert_close(got[n, 2 * i : 2 * i + 2], rotation @ x[n, 2 * i : 2 * i + 2])


# --- the patch embedding as a matrix product ---


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize(
    ("patch", "chans", "size"),
    [((7, 7), 1, (28, 28)), ((4, 2), 3, (8, 6)), ((16, 16), 3, (32, 48)), ((14, 14), 3, (34, 31)), ((4, 2), 1, (7, 9))],
)
def test_the_patch_matmul_is_the_strided_convolution_forward_and_backward(dtype, patch, chans, size):
    """Under the autocast a run trains in; the weight's and bias's gradients are what training reads. Sides of no
    whole number of patches: both leave the last rows and columns out (the grid floors)."""
    weight = torch.randn(16, chans, *patch, requires_grad=True)
    bias = torch.randn(16, requires_grad=True)
    images = torch.randn(3, chans, *size)
    with torch.autocast("cpu", BF16, enabled=dtype == BF16):
        got = kernels.patch_matmul(images, weight, bias, patch)
    expected = torch.nn.functional.conv2d(images.double(), weight.double(), bias.double(), stride=patch)
    expected = expected.flatten(2).transpose(1, 2)  # (B, h*w, D)
    assert got.dtype == dtype and got.shape == expected.shape
    assert relative_error(got, expected) < TOLERANCE[dtype]
    for a, b in zip(grads(got, [weight, bias]), grads(expected, [weight, bias]), strict=True):
        assert relative_error(a, b) < TOLERANCE[dtype]


def test_the_patch_matmul_serves_cpus_only():
    assert kernels.patch_matmul_serves(torch.empty(1, 1, 2, 2))
    assert not kernels.patch_matmul_serves(torch.empty(1, 1, 2, 2, device="meta"))


# --- attention within each image of a packed sequence ---

# token counts of the images of each packed sequence, padded to the longest: odd lengths, an image past a 128-slot
# block, one of a single token, a sequence of one image, padding at each end but the longest's
LAYOUTS = [[[3, 5], [7], [1, 2, 2]], [[130, 7, 1], [61], [128, 9]]]


def owners(layout: list[list[int]]) -> torch.Tensor:
    """Packing's owner of each slot (S, L): the image's index, or for a padding slot a negative number its own."""
    length = max(sum(sizes) for sizes in layout)
    owner, image = torch.empty(len(layout), length, dtype=torch.long), 0
    for k, sizes in enumerate(layout):
        at = 0
        for n in sizes:
            owner[k, at : at + n], image, at = image, image + 1, at + n
        owner[k, at:] = -1 - torch.arange(k * length + at, (k + 1) * length)
    return owner


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_block_mask_keeps_the_dense_masks_pairs_and_skips_blocks_no_image_spans(layout):
    owner = owners(layout)
    block = kernels.block_document_mask(owner)
    dense = kernels.dense_document_mask(owner, F32)
    torch.testing.assert_close(kernels.dense_mask(block, F32), dense, rtol=0, atol=0)
    same = owner[:, :, None] == owner[:, None, :]  # written out pair by pair, as packing.py states it
    assert torch.equal(dense[:, 0] == 0, same) and torch.equal(dense[:, 0] == float("-inf"), ~same)
    if owner.shape[1] > 128:  # sequence 3's images, 128 and 9 tokens, meet in no block: 1 of 2 blocks a row
        assert (block.kv_num_blocks + block.full_kv_num_blocks)[2, 0].tolist() == [1, 1]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fused", [True, False])
def test_attention_on_the_block_mask_is_attention_on_the_dense_mask(monkeypatch, layout, fused):
    """Forward only: on a CPU FlexAttention has no backward (CUDA's below); eager it computes what compiled does, and
    saves this test the compile. Unfused or asked for weights, attend_heads writes the BlockMask out."""
    monkeypatch.setattr(kernels, "_compiled_flex_attention", lambda: kernels.flex_attention)
    owner = owners(layout)
    q, k, v = torch.randn(3, len(layout), 2, owner.shape[1], 8).unbind(0)  # (S, H, L, D_k)
    with torch.no_grad():
        got, weights = attend_heads(
            q, k, v, 0.0, fused, need_weights=not fused, bias=kernels.block_document_mask(owner)
        )
        expected, dense_weights = attention_reference(q, k, v, bias=kernels.dense_document_mask(owner, F32))
    assert relative_error(got, expected) < TOLERANCE[F32]
    if not fused:
        torch.testing.assert_close(weights, dense_weights)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_document_attention_under_autocast_computes_in_its_dtype_as_fused_attention_does(monkeypatch):
    """A norm's fp32 queries and keys beside bf16 values: compiled FlexAttention takes one dtype (eager, which stands
    in for it here, would mix them), the autocast one."""
    dtypes = []

    def flex(q, k, v, **kwargs):
        dtypes.append({q.dtype, k.dtype, v.dtype})
        return kernels.flex_attention(q, k, v, **kwargs)

    monkeypatch.setattr(kernels, "_compiled_flex_attention", lambda: flex)
    owner = owners(LAYOUTS[0])
    q, k = torch.randn(2, 3, 2, owner.shape[1], 8).unbind(0)
    v = torch.randn(3, 2, owner.shape[1], 8).to(BF16)
    with torch.no_grad(), torch.autocast("cpu", BF16):
        got = kernels.document_attention(q, k, v, kernels.block_document_mask(owner))
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=kernels.dense_document_mask(owner, BF16)
        )
    assert dtypes == [{BF16}] and got.dtype == expected.dtype == BF16
    assert relative_error(got, expected) < TOLERANCE[BF16]


def test_flex_attention_serves_gpus_only():
    assert not kernels.flex_attention_serves(torch.empty(1))
    assert isinstance(kernels.document_mask(owners(LAYOUTS[0]), F32), torch.Tensor)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_document_attention_is_fused_attention_on_the_dense_mask_forward_and_backward(dtype, layout, dropout):
    """Compiled FlexAttention against torch's fused attention on the dense mask (itself held to attention_reference
    above); with dropout both draw from one seed on the dense mask."""
    skip_unserved("cuda", dtype)
    owner = owners(layout).cuda()
    mask = kernels.document_mask(owner, dtype)
    assert isinstance(mask, kernels.BlockMask)
    q, k, v = (t.to(dtype).requires_grad_() for t in torch.randn(3, len(layout), 2, owner.shape[1], 64).cuda())
    torch.manual_seed(0)
    got = kernels.document_attention(q, k, v, mask, dropout)
    torch.manual_seed(0)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=kernels.dense_document_mask(owner, dtype), dropout_p=dropout
    )
    assert relative_error(got, expected) < TOLERANCE[dtype]
    for a, b in zip(grads(got, [q, k, v]), grads(expected, [q, k, v]), strict=True):
        assert relative_error(a, b) < TOLERANCE[dtype]
