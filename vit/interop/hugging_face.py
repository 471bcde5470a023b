"""Hugging Face ViTForImageClassification / ViTModel: save_pretrained folders and bare state dicts. Keys are
renamed to timm's, and timm's to ours by vit/interop/timm.py, so there is one translation into our names."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.interop.files import Converted, read, read_safetensors
from vit.interop.timm import from_timm, mlp_ratio_for
from vit.model.config import ViTConfig

HF_CONFIG, HF_WEIGHTS, HF_PICKLED_WEIGHTS = "config.json", "model.safetensors", "pytorch_model.bin"
HF_PREPROCESSOR = "preprocessor_config.json"

# transformers 5 renamed the modules of a ViT layer. Its save_pretrained writes the classic names back (unless
# save_original_format=False); model.state_dict() and files saved from it have the new ones. Classic names are
# renamed to the new as transformers does on loading (conversion_mapping.py, "ViTModel"), then both to timm's.
_HF_CLASSIC_LAYER = {
    "attention.attention.query": "attention.q_proj",
    "attention.attention.key": "attention.k_proj",
    "attention.attention.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
}
_HF_CLASSIC = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
_HF_TO_TIMM = [
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^layers\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"^layers\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"blocks.\1.attn.proj."),
    (r"^layers\.(\d+)\.mlp\.(fc[12])\.", r"blocks.\1.mlp.\2."),
    (r"^layernorm\.", "norm."),
    (r"^classifier\.", "head."),
]
_HF_QKV = re.compile(r"^layers\.(\d+)\.attention\.([qkv])_proj\.(weight|bias)$")


def is_hugging_face(state: dict[str, Tensor]) -> bool:
    return any(k.removeprefix("vit.").startswith("embeddings.patch_embeddings.") for k in state)


def _hf_current_name(key: str) -> str:
    """A Hugging Face ViT key without ViTForImageClassification's 'vit.', in transformers 5's names."""
    key = key.removeprefix("vit.")
    if m := _HF_CLASSIC.match(key):
        return f"layers.{m[1]}.{_HF_CLASSIC_LAYER.get(m[2], m[2])}.{m[3]}"
    return key


def hugging_face_to_timm(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face ViT keys, classic or transformers 5's -> timm's: separate query/key/value projections
    become one qkv. ViTModel's pooler (dense + tanh on the class token) is not part of the classifier: left out.
    A key with no place here is reported as it was given."""
    out, qkv, unknown = {}, {}, []
    for given, value in state.items():
        key = _hf_current_name(given)
        if key.startswith("pooler."):
            continue
        if m := _HF_QKV.match(key):
            qkv[(int(m.group(1)), m.group(3), m.group(2))] = value
            continue
        for pattern, replacement in _HF_TO_TIMM:
            new, n = re.subn(pattern, replacement, key)
            if n:
                out[new] = value
                break
        else:
            unknown.append(given)
    if unknown:
        raise ValueError(f"Hugging Face weights this ViT has no place for: {', '.join(sorted(unknown))}")
    for layer, kind in sorted({(layer, kind) for layer, kind, _ in qkv}):
        parts = [qkv[(layer, kind, part)] for part in "qkv"]
        out[f"blocks.{layer}.attn.qkv.{kind}"] = torch.cat(parts)  # [W_q; W_k; W_v], as timm and we fuse them
    return out


def hugging_face_config(values: dict[str, Any], has_head: bool) -> ViTConfig:
    if values.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act={values['hidden_act']!r}: this ViT's MLP uses exact GELU ('gelu')")
    if values.get("model_type", "vit") != "vit":
        raise ValueError(f"model_type={values['model_type']!r} is not a plain ViT ('vit')")
    dim = values["hidden_size"]
    return ViTConfig(
        img_size=values.get("image_size", 224),
        patch_size=values.get("patch_size", 16),
        in_chans=values.get("num_channels", 3),
        num_classes=len(values.get("id2label") or {}) if has_head else 0,
        embed_dim=dim,
        depth=values["num_hidden_layers"],
        num_heads=values["num_attention_heads"],
        mlp_ratio=mlp_ratio_for(values.get("intermediate_size", 4 * dim), dim),
        qkv_bias=values.get("qkv_bias", True),
        pos_embed="learned",
        pool="token",
        norm="pre",
        norm_eps=values.get("layer_norm_eps", 1e-12),
    )


def from_hugging_face(folder: Path) -> Converted:
    """A save_pretrained folder: config.json plus model.safetensors (or pytorch_model.bin)."""
    if not (folder / HF_CONFIG).is_file():
        raise ValueError(f"a folder checkpoint must be a Hugging Face save_pretrained folder with {HF_CONFIG}")
    values = json.loads((folder / HF_CONFIG).read_text())
    if (folder / HF_WEIGHTS).is_file():
        state = read_safetensors(folder / HF_WEIGHTS)[0]
    elif (folder / HF_PICKLED_WEIGHTS).is_file():
        state = read(folder / HF_PICKLED_WEIGHTS)
    else:
        raise ValueError(f"no {HF_WEIGHTS} or {HF_PICKLED_WEIGHTS} beside {HF_CONFIG}")
    timm_state = hugging_face_to_timm(state)
    config = hugging_face_config(values, has_head="head.weight" in timm_state)
    labels = (values.get("id2label") or {}) if config.num_classes else {}  # ViTModel: features, no classes
    facts: dict[str, Any] = {"classes": [labels[k] for k in sorted(labels, key=int)] if labels else None}
    if (folder / HF_PREPROCESSOR).is_file():
        preprocessor = json.loads((folder / HF_PREPROCESSOR).read_text())
        facts |= {"mean": preprocessor.get("image_mean"), "std": preprocessor.get("image_std")}
    return config, from_timm(timm_state, config), facts
