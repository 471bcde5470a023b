"""torchvision's VisionTransformer state dicts (vit_b_16, vit_b_32, vit_l_16, vit_l_32, vit_h_14): renamed into timm's
layout, which vit/interop/timm/layout.py reads as ours. torchvision's ViT is the classic one: pre-norm, GELU, LayerNorm
eps 1e-6, a learned table with a class row, the class token pooled. A state dict does not record heads: the five named
models have 12 heads at width 768 and 16 at 1024 and 1280, so the width says them unless a config is given, which gives
the heads alone (its pooling or activation would not be torchvision's). Refused by name: a representation layer
(heads.pre_logits) and a convolutional stem (conv_stem_configs)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from torch import Tensor

from vit.interop.files import Converted
from vit.interop.loaded import Loaded
from vit.interop.timm import from_timm, timm_config
from vit.model.config import ViTConfig

HEADS_BY_WIDTH = {768: 12, 1024: 16, 1280: 16}  # vit_b_*, vit_l_*, vit_h_14
_LAYER = re.compile(r"^encoder\.layers\.encoder_layer_(\d+)\.(.+)$")
_LAYER_RENAMES = {
    "ln_1.": "norm1.",
    "ln_2.": "norm2.",
    "self_attention.in_proj_weight": "attn.qkv.weight",  # nn.MultiheadAttention packs [W_q; W_k; W_v] as timm does
    "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj.": "attn.proj.",
    "mlp.0.": "mlp.fc1.",  # MLPBlock: Linear, GELU, Dropout, Linear, Dropout
    "mlp.3.": "mlp.fc2.",
    "mlp.linear_1.": "mlp.fc1.",  # torchvision < 0.13 named them
    "mlp.linear_2.": "mlp.fc2.",
}
_RENAMES = {
    "class_token": "cls_token",
    "conv_proj.weight": "patch_embed.proj.weight",
    "conv_proj.bias": "patch_embed.proj.bias",
    "encoder.pos_embedding": "pos_embed",
    "encoder.ln.weight": "norm.weight",
    "encoder.ln.bias": "norm.bias",
    "heads.head.weight": "head.weight",
    "heads.head.bias": "head.bias",
}


def is_torchvision(state: dict[str, Tensor]) -> bool:
    return any(k.startswith("conv_proj.") for k in state) and any(k.startswith("encoder.layers.") for k in state)


def rename_into_timm(
    state: dict[str, Tensor], layer: re.Pattern[str], layer_renames: dict[str, str], renames: dict[str, str]
) -> tuple[dict[str, Tensor], list[str]]:
    """Keys renamed into timm's, and those with no place: a layer's (`layer` matches its index and the rest) by the
    first of `layer_renames` that begins the rest, any other key whole by `renames`."""
    out, unplaced = {}, []
    for key, value in state.items():
        if m := layer.match(key):
            rest = next((new + m[2][len(old) :] for old, new in layer_renames.items() if m[2].startswith(old)), None)
            if rest is None:
                unplaced.append(key)
            else:
                out[f"blocks.{m[1]}.{rest}"] = value
        elif key in renames:
            out[renames[key]] = value
        else:
            unplaced.append(key)
    return out, unplaced


def torchvision_to_timm(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """torchvision's keys -> timm's; a key with no place (heads.pre_logits: a Dense + tanh we lack) is an error."""
    out, unplaced = rename_into_timm(state, _LAYER, _LAYER_RENAMES, _RENAMES)
    if any(k.startswith("heads.pre_logits") for k in unplaced):
        raise ValueError(
            "torchvision's heads.pre_logits (representation_size: a Linear + tanh before the head) has no place"
        )
    if any(k.startswith("conv_proj.") for k in unplaced):
        raise ValueError("its patch embedding is a convolutional stem (conv_stem_configs), not one strided convolution")
    if unplaced:
        raise ValueError(f"torchvision weights this ViT has no place for: {', '.join(sorted(unplaced))}")
    return out


def from_torchvision(state: dict[str, Tensor], config: ViTConfig | None) -> Converted:
    """A torchvision ViT state dict; heads from `config` if given, else from the width (HEADS_BY_WIDTH)."""
    timm_state = torchvision_to_timm(state)
    width = timm_state["patch_embed.proj.weight"].shape[0]
    if config is None and width not in HEADS_BY_WIDTH:
        raise ValueError(
            f"a torchvision ViT of width {width} is none of vit_b/l/h, whose widths say their heads: give a "
            "config (--preset, model.num_heads, config=) with its heads"
        )
    heads = HEADS_BY_WIDTH[width] if config is None else config.num_heads
    if width % heads:
        raise ValueError(f"{heads} heads do not divide the torchvision ViT's width {width}")
    # the config gives heads alone: the rest of torchvision's ViT is fixed (its class token pooled, GELU, eps 1e-6)
    source = timm_config(timm_state, ViTConfig(embed_dim=width, num_heads=heads, act="gelu", norm_eps=1e-6))
    return source, from_timm(timm_state, source), {}


def with_weights_transform(loaded: Loaded, source: dict[str, Any]) -> Loaded:
    """A torchvision:ARCH.WEIGHTS load read as its weights' evaluation transform reads images (hub.py's `source`):
    crop, interpolation, mean and std, and the classes where the head has as many."""
    framing = {key: source[key] for key in ("crop_pct", "interpolation")}
    stats = {"mean": tuple(source["mean"]), "std": tuple(source["std"]), "stats_recorded": True}
    classes = source["classes"] if source["classes"] and len(source["classes"]) == loaded.config.num_classes else None
    return replace(loaded, **framing, **stats, classes=tuple(classes) if classes else loaded.classes)
