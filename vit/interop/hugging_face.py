"""Hugging Face transformers' ViT families: save_pretrained folders (config.json + weights), and ViT state dicts
saved as a file (the other families' are refused by name: only config.json says their architecture). Keys are
renamed to timm's, and timm's to ours by vit/interop/timm/layout.py, so there is one translation into our names; the
architecture is config.json's, with transformers' defaults for what it leaves out.

What each model_type is in ViTConfig:
- vit (ViTModel, ViTForImageClassification): the classic ViT.
- deit: the teacher classifier's two heads, averaged (distill_token); the one-head classifier never reads the
  distillation token's output, a register (reg_tokens=1); DeiTModel keeps the token (distill_token, no head), its
  features the two tokens averaged, as the teacher classifier's without heads (num_labels=0) and timm's.
- dinov2: layer_scale_init, act='swiglu' for use_swiglu_ffn; the classifier reads [CLS; mean of patches]
  (pool='token_avg', headless too: config.json's architectures says so), Dinov2Model's pooler_output is the class
  token.
- dinov2_with_registers: also reg_tokens; the registers join after the positions are added, so the table's class
  row is folded into the class token and the table has no prefix rows (pos_embed_prefix=False): exact.
- clip_vision_model, and clip's vision tower: embed_norm (pre_layrnorm), patch_bias=False; post_layernorm
  normalises the pooled class token only, which is our final norm read at the class token.
- siglip_vision_model, and siglip's vision tower: no class token, pool='map' (its attention-pooling head);
  SiglipForImageClassification averages the normalised tokens (pool='avg').
- siglip2_vision_model, and siglip2's vision tower (NaFlex): SigLIP's network, which reads images at their own size;
  its patches projected by a linear map of their (p, p, C) pixels (the strided convolution it equals, weight
  reordered), its num_patches table resized to each image's grid bilinearly with antialiasing (pos_resample's mode
  'bilinear'); its attention mask for padded patches is our packing's block mask (forward_packed).

Left out, not being part of the network from an image to its pooled features or logits: ViTModel's and DeiTModel's
pooler (dense + tanh), DINOv2's mask token (masked-image pretraining's input), a dual encoder's text tower and
contrastive projections (CLIP's visual_projection included: the features are the tower's pooled output).
Outputs equal transformers' at config.json's image size; at another one transformers resamples its position table
its own way (DINOv2's without antialiasing), ours as timm does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor

from vit.interop.files import Converted, json_kind, read_json_object, read_weights
from vit.interop.timm import from_timm, mlp_ratio_for
from vit.interop.timm.eva import pair_heads
from vit.model.config import Resampling, RopeGrid, ViTConfig

HF_CONFIG, HF_WEIGHTS, HF_PICKLED_WEIGHTS = "config.json", "model.safetensors", "pytorch_model.bin"
HF_PREPROCESSOR = "preprocessor_config.json"


@dataclass(frozen=True)
class _Family:
    """One model_type's vision tower as stored: the module name it has inside classifiers and dual encoders,
    transformers' config defaults (config.json may leave them out), and the weights outside the network."""

    tower: str
    defaults: dict[str, Any]
    left_out: tuple[str, ...] = ()


