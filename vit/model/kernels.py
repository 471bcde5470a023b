"""The model's kernels and dispatch policies: each place where it computes an equation in another form than its
file writes, and when. Each kernel sits beside the reference it must equal, and tests/model/test_kernels.py holds it
to that reference, forward and backward, in each dtype it serves. The model files call these by name where their
fast path forks, and otherwise read as the equations.

- `softmax_rows`: the softmax of written-out attention. While torch.compile traces a CPU bf16 training step it is
  `opaque_softmax`, a custom op inductor cannot see into: its pattern matcher would otherwise put torch's CPU flash
  kernel back in place of the written-out attention (it does for one-head models), and that kernel's bf16 backward
  is slow (benchmarks/NOTES.md change 26). Reference: `Tensor.softmax` and its gradient, whose kernel, the private
  `torch._softmax_backward_data`, its backward calls (the test pins that call).
- `fused_attention_serves`: where torch's fused `scaled_dot_product_attention` computes attention rather than
  `vit.model.attention.attention_reference`: everywhere but bf16 on a CPU, where two matrix products and a softmax
  train faster than torch's CPU flash kernel, save compiled inference, where inductor's own fused kernel wins
  (change 11). Reference: `attention_reference`.
- `rope`: the rotation of `vit.model.pos_embed.apply_rope`; eager a complex product, `rope_complex`, one pass over
  x (change 33); compiled the multiply-add on the swapped pairs, `rope_multiply_add`, which inductor fuses into one
  pass itself, having no code for complex numbers (change 25). Reference: `rope_reference`, each pair turned as
  written.
- `patch_matmul`: the patch embedding on a CPU (`patch_matmul_serves`) as one matrix product over the patches that
  `patchify` cuts out; oneDNN's CPU convolution is slow for small, few-channel images, in its weight gradient above
  all (change 1). Reference: the strided convolution of `vit.model.patch_embed.PatchEmbed`, the path on GPUs.
- `document_mask`: what keeps each image packed into a sequence (vit/model/packing.py) to its own tokens. Where
  `flex_attention_serves` (a GPU), a FlexAttention BlockMask that `document_attention` reads, skipping the blocks
  between images and never writing an (L, L) tensor; on a CPU, where FlexAttention has no backward (torch 2.14) and
  infers, compiled, slower than torch's flash kernel reads the dense mask, the reference `dense_document_mask`, the
  additive (S, 1, L, L) mask (`dense_mask` writes a BlockMask out as that reference).
- `GridCache`: a fixed position table or rope's phases at a grid other than the model's own, kept for the last few
  grids rather than computed each forward; while torch.compile traces, computed (the graph keeps it as a constant).
  Reference: the table's function itself, `vit.model.pos_embed.sincos_2d` or `rope_2d`
  (tests/model/test_pos_embed.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import cache, partial
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention


def _cpu_bf16(t: Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype == torch.bfloat16


# --- the softmax of written-out attention ---


def softmax_rows(scores: Tensor) -> Tensor:
    """Softmax over the last axis; while torch.compile traces a CPU bf16 training step, as an op inductor cannot see
    into (change 26)."""
    if _cpu_bf16(scores) and torch.compiler.is_compiling() and torch.is_grad_enabled():
        return opaque_softmax(scores)
    return scores.softmax(dim=-1)


@torch.library.custom_op("vit::softmax_rows", mutates_args=())
def opaque_softmax(scores: Tensor) -> Tensor:
    """scores.softmax(-1), forward and backward, as one op that inductor's pattern matcher cannot see into."""
    return scores.softmax(dim=-1)


@opaque_softmax.register_fake
def _(scores: Tensor) -> Tensor:
    return torch.empty_like(scores)


def _keep_weights(ctx, inputs: tuple[Tensor], output: Tensor) -> None:
    ctx.save_for_backward(output)  # the weights


def _softmax_backward(ctx, grad: Tensor) -> Tensor:
    """w ⊙ (g − Σ_j g_j w_j): the kernel autograd runs for Tensor.softmax (private to torch; test_kernels pins it)."""
    (weights,) = ctx.saved_tensors
    return torch._softmax_backward_data(grad, weights, -1, weights.dtype)


