"""OpenCLIP's vision towers (open_clip's VisionTransformer, alone or under 'visual.' in a CLIP state dict): renamed
into timm's layout, which vit/interop/timm/layout.py reads as ours. From a whole CLIP state dict only 'visual.*'
is read: the text tower, its projection and logit_scale are left out. The tower's projection to the joint embedding
(pooled @ proj, no bias) becomes our head, head.weight = projᵀ and head.bias = 0, so that the logits are the
image embedding as encode_image returns it (not normalised).

A state dict records neither heads nor activation (OpenAI's weights use QuickGELU, LAION's GELU) nor pooling: a file
named after an open_clip model (ViT-B-32-quickgelu.openai.bin) takes them from that model's config when open_clip
is installed; else `config` gives heads, act and pool ('token', or 'avg' with fc_norm for final_ln_after_pool).
LayerNorm eps is open_clip's 1e-5. Refused by name: ModifiedResNet towers (RN50...), timm-backed towers
('visual.trunk.*'), attentional pooling (CoCa), scaled cosine attention, head scaling, a norm after attention.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.interop.files import Converted, read_json_object, read_weights
from vit.interop.timm import from_timm, timm_config
from vit.interop.torchvision import rename_into_timm
from vit.model.config import ViTConfig

FOLDER_CONFIG = "open_clip_config.json"  # a hub folder's: model_cfg (the architecture) and preprocess_cfg
FOLDER_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")  # beside it, safetensors first
VISUAL = "visual."  # the vision tower's prefix in a CLIP state dict
OPEN_CLIP_EPS = 1e-5  # open_clip's LayerNorm is torch's, with torch's default eps
_POOLS = {"tok": "token", "avg": "avg"}  # open_clip's pool_type -> ours
# open_clip's PreprocessCfg defaults (OPENAI_DATASET_MEAN, _STD), for a preprocess_cfg that leaves them out or null
OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
_LAYER = re.compile(r"^transformer\.resblocks\.(\d+)\.(.+)$")
_LAYER_RENAMES = {
    "ln_1.": "norm1.",
    "attn.in_proj_weight": "attn.qkv.weight",  # nn.MultiheadAttention packs [W_q; W_k; W_v] as timm does
    "attn.in_proj_bias": "attn.qkv.bias",
    "attn.out_proj.": "attn.proj.",
    "attn.ln_q.": "attn.q_norm.",  # the custom block's qk_norm
    "attn.ln_k.": "attn.k_norm.",
    "attn.ln_inner.": "attn.norm.",  # scale_attn_inner: a norm on the heads' concatenation before out_proj
    "ln_2.": "norm2.",
    "mlp.c_fc.": "mlp.fc1.",
    "mlp.ln.": "mlp.norm.",  # scale_fc: a norm on the MLP's hidden layer
    "mlp.c_proj.": "mlp.fc2.",
    "ls_1.gamma": "ls1.gamma",
    "ls_2.gamma": "ls2.gamma",
}
_RENAMES = {
    "conv1.weight": "patch_embed.proj.weight",  # no bias
    "class_embedding": "cls_token",
    "positional_embedding": "pos_embed",
    "ln_pre.weight": "norm_pre.weight",
    "ln_pre.bias": "norm_pre.bias",
}
# weights of open_clip features ViTConfig lacks, by the key that shows them
_LACKED = {
    "attn_pool": "attentional pooling (attentional_pool, CoCa's AttentionalPooler)",
    "attn.logit_scale": "scaled cosine attention (scaled_cosine_attn)",
    "attn.head_scale": "per-head scaling of the attention output (scale_heads)",
    "ln_attn.": "a norm after attention (scale_attn)",
}


def is_open_clip(state: dict[str, Tensor]) -> bool:
    """A CLIP state dict ('visual.*') or a vision tower alone: ViT (class_embedding), ModifiedResNet or timm trunk."""
    return any(k.startswith(VISUAL) or k.startswith(("trunk.", "attnpool.")) for k in state) or (
        "class_embedding" in state
    )


def visual_tower(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The vision tower's weights without 'visual.', refusing a tower that is not open_clip's VisionTransformer."""
    if any(k.startswith(VISUAL) for k in state):
        state = {k.removeprefix(VISUAL): v for k, v in state.items() if k.startswith(VISUAL)}
    if any(k.startswith("trunk.") for k in state):
        raise ValueError(
            "its vision tower is a timm model (open_clip's TimmModel, keys 'visual.trunk.*'): save the 'trunk.' "
            "weights without that prefix, named after the timm architecture, and load them as timm's"
        )
    if any(k.startswith(("layer1.", "attnpool.")) for k in state):
        raise ValueError("its vision tower is a ModifiedResNet (OpenAI's RN50 family), not a ViT")
    if missing := [key for key in ("conv1.weight", "class_embedding", "positional_embedding") if key not in state]:
        raise ValueError(f"not an OpenCLIP ViT tower (no {' and no '.join(missing)})")
    return state


