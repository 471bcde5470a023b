"""timm's VisionTransformer: its state dicts read as ours (sizes from the weights), and ours written as its.

The two compute the same function for the configurations timm can express (pre-norm, learned or
fixed absolute positions or none, class token or global average pooling with the final norm before
pooling). The differences are names and the layout of the learned position table:
ours is a (h, w, D) grid plus (P, D) prefix rows, timm's one (1, P + h*w, D) sequence.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from vit.interop.files import Converted
from vit.model.config import ViTConfig
from vit.model.pos_embed import FIXED_TABLES

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


# reading a timm state dict --------------------------------------------------------------------------


def _grid(tokens: int, hint: ViTConfig | None) -> tuple[int, int] | None:
    """The (rows, columns) of `tokens` patches: the hint's grid if it has as many, else a square; else None."""
    if hint is not None and hint.num_patches == tokens:
        return hint.grid_size
    side = math.isqrt(tokens)
    return (side, side) if side * side == tokens else None


def table_grid(tokens: int, hint: ViTConfig | None) -> tuple[int, int]:
    if (grid := _grid(tokens, hint)) is None:
        raise ValueError(f"a position table of {tokens} patches is not square; give a config with its grid")
    return grid


def mlp_ratio_for(hidden: int, dim: int) -> float:
    """The mlp_ratio for which int(dim * ratio), the MLP width ViTConfig.mlp_hidden_dim and timm compute, is
    `hidden`. hidden / dim can fall one float step short of it (56 * (122 / 56) == 121.99...)."""
    ratio = hidden / dim
    while int(dim * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def _add_class_position(state: dict[str, Tensor], hint: ViTConfig | None) -> dict[str, Tensor]:
    """timm's no_embed_class=True (DeiT III) adds no position to the class token, so its table has no row for
    it. A zero row computes the same and gives the table the layout of timm's default and of our model."""
    pos = state.get("pos_embed")  # (1, rows, D)
    if "cls_token" not in state or pos is None:
        return state
    if _grid(pos.shape[1] - 1, hint) is not None or _grid(pos.shape[1], hint) is None:
        return state  # a row for the class token, or no grid either way (reported by timm_config)
    return {**state, "pos_embed": torch.cat((pos.new_zeros(1, 1, pos.shape[2]), pos), dim=1)}


def timm_config(state: dict[str, Tensor], config: ViTConfig | None) -> ViTConfig:
    """The architecture of a timm ViT state dict: sizes from the weights, the rest (heads, eps, position
    kind, dropout) from `config`, which a timm state dict cannot do without: it does not record heads."""
    if config is None:
        raise ValueError("a timm state dict does not record the number of heads: choose a model preset for it")
    try:
        dim, chans, ph, pw = state["patch_embed.proj.weight"].shape
        depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
        hidden = state["blocks.0.mlp.fc1.weight"].shape[0]
    except (KeyError, ValueError):
        raise ValueError("not a timm VisionTransformer state dict (no patch_embed.proj / blocks.N.mlp keys)") from None
    if dim % config.num_heads:
        raise ValueError(
            f"a timm state dict does not record the number of heads, and the {config.num_heads} given do not divide "
            f"its width {dim}: give the file's head count (a matching --preset NAME on the command lines, "
            f"model.num_heads=H with model.pretrained, or config= for vit.checkpoint.load)"
        )
    prefix = 1 if "cls_token" in state else 0
    pos = state.get("pos_embed")
    tokens = pos.shape[1] - prefix if pos is not None else config.grid_size[0] * config.grid_size[1]
    gh, gw = table_grid(tokens, config)
    kind = config.pos_embed
    if pos is None and kind == "learned":
        kind = "none"  # the file has no table to learn from
    if pos is not None and kind in ("none", "rope2d"):
        kind = "learned"  # the file has a table: keep it
    return replace(
        config,
        img_size=(gh * ph, gw * pw),
        patch_size=(ph, pw),
        in_chans=chans,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        embed_dim=dim,
        depth=depth,
        mlp_ratio=mlp_ratio_for(hidden, dim),
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        pos_embed=kind,
        pool="token" if prefix else "avg",
        layer_scale_init=(config.layer_scale_init or 1e-5) if "blocks.0.ls1.gamma" in state else None,
        norm="pre",
    )


def from_timm_state(state: dict[str, Tensor], config: ViTConfig | None) -> Converted:
    state = _add_class_position(state, config)
    source = timm_config(state, config)
    return source, from_timm(state, source), {}
