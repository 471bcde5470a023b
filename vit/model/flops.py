"""The FLOPs of the network a ViTConfig declares, counted from the equations rather than measured, so that a run's
summary and the benchmarks' MFU state the same number without running the network.

Per image, for the forward pass (a multiply-add is 2 FLOPs), with N patches, T = N + prefix tokens, width D, MLP
width M, L layers, C channels, P_h x P_w patches and K classes:

    patch embedding   2 N (C P_h P_w) D
    each layer        2 T (3 D²)  +  2 T² D  +  2 T² D  +  2 T D²  +  2 T (2 D M)
                      (QKV)          (Q Kᵀ)     (A V)      (W⁽ᵒ⁾)     (MLP; SwiGLU's three matrices: 2 T (3 D M))
                    = 2 T (4 D² + 2 D M) + 4 T² D
                      (grouped-query keys and values, G of H heads: QKV is 2 T D² (1 + 2 G / H); differential
                      attention: A V twice, 6 T² D for the products)
    attention pool    2 T (2 D²)  +  4 T D  +  2 (2 D²)  +  2 (2 D M')     (SigLIP's MAP head: K, V of every token,
                      one query; M' its MLP width)
    head              2 D K        (DINOv2's token_avg reads 2D features; DeiT's distillation token adds a head)

LayerNorm, softmax, GELU and position tables are left out (about 1-2% for the presets' shapes), and so is rel_pos's
MLP, which draws one table for a whole batch. The count is the full model's, as MFU counts it, although forward()
skips most of the last layer for class-token models (vision_transformer.py).
"""

from __future__ import annotations

from vit.model.config import ViTConfig


def forward_flops(c: ViTConfig) -> float:
    """FLOPs of one image's forward pass, by the formula of the module docstring."""
    N, T, D, M = c.num_patches, c.num_patches + c.num_prefix_tokens, c.embed_dim, c.mlp_hidden_dim
    matrices = 3 if c.act == "swiglu" else 2  # of an MLP: SwiGLU's gate, value and output; else in and out
    patches = 2 * N * (c.in_chans * c.patch_size[0] * c.patch_size[1]) * D
    # Q Kᵀ and A V; differential attention's two maps each multiply V
    products = 6 if c.attention == "differential" else 4
    layers = sum(
        2 * T * (D * D * (2 + 2 * c.kv_heads_of(layer) / c.num_heads) + matrices * D * M) + products * T * T * D
        for layer in range(c.depth)
    )
    pool = 0
    if c.pool == "map":
        pool_mlp = int(D * c.pool_mlp_ratio) if c.pool_mlp_ratio else M
        pool = 2 * T * 2 * D * D + 4 * T * D + 2 * 2 * D * D + 2 * matrices * D * pool_mlp
    features = 2 * D if c.pool == "token_avg" else D  # the [class token; mean of the patch tokens]
    heads = 2 if c.distill_token else 1
    return patches + layers + pool + heads * 2 * features * c.num_classes