# transformers' config defaults per family, which config.json may leave out
_SIZES = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_channels=3, image_size=224, qkv_bias=True
)
_CLASSIC = dict(_SIZES, patch_size=16, intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-12)
_DINOV2 = dict(_SIZES, mlp_ratio=4, use_swiglu_ffn=False, layerscale_value=1.0, hidden_act="gelu", layer_norm_eps=1e-6)
_DUAL_ENCODER = ("text_model.", "text_projection.", "visual_projection.", "logit_scale", "logit_bias")
_CONTRASTIVE = dict(_SIZES, intermediate_size=3072)
_FAMILIES = {
    "vit": _Family("vit.", _CLASSIC, ("pooler.",)),
    "deit": _Family("deit.", _CLASSIC, ("pooler.",)),
    "dinov2": _Family("dinov2.", dict(_DINOV2, patch_size=14), ("embeddings.mask_token",)),
    "dinov2_with_registers": _Family(
        "dinov2_with_registers.", dict(_DINOV2, patch_size=16, num_register_tokens=4), ("embeddings.mask_token",)
    ),
    "clip_vision_model": _Family(
        "vision_model.", dict(_CONTRASTIVE, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5), _DUAL_ENCODER
    ),
    "dinov3_vit": _Family(
        "",
        dict(
            _SIZES,
            hidden_size=384,
            num_attention_heads=6,
            patch_size=16,
            intermediate_size=1536,
            hidden_act="gelu",
            layer_norm_eps=1e-5,
            rope_theta=100.0,
            query_bias=True,
            value_bias=True,
            proj_bias=True,
            mlp_bias=True,
            layerscale_value=1.0,
            use_gated_mlp=False,
            num_register_tokens=0,
        ),
        ("embeddings.mask_token",),
    ),
    "siglip_vision_model": _Family(
        "vision_model.",
        dict(_CONTRASTIVE, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=True),
        _DUAL_ENCODER,
    ),
}
_FAMILIES["siglip2_vision_model"] = _Family(
    "vision_model.",
    {**_FAMILIES["siglip_vision_model"].defaults, "num_patches": 256},  # no image_size: a table of num_patches rows
    _DUAL_ENCODER,
)
_VISION_TOWER = {"clip": "clip_vision_model", "siglip": "siglip_vision_model", "siglip2": "siglip2_vision_model"}
_REFUSED: dict[str, str] = {}
# transformers' hidden_act -> ours; gelu_python is erf's GELU written out, gelu_new, gelu_fast and gelu_accurate the
# tanh approximation written out (each within 1.2e-6 of ours on N(0, 16) inputs)
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "quick_gelu": "quick_gelu",
}

# A layer's modules in every family's spelling, classic (what save_pretrained writes) or transformers 5's (in
# memory, and save_pretrained(save_original_format=False)) -> timm's; the parts in _PACKS are concatenated after.
_LAYER_SPELLINGS = {
    "norm1": ("layernorm_before", "layer_norm1", "norm1"),
    "norm2": ("layernorm_after", "layer_norm2", "norm2"),
    "attn.q": ("attention.attention.query", "attention.q_proj", "self_attn.q_proj"),
    "attn.k": ("attention.attention.key", "attention.k_proj", "self_attn.k_proj"),
    "attn.v": ("attention.attention.value", "attention.v_proj", "self_attn.v_proj"),
    "attn.proj": ("attention.output.dense", "attention.o_proj", "self_attn.out_proj"),
    "mlp.fc1": ("intermediate.dense", "mlp.fc1", "mlp.weights_in"),  # DINOv2's weights_in packs [gate; value]
    "mlp.gate": ("mlp.gate_proj",),
    "mlp.value": ("mlp.up_proj",),  # transformers computes SiLU(gate) * up
    "mlp.fc2": ("output.dense", "mlp.fc2", "mlp.weights_out", "mlp.down_proj"),
    "ls1": ("layer_scale1",),
    "ls2": ("layer_scale2",),
}
_LAYER = {spelling: timm for timm, spellings in _LAYER_SPELLINGS.items() for spelling in spellings}
_LAYER_KEY = re.compile(r"^(?:encoder\.|model\.)?layers?\.(\d+)\.(.+)\.(weight|bias|lambda1)$")
_PACKS = {"attn.qkv": ("attn.q", "attn.k", "attn.v"), "mlp.fc1": ("mlp.gate", "mlp.value")}  # as timm and we fuse
# every other module, first match wins
_RENAMES = [
    (r"^embeddings\.(cls_token|class_embedding)$", "cls_token"),
    (r"^embeddings\.distillation_token$", "dist_token"),
    (r"^embeddings\.register_tokens$", "reg_token"),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.position_embedding\.weight$", "pos_embed"),  # CLIP's and SigLIP's nn.Embedding
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^embeddings\.patch_embedding\.", "patch_embed.proj."),
    (r"^embeddings\.patch_embeddings\.(weight|bias)$", r"patch_embed.proj.\1"),  # DINOv3's bare Conv2d
    (r"^pre_layrnorm\.", "norm_pre."),
    (r"^(post_)?layernorm\.", "norm."),
    (r"^norm\.", "norm."),
    (r"^head\.probe$", "attn_pool.latent"),  # SigLIP's attention-pooling head
    (r"^head\.attention\.in_proj_", "attn_pool.qkv."),  # nn.MultiheadAttention's [W_q; W_k; W_v], split below
    (r"^head\.attention\.out_proj\.", "attn_pool.proj."),
    (r"^head\.layernorm\.", "attn_pool.norm."),
    (r"^head\.mlp\.", "attn_pool.mlp."),
    (r"^(cls_)?classifier\.", "head."),
    (r"^distillation_classifier\.", "head_dist."),
]
_QKV_PART = re.compile(r"^(blocks\.\d+)\.attn\.[qkv]\.(weight|bias)$")
_SEQUENCES = ("cls_token", "dist_token", "reg_token", "pos_embed")  # (1, n, D) in timm; CLIP's are (D,) and (N, D)


