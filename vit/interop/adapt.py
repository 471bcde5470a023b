"""A pretrained network's weights made the start of another run's network: each difference (grid, classes,
channels, pooling) handled explicitly, anything else refused with the reason (vit/interop/finetune.py says which).
Below the loader, which rebuilds the frozen weights of a partly fine-tuned run's checkpoint the same way."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from timm.models._manipulate import adapt_input_conv
from torch import Tensor

from vit.model.config import ConfigError, ViTConfig
from vit.model.pos_embed import resample, resample_axis

# the run's own fields: the data's image size, channels and classes, and regularisation; the rest is the network
RUN_FIELDS = ("img_size", "in_chans", "num_classes", "dropout", "attn_dropout", "drop_path", "head_dropout")
_ADAPTED = ("pool", "class_token", "pos_embed", "layer_scale_init")  # handled one by one in adapt()
ARCHITECTURE = tuple(f.name for f in fields(ViTConfig) if f.name not in RUN_FIELDS + _ADAPTED)


def config_hint(requested: dict[str, Any]) -> ViTConfig | None:
    """What the run's config says of a pretrained network, for the files that do not say it all (a bare timm file's
    heads): its model fields, less an image size its patches need not tile (the file has its own)."""
    for values in (requested, {k: v for k, v in requested.items() if k not in ("img_size", "patch_size")}):
        try:
            return ViTConfig.from_dict(values)
        except ConfigError:
            continue
    return None


def adapt(weights: dict[str, Tensor], source: ViTConfig, target: ViTConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Our state dict for `source` -> a start for `target`, and a line per change made."""
    differ = [
        f"{f}: {getattr(source, f)} vs {getattr(target, f)}"
        for f in ARCHITECTURE
        if getattr(source, f) != getattr(target, f)
    ]
    if source.rotary != target.rotary:  # pos_embed's table is adapted below; its rotary phases are the network's
        differ.append(f"rotary phases: {source.rotary} vs {target.rotary}")
    if (source.layer_scale_init is None) != (target.layer_scale_init is None):
        differ.append(f"layer_scale_init: {source.layer_scale_init} vs {target.layer_scale_init}")
    if differ:
        raise ValueError(f"the pretrained network differs from model.* in {'; '.join(differ)} (pretrained vs config)")
    out, notes = dict(weights), []
    if source.in_chans != target.in_chans:
        out["patch_embed.proj.weight"] = adapt_input_conv(target.in_chans, out["patch_embed.proj.weight"])
        notes.append(f"patch embedding adapted from {source.in_chans} to {target.in_chans} input channels")
    if target.class_token and not source.class_token:
        raise ValueError(
            f"the pretrained model has no class token (pool={source.pool!r}); fine-tune with model.pool=avg"
        )
    if source.class_token and not target.class_token:
        if source.num_prefix_tokens > 1:
            raise ValueError("dropping the class token of a model with other prefix tokens (registers, distillation)")
        out.pop("cls_token", None)
        out.pop("pos_embed.prefix", None)
        notes.append("class token dropped: the head reads the average of the patch tokens (model.pool=avg)")
    if target.pool == "map" and source.pool != "map":
        raise ValueError("the pretrained model has no attention pooling to fine-tune (pool='map')")
    if source.pool == "map" and target.pool != "map":
        out = {k: v for k, v in out.items() if not k.startswith("attn_pool.")}
        notes.append(f"attention pooling dropped: pool={target.pool!r}")
    if source.pool != target.pool:
        notes.append(f"pooling changed: {source.pool} -> {target.pool}")
    if target.table == "learned":
        if "pos_embed.table" not in out:
            raise ValueError(f"model.pos_embed=learned but the pretrained model has pos_embed={source.pos_embed!r}")
        if source.grid_size != target.grid_size:
            out["pos_embed.table"] = resample(  # as the network itself resamples it to another grid
                out["pos_embed.table"],
                target.grid_size,
                (r := target.pos_resample).mode,
                antialias=r.antialias,
                align_corners=r.corners,
                square=r.square,
            )
            notes.append(f"position table resampled from {source.grid_size} to {target.grid_size} patches")
    elif target.table == "factorized":
        if "pos_embed.rows" not in out:
            raise ValueError(f"model.pos_embed=factorized but the pretrained model has pos_embed={source.pos_embed!r}")
        if source.grid_size != target.grid_size:
            h, w = target.grid_size
            n_y, n_x = (max(h, w),) * 2 if target.pos_resample.square else (h, w)
            corners = target.pos_resample.corners
            out["pos_embed.rows"] = resample_axis(out["pos_embed.rows"], n_y, corners)[:h]
            out["pos_embed.cols"] = resample_axis(out["pos_embed.cols"], n_x, corners)[:w]
            notes.append(f"factorized position tables resampled from {source.grid_size} to {target.grid_size} patches")
    elif "pos_embed.table" in out or "pos_embed.rows" in out:
        raise ValueError(
            f"the pretrained model learned a position table; model.pos_embed={target.pos_embed!r} would discard it"
        )
    if source.num_classes != target.num_classes or source.pooled_dim != target.pooled_dim:
        out = {k: v for k, v in out.items() if not k.startswith(("head.", "head_dist."))}
        notes.append(f"new head: {source.num_classes} -> {target.num_classes} classes")
    return out, notes