opaque_softmax.register_autograd(_softmax_backward, setup_context=_keep_weights)


# --- fused attention against attention_reference ---


def fused_attention_serves(v: Tensor) -> bool:
    """Whether torch's fused attention computes softmax(Q Kᵀ / √D_k + B) V for these values, rather than
    attention_reference: not in bf16 on a CPU, where its flash kernel's bf16 backward is slow, except for compiled
    inference, which inductor fuses better (change 11)."""
    if not _cpu_bf16(v):
        return True
    return not torch.is_grad_enabled() and torch.compiler.is_compiling()


# --- rotary position embedding ---


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """rope_reference's rotation: eager as a complex product; compiled as the multiply-add, since inductor generates
    no code for complex numbers (changes 25, 33). x (..., N, d), cos and sin (N, d) -> (..., N, d), in x's dtype."""
    if torch.compiler.is_compiling():
        return rope_multiply_add(x, cos, sin)
    return rope_complex(x, cos, sin)


def rope_reference(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Each pair (x_2i, x_2i+1) turned by its phase as written: (x_2i cos − x_2i+1 sin, x_2i+1 cos + x_2i sin),
    with cos and sin repeated for both members of a pair."""
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[..., 0::2], sin[..., 0::2]
    return torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2).to(x.dtype)


def rope_complex(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Each pair as the complex number x_2i + i x_2i+1 times e^(iθ): one pass over x (change 33)."""
    real = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)  # complex needs fp32 or fp64
    phase = torch.complex(cos[..., 0::2].to(real), sin[..., 0::2].to(real))  # e^(i theta): (N, d/2)
    pairs = torch.view_as_complex(x.to(real).unflatten(-1, (-1, 2)))  # x_2i + i x_2i+1: (..., N, d/2)
    return torch.view_as_real(pairs * phase).flatten(-2).to(x.dtype)