# Bare state dicts of the families whose architecture only config.json says, each told by a key that only its models
# hold, under any tower's module name; first match wins. DeiTModel's keys are ViTModel's and a distillation token:
# given a config, it loads as ViTModel's do.
_BARE_FAMILIES = {
    r"(^|\.)embeddings\.patch_embeddings\.weight$": "DINOv3",  # a bare Conv2d where the others have .projection
    r"(^|\.)embeddings\.register_tokens$": "DINOv2 with registers",  # DINOv3's too, told apart above
    r"\.layer_scale1\.": "DINOv2",
    r"(^|\.)pre_layrnorm\.": "CLIP",
    r"(^|\.)embeddings\.patch_embedding\.weight$": "SigLIP",  # CLIP's too, told apart above
    r"^deit\.": "DeiT classifier",
}


def is_hugging_face(state: dict[str, Tensor]) -> bool:
    return any(k.removeprefix("vit.").startswith("embeddings.patch_embeddings.") for k in state)


def refuse_bare_family(state: dict[str, Tensor], path: Path | None) -> None:
    """Refuses a bare state dict of a family in _BARE_FAMILIES, naming it and the folder that would load."""
    family = next((name for key, name in _BARE_FAMILIES.items() if any(re.search(key, k) for k in state)), None)
    if family is not None:
        weights = HF_PICKLED_WEIGHTS if path is not None and path.suffix != ".safetensors" else HF_WEIGHTS
        raise ValueError(
            f"a bare Hugging Face {family} state dict: its heads, activation, norm eps and more are in the model's "
            f"{HF_CONFIG}, which a weights file does not carry; load instead the folder save_pretrained writes, or "
            f"a folder holding the model's {HF_CONFIG} and these weights as {weights}"
        )


def _timm_name(key: str) -> str | None:
    """A key of the tower, in any spelling, as timm names it (packed parts still apart); None: no place for it."""
    if m := _LAYER_KEY.match(key):
        module = _LAYER.get(m[2])
        return None if module is None else f"blocks.{m[1]}.{module}.{'gamma' if m[3] == 'lambda1' else m[3]}"
    for pattern, replacement in _RENAMES:
        new, n = re.subn(pattern, replacement, key)
        if n:
            return new
    return None