def open_clip_to_timm(tower: dict[str, Tensor], ln_after_pool: bool) -> dict[str, Tensor]:
    """open_clip's keys -> timm's. ln_post is timm's fc_norm when it follows average pooling (ln_after_pool), else
    its norm (on the class token alone it is the same either way: a LayerNorm acts on each token)."""
    post = "fc_norm." if ln_after_pool else "norm."
    renames = _RENAMES | {"ln_post.weight": post + "weight", "ln_post.bias": post + "bias"}
    out, unplaced = rename_into_timm({k: v for k, v in tower.items() if k != "proj"}, _LAYER, _LAYER_RENAMES, renames)
    if lacked := sorted({what for k in unplaced for part, what in _LACKED.items() if part in k}):
        raise ValueError(f"its vision tower has {'; '.join(lacked)}, which this ViT lacks")
    if unplaced:
        raise ValueError(f"OpenCLIP weights this ViT has no place for: {', '.join(sorted(unplaced))}")
    out["cls_token"] = out["cls_token"].reshape(1, 1, -1)  # (D,) -> (1, 1, D)
    out["pos_embed"] = out["pos_embed"][None]  # (1 + N, D) -> (1, 1 + N, D), the class row first
    if (proj := tower.get("proj")) is not None:  # (D, E), applied as pooled @ proj
        if proj.ndim != 2:
            raise ValueError(f"its projection proj has shape {tuple(proj.shape)}, not (width, embedding width)")
        out["head.weight"] = proj.T.contiguous()  # (E, D)
        out["head.bias"] = torch.zeros(proj.shape[1], dtype=proj.dtype)
    return out


def model_config_named(path: Path | None) -> tuple[str, dict[str, Any]] | None:
    """The open_clip model a file is named after (ViT-B-32-quickgelu.openai.bin) and its config, if open_clip is
    installed; the loader works without it."""
    try:
        import open_clip
    except ImportError:
        return None
    name = None if path is None else path.name.split(".")[0]
    return (name, open_clip.get_model_config(name)) if name in open_clip.list_models() else None


def _from_model_config(name: str, model_cfg: dict[str, Any], width: int) -> dict[str, Any]:
    """What the weights do not record, from an open_clip model config, refusing one that does not describe them."""
    vision = model_cfg.get("vision_cfg", {})
    norm_kwargs = vision.get("norm_kwargs") if isinstance(vision, dict) else None
    for what, value in (("vision_cfg", vision), ("vision_cfg.norm_kwargs", norm_kwargs or {})):
        if not isinstance(value, dict):
            raise ValueError(f"open_clip's {name} has {what}={value!r}, not a JSON object")
    if vision.get("timm_model_name"):
        named = f"timm's {vision['timm_model_name']}"
    elif not isinstance(vision.get("layers"), int):
        named = "a ModifiedResNet"
    else:
        named = f"a ViT of width {vision.get('width')}"
    if named != f"a ViT of width {width}":
        raise ValueError(
            f"the file is named after open_clip's {name} but its weights differ from it: a ViT of width {width}, "
            f"not {named}"
        )
    if (pool := vision.get("pool_type", "tok")) not in _POOLS:
        raise ValueError(f"open_clip's {name} pools with pool_type={pool!r}, which this ViT lacks")
    head_width = vision.get("head_width", 64)
    if isinstance(head_width, bool) or not isinstance(head_width, int) or not 0 < head_width <= width:
        raise ValueError(f"open_clip's {name} has vision_cfg.head_width={head_width!r}, not a width up to {width}")
    if vision.get("act_kwargs"):
        raise ValueError(f"open_clip's {name} sets its activation's act_kwargs={vision['act_kwargs']}")
    return dict(
        img_size=vision.get("image_size", 224),
        patch_size=vision.get("patch_size", 16),
        num_heads=width // head_width,
        act="quick_gelu" if model_cfg.get("quick_gelu") else "gelu",
        pool=_POOLS[pool],
        final_norm="pooled" if pool == "avg" and vision.get("final_ln_after_pool") else "tokens",
        norm_eps=(vision.get("norm_kwargs") or {}).get("eps", OPEN_CLIP_EPS),
    )


