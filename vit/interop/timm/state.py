"""The architecture of a bare timm ViT state dict, which records only its shapes: every size and switch its keys
show; heads, activation and norm eps from a timm architecture name when the file is named after one, else from
the config given.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

from torch import Tensor

from vit.interop.files import Converted
from vit.interop.timm.architecture import architecture_named, read_timm_module, timm_architecture
from vit.interop.timm.build import mlp_ratio_for
from vit.interop.timm.layout import from_timm
from vit.interop.timm.modules import DISTILLED_FC_NORM
from vit.model.config import ViTConfig, pos_embed_of


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


def timm_config(state: dict[str, Tensor], config: ViTConfig | None) -> ViTConfig:
    """The architecture of a bare timm ViT state dict: every size and switch its keys and shapes show, the rest
    (heads, activation, norm eps and kind, position kind) from `config`: a state dict does not record them."""
    if config is None:
        raise ValueError("a timm state dict does not record the number of heads: choose a model preset for it")
    try:
        dim, chans, ph, pw = state["patch_embed.proj.weight"].shape
        depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
        fc1, hidden = state["blocks.0.mlp.fc1.weight"].shape[0], state["blocks.0.mlp.fc2.weight"].shape[1]
    except (KeyError, ValueError):
        raise ValueError("not a timm VisionTransformer state dict (no patch_embed.proj / blocks.N.mlp keys)") from None
    if dim % config.num_heads:
        raise ValueError(
            f"a timm state dict does not record the number of heads, and the {config.num_heads} given do not divide "
            f"its width {dim}: give the file's head count (a matching --preset NAME on the command lines, "
            f"model.num_heads=H with model.pretrained, or config= for vit.checkpoint.load)"
        )
    if fc1 == 2 * hidden and config.act != "swiglu":
        raise ValueError(f"its MLP is gated (fc1 {fc1} wide, fc2 {hidden}): give act='swiglu' or its architecture")
    regs = state["reg_token"].shape[1] if "reg_token" in state else 0
    prefix = ("cls_token" in state) + ("dist_token" in state) + regs
    pos = state.get("pos_embed")
    if pos is not None:
        rows = pos.shape[1]
        with_prefix = _grid(rows - prefix, config) if rows > prefix else None
        without = _grid(rows, config) if prefix else None  # timm's no_embed_class: no rows for the prefix
        if with_prefix is None and without is None:
            raise ValueError(f"a position table of {rows} rows is not square; give a config with its grid")
        if with_prefix is not None and without is not None:  # one a square guess: the config's grid decides
            hinted_with = config.num_patches == rows - prefix
            if hinted_with == (config.num_patches == rows):
                fits = f"fits a grid with and without its {prefix} prefix rows"
                raise ValueError(f"a position table of {rows} rows {fits}")
            without = None if hinted_with else without
        grid, prefix_rows = (with_prefix, True) if without is None else (without, False)
        if prefix and prefix_rows != config.pos_embed_prefix and math.prod(grid) != config.num_patches:
            # only a square guess says so: a 2x4 grid after a class row (9 rows) would be read as 3x3 without one
            have = "with" if prefix_rows else "without"
            raise ValueError(
                f"a position table of {rows} rows is square only {have} rows for its {prefix} prefix token(s), "
                f"and the config says pos_embed_prefix={config.pos_embed_prefix}; give a config with its grid"
            )
    else:
        grid, prefix_rows = config.grid_size, True
    table = config.table
    if pos is None and table == "learned":
        table = "none"  # the file has no table to learn from
    if pos is not None and table == "none":
        table = "learned"  # the file has a table: keep it
    has = lambda key: key in state  # noqa: E731
    if has("dist_token") and has("fc_norm.weight"):
        raise ValueError(DISTILLED_FC_NORM)
    pool = config.pool
    if has("attn_pool.latent"):
        pool = "map"
    elif "cls_token" not in state:
        pool = "avg" if pool in ("token", "token_avg") else pool
    elif pool == "map":
        pool = "token"
    return replace(
        config,
        img_size=(grid[0] * ph, grid[1] * pw),
        patch_size=(ph, pw),
        in_chans=chans,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        embed_dim=dim,
        depth=depth,
        mlp_ratio=mlp_ratio_for(hidden, dim),
        qkv_bias=has("blocks.0.attn.qkv.bias"),
        pos_embed=pos_embed_of(table, config.rotary),
        pool=pool,
        class_token=has("cls_token"),
        reg_tokens=regs,
        distill_token=has("dist_token"),
        pos_embed_prefix=prefix_rows,
        patch_bias=has("patch_embed.proj.bias"),
        embed_norm=has("norm_pre.weight"),
        final_norm="pooled" if has("fc_norm.weight") else "tokens" if has("norm.weight") else "none",
        qk_norm=has("blocks.0.attn.q_norm.weight"),
        attn_norm=has("blocks.0.attn.norm.weight"),
        mlp_norm=has("blocks.0.mlp.norm.weight"),
        proj_bias=has("blocks.0.attn.proj.bias"),
        layer_scale_init=(config.layer_scale_init or 1e-5) if has("blocks.0.ls1.gamma") else None,
        layer="res_post" if config.layer == "res_post" else "pre",  # timm has no post-norm ViT; keys do not say which
    )


# what a bare file's keys show of its architecture, which the architecture it is named after must share
SHOWN_BY_KEYS = (
    "pool", "class_token", "reg_tokens", "distill_token", "final_norm", "embed_norm", "qk_norm",
    "attn_norm", "mlp_norm", "patch_bias", "qkv_bias", "proj_bias",
)  # fmt: skip


def _contradicted(named: ViTConfig, weights: ViTConfig) -> str:
    """The switches where a file's weights contradict the architecture it is named after, said; '' if none."""
    shown = [(k, getattr(weights, k), getattr(named, k)) for k in SHOWN_BY_KEYS]
    differ = [f"{k}={theirs!r}, not {named_as!r}" for k, theirs, named_as in shown if theirs != named_as]
    if (weights.layer_scale_init is None) != (named.layer_scale_init is None):
        differ.append("layer scale " + ("present" if weights.layer_scale_init is not None else "absent"))
    return ", ".join(differ)