def hugging_face_to_timm(state: dict[str, Tensor], family: str = "vit") -> dict[str, Tensor]:
    """A family's Hugging Face keys, classic or transformers 5's, with or without the tower's module name ->
    timm's: separate query/key/value projections become one qkv, SwiGLU's gate and value one fc1, SigLIP's
    in_proj a q and a kv. The weights outside the network are left out (module docstring); a key with no place here
    is reported as it was given."""
    tower, left_out = _FAMILIES[family].tower, _FAMILIES[family].left_out
    out, unknown = {}, []
    for given, value in state.items():
        key = given.removeprefix(tower)
        if key.startswith(left_out):
            continue
        if (name := _timm_name(key)) is None:
            unknown.append(given)
        elif value.numel() == 0:  # DINOv3's register_tokens of a model without registers: (1, 0, D)
            continue
        else:
            out[name] = value.reshape(1, -1, value.shape[-1]) if name in _SEQUENCES else value
    if unknown:
        raise ValueError(f"Hugging Face weights this ViT has no place for: {', '.join(sorted(unknown))}")
    # a key bias only adds q·b_k to a softmax row: zero where it is left out. DINOv3's config leaves out any of
    # the three (query_bias, key_bias, value_bias); another family's file without a query or value bias is broken
    unbiased = _PACKS["attn.qkv"] if family == "dinov3_vit" else ("attn.k",)
    for block in {m[1] for k in out if (m := _QKV_PART.match(k)) and m[2] == "bias"}:
        for part in unbiased:
            if (weight := out.get(f"{block}.{part}.weight")) is not None:
                out.setdefault(f"{block}.{part}.bias", weight.new_zeros(weight.shape[0]))
    for packed, parts in _PACKS.items():
        first = re.compile(rf"^(blocks\.\d+)\.{re.escape(parts[0])}\.(weight|bias)$")
        for block, param in [m.groups() for k in list(out) if (m := first.match(k))]:
            names = [f"{block}.{part}.{param}" for part in parts]
            if missing := [name for name in names if name not in out]:
                raise ValueError(f"Hugging Face weights lack {', '.join(missing)} (timm's names) beside {names[0]}")
            tensors = [out.pop(name) for name in names]
            if len({t.shape[1:] for t in tensors}) > 1:
                shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in zip(names, tensors, strict=True))
                raise ValueError(f"Hugging Face weights that do not fit together into {packed}: {shapes}")
            out[f"{block}.{packed}.{param}"] = torch.cat(tensors)
    if strays := sorted(k for k in out if _QKV_PART.match(k)):  # a key or value projection without its query
        raise ValueError(f"Hugging Face weights lack the query projection beside {', '.join(strays)} (timm's names)")
    for param in ("weight", "bias"):
        if (qkv := out.pop(f"attn_pool.qkv.{param}", None)) is not None:
            dim = qkv.shape[0] // 3
            out[f"attn_pool.q.{param}"], out[f"attn_pool.kv.{param}"] = qkv[:dim], qkv[dim:]  # [W_q], [W_k; W_v]
    return out


def _family(model_type: str) -> str:
    """The family of a model_type (a dual encoder's: its vision tower's), refusing the rest in one line."""
    if not isinstance(model_type, str):
        raise ValueError(f"{HF_CONFIG}: model_type={model_type!r} is not a name")
    if model_type in _REFUSED:
        raise ValueError(f"model_type {model_type}: {_REFUSED[model_type]}")
    family = _VISION_TOWER.get(model_type, model_type)
    if family not in _FAMILIES:
        known = ", ".join([*_FAMILIES, *_VISION_TOWER])
        raise ValueError(f"model_type {model_type} is not one this loader reads ({known})")
    return family


# config.json's fields the arithmetic below reads: a string, null or 0 there would fail as a traceback
_COUNTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_channels", "intermediate_size", "head_dim")
_POSITIVE = ("layer_norm_eps", "mlp_ratio", "layerscale_value", "rope_theta")


