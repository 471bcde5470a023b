"""A family's Hugging Face weights, in any spelling its versions wrote, renamed into timm's VisionTransformer layout
(which vit/interop/timm/layout.py then reads as ours); and the bare state dicts told apart by their keys."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import Tensor

from vit.interop.hugging_face.dispatch import family_of

HF_CONFIG, HF_WEIGHTS, HF_PICKLED_WEIGHTS = "config.json", "model.safetensors", "pytorch_model.bin"

# A layer's modules in every family's spelling, classic (what save_pretrained writes), transformers 5's (in memory,
# and save_pretrained(save_original_format=False)) or timm's (the original checkpoints of TIPSv2 and RADIO) ->
# timm's; the parts in _PACKS are concatenated after.
_LAYER_SPELLINGS = {
    "norm1": ("layernorm_before", "layer_norm1", "norm1"),
    "norm2": ("layernorm_after", "layer_norm2", "norm2"),
    "attn.q": ("attention.attention.query", "attention.q_proj", "self_attn.q_proj"),
    "attn.k": ("attention.attention.key", "attention.k_proj", "self_attn.k_proj"),
    "attn.v": ("attention.attention.value", "attention.v_proj", "self_attn.v_proj"),
    "attn.qkv": ("attn.qkv",),
    "attn.q_norm": ("attention.q_norm", "attn.q_norm"),
    "attn.k_norm": ("attention.k_norm", "attn.k_norm"),
    "attn.proj": (
        "attention.output.dense",
        "attention.o_proj",
        "attention.out_proj",
        "self_attn.out_proj",
        "attn.proj",
    ),
    "mlp.fc1": ("intermediate.dense", "mlp.fc1", "mlp.weights_in"),  # DINOv2's weights_in packs [gate; value]
    "mlp.gate": ("mlp.gate_proj",),
    "mlp.value": ("mlp.up_proj",),  # transformers computes act(gate) * up; a plain MLP's up_proj is its fc1
    "mlp.fc2": ("output.dense", "mlp.fc2", "mlp.weights_out", "mlp.down_proj"),
    "ls1": ("layer_scale1", "ls1"),
    "ls2": ("layer_scale2", "ls2"),
}
_LAYER = {spelling: timm for timm, spellings in _LAYER_SPELLINGS.items() for spelling in spellings}
_LAYER_KEY = re.compile(r"^(?:encoder\.|model\.)?(?:layers?|blocks)\.(\d+)\.(.+)\.(weight|bias|lambda1|gamma)$")
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
    # timm's own names: a family's renames give them, and TIPSv2's and RADIO's original checkpoints hold them
    (r"^(cls_token|reg_token|pos_embed)$", r"\1"),
    (r"^(patch_embed\.(?:proj|norm)|attn_pool)\.", r"\1."),
]
_QKV_PART = re.compile(r"^(blocks\.\d+)\.attn\.[qkv]\.(weight|bias)$")
_SEQUENCES = ("cls_token", "dist_token", "reg_token", "pos_embed")  # (1, n, D) in timm; CLIP's are (D,) and (N, D)


# Bare state dicts of the families whose architecture only config.json says, each told by a key that only its models
# hold, under any tower's module name; first match wins. DeiTModel's keys are ViTModel's and a distillation token:
# given a config, it loads as ViTModel's do.
_BARE_FAMILIES = {
    r"(^|\.)storage_tokens$|\.attention\.q_norm\.": "Sapiens 2",  # in its original names or transformers'
    r"(^|\.)patch_generator\.|(^|\.)embeddings\.cls_register_token$": "RADIO",
    r"(^|\.)embeddings\.rms_norm\.": "AIMv2",
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


def hugging_face_to_timm(state: dict[str, Tensor], model_type: str = "vit") -> dict[str, Tensor]:
    """A family's Hugging Face keys, in any of its spellings, with or without the tower's module name -> timm's:
    separate query/key/value projections become one qkv, SwiGLU's gate and value one fc1, SigLIP's in_proj a q and a
    kv. The weights outside the network are left out (Family.left_out); a key with no place here is reported as it
    was given, and two keys for one place are refused."""
    family = family_of(model_type)
    out, unknown, given_as = {}, [], {}
    for given, value in state.items():
        key = next((given.removeprefix(t) for t in family.towers if given.startswith(t)), given)
        if key.startswith(family.left_out):
            continue
        for pattern, replacement in family.renames:
            key = re.sub(pattern, replacement, key)
        if (name := _timm_name(key)) is None:
            unknown.append(given)
        elif value.numel() == 0:  # DINOv3's register_tokens of a model without registers: (1, 0, D)
            continue
        elif name in given_as:
            raise ValueError(f"Hugging Face weights {given_as[name]} and {given} are both {name} (timm's name)")
        else:
            given_as[name] = given
            out[name] = value.reshape(1, -1, value.shape[-1]) if name in _SEQUENCES else value
    if unknown:
        raise ValueError(f"Hugging Face weights this ViT has no place for: {', '.join(sorted(unknown))}")
    for block in {m[1] for k in out if (m := _QKV_PART.match(k)) and m[2] == "bias"}:
        for part in family.unbiased:
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
