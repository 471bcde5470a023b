"""State dicts between ours and timm's VisionTransformer, whose key layout is the one every foreign source is
translated into (hugging_face.py, torchvision.py, eva.py, ...). The differences are names and the learned position
table's layout: ours is a (h, w, D) grid plus (P, D) prefix rows, timm's one (1, [P +] h*w, D) sequence.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from vit.interop.timm.build import distilled_timm_kwargs, timm_kwargs
from vit.model.config import ViTConfig
from vit.model.pos_embed import FIXED_TABLES
from vit.model.size import check_depth, check_memory
from vit.model.vision_transformer import VisionTransformer

# Key renames, first match wins; the rest of each key is the same on both sides.
_TO_TIMM = [
    (r"^layers\.(\d+)\.attn\.out_proj\.", r"blocks.\1.attn.proj."),
    (r"^layers\.", "blocks."),
    (r"^embed_norm\.", "norm_pre."),
]
_FROM_TIMM = [
    (r"^blocks\.(\d+)\.attn\.proj\.", r"layers.\1.attn.out_proj."),
    (r"^blocks\.", "layers."),
    (r"^norm_pre\.", "embed_norm."),
]
_POS_KEYS = ("pos_embed.table", "pos_embed.prefix")


def _rename(key: str, rules: list[tuple[str, str]]) -> str:
    for pattern, replacement in rules:
        new, n = re.subn(pattern, replacement, key)
        if n:
            return new
    return key


def _fixed_table(config: ViTConfig) -> Tensor:
    """A fixed table as timm's (1, [P +] N, D) sequence, zeros on prefix rows."""
    table = FIXED_TABLES[config.table](config.grid_size, config.embed_dim, config.pos_temperature)
    table = table.flatten(0, 1)
    rows = config.num_prefix_tokens if config.pos_embed_prefix else 0
    return torch.cat((torch.zeros(rows, config.embed_dim), table))[None]


def to_timm(state_dict: dict[str, Tensor], config: ViTConfig) -> dict[str, Tensor]:
    """Our state dict -> timm's, for timm's model of `config` (build_timm)."""
    (distilled_timm_kwargs if config.distill_token else timm_kwargs)(config)  # refuses what timm cannot express
    out = {_rename(k, _TO_TIMM): v for k, v in state_dict.items() if k not in _POS_KEYS}
    if config.table == "learned":
        table = state_dict["pos_embed.table"].flatten(0, 1)  # (h*w, D)
        if "pos_embed.prefix" in state_dict:
            table = torch.cat((state_dict["pos_embed.prefix"], table))
        out["pos_embed"] = table[None]  # (1, [P +] h*w, D)
    elif config.table in FIXED_TABLES:
        out["pos_embed"] = _fixed_table(config)
    return out


def _expected_keys(config: ViTConfig) -> set[str]:
    with torch.device("meta"):
        return set(VisionTransformer(config).state_dict())


def from_timm(state_dict: dict[str, Tensor], config: ViTConfig) -> dict[str, Tensor]:
    """timm's state dict -> ours for VisionTransformer(config). Keys the config has no place for are an error."""
    out = {_rename(k, _FROM_TIMM): v for k, v in state_dict.items() if k != "pos_embed"}
    check_depth(config, out)  # a file's config may state a million layers, or terabytes: refused before
    check_memory(config)  # the meta build below, whose time grows with depth and whose sizes may overflow
    expected = _expected_keys(config)
    unplaced = sorted(k for k in state_dict if k != "pos_embed" and _rename(k, _FROM_TIMM) not in expected)
    if unplaced:
        raise ValueError(
            f"timm weights this configuration has no place for (a feature it lacks): {', '.join(unplaced)}"
        )
    pos = state_dict.get("pos_embed")
    h, w = config.grid_size
    rows = config.num_prefix_tokens if config.pos_embed_prefix else 0
    if config.table == "learned":
        if pos is None:
            raise KeyError("timm state dict has no 'pos_embed' but the config asks for a learned table")
        shape = (1, rows + h * w, config.embed_dim)
        if tuple(pos.shape) != shape:
            raise ValueError(
                f"timm 'pos_embed' has shape {tuple(pos.shape)}, expected {shape} for a {h}x{w} grid "
                f"with {rows} prefix row(s); resample it to this grid first"
            )
        out["pos_embed.table"] = pos[0, rows:].reshape(h, w, -1)
        if rows:
            out["pos_embed.prefix"] = pos[0, :rows]
    elif pos is not None:
        fixed = _fixed_table(config) if config.table in FIXED_TABLES else None
        if fixed is None or fixed.shape != pos.shape or not torch.allclose(fixed, pos.float(), atol=1e-5):
            raise ValueError(
                f"timm state dict carries a 'pos_embed' table that pos_embed={config.pos_embed!r} would "
                "discard; use a learned table (pos_embed='learned', or 'learned+' its rotary kind) to keep it"
            )
    return out
