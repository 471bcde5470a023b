"""Other libraries' ViT checkpoints, translated to our model: timm state dicts, the JAX .npz files of the
original ViT (read by timm's own loader), and Hugging Face ViTForImageClassification / ViTModel folders.

Everything here returns (ViTConfig, our state dict, data facts) and raises ValueError with the reason;
vit/checkpoint.py adds the file name and builds the model. Hugging Face keys are renamed to timm's, and
timm's to ours by vit/timm_interop.py, so there is one translation into our names.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import _load_weights
from torch import Tensor

from vit.config import ViTConfig
from vit.timm_interop import from_timm, timm_kwargs

Converted = tuple[ViTConfig, dict[str, Tensor], dict[str, Any]]

HF_CONFIG, HF_WEIGHTS, HF_PICKLED_WEIGHTS = "config.json", "model.safetensors", "pytorch_model.bin"
HF_PREPROCESSOR = "preprocessor_config.json"


def read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors and metadata of a .safetensors file (a format that cannot carry code)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"not a readable .safetensors file (truncated or corrupt?): {err}") from None


# timm ------------------------------------------------------------------------------------------------


def _grid(tokens: int, hint: ViTConfig | None) -> tuple[int, int] | None:
    """The (rows, columns) of `tokens` patches: the hint's grid if it has as many, else a square; else None."""
    if hint is not None and hint.num_patches == tokens:
        return hint.grid_size
    side = math.isqrt(tokens)
    return (side, side) if side * side == tokens else None


def _table_grid(tokens: int, hint: ViTConfig | None) -> tuple[int, int]:
    if (grid := _grid(tokens, hint)) is None:
        raise ValueError(f"a position table of {tokens} patches is not square; give a config with its grid")
    return grid


def _mlp_ratio(hidden: int, dim: int) -> float:
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
    prefix = 1 if "cls_token" in state else 0
    pos = state.get("pos_embed")
    tokens = pos.shape[1] - prefix if pos is not None else config.grid_size[0] * config.grid_size[1]
    gh, gw = _table_grid(tokens, config)
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
        mlp_ratio=_mlp_ratio(hidden, dim),
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


JAX_EMBEDDING, JAX_POSITIONS = "embedding/kernel", "Transformer/posembed_input/pos_embedding"
JAX_MLP = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"
# Every array timm's loader reads into the network we build from a .npz; any other is a part we would drop.
JAX_USED = re.compile(
    r"(embedding|head)/(kernel|bias)|cls|Transformer/posembed_input/pos_embedding|Transformer/encoder_norm/(scale|bias)"
    r"|Transformer/encoderblock_\d+/(LayerNorm_[02]/(scale|bias)|MlpBlock_3/Dense_[01]/(kernel|bias)"
    r"|MultiHeadDotProductAttention_1/(query|key|value|out)/(kernel|bias))"
)


def from_jax(path: Path, config: ViTConfig | None) -> Converted:
    """The original ViT's .npz (google-research/vision_transformer layout), read by timm's loader into a timm
    model. Sizes come from the arrays, heads and the rest from `config`, as for timm state dicts."""
    if config is None:
        raise ValueError("a .npz file does not record the number of heads: choose a model preset for it")
    with np.load(path, allow_pickle=False) as arrays:  # no pickles: numbers only
        shapes = {k: arrays[k].shape for k in arrays.files}
    if JAX_EMBEDDING not in shapes:
        hint = " (big_vision's params/ layout is not supported)" if f"params/{JAX_EMBEDDING}" in shapes else ""
        raise ValueError(f"not a ViT .npz: no '{JAX_EMBEDDING}' array{hint}")
    if unused := sorted(k for k in shapes if not JAX_USED.fullmatch(k)):
        pre_logits = any(k.startswith("pre_logits/") for k in unused)
        what = " (pre_logits/*: the Dense + tanh representation layer of ImageNet-21k models)" if pre_logits else ""
        raise ValueError(f"arrays this ViT has no place for, so its logits would differ: {', '.join(unused)}{what}")
    ph, pw, chans, dim = shapes[JAX_EMBEDDING]  # (H, W, C_in, D)
    prefix = 1 if "cls" in shapes else 0
    depth = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"Transformer/encoderblock_(\d+)/", k)))
    gh, gw = _table_grid(shapes[JAX_POSITIONS][1] - prefix, config)  # (1, prefix + N, D)
    source = replace(
        config,
        img_size=(gh * ph, gw * pw),
        patch_size=(ph, pw),
        in_chans=chans,
        num_classes=shapes["head/kernel"][-1] if "head/kernel" in shapes else 0,
        embed_dim=dim,
        depth=depth,
        mlp_ratio=_mlp_ratio(shapes[JAX_MLP][1], dim),  # (D, hidden)
        qkv_bias=True,
        pos_embed="learned",
        pool="token" if prefix else "avg",
        layer_scale_init=None,
        norm="pre",
    )
    model = TimmViT(**timm_kwargs(source))
    _load_weights(model, str(path))
    return source, from_timm(model.state_dict(), source), {}


# Hugging Face ----------------------------------------------------------------------------------------

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
        mlp_ratio=_mlp_ratio(values.get("intermediate_size", 4 * dim), dim),
        qkv_bias=values.get("qkv_bias", True),
        pos_embed="learned",
        pool="token",
        norm="pre",
        norm_eps=values.get("layer_norm_eps", 1e-12),
    )


def from_hugging_face(folder: Path, read: Callable[[Path], dict[str, Any]]) -> Converted:
    """A save_pretrained folder: config.json plus model.safetensors (or pytorch_model.bin, read by `read`)."""
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


def from_state_dict(state: dict[str, Tensor], config: ViTConfig | None) -> Converted:
    """A bare state dict of timm's or Hugging Face's ViT (keys tell which)."""
    if is_hugging_face(state):
        state = hugging_face_to_timm(state)
    if "patch_embed.proj.weight" not in state:
        raise ValueError(
            "not a ViT checkpoint of a known kind: neither ours (hyper_parameters), timm's "
            "(patch_embed.proj.weight) nor Hugging Face's (embeddings.patch_embeddings.*)"
        )
    return from_timm_state(state, config)