def from_timm_state(state: dict[str, Tensor], config: ViTConfig | None, path: Path | None = None) -> Converted:
    """A bare timm state dict; named after a timm architecture, that architecture says what the shapes do not
    (heads, activation, norm kind and eps, pooling), and the weights say the sizes."""
    if path is not None and (name := architecture_named(path)) is not None:
        head = state.get("head.weight")
        try:
            named, renamed = read_timm_module(timm_architecture(name, num_classes=0 if head is None else head.shape[0]))
        except ValueError as err:
            raise ValueError(f"timm's {name} is not a ViT this model can hold: {err}") from None
        state = renamed(state)
        dim = state["patch_embed.proj.weight"].shape[0] if "patch_embed.proj.weight" in state else None
        if dim != named.embed_dim:  # its heads would not be the file's: the name does not describe it
            differ = f"width {dim}, not {named.embed_dim}"
            raise ValueError(f"the file is named after timm's {name} but its weights differ from it: {differ}")
        if config is not None and config.num_heads != named.num_heads:
            raise ValueError(f"{config.num_heads} heads were given, but timm's {name} has {named.num_heads}")
        # depth, grid and classes from the weights (a fine-tune may change them); rotary phases are in no tensor
        weights = timm_config(state, named)
        source = replace(weights, pos_embed=pos_embed_of(weights.table, named.rotary), rope=named.rope)
        if differ := _contradicted(named, source):  # saved from the architecture built otherwise (global_pool=...)
            raise ValueError(f"the file is named after timm's {name} but its weights differ from it: {differ}")
        return source, from_timm(state, source), {}
    source = timm_config(state, config)
    return source, from_timm(state, source), {}
