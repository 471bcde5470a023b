"""A pretrained checkpoint as the start of a fine-tuning run at another resolution, class count, channel
count or pooling: each difference handled explicitly, anything else refused with the reason.

- grid: a learned position table is resampled bicubically to the new patch grid (vit.model.pos_embed.resample);
  fixed tables are recomputed by the model itself;
- classes: a head for another number of classes is replaced by a freshly initialised one;
- channels: the patch embedding is adapted by timm's adapt_input_conv (e.g. RGB -> grayscale sums the
  colour filters);
- pooling: class token -> average pooling drops the class token and its position; average pooling ->
  class token is refused (the token would start untrained);
- width, depth, heads, MLP, patch size, norm placement must match: they are the pretrained network.
"""

from __future__ import annotations

from pathlib import Path

from timm.models._manipulate import adapt_input_conv
from torch import Tensor

from vit.interop.files import CheckpointError
from vit.interop.load import load
from vit.model import VisionTransformer
from vit.model.config import ViTConfig
from vit.model.pos_embed import resample

ARCHITECTURE = ("embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "patch_size", "norm")


def adapt(weights: dict[str, Tensor], source: ViTConfig, target: ViTConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Our state dict for `source` -> a start for `target`, and a line per change made."""
    differ = [
        f"{f}: {getattr(source, f)} vs {getattr(target, f)}"
        for f in ARCHITECTURE
        if getattr(source, f) != getattr(target, f)
    ]
    if (source.layer_scale_init is None) != (target.layer_scale_init is None):
        differ.append(f"layer_scale_init: {source.layer_scale_init} vs {target.layer_scale_init}")
    if differ:
        raise ValueError(f"the pretrained network differs from model.* in {'; '.join(differ)} (pretrained vs config)")
    out, notes = dict(weights), []
    if source.in_chans != target.in_chans:
        out["patch_embed.proj.weight"] = adapt_input_conv(target.in_chans, out["patch_embed.proj.weight"])
        notes.append(f"patch embedding adapted from {source.in_chans} to {target.in_chans} input channels")
    if source.pool != target.pool:
        if target.pool == "token":
            raise ValueError("the pretrained model has no class token (pool='avg'); fine-tune with model.pool=avg")
        out.pop("cls_token", None)
        out.pop("pos_embed.prefix", None)
        notes.append("class token dropped: the head reads the average of the patch tokens (model.pool=avg)")
    if target.pos_embed == "learned":
        if "pos_embed.table" not in out:
            raise ValueError(f"model.pos_embed=learned but the pretrained model has pos_embed={source.pos_embed!r}")
        if source.grid_size != target.grid_size:
            out["pos_embed.table"] = resample(out["pos_embed.table"], target.grid_size)
            notes.append(f"position table resampled from {source.grid_size} to {target.grid_size} patches")
    elif "pos_embed.table" in out:
        raise ValueError(
            f"the pretrained model learned a position table; model.pos_embed={target.pos_embed!r} would discard it"
        )
    if source.num_classes != target.num_classes:
        out = {k: v for k, v in out.items() if not k.startswith("head.")}
        notes.append(f"new head: {source.num_classes} -> {target.num_classes} classes")
    return out, notes


def load_pretrained_(model: VisionTransformer, path: str | Path) -> list[str]:
    """Fill `model` with the checkpoint at `path`, adapted to model.config; returns what was changed."""
    loaded = load(path, config=model.config)
    try:
        weights, notes = adapt(loaded.model.state_dict(), loaded.config, model.config)
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    fresh = {k for k in missing if k.startswith("head.")}
    if set(missing) - fresh or unexpected:
        raise CheckpointError(
            f"{path}: after adapting, keys still do not match: missing {sorted(set(missing) - fresh)}, "
            f"unexpected {sorted(unexpected)}"
        )
    return notes
