"""timm's Eva class (EVA-01, EVA-02 and their CLIP towers): read off the module into a ViTConfig, its weights
renamed into timm's VisionTransformer layout, which layout.py then reads as ours.

EVA-02 is a pre-norm ViT with a learned table *and* rotary phases in EVA's layout (the first half of each head's
pairs turns with the row y, positions scaled to a reference grid), SwiGLU with separate gate and value weights
and a norm on its hidden layer, and separate query and value biases (the key has none). Each has a ViTConfig
field, as has RoPE-Mixed (learned per-layer frequencies), and EVA-02 enormous's post-norm blocks are
ViTConfig.layer='res_post'; Sapiens 2's grouped-query attention (fewer key/value heads in its middle layers) and
LayerScale on the attention branch alone are ViTConfig.kv_heads and layer_scale_attn_only; what has none (M-RoPE;
gated attention) is refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor, nn

from vit.interop.timm.modules import mlp_activation, shared_fields
from vit.model.config import RopeGrid, ViTConfig, pos_embed_of


def config_of_eva_model(model: nn.Module) -> ViTConfig:
    """Every architectural choice of a timm Eva model as a ViTConfig; a ValueError names one ViTConfig lacks."""
    from timm.layers import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed
    from timm.layers.attention import AttentionRope
    from timm.models.eva import EvaAttention, EvaBlock, EvaBlockPostNorm

    block = model.blocks[0]
    if type(block) not in (EvaBlock, EvaBlockPostNorm):
        raise ValueError(f"its layers are timm's {type(block).__name__}, not EvaBlock or EvaBlockPostNorm")
    post_norm = type(block) is EvaBlockPostNorm  # EVA-02 enormous: the norm on each branch's output, no layer scale
    attn, mlp = block.attn, block.mlp
    if type(attn) not in (EvaAttention, AttentionRope):
        raise ValueError(f"its attention is timm's {type(attn).__name__}")
    if any(type(b) is not type(block) or type(b.attn) is not type(attn) for b in model.blocks):
        raise ValueError("its layers are not all of one kind")
    if attn.gate is not None:
        raise ValueError("its attention is gated")
    kv_heads = [getattr(b.attn, "num_kv_heads", attn.num_heads) for b in model.blocks]  # Sapiens 2's differ by layer
    gamma_1, gamma_2 = getattr(block, "gamma_1", None), getattr(block, "gamma_2", None)
    if gamma_1 is None and gamma_2 is not None:
        raise ValueError("it scales the MLP branch alone")
    act = mlp_activation(mlp)
    rope = model.rope
    eva_layout = type(rope) is RotaryEmbeddingCat and not rope.in_pixels
    dinov3_layout = (
        type(rope) is RotaryEmbeddingDinoV3 and rope.min_period is None and rope.normalize_coords == "separate"
    )
    mixed = type(rope) is RotaryEmbeddingMixed  # learned frequencies on index positions
    if rope is not None and not (eva_layout or dinov3_layout or mixed):
        raise ValueError(f"its rotary embedding is timm's {type(rope).__name__} in a layout ours lacks")
    projections = (attn.qkv, attn.q_proj)  # one of them: fused or separate
    has_qkv_bias = getattr(attn, "q_bias", None) is not None or any(
        m is not None and m.bias is not None for m in projections
    )
    fields = shared_fields(model, act)
    rotary = "none" if rope is None else "rope_mixed" if mixed else "rope2d"
    return ViTConfig(
        **{**fields, "pos_embed": pos_embed_of(fields["pos_embed"], rotary)},
        qkv_bias=has_qkv_bias,
        pos_temperature=float(rope.temperature) if rope is not None else 10000.0,
        rope=RopeGrid(
            # timm stacks the grid's coordinates (row, column) for 'ij' indexing: the first half of the pairs turns
            # with y
            axes="yx" if rope is None or rope.grid_indexing == "ij" else "xy",
            grid="centered" if dinov3_layout else "index",
            offset=float(getattr(rope, "grid_offset", 0.0)),
            ref_grid=tuple(rope.ref_feat_shape) if eva_layout and rope.ref_feat_shape is not None else None,
        ),
        reg_tokens=model.reg_token.shape[1] if model.reg_token is not None else 0,
        layer="res_post" if post_norm else "pre",
        layer_scale_init=1e-5 if gamma_1 is not None else None,  # the start value is not needed
        layer_scale_attn_only=gamma_1 is not None and gamma_2 is None,
        kv_heads=None if set(kv_heads) == {attn.num_heads} else kv_heads[0] if len(set(kv_heads)) == 1 else kv_heads,
        pool_prefix=model.global_pool == "map",  # Eva's attention pool reads every token; its mean, the patches only
    )


_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_RENAMES = {"gamma_1": "ls1.gamma", "gamma_2": "ls2.gamma"}
_PACKED = {  # Eva's separate tensors that VisionTransformer's layout holds in one
    *(f"attn.{name}" for name in ("q_bias", "v_bias", "q_proj.weight", "k_proj.weight", "v_proj.weight")),
    *(f"attn.{name}" for name in ("q_proj.bias", "k_proj.bias", "v_proj.bias")),
    *(f"mlp.{name}" for name in ("fc1_g.weight", "fc1_x.weight", "fc1_g.bias", "fc1_x.bias")),
}


def half_split_to_pairs(head_dim: int) -> Tensor:
    """The order of a head's dims that makes DINOv3's half-split rotation (dim i turns with dim i + d/2) our
    interleaved one (2i with 2i + 1): position 2i takes dim i, 2i + 1 takes dim i + d/2. Queries and keys
    permuted alike keep every dot product, so the rows of W_q and W_k are reordered once, at loading. (d,)"""
    return torch.arange(head_dim).reshape(2, head_dim // 2).T.flatten()


def pair_heads(state: dict[str, Tensor], num_heads: int, head_dim: int) -> dict[str, Tensor]:
    """Reorder each head's query and key dims (qkv rows, their biases, qk-norm gains) by half_split_to_pairs. The
    qkv rows are H query heads, then G key and G value heads (G = H but for grouped-query attention)."""
    out, order = dict(state), half_split_to_pairs(head_dim)
    for key, value in state.items():
        if m := re.match(r"^blocks\.\d+\.attn\.(qkv\.(weight|bias)|[qk]_norm\.(weight|bias))$", key):
            if m[1].startswith("qkv"):
                heads = value.reshape(-1, head_dim, *value.shape[1:]).clone()  # (H + 2G, D_k, ...)
                turned = num_heads + (heads.shape[0] - num_heads) // 2  # the query and key heads; values keep order
                heads[:turned] = heads[:turned, order]
                out[key] = heads.reshape(value.shape)
            else:
                out[key] = value[order]
    return out


def eva_renaming(model: nn.Module) -> Callable[[dict[str, Tensor]], dict[str, Tensor]]:
    """The state-dict translation of this Eva model: eva_to_timm, then, for half-split rotation, pair_heads, and for
    RoPE-Mixed on 'ij' coordinates (t_x the row), its frequencies swapped so that the first multiplies x."""
    attn, rope = model.blocks[0].attn, model.rope
    steps = [eva_to_timm]
    if rope is not None and attn.rotate_half:
        steps.append(lambda state: pair_heads(state, attn.num_heads, attn.head_dim))
    if rope is not None and "freqs" in dict(rope.named_parameters()) and rope.grid_indexing == "ij":
        steps.append(lambda state: {**state, "rope.freqs": state["rope.freqs"].flip(0)})

    def rename(state: dict[str, Tensor]) -> dict[str, Tensor]:
        for step in steps:
            state = step(state)
        return state

    return rename


def eva_to_timm(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Eva's keys -> timm VisionTransformer's: one qkv weight and bias (the key's bias zero where Eva has none, as
    EVA computes it, or its own: under rotary phases q·R_j b_k differs from key to key), SwiGLU's gate and value
    weights packed as [W_g; W_v] in fc1, gamma_1/2 as LayerScale gains. Rotary buffers are dropped: the model
    computes them; RoPE-Mixed's learned rope.freqs (2, depth, heads, head_dim/2) keep their name and layout."""
    out: dict[str, Tensor] = {}
    parts: dict[tuple[int, str], Tensor] = {}
    for key, value in state.items():
        if key.startswith("rope.") and key != "rope.freqs":  # buffers; RoPE-Mixed's learned frequencies stay
            continue
        m = _BLOCK.match(key)
        if m is None:
            out[key] = value
            continue
        layer, rest = int(m[1]), m[2]
        if rest in _RENAMES:
            out[f"blocks.{layer}.{_RENAMES[rest]}"] = value
        elif rest in _PACKED:
            parts[(layer, rest)] = value
        else:
            out[key] = value
    for layer in sorted({layer for layer, _ in parts}):
        get = lambda name, layer=layer: parts.get((layer, name))  # noqa: E731
        if (w := get("attn.q_proj.weight")) is not None:
            out[f"blocks.{layer}.attn.qkv.weight"] = torch.cat(
                (w, get("attn.k_proj.weight"), get("attn.v_proj.weight"))
            )
        q_bias, k_bias, v_bias = get("attn.q_bias"), None, get("attn.v_bias")
        if q_bias is None:  # separate projections, the key's with a bias of its own (Sapiens 2) or none
            q_bias, k_bias, v_bias = (get(f"attn.{p}_proj.bias") for p in "qkv")
        if q_bias is not None:
            k_bias = torch.zeros_like(v_bias) if k_bias is None else k_bias
            out[f"blocks.{layer}.attn.qkv.bias"] = torch.cat((q_bias, k_bias, v_bias))
        if (g := get("mlp.fc1_g.weight")) is not None:
            out[f"blocks.{layer}.mlp.fc1.weight"] = torch.cat((g, get("mlp.fc1_x.weight")))
            if (gb := get("mlp.fc1_g.bias")) is not None:
                out[f"blocks.{layer}.mlp.fc1.bias"] = torch.cat((gb, get("mlp.fc1_x.bias")))
    return out