def _from_config(config: ViTConfig) -> dict[str, Any]:
    """What the weights do not record, from the config given: heads, activation and pooling."""
    if config.act == "swiglu":
        raise ValueError("open_clip's ViT has no gated MLP: act='swiglu' does not describe it")
    if config.pool not in _POOLS.values():
        raise ValueError(f"open_clip's ViT pools with its class token or the patches' mean, not pool={config.pool!r}")
    return dict(
        img_size=config.img_size,  # a grid hint only: the weights say the size
        patch_size=config.patch_size,
        num_heads=config.num_heads,
        act=config.act,
        pool=config.pool,
        final_norm="pooled" if config.pool == "avg" and config.final_norm == "pooled" else "tokens",
        norm_eps=OPEN_CLIP_EPS,
    )


def from_open_clip(
    state: dict[str, Tensor],
    config: ViTConfig | None,
    path: Path | None = None,
    named: tuple[str, dict[str, Any]] | None = None,
) -> Converted:
    """An OpenCLIP vision tower, or a CLIP state dict's; heads, activation and pooling from `named` (a model name
    and its model_cfg: a hub folder's), else from the open_clip model the file is named after, else from `config`."""
    tower = visual_tower(state)
    width = tower["conv1.weight"].shape[0]
    if (named := named or model_config_named(path)) is not None:
        name, model_cfg = named
        unrecorded = _from_model_config(name, model_cfg, width)
        if config is not None and config.num_heads != unrecorded["num_heads"]:
            raise ValueError(
                f"{config.num_heads} heads were given, but open_clip's {name} has {unrecorded['num_heads']}"
            )
    elif config is not None:
        unrecorded = _from_config(config)
    else:
        raise ValueError(
            "an OpenCLIP state dict records neither its heads nor its activation (QuickGELU for OpenAI's weights): "
            "give config= with num_heads and act, or name the file after an open_clip model "
            "(ViT-B-32-quickgelu.openai.bin, with open_clip_torch installed)"
        )
    if width % unrecorded["num_heads"]:
        raise ValueError(f"{unrecorded['num_heads']} heads do not divide the tower's width {width}")
    timm_state = open_clip_to_timm(tower, ln_after_pool=unrecorded["final_norm"] == "pooled")
    source = timm_config(timm_state, ViTConfig(embed_dim=width, **unrecorded))
    return source, from_timm(timm_state, source), {}


def is_open_clip_folder(path: Path) -> bool:
    return (path / FOLDER_CONFIG).is_file()


def from_open_clip_folder(path: Path) -> Converted:
    """A folder as OpenCLIP's hub ships a model (open_clip_config.json beside open_clip_model.safetensors or
    open_clip_pytorch_model.bin): the architecture from its model_cfg, the preprocessing from its preprocess_cfg."""
    folder_config = read_json_object(path / FOLDER_CONFIG)
    model_cfg, pre = folder_config.get("model_cfg"), folder_config.get("preprocess_cfg") or {}
    for key, value in (("model_cfg", model_cfg), ("preprocess_cfg", pre)):
        if not isinstance(value, dict):
            raise ValueError(f"{FOLDER_CONFIG}: {key} is {value!r}, not a JSON object")
    weights = next((path / name for name in FOLDER_WEIGHTS if (path / name).is_file()), None)
    if weights is None:
        raise ValueError(f"{FOLDER_CONFIG} has no weights beside it: expected one of {', '.join(FOLDER_WEIGHTS)}")
    state = read_weights(weights)
    if not is_open_clip(state):
        raise ValueError(f"{weights.name} holds no OpenCLIP vision tower (no visual.* weights)")
    config, weights_ours, _ = from_open_clip(state, None, weights, named=(path.name, model_cfg))
    if pre.get("resize_mode", "shortest") != "shortest":
        raise ValueError(
            f"preprocess_cfg.resize_mode={pre['resize_mode']!r}: evaluation here resizes the shorter side and "
            f"crops the centre (open_clip's 'shortest'), so images would not be read as the model saw them"
        )
    mean, std = pre.get("mean") or OPENAI_MEAN, pre.get("std") or OPENAI_STD  # open_clip's defaults
    facts = {"mean": mean, "std": std, "crop_pct": 1.0, "interpolation": pre.get("interpolation")}
    return config, weights_ours, facts