def _check_types(v: dict[str, Any]) -> None:
    """The numbers and names in a tower's config.json, refusing the first of the wrong kind by its key."""
    for key in (*_COUNTS, *_POSITIVE, "num_register_tokens", "hidden_act"):
        if key not in v or (key == "head_dim" and v[key] is None):  # absent: the family's default, or unused
            continue
        value, least = v[key], 0 if key == "num_register_tokens" else 1
        if key == "hidden_act":
            wrong = None if isinstance(value, str) else "a name"
        elif isinstance(value, bool) or not isinstance(value, (int, float) if key in _POSITIVE else int):
            wrong = "a number" if key in _POSITIVE else "a whole number"
        elif key in _POSITIVE:
            wrong = None if value > 0 else "> 0"
        else:
            wrong = None if value >= least else f">= {least}"
        if wrong:
            raise ValueError(f"{key}={value!r} is not {wrong}")


def _mlp(v: dict[str, Any], family: str) -> tuple[str, int]:
    """The MLP's activation and hidden width (fc2's input)."""
    if v.get("use_swiglu_ffn"):  # SwiGLU keeps two thirds of DINOv2's MLP width, rounded up to a multiple of 8
        return "swiglu", (int(int(v["hidden_size"] * v["mlp_ratio"]) * 2 / 3) + 7) // 8 * 8
    if v.get("use_gated_mlp"):  # DINOv3's act(gate_proj x) * up_proj x
        if v["hidden_act"] != "silu":
            raise ValueError(f"a gated MLP with hidden_act={v['hidden_act']!r}: this ViT gates with SiLU only")
        return "swiglu", v["intermediate_size"]
    if (act := _ACTIVATIONS.get(v["hidden_act"])) is None:
        raise ValueError(f"hidden_act={v['hidden_act']!r} is not an activation this ViT has")
    hidden = int(v["hidden_size"] * v["mlp_ratio"]) if family.startswith("dinov2") else v["intermediate_size"]
    return act, hidden


def _switches(v: dict[str, Any], family: str, has_head: bool, distill_head: bool) -> dict[str, Any]:
    """What sets a family apart from the classic ViT, as ViTConfig fields."""
    if family == "deit":  # the one-head classifier never reads the distillation token's output: a register
        one_head = has_head and not distill_head
        return dict(distill_token=not one_head, reg_tokens=int(one_head))
    if family.startswith("dinov2"):
        registers = family == "dinov2_with_registers"
        classifier = any(name.endswith("ForImageClassification") for name in v.get("architectures") or [])
        return dict(
            # the classifier reads [CLS; mean of patches], headless too (num_labels=0); the model its CLS
            pool="token_avg" if has_head or classifier else "token",
            layer_scale_init=v["layerscale_value"],
            reg_tokens=v["num_register_tokens"] if registers else 0,
            pos_embed_prefix=not registers,  # the class row is folded into the class token (_placed)
        )
    if family == "dinov3_vit":
        if v["proj_bias"] != v["mlp_bias"]:
            raise ValueError(f"proj_bias={v['proj_bias']} and mlp_bias={v['mlp_bias']} differ: this ViT ties them")
        return dict(
            pos_embed="rope2d",  # RoPE alone: DINOv3's phases at its patches' centres, rows first (_placed pairs heads)
            rope=RopeGrid(axes="yx", grid="centered"),
            pos_temperature=v["rope_theta"],
            qkv_bias=v["query_bias"] or v["value_bias"],
            proj_bias=v["proj_bias"],
            reg_tokens=v["num_register_tokens"],
            layer_scale_init=v["layerscale_value"],
        )
    if family == "clip_vision_model":
        if has_head:
            raise ValueError(
                "CLIPForImageClassification averages the patch tokens before any final norm "
                "(post_layernorm normalises the class token only), a pooling this ViT lacks"
            )
        return dict(embed_norm=True, patch_bias=False)  # post_layernorm on the class token = our final norm there
    if family == "siglip_vision_model":  # SiglipForImageClassification averages the tokens, past the head
        return dict(class_token=False, pool="map" if v["vision_use_head"] and not has_head else "avg")
    if family == "siglip2_vision_model":
        side = math.isqrt(v["num_patches"])
        if side * side != v["num_patches"]:
            raise ValueError(f"num_patches={v['num_patches']} is not a square grid's")
        pool = "map" if v["vision_use_head"] and not has_head else "avg"
        bilinear = Resampling(mode="bilinear")
        return dict(class_token=False, pool=pool, pos_resample=bilinear, img_size=side * v["patch_size"])
    return {}


def hugging_face_config(values: dict[str, Any], has_head: bool, distill_head: bool = False) -> ViTConfig:
    """The ViT that config.json describes (a dual encoder's: its vision tower), transformers' defaults for what it
    leaves out. `has_head`: the weights hold a classifier; `distill_head`: DeiT's second one, on its own token."""
    model_type = values.get("model_type", "vit")
    family = _family(model_type)
    tower = (values.get("vision_config") or {}) if model_type in _VISION_TOWER else values
    if not isinstance(tower, dict):
        raise ValueError(f"model_type {model_type}: vision_config={tower!r} is not a JSON object")
    v = {**_FAMILIES[family].defaults, **tower}
    try:
        _check_types(v)
        dim, heads = v["hidden_size"], v["num_attention_heads"]
        if (v.get("head_dim") or dim // heads) * heads != dim:
            raise ValueError(f"head_dim={v['head_dim']} x {heads} heads is not its width {dim}")
        act, hidden = _mlp(v, family)
        switches = _switches(v, family, has_head, distill_head)
    except ValueError as err:
        raise ValueError(f"model_type {model_type}: {err}") from None
    classic = dict(
        img_size=v.get("image_size"),
        patch_size=v["patch_size"],
        in_chans=v["num_channels"],
        num_classes=_num_labels(values) if has_head else 0,
        embed_dim=dim,
        depth=v["num_hidden_layers"],
        num_heads=heads,
        mlp_ratio=mlp_ratio_for(hidden, dim),
        qkv_bias=v["qkv_bias"],
        act=act,
        pos_embed="learned",
        pool="token",
        norm_eps=v["layer_norm_eps"],
    )
    return ViTConfig(**classic | switches)


def _num_labels(values: dict[str, Any]) -> int:
    return len(_labels(values)) or values.get("num_labels", 2)  # transformers' rule


def _labels(values: dict[str, Any]) -> dict[int, str]:
    """config.json's id2label as class index -> name, refusing in one line what is not such a mapping."""
    labels = values.get("id2label") or {}
    if not isinstance(labels, dict):
        raise ValueError(f"{HF_CONFIG}: id2label holds {json_kind(labels)}, not a mapping of class indices to names")
    for key, name in labels.items():
        if not key.isdigit() or not isinstance(name, str):  # JSON's keys are strings
            raise ValueError(f"{HF_CONFIG}: id2label[{key!r}]={name!r} is not a class index and its name")
    return {int(key): name for key, name in labels.items()}


def _placed(state: dict[str, Tensor], config: ViTConfig, model_type: str) -> dict[str, Tensor]:
    """The weights whose place depends on the architecture read from config.json."""
    if model_type == "dinov2_with_registers":  # registers join after the positions are added: the class row is
        pos = state["pos_embed"]  # the class token's alone (1, 1 + N, D)
        state["cls_token"], state["pos_embed"] = state["cls_token"] + pos[:, :1], pos[:, 1:]
    if model_type == "deit" and config.reg_tokens:
        state["reg_token"] = state.pop("dist_token")
    if model_type == "dinov3_vit":
        if config.act != "swiglu":  # the plain MLP's up_proj is its fc1, not a gated MLP's value half
            state = {re.sub(r"\.mlp\.value\.", ".mlp.fc1.", k): v for k, v in state.items()}
        state = pair_heads(state, config.num_heads, config.head_dim)  # half-split rotation -> our interleaved pairs
    if model_type in ("siglip", "siglip2", "siglip2_vision_model") and config.pool == "avg":  # a head never run
        state = {k: v for k, v in state.items() if not k.startswith("attn_pool.")}
    if model_type in ("siglip2", "siglip2_vision_model") and state["patch_embed.proj.weight"].dim() == 2:
        (ph, pw), weight = config.patch_size, state["patch_embed.proj.weight"]  # (D, p_h p_w C), channels last
        state["patch_embed.proj.weight"] = weight.reshape(len(weight), ph, pw, -1).permute(0, 3, 1, 2)
    return state


def _side(p: dict[str, Any], key: str) -> int | None:
    """An image processor's size or crop_size: an int, or a dict (shortest_edge, or height and width)."""
    size = p.get(key)
    if isinstance(size, dict):
        size = size.get("shortest_edge", size.get("height"))
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"{HF_PREPROCESSOR}: {key}={p[key]!r} is not a size in pixels")
    return size


def _preprocessing(folder: Path) -> dict[str, Any]:
    """mean, std, crop_pct (crop size / resize size) and interpolation from preprocessor_config.json; None for
    what it does not say."""
    if not (folder / HF_PREPROCESSOR).is_file():
        return {"mean": None, "std": None, "crop_pct": None, "interpolation": None}
    p = read_json_object(folder / HF_PREPROCESSOR)
    crop, size, crop_pct = _side(p, "crop_size"), _side(p, "size"), p.get("crop_pct")
    if crop_pct is None and p.get("do_center_crop") is not False and crop and size:
        crop_pct = crop / size
    resample = p.get("resample")
    try:
        interpolation = None if resample is None else Image.Resampling(resample).name.lower()  # PIL's enum
    except ValueError:
        raise ValueError(f"{HF_PREPROCESSOR}: resample={resample!r} is not one of PIL's filters") from None
    stats = {}
    for key in ("image_mean", "image_std"):  # a list, or one number for every channel
        values = [p[key]] if isinstance(p.get(key), (int, float)) else p.get(key)
        if values is not None and not (
            isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        ):
            raise ValueError(f"{HF_PREPROCESSOR}: {key}={p[key]!r} is not a list of numbers")
        stats[key] = values
    mean, std = (stats["image_mean"], stats["image_std"]) if p.get("do_normalize") is not False else ([0.0], [1.0])
    # transformers feeds (x · rescale_factor - mean) / std for pixels x in 0..255, ours (x / 255 - mean) / std
    rescale = p.get("rescale_factor", 1 / 255) if p.get("do_rescale") is not False else 1.0
    if isinstance(rescale, bool) or not isinstance(rescale, (int, float)) or rescale <= 0:
        raise ValueError(f"{HF_PREPROCESSOR}: rescale_factor={rescale!r} is not a number > 0")
    if rescale != 1 / 255 and mean is not None and std is not None:
        mean, std = ([value / (255 * rescale) for value in values] for values in (mean, std))
    return {"mean": mean, "std": std, "crop_pct": crop_pct, "interpolation": interpolation}


def from_hugging_face(folder: Path) -> Converted:
    """A save_pretrained folder: config.json plus model.safetensors (or pytorch_model.bin)."""
    if not (folder / HF_CONFIG).is_file():
        raise ValueError(f"a folder checkpoint must be a Hugging Face save_pretrained folder with {HF_CONFIG}")
    values = read_json_object(folder / HF_CONFIG)
    model_type = values.get("model_type", "vit")
    family = _family(model_type)  # refused before reading the weights
    weights = next((folder / name for name in (HF_WEIGHTS, HF_PICKLED_WEIGHTS) if (folder / name).is_file()), None)
    if weights is None:
        raise ValueError(f"no {HF_WEIGHTS} or {HF_PICKLED_WEIGHTS} beside {HF_CONFIG}")
    state = read_weights(weights)
    timm_state = hugging_face_to_timm(state, family)
    config = hugging_face_config(values, "head.weight" in timm_state, "head_dist.weight" in timm_state)
    labels = _labels(values) if config.num_classes else {}  # a bare model: features, no classes
    classes = [labels[k] for k in sorted(labels)] if labels and len(labels) == config.num_classes else None
    facts = {"classes": classes, **_preprocessing(folder)}
    return config, from_timm(_placed(timm_state, config, model_type), config), facts
