"""State-dict conversion between our VisionTransformer and timm.models.vision_transformer.VisionTransformer.

The two compute the same function for the configurations timm can express (pre-norm, learned or
fixed absolute positions or none, class token or global average pooling with the final norm before
pooling). The differences are names and the layout of the learned position table:
ours is a (h, w, D) grid plus (P, D) prefix rows, timm's one (1, P + h*w, D) sequence.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from vit.config import ViTConfig
from vit.pos_embed import FIXED_TABLES

# Key renames, first match wins; the rest of each key is the same on both sides.
_TO_TIMM = [(r"^layers\.(\d+)\.attn\.out_proj\.", r"blocks.\1.attn.proj."), (r"^layers\.", "blocks.")]
_FROM_TIMM = [(r"^blocks\.(\d+)\.attn\.proj\.", r"layers.\1.attn.out_proj."), (r"^blocks\.", "layers.")]
_POS_KEYS = ("pos_embed.table", "pos_embed.prefix")


def _rename(key: str, rules: list[tuple[str, str]]) -> str:
    for pattern, replacement in rules:
        new, n = re.subn(pattern, replacement, key)
        if n:
            return new
    return key


def timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Constructor arguments for timm's VisionTransformer that build the same network as `config`."""
    if config.norm != "pre":
        raise ValueError("timm's VisionTransformer has no post-norm layer of the textbook form; norm must be 'pre'")
    if config.pos_embed == "rope2d":
        raise ValueError("timm's VisionTransformer has no rotary position embedding; pos_embed must not be rope2d")
    return dict(
        img_size=config.img_size,
        patch_size=config.patch_size,
        in_chans=config.in_chans,
        num_classes=config.num_classes,
        embed_dim=config.embed_dim,
        depth=config.depth,
        num_heads=config.num_heads,
        mlp_ratio=config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        norm_layer=partial(nn.LayerNorm, eps=config.norm_eps),  # timm's default eps is fixed at 1e-6
        init_values=config.layer_scale_init,
        class_token=config.pool == "token",
        global_pool=config.pool,
        fc_norm=False,  # our final LayerNorm comes before pooling, for both pools
        pos_embed="none" if config.pos_embed == "none" else "learn",
        drop_rate=config.head_dropout,
        pos_drop_rate=config.dropout,
        proj_drop_rate=config.dropout,
        attn_drop_rate=config.attn_dropout,
        drop_path_rate=config.drop_path,
    )


def _fixed_table(config: ViTConfig) -> Tensor:
    """A fixed table as timm's (1, P + N, D) sequence, zeros on prefix rows."""
    table = FIXED_TABLES[config.pos_embed](config.grid_size, config.embed_dim, config.pos_temperature)
    table = table.flatten(0, 1)
    prefix = torch.zeros(config.num_prefix_tokens, config.embed_dim)
    return torch.cat((prefix, table))[None]


def to_timm(state_dict: dict[str, Tensor], config: ViTConfig) -> dict[str, Tensor]:
    """Our state dict -> timm's, for a timm model built with timm_kwargs(config)."""
    timm_kwargs(config)  # refuses what timm cannot express
    out = {_rename(k, _TO_TIMM): v for k, v in state_dict.items() if k not in _POS_KEYS}
    if config.pos_embed == "learned":
        table = state_dict["pos_embed.table"].flatten(0, 1)  # (h*w, D)
        if config.num_prefix_tokens:
            table = torch.cat((state_dict["pos_embed.prefix"], table))
        out["pos_embed"] = table[None]  # (1, P + h*w, D)
    elif config.pos_embed in FIXED_TABLES:
        out["pos_embed"] = _fixed_table(config)
    return out


def from_timm(state_dict: dict[str, Tensor], config: ViTConfig) -> dict[str, Tensor]:
    """timm's state dict -> ours for VisionTransformer(config). Keys we cannot place are an error."""
    unsupported = sorted(
        k for k in state_dict if k.startswith(("fc_norm.", "reg_token", "norm_pre.", "attn_pool.")) or "q_norm" in k
    )
    if unsupported:
        raise ValueError(
            "timm checkpoint uses features this model does not have (post-pool norm, register tokens, "
            f"pre-norm of the patch tokens, attention pooling or QK-norm): {', '.join(unsupported)}"
        )
    out = {_rename(k, _FROM_TIMM): v for k, v in state_dict.items() if k != "pos_embed"}
    pos = state_dict.get("pos_embed")
    h, w = config.grid_size
    p = config.num_prefix_tokens
    if config.pos_embed == "learned":
        if pos is None:
            raise KeyError("timm state dict has no 'pos_embed' but the config asks for a learned table")
        expected = (1, p + h * w, config.embed_dim)
        if tuple(pos.shape) != expected:
            raise ValueError(
                f"timm 'pos_embed' has shape {tuple(pos.shape)}, expected {expected} for a {h}x{w} grid "
                f"with {p} prefix token(s); resample it to this grid first"
            )
        out["pos_embed.table"] = pos[0, p:].reshape(h, w, -1)
        if p:
            out["pos_embed.prefix"] = pos[0, :p]
    elif pos is not None:
        fixed = _fixed_table(config) if config.pos_embed in FIXED_TABLES else None
        if fixed is None or fixed.shape != pos.shape or not torch.allclose(fixed, pos.float(), atol=1e-5):
            raise ValueError(
                f"timm state dict carries a 'pos_embed' table that pos_embed={config.pos_embed!r} would "
                "discard; use pos_embed='learned' to keep it"
            )
    return out
