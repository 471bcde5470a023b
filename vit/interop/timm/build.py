"""timm's model of a ViTConfig: the arguments of timm's VisionTransformer (or DeiT's distilled one) that build the
same network, refusing by name what timm cannot express. The two models compute the same function for those
configurations; their state dicts differ in names and the position table's layout (layout.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Any

from torch import nn

from vit.model.config import ViTConfig

ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}  # ours -> timm's act_layer


def timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Constructor arguments for timm's VisionTransformer that build the same network as `config`."""
    from timm.layers import RmsNorm, SwiGLUPacked

    refusals = {
        f"layer={config.layer!r} (post-norm, res-post-norm or parallel layers)": config.layer != "pre",
        "rel_pos (timm's VisionTransformerRelPos)": config.rel_pos != "none",
        f"rotary phases (pos_embed={config.pos_embed})": config.rotary != "none",
        "pool='token_avg'": config.pool == "token_avg",
        "distill_token (timm's VisionTransformerDistilled, see build_timm)": config.distill_token,
        "embed_norm without patch_bias or the reverse (timm ties them)": config.embed_norm == config.patch_bias,
        "patch_norm (AIMv2's architecture only)": config.patch_norm,
        "kv_heads (grouped-query attention: timm's Eva)": config.kv_heads is not None,
        "layer_scale_attn_only (timm's Eva)": config.layer_scale_attn_only,
        "attention='differential'": config.attention != "softmax",
        "pos_embed='factorized' (timm's NaFlexVit)": config.table == "factorized",
        "pool='map' with act='swiglu'": config.pool == "map" and config.act == "swiglu",
        "pool_heads or pool_mlp_ratio (timm's VisionTransformer pools with its layers')": config.pool_heads is not None
        or config.pool_mlp_ratio is not None,
    }
    if refused := [what for what, applies in refusals.items() if applies]:
        raise ValueError(f"timm's VisionTransformer cannot express {', '.join(refused)}")
    norm = partial(nn.LayerNorm if config.norm_layer == "layernorm" else RmsNorm, eps=config.norm_eps)
    swiglu = config.act == "swiglu"
    packed = {"mlp_layer": SwiGLUPacked} if swiglu else {}
    return packed | dict(
        img_size=config.img_size,
        patch_size=config.patch_size,
        in_chans=config.in_chans,
        num_classes=config.num_classes,
        embed_dim=config.embed_dim,
        depth=config.depth,
        num_heads=config.num_heads,
        # timm's packed SwiGLU counts both halves of fc1 as its hidden width
        mlp_ratio=mlp_ratio_for(2 * config.mlp_hidden_dim, config.embed_dim) if swiglu else config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm,
        scale_attn_norm=config.attn_norm,
        scale_mlp_norm=config.mlp_norm,
        proj_bias=config.proj_bias,
        norm_layer=norm,
        act_layer=nn.SiLU if swiglu else ACTIVATIONS[config.act],
        init_values=config.layer_scale_init,
        class_token=config.class_token,
        reg_tokens=config.reg_tokens,
        no_embed_class=not config.pos_embed_prefix,
        pre_norm=config.embed_norm,
        global_pool=config.pool,
        pool_include_prefix=config.pool_prefix,
        fc_norm=config.final_norm == "pooled",
        final_norm=config.final_norm != "none",
        pos_embed="none" if config.table == "none" else "learn",
        drop_rate=config.head_dropout,
        pos_drop_rate=config.dropout,
        proj_drop_rate=config.dropout,
        attn_drop_rate=config.attn_dropout,
        drop_path_rate=config.drop_path,
    )


def distilled_timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Constructor arguments for timm's VisionTransformerDistilled (DeiT) that build the same network as `config`,
    refusing what that class builds differently: its head never applies fc_norm, and its position table always has
    rows for exactly the class and distillation tokens."""
    refusals = {
        "final_norm='pooled' (its heads read the tokens without it)": config.final_norm == "pooled",
        "reg_tokens": config.reg_tokens > 0,
        "a position table without prefix rows (pos_embed_prefix=false)": not config.pos_embed_prefix,
        "no position table": config.table == "none",
    }
    if refused := [what for what, applies in refusals.items() if applies]:
        raise ValueError(f"timm's VisionTransformerDistilled cannot express {', '.join(refused)}")
    return timm_kwargs(replace(config, distill_token=False))


def build_timm(config: ViTConfig) -> nn.Module:
    """timm's model of the same network as `config`: VisionTransformer, or VisionTransformerDistilled for DeiT."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    if config.distill_token:
        return VisionTransformerDistilled(**distilled_timm_kwargs(config))
    return TimmViT(**timm_kwargs(config))


def mlp_ratio_for(hidden: int, dim: int) -> float:
    """The mlp_ratio for which int(dim * ratio), the MLP width ViTConfig.mlp_hidden_dim and timm compute, is
    `hidden`. hidden / dim can fall one float step short of it (56 * (122 / 56) == 121.99...)."""
    ratio = hidden / dim
    while int(dim * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio
