"""The ViTConfig that a Hugging Face config.json describes: the classic ViT's sizes, read alike for every family with
transformers' defaults for what it leaves out, and what sets the family apart (its Family.switches)."""

from __future__ import annotations

from typing import Any

from vit.interop.files import json_kind
from vit.interop.hugging_face.dispatch import VISION_TOWERS, family_of
from vit.interop.hugging_face.family import Family
from vit.interop.hugging_face.keys import HF_CONFIG
from vit.interop.timm import mlp_ratio_for
from vit.model.config import ViTConfig

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

# config.json's numbers the arithmetic below reads, with the least each may be: a string, null or 0 there would
# fail as a traceback
_COUNTS = dict(
    hidden_size=1, num_hidden_layers=1, num_attention_heads=1, num_channels=1, intermediate_size=1, head_dim=1,
    max_img_size=1, n_cls_tokens=1, num_cls_tokens=1, num_register_tokens=0, num_registers=0,
)  # fmt: skip
_POSITIVE = ("layer_norm_eps", "rms_norm_eps", "mlp_ratio", "layerscale_value", "rope_theta")


def _check_types(v: dict[str, Any]) -> None:
    """The numbers and names in a tower's config.json, refusing the first of the wrong kind by its key."""
    for key in (*_COUNTS, *_POSITIVE, "hidden_act"):
        if key not in v or (key == "head_dim" and v[key] is None):  # absent: the family's default, or unused
            continue
        value = v[key]
        if key == "hidden_act":
            wrong = None if isinstance(value, str) else "a name"
        elif isinstance(value, bool) or not isinstance(value, (int, float) if key in _POSITIVE else int):
            wrong = "a number" if key in _POSITIVE else "a whole number"
        elif key in _POSITIVE:
            wrong = None if value > 0 else "> 0"
        else:
            wrong = None if value >= _COUNTS[key] else f">= {_COUNTS[key]}"
        if wrong:
            raise ValueError(f"{key}={value!r} is not {wrong}")


def _mlp(v: dict[str, Any]) -> tuple[str, int]:
    """The MLP's activation and hidden width (fc2's input): intermediate_size where the family's config has one,
    else mlp_ratio's."""
    if v.get("use_swiglu_ffn"):  # SwiGLU keeps two thirds of DINOv2's MLP width, rounded up to a multiple of 8
        return "swiglu", (int(int(v["hidden_size"] * v["mlp_ratio"]) * 2 / 3) + 7) // 8 * 8
    if v.get("use_gated_mlp"):  # act(gate_proj x) * up_proj x
        if v["hidden_act"] != "silu":
            raise ValueError(f"a gated MLP with hidden_act={v['hidden_act']!r}: this ViT gates with SiLU only")
        return "swiglu", v["intermediate_size"]
    if (act := _ACTIVATIONS.get(v["hidden_act"])) is None:
        raise ValueError(f"hidden_act={v['hidden_act']!r} is not an activation this ViT has")
    hidden = v["intermediate_size"] if "intermediate_size" in v else int(v["hidden_size"] * v["mlp_ratio"])
    return act, hidden


def tower_values(values: dict[str, Any]) -> tuple[str, Family, dict[str, Any]]:
    """config.json's model_type, its family (refusing one it is not) and its vision tower's settings: config.json's
    (a dual encoder's vision_config), transformers' defaults for what it leaves out."""
    model_type = values.get("model_type", "vit")
    family = family_of(model_type)
    tower = (values.get("vision_config") or {}) if model_type in VISION_TOWERS else values
    if not isinstance(tower, dict):
        raise ValueError(f"model_type {model_type}: vision_config={tower!r} is not a JSON object")
    return model_type, family, {**family.defaults, **tower}


def hugging_face_config(values: dict[str, Any], has_head: bool, distill_head: bool = False) -> ViTConfig:
    """The ViT that config.json describes (a dual encoder's: its vision tower), transformers' defaults for what it
    leaves out. `has_head`: the weights hold a classifier; `distill_head`: DeiT's second one, on its own token."""
    model_type, family, v = tower_values(values)
    try:
        _check_types(v)
        dim, heads = v["hidden_size"], v["num_attention_heads"]
        if (v.get("head_dim") or dim // heads) * heads != dim:
            raise ValueError(f"head_dim={v['head_dim']} x {heads} heads is not its width {dim}")
        act, hidden = _mlp(v)
        switches = family.switches(v, has_head, distill_head)
    except ValueError as err:
        raise ValueError(f"model_type {model_type}: {err}") from None
    classic = dict(
        img_size=v.get("image_size"),
        patch_size=v["patch_size"],
        in_chans=v["num_channels"],
        num_classes=num_labels(values) if has_head else 0,
        embed_dim=dim,
        depth=v["num_hidden_layers"],
        num_heads=heads,
        mlp_ratio=mlp_ratio_for(hidden, dim),
        qkv_bias=v["qkv_bias"],
        act=act,
        pos_embed="learned",
        pool="token",
        norm_eps=v["layer_norm_eps"] if "layer_norm_eps" in v else v["rms_norm_eps"],
    )
    return ViTConfig(**classic | switches)


def num_labels(values: dict[str, Any]) -> int:
    return len(labels(values)) or values.get("num_labels", 2)  # transformers' rule


def labels(values: dict[str, Any]) -> dict[int, str]:
    """config.json's id2label as class index -> name, refusing in one line what is not such a mapping."""
    found = values.get("id2label") or {}
    if not isinstance(found, dict):
        raise ValueError(f"{HF_CONFIG}: id2label holds {json_kind(found)}, not a mapping of class indices to names")
    for key, name in found.items():
        if not key.isdigit() or not isinstance(name, str):  # JSON's keys are strings
            raise ValueError(f"{HF_CONFIG}: id2label[{key!r}]={name!r} is not a class index and its name")
    return {int(key): name for key, name in found.items()}