def rope_multiply_add(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x cos + (x_2i+1, x_2i) (−sin, sin): one multiply-add on the swapped pairs, which inductor fuses (change 25)."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x_2i+1, x_2i)
    signed_sin = torch.stack((-sin[..., 0::2], sin[..., 1::2]), dim=-1).flatten(-2)  # (-sin, sin): (N, d)
    return torch.addcmul(x * cos, swapped, signed_sin).to(x.dtype)


# --- the patch embedding as a matrix product ---


def patch_matmul_serves(images: Tensor) -> bool:
    """Whether patch_matmul embeds these images: on a CPU, where oneDNN's convolution is the slower (change 1)."""
    return images.device.type == "cpu"


def patch_matmul(images: Tensor, weight: Tensor, bias: Tensor | None, patch_size: tuple[int, int]) -> Tensor:
    """x_n = E p_n + b for every patch at once, E the convolution's weight (D, C, P_h, P_w) flattened: the strided
    convolution's tokens, (B, C, H, W) -> (B, h*w, D)."""
    E = weight.flatten(1)  # (D, C * P_h * P_w)
    return F.linear(patchify(images, patch_size), E, bias)


def patchify(images: Tensor, patch_size: tuple[int, int]) -> Tensor:
    """(B, C, H, W) -> (B, h*w, C*P_h*P_w): the h = ⌊H/P_h⌋ by w = ⌊W/P_w⌋ whole patches in raster order, each
    flattened as (channel, row, column), the order of a convolution kernel's weights; the rows and columns past the
    last whole patch (bottom and right) are left out, as the strided convolution leaves them."""
    B, C, H, W = images.shape
    ph, pw = patch_size
    h, w = H // ph, W // pw
    images = images[:, :, : h * ph, : w * pw]  # (B, C, h P_h, w P_w): a view, copied by the reshape only if cropped
    patches = images.reshape(B, C, h, ph, w, pw).permute(0, 2, 4, 1, 3, 5)  # (B, h, w, C, P_h, P_w)
    return patches.reshape(B, h * w, C * ph * pw)


# --- attention within each image of a packed sequence ---


def document_mask(owner: Tensor, dtype: torch.dtype) -> Tensor | BlockMask:
    """The mask of packed sequences whose slot s of sequence k belongs to image owner[k, s] (S, L), each padding slot
    its own: a BlockMask where flex_attention_serves, else the reference dense_document_mask in `dtype`."""
    if flex_attention_serves(owner):
        return block_document_mask(owner)
    return dense_document_mask(owner, dtype)


def flex_attention_serves(t: Tensor) -> bool:
    """Whether packed attention runs as FlexAttention: on a GPU; not on a CPU, where it has no backward and infers
    slower than torch's flash kernel on the dense mask."""
    return t.device.type == "cuda"


def dense_document_mask(owner: Tensor, dtype: torch.dtype) -> Tensor:
    """(S, 1, L, L): M_st = 0 where slots s and t hold one image, -inf where not."""
    return _additive(owner[:, :, None] == owner[:, None, :], dtype).unsqueeze(1)  # (S, L, L) pairs kept


def block_document_mask(owner: Tensor) -> BlockMask:
    """dense_document_mask's pairs as a BlockMask: the blocks of 128 x 128 slots that no image spans are skipped."""
    S, L = owner.shape
    return create_block_mask(partial(_same_image, owner), S, None, L, L, device=owner.device)


def _same_image(owner: Tensor, k: Tensor, h: Tensor, s: Tensor, t: Tensor) -> Tensor:
    return owner[k, s] == owner[k, t]


def dense_mask(mask: BlockMask, dtype: torch.dtype) -> Tensor:
    """A BlockMask written out as the additive (S, 1, L, L) mask: 0 where it keeps a pair, -inf where not."""
    S, _, L, _ = mask.shape
    return _additive(create_mask(mask.mask_mod, S, 1, L, L, device=mask.kv_num_blocks.device), dtype)


def _additive(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask of the pairs attended as the additive one softmax reads: 0 where kept, -inf where not."""
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, float("-inf"))


def document_attention(q: Tensor, k: Tensor, v: Tensor, mask: BlockMask, dropout_p: float = 0.0) -> Tensor:
    """softmax(Q Kᵀ / √D_k + M) V with M the BlockMask's, (S, H, L, D_k) each: compiled FlexAttention (eager it is a
    slow reference); with attention dropout, which it lacks, torch's fused attention on the dense mask. Under autocast
    in the autocast dtype, as torch's fused attention would be (a norm's fp32 queries beside bf16 values)."""
    if torch.is_autocast_enabled(q.device.type):
        q, k, v = (t.to(torch.get_autocast_dtype(q.device.type)) for t in (q, k, v))
    if dropout_p:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(mask, q.dtype), dropout_p=dropout_p)
    attend = flex_attention if torch.compiler.is_compiling() else _compiled_flex_attention()
    return attend(q, k, v, block_mask=mask)


@cache
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=True)


# --- fixed position tables at other grids ---

T = TypeVar("T")


class GridCache:
    """Fixed tables (or rotary phases) of the last `size` grids other than the model's own, each on the device it was
    asked for: such a table is the same every forward, and computing it (float64 trigonometry on the CPU, then a
    copy to the device) costs more than the lookup. A model at another resolution, or NaFlex batches, ask for the
    same few grids again and again. While torch.compile traces, computed as before (the graph keeps it)."""

    def __init__(self, size: int = 32):
        self.size, self.tables = size, OrderedDict()

    def get(self, grid: tuple[int, int], device: torch.device, compute: Callable[[], T]) -> T:
        if torch.compiler.is_compiling():
            return compute()
        key = (tuple(grid), device)
        table = self.tables.pop(key, None)  # each step one dict operation: threads serving one model may interleave
        self.tables[key] = table = compute() if table is None else table  # now the last asked for
        while len(self.tables) > self.size:
            self.tables.popitem(last=False)  # the grid asked for longest ago
        return table
