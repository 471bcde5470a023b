"""timm's VisionTransformer: its hub folders and state dicts read as ours, and ours written as its.

timm's key layout is the one every foreign source is translated into (hugging_face.py, torchvision.py, ...),
and this file translates it into ours. The two models compute the same function for the configurations timm can
express; the differences are names and the learned position table's layout: ours is a (h, w, D) grid plus
(P, D) prefix rows, timm's one (1, [P +] h*w, D) sequence.

A hub folder (config.json with `architecture` and `model_args`, as timm's save_for_hf writes) names its
architecture: timm builds it on the meta device and `config_of_timm_model` reads every choice off the module,
refusing the ones ViTConfig lacks by name. A bare state dict records only its shapes: heads, activation and norm
eps come from a timm architecture name when the file is named after one, else from the config given.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vit.interop.files import Converted, read_json_object, read_weights
from vit.model.config import ViTConfig
from vit.model.pos_embed import FIXED_TABLES
from vit.model.size import check_depth, check_memory
from vit.model.vision_transformer import VisionTransformer

TIMM_CONFIG, TIMM_WEIGHTS, TIMM_PICKLED_WEIGHTS = "config.json", "model.safetensors", "pytorch_model.bin"

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
_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}  # ours -> timm's act_layer


def _rename(key: str, rules: list[tuple[str, str]]) -> str:
    for pattern, replacement in rules:
        new, n = re.subn(pattern, replacement, key)
        if n:
            return new
    return key


# writing timm's model ---------------------------------------------------------------------------------


def timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Constructor arguments for timm's VisionTransformer that build the same network as `config`."""
    from timm.layers import RmsNorm, SwiGLUPacked

    refusals = {
        f"norm={config.norm!r} (the textbook's post-norm layer, or Swin-v2's res-post-norm)": config.norm != "pre",
        "rel_pos (timm's VisionTransformerRelPos)": config.rel_pos != "none",
        "rotary phases (pos_embed='rope2d' or rope)": config.uses_rope,
        "pool='token_avg'": config.pool == "token_avg",
        "distill_token (timm's VisionTransformerDistilled, see build_timm)": config.distill_token,
        "embed_norm without patch_bias or the reverse (timm ties them)": config.embed_norm == config.patch_bias,
        "pool='map' with act='swiglu'": config.pool == "map" and config.act == "swiglu",
        "pool_heads or pool_mlp_ratio (timm's VisionTransformer pools with its layers')": config.pool_heads is not None
        or config.pool_mlp_ratio is not None,
    }
    if refused := [what for what, applies in refusals.items() if applies]:
        raise ValueError(f"timm's VisionTransformer cannot express {', '.join(refused)}")
    norm = partial(nn.LayerNorm if config.norm_layer == "layernorm" else RmsNorm, eps=config.norm_eps)
    swiglu = config.act == "swiglu"
    packed = {"mlp_layer": SwiGLUPacked} if swiglu else {}
    return packed | dict(
        img_size=config.img_size,
        patch_size=config.patch_size,
        in_chans=config.in_chans,
        num_classes=config.num_classes,
        embed_dim=config.embed_dim,
        depth=config.depth,
        num_heads=config.num_heads,
        # timm's packed SwiGLU counts both halves of fc1 as its hidden width
        mlp_ratio=mlp_ratio_for(2 * config.mlp_hidden_dim, config.embed_dim) if swiglu else config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        qk_norm=config.qk_norm,
        scale_attn_norm=config.attn_norm,
        scale_mlp_norm=config.mlp_norm,
        proj_bias=config.proj_bias,
        norm_layer=norm,
        act_layer=nn.SiLU if swiglu else _ACTIVATIONS[config.act],
        init_values=config.layer_scale_init,
        class_token=config.class_token,
        reg_tokens=config.reg_tokens,
        no_embed_class=not config.pos_embed_prefix,
        pre_norm=config.embed_norm,
        global_pool=config.pool,
        pool_include_prefix=config.pool_prefix,
        fc_norm=config.fc_norm,
        final_norm=config.final_norm,
        pos_embed="none" if config.pos_embed == "none" else "learn",
        drop_rate=config.head_dropout,
        pos_drop_rate=config.dropout,
        proj_drop_rate=config.dropout,
        attn_drop_rate=config.attn_dropout,
        drop_path_rate=config.drop_path,
    )


def distilled_timm_kwargs(config: ViTConfig) -> dict[str, Any]:
    """Constructor arguments for timm's VisionTransformerDistilled (DeiT) that build the same network as `config`,
    refusing what that class builds differently: its head never applies fc_norm, and its position table always has
    rows for exactly the class and distillation tokens."""
    refusals = {
        "fc_norm (its heads read the tokens without it)": config.fc_norm,
        "reg_tokens": config.reg_tokens > 0,
        "a position table without prefix rows (pos_embed_prefix=false)": not config.pos_embed_prefix,
        "pos_embed='none'": config.pos_embed == "none",
    }
    if refused := [what for what, applies in refusals.items() if applies]:
        raise ValueError(f"timm's VisionTransformerDistilled cannot express {', '.join(refused)}")
    return timm_kwargs(replace(config, distill_token=False))


def build_timm(config: ViTConfig) -> nn.Module:
    """timm's model of the same network as `config`: VisionTransformer, or VisionTransformerDistilled for DeiT."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    if config.distill_token:
        return VisionTransformerDistilled(**distilled_timm_kwargs(config))
    return TimmViT(**timm_kwargs(config))


def hub_config(config: ViTConfig, facts: dict[str, Any]) -> dict[str, Any]:
    """config.json of a timm hub folder holding `config`, so that timm.create_model('local-dir:FOLDER',
    pretrained=True) builds this network: timm's generic ViT architecture with every argument in model_args (JSON,
    so norms and activations by name). `facts` (our data facts) become its pretrained_cfg's preprocessing."""
    kwargs = timm_kwargs(config)
    refusals = {
        "act='swiglu' (timm names its packed SwiGLU by class only)": config.act == "swiglu",
        f"norm_eps={config.norm_eps} (timm names its norms with eps 1e-6 only)": config.norm_eps != 1e-6,
        "distill_token (timm's distilled ViT has no generic architecture)": config.distill_token,
    }
    if refused := [what for what, applies in refusals.items() if applies]:
        raise ValueError(f"a timm hub folder cannot state {', '.join(refused)}")
    dropped = ("norm_layer", "act_layer", "drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate")
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items() if k not in dropped}
    args |= {"norm_layer": config.norm_layer, "act_layer": _ACTIVATIONS[config.act], "drop_path_rate": 0.0}
    classes = facts.get("classes")
    return {
        "architecture": "vit_base_patch16_224",  # timm's plain VisionTransformer; model_args say the rest
        "num_classes": config.num_classes,
        "num_features": config.embed_dim,
        "global_pool": config.pool,
        "model_args": args,
        "pretrained_cfg": {
            "input_size": [config.in_chans, *config.img_size],
            "mean": list(facts.get("mean") or (0.5,) * config.in_chans),
            "std": list(facts.get("std") or (0.5,) * config.in_chans),
            "crop_pct": facts.get("crop_pct") or 1.0,
            "crop_mode": facts.get("crop_mode") or "center",
            "interpolation": facts.get("interpolation") or "bicubic",
            "num_classes": config.num_classes,
            **({"label_names": list(classes)} if classes else {}),
        },
    }


def _fixed_table(config: ViTConfig) -> Tensor:
    """A fixed table as timm's (1, [P +] N, D) sequence, zeros on prefix rows."""
    table = FIXED_TABLES[config.pos_embed](config.grid_size, config.embed_dim, config.pos_temperature)
    table = table.flatten(0, 1)
    rows = config.num_prefix_tokens if config.pos_embed_prefix else 0
    return torch.cat((torch.zeros(rows, config.embed_dim), table))[None]


def to_timm(state_dict: dict[str, Tensor], config: ViTConfig) -> dict[str, Tensor]:
    """Our state dict -> timm's, for timm's model of `config` (build_timm)."""
    (distilled_timm_kwargs if config.distill_token else timm_kwargs)(config)  # refuses what timm cannot express
    out = {_rename(k, _TO_TIMM): v for k, v in state_dict.items() if k not in _POS_KEYS}
    if config.pos_embed == "learned":
        table = state_dict["pos_embed.table"].flatten(0, 1)  # (h*w, D)
        if "pos_embed.prefix" in state_dict:
            table = torch.cat((state_dict["pos_embed.prefix"], table))
        out["pos_embed"] = table[None]  # (1, [P +] h*w, D)
    elif config.pos_embed in FIXED_TABLES:
        out["pos_embed"] = _fixed_table(config)
    return out


# reading timm's weights -------------------------------------------------------------------------------


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
    if config.pos_embed == "learned":
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
        fixed = _fixed_table(config) if config.pos_embed in FIXED_TABLES else None
        if fixed is None or fixed.shape != pos.shape or not torch.allclose(fixed, pos.float(), atol=1e-5):
            raise ValueError(
                f"timm state dict carries a 'pos_embed' table that pos_embed={config.pos_embed!r} would "
                "discard; use pos_embed='learned' to keep it"
            )
    return out


# the architecture of a timm model, read off the module ------------------------------------------------


def _norm_kind(module: nn.Module, where: str) -> tuple[str, float]:
    """('layernorm' | 'rmsnorm', eps) of one of timm's norm modules, refusing other norms by name."""
    from timm.layers import RmsNorm

    if isinstance(module, nn.LayerNorm) and module.elementwise_affine and module.bias is not None:
        return "layernorm", module.eps
    if isinstance(module, RmsNorm | nn.RMSNorm) and getattr(module, "weight", None) is not None:
        return "rmsnorm", module.eps
    raise ValueError(f"its {where} is a {type(module).__name__}, not an affine LayerNorm or RMSNorm")


def mlp_activation(mlp: nn.Module) -> str:
    """ViTConfig.act of a timm MLP: Mlp's activation, or 'swiglu' for a gated MLP that computes SiLU(gate) * value
    with the gate first (SwiGLU, and GluMlp without gate_last); any other MLP is refused by name."""
    from timm.layers import GluMlp, Mlp, SwiGLU

    if type(mlp) is SwiGLU or type(mlp) is GluMlp:
        if not isinstance(mlp.act, nn.SiLU) or getattr(mlp, "gate_last", False):
            raise ValueError(f"its gated MLP uses {type(mlp.act).__name__} or gates with its second half")
        return "swiglu"
    if type(mlp) is Mlp:
        return _activation(mlp.act)
    raise ValueError(f"its MLP is timm's {type(mlp).__name__}")


def norm_kinds_of(norms: dict[str, nn.Module]) -> set[tuple[str, float]]:
    """The (kind, eps) of these norms (by where they sit), Identity left out, refusing a kind ViTConfig lacks."""
    return {_norm_kind(m, where) for where, m in norms.items() if not isinstance(m, nn.Identity)}


def _norm_kinds(model: nn.Module, block: nn.Module) -> set[tuple[str, float]]:
    """The (kind, eps) of every norm a timm ViT or Eva model has, its attention pool's included."""
    attn, mlp, pool = block.attn, block.mlp, getattr(model, "attn_pool", None)
    norms = dict(norm1=block.norm1, norm2=block.norm2, norm=model.norm, fc_norm=model.fc_norm, norm_pre=model.norm_pre)
    norms |= {"q_norm": attn.q_norm, "attn.norm": attn.norm, "mlp.norm": mlp.norm}
    if pool is not None:
        norms["attn_pool.norm"] = pool.norm
    return norm_kinds_of(norms)


def _activation(act: nn.Module) -> str:
    from timm.layers.activations import GELU, GELUTanh, QuickGELU

    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    if isinstance(act, GELU):
        return "gelu"
    if isinstance(act, GELUTanh):
        return "gelu_tanh"
    if isinstance(act, QuickGELU):
        return "quick_gelu"
    raise ValueError(f"its MLP activation is {type(act).__name__}, not GELU, tanh-GELU, QuickGELU or SwiGLU")


def check_attention_pool(pool: nn.Module, act: str, dim: int) -> dict[str, Any]:
    """The ViTConfig fields of a timm attention pool (its heads and MLP width), refusing one that AttentionPool
    (one learned query over the patches, then a residual MLP with the layers' activation) would not compute."""
    from timm.layers import AttentionPoolLatent

    if type(pool) is not AttentionPoolLatent or pool.latent_len != 1 or pool.pos_embed is not None:
        raise ValueError("its attention pooling is not one learned query over the patch tokens")
    if not isinstance(pool.q, nn.Linear) or pool.q.bias is None or not isinstance(pool.q_norm, nn.Identity):
        raise ValueError("its attention pooling's query projection differs from ours (none, no bias, or normed)")
    if pool.mlp is None or act == "swiglu" or _activation(pool.mlp.act) != act:
        raise ValueError("its attention pooling has no MLP, or one whose activation differs from its layers'")
    return {"pool_heads": pool.num_heads, "pool_mlp_ratio": mlp_ratio_for(pool.mlp.fc1.out_features, dim)}


def _plain_pool(pooling: dict[str, Any], heads: int, hidden: int, dim: int) -> dict[str, Any]:
    """The pool fields, left at None (the layers' own) where they equal the layers'."""
    out = dict(pooling)
    if out.get("pool_heads") == heads:
        out.pop("pool_heads")
    if "pool_mlp_ratio" in out and int(dim * out["pool_mlp_ratio"]) == hidden:
        out.pop("pool_mlp_ratio")
    return out


# timm's distilled ViT builds fc_norm in place of the final norm (fc_norm=True) but its head never applies it
DISTILLED_FC_NORM = "it is DeiT's distilled ViT with fc_norm, which timm builds but never applies: no final norm runs"


def config_of_timm_model(model: nn.Module) -> ViTConfig:
    """Every architectural choice of a timm VisionTransformer (or DeiT's distilled one) as a ViTConfig. A choice
    ViTConfig lacks is a ValueError naming it: the model would not compute what timm's computes."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import Attention, Block, ResPostBlock
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    kind = type(model).__name__
    if not isinstance(model, TimmViT):
        raise ValueError(f"timm's {kind} is not a plain VisionTransformer")
    block = model.blocks[0]
    if type(block) not in (Block, ResPostBlock):
        raise ValueError(f"its layers are timm's {type(block).__name__}, not the pre-norm Block or ResPostBlock")
    attn, mlp = block.attn, block.mlp
    if type(attn) is not Attention or getattr(attn, "gate", None) is not None:
        raise ValueError(
            f"its attention is timm's {type(attn).__name__}{' (gated)' if type(attn) is Attention else ''}"
        )
    act = mlp_activation(mlp)
    if isinstance(model, VisionTransformerDistilled) and not isinstance(model.fc_norm, nn.Identity):
        raise ValueError(DISTILLED_FC_NORM)
    proj_bias = attn.proj.bias is not None
    fc1 = mlp.fc1_g if hasattr(mlp, "fc1_g") else mlp.fc1  # timm's SwiGLU keeps the gate's and value's apart
    if (fc1.bias is not None) != proj_bias or (mlp.fc2.bias is not None) != proj_bias:
        raise ValueError("its output projection and MLP differ in having biases")
    return ViTConfig(
        **shared_fields(model, act),
        qkv_bias=attn.qkv.bias is not None,
        reg_tokens=model.num_reg_tokens,
        distill_token=isinstance(model, VisionTransformerDistilled),
        proj_bias=proj_bias,
        layer_scale_init=1e-5 if not isinstance(getattr(block, "ls1", nn.Identity()), nn.Identity) else None,
        pool_prefix=model.pool_include_prefix,
        norm="res_post" if type(block) is ResPostBlock else "pre",  # ResPostBlock: the norm on each branch's output
    )


def check_patch_embed(embed: nn.Module) -> None:
    """Refuse a timm patch embedding that is not one strided convolution (a ResNet stem, a norm, overlaps)."""
    from timm.layers import PatchEmbed

    if type(embed) is not PatchEmbed:
        raise ValueError(f"its patch embedding is timm's {type(embed).__name__}, not a strided convolution")
    if not isinstance(embed.norm, nn.Identity) or not isinstance(embed.proj, nn.Conv2d) or embed.dynamic_img_pad:
        raise ValueError("its patch embedding is not a plain strided convolution")
    if embed.proj.stride != embed.proj.kernel_size:
        raise ValueError(f"its patches overlap (stride {embed.proj.stride}, kernel {embed.proj.kernel_size})")


def sizes(model: nn.Module, hidden: int) -> dict[str, Any]:
    """The ViTConfig sizes of a timm ViT of any class: input, patches, classes, width, depth, heads, MLP ratio."""
    embed = model.patch_embed
    return dict(
        img_size=tuple(embed.img_size),
        patch_size=tuple(embed.patch_size),
        in_chans=embed.proj.in_channels,
        num_classes=model.num_classes,
        embed_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=model.blocks[0].attn.num_heads,
        mlp_ratio=mlp_ratio_for(hidden, model.embed_dim),
    )


def shared_fields(model: nn.Module, act: str) -> dict[str, Any]:
    """The ViTConfig fields timm's VisionTransformer and Eva both hold, read off either (sizes, tokens, norms,
    pooling), refusing a patch embedding, pooling or mix of norms ViTConfig lacks."""
    block = model.blocks[0]
    attn, mlp, embed, pool = block.attn, block.mlp, model.patch_embed, model.global_pool
    if attn.num_heads * attn.head_dim != model.embed_dim:
        raise ValueError(f"its attention width {attn.num_heads} x {attn.head_dim} is not its width {model.embed_dim}")
    if pool not in ("token", "avg", "map"):
        raise ValueError(f"its pooling global_pool={pool!r}")
    pooling = check_attention_pool(model.attn_pool, act, model.embed_dim) if pool == "map" else {}
    check_patch_embed(embed)
    kinds = _norm_kinds(model, block)
    if len(kinds) != 1:
        raise ValueError(f"its norms differ in kind or eps: {sorted(kinds)}")
    (norm_layer, eps), hidden = kinds.pop(), mlp.fc2.in_features
    identity = lambda module: isinstance(module, nn.Identity)  # noqa: E731
    return dict(
        **sizes(model, hidden),
        pos_embed="learned" if model.pos_embed is not None else "none",
        pool=pool,
        class_token=model.cls_token is not None,
        pos_embed_prefix=not model.no_embed_class,
        patch_bias=embed.proj.bias is not None,
        embed_norm=not identity(model.norm_pre),
        norm_layer=norm_layer,
        norm_eps=eps,
        fc_norm=not identity(model.fc_norm),
        final_norm=not (identity(model.norm) and identity(model.fc_norm)),
        qk_norm=not identity(attn.q_norm),
        attn_norm=not identity(attn.norm),
        mlp_norm=not identity(mlp.norm),
        act=act,
        **_plain_pool(pooling, attn.num_heads, hidden, model.embed_dim),
    )


def read_timm_module(model: nn.Module) -> tuple[ViTConfig, Any]:
    """The ViTConfig of a timm model of a class that holds ViTs (VisionTransformer, Eva, VisionTransformerRelPos),
    and the renaming of its state dict into VisionTransformer's layout (the identity for VisionTransformer)."""
    from timm.models.eva import Eva
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    if isinstance(model, Eva):
        from vit.interop.timm_eva import config_of_eva_model, eva_renaming  # these readers build on this file

        return config_of_eva_model(model), eva_renaming(model)
    if isinstance(model, VisionTransformerRelPos):
        from vit.interop.timm_relpos import config_of_relpos_model, relpos_renaming

        return config_of_relpos_model(model), relpos_renaming(model)
    return config_of_timm_model(model), lambda state: state


def timm_architecture(name: str, **model_args: Any) -> nn.Module:
    """timm's model of a registered architecture name, built on the meta device (no memory, no weights)."""
    import timm

    if not timm.is_model(name):
        raise ValueError(f"{name!r} is not one of timm's architectures")
    try:
        with torch.device("meta"):
            return timm.create_model(name, pretrained=False, **model_args)
    except (TypeError, ValueError, KeyError, RuntimeError, AssertionError, ZeroDivisionError) as err:
        # a config.json's model_args are anyone's: patch_size=0, norm_layer='nope' fail inside timm
        raise ValueError(f"timm cannot build {name} with model_args {model_args}: {err}") from None


def _weights_file(folder: Path) -> Path:
    if (folder / TIMM_WEIGHTS).is_file():
        return folder / TIMM_WEIGHTS
    if (folder / TIMM_PICKLED_WEIGHTS).is_file():
        return folder / TIMM_PICKLED_WEIGHTS
    raise ValueError(f"no {TIMM_WEIGHTS} or {TIMM_PICKLED_WEIGHTS} beside {TIMM_CONFIG}")


def is_timm_folder(folder: Path) -> bool:
    """timm's hub folders name an `architecture` in config.json; Hugging Face's name a `model_type`."""
    try:
        values = json.loads((folder / TIMM_CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(values, dict) and "architecture" in values  # else the Hugging Face reader names the file


def timm_facts(pretrained_cfg: dict[str, Any]) -> dict[str, Any]:
    """The preprocessing a timm checkpoint was trained with (its pretrained_cfg) as our data facts, each entry read
    as timm's resolve_data_config reads it (missing, null or empty: timm's default, not ours)."""
    from timm.data import DEFAULT_CROP_PCT, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    labels = pretrained_cfg.get("label_names")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(label, str) for label in labels)):
        raise ValueError(f"pretrained_cfg.label_names={labels!r} is not a list of names")
    return {
        "mean": pretrained_cfg.get("mean") or IMAGENET_DEFAULT_MEAN,
        "std": pretrained_cfg.get("std") or IMAGENET_DEFAULT_STD,
        "crop_pct": pretrained_cfg.get("crop_pct") or DEFAULT_CROP_PCT,
        "crop_mode": pretrained_cfg.get("crop_mode")
        or "center",  # 'squash' read as timm; 'border' refused by preprocess
        "interpolation": pretrained_cfg.get("interpolation") or "bicubic",
        "classes": labels or None,
    }


# timm.create_model's own arguments that read or fetch weights, not the architecture's: in a config.json's
# model_args, checkpoint_path would have timm read any file named there
_LOADING_ARGS = ("checkpoint_path", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def _read_hub_config(folder: Path) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(pretrained_cfg, architecture, model_args) of config.json by timm's own reader, refusing in one line the
    entries of another kind, on which that reader fails with a traceback."""
    from timm.models._hub import load_model_config_from_path

    values = read_json_object(folder / TIMM_CONFIG)
    for key, kind, what in (
        ("architecture", str, "a name"),
        ("model_args", dict, "a JSON object"),
        ("pretrained_cfg", dict, "a JSON object"),
    ):
        if key in values and not isinstance(values[key], kind):
            raise ValueError(f"{TIMM_CONFIG}: {key}={values[key]!r} is not {what}")
    if loading := [key for key in _LOADING_ARGS if key in values.get("model_args", {})]:
        raise ValueError(
            f"{TIMM_CONFIG}: model_args.{loading[0]}={values['model_args'][loading[0]]!r} would have timm load "
            f"weights other than the folder's own {TIMM_WEIGHTS} or {TIMM_PICKLED_WEIGHTS}: refused"
        )
    try:
        return load_model_config_from_path(folder)
    except (TypeError, KeyError, IndexError, AttributeError) as err:  # e.g. input_size=224 beside model_args.in_chans
        raise ValueError(f"{TIMM_CONFIG}: timm cannot read it ({type(err).__name__}: {err})") from None


def from_timm_folder(folder: Path) -> Converted:
    """A timm hub folder: timm's own reader of config.json, its architecture built on the meta device."""
    pretrained_cfg, name, model_args = _read_hub_config(folder)
    weights_file = _weights_file(folder)
    weights = read_weights(weights_file)
    held = len({m[1] for k in weights if (m := re.match(r"blocks\.(\d+)\.", k))})
    if "depth" in model_args and model_args["depth"] != held:  # timm builds every layer stated, meta or not: minutes
        raise ValueError(
            f"{TIMM_CONFIG}: model_args.depth={model_args['depth']!r}, but {weights_file.name} holds {held} layers"
        )
    model = timm_architecture(name, **{"num_classes": pretrained_cfg.get("num_classes", 1000), **model_args})
    try:
        config, renamed = read_timm_module(model)
    except ValueError as err:
        raise ValueError(f"timm's {name} is not a ViT this model can hold: {err}") from None
    facts = timm_facts(pretrained_cfg)
    if facts["classes"] and len(facts["classes"]) != config.num_classes:
        facts["classes"] = None
    return config, from_timm(renamed(weights), config), facts


# reading a bare timm state dict -----------------------------------------------------------------------


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


def mlp_ratio_for(hidden: int, dim: int) -> float:
    """The mlp_ratio for which int(dim * ratio), the MLP width ViTConfig.mlp_hidden_dim and timm compute, is
    `hidden`. hidden / dim can fall one float step short of it (56 * (122 / 56) == 121.99...)."""
    ratio = hidden / dim
    while int(dim * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


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
    kind = config.pos_embed
    if pos is None and kind == "learned":
        kind = "none"  # the file has no table to learn from
    if pos is not None and kind in ("none", "rope2d"):
        kind = "learned"  # the file has a table: keep it
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
        pos_embed=kind,
        pool=pool,
        class_token=has("cls_token"),
        reg_tokens=regs,
        distill_token=has("dist_token"),
        pos_embed_prefix=prefix_rows,
        patch_bias=has("patch_embed.proj.bias"),
        embed_norm=has("norm_pre.weight"),
        fc_norm=has("fc_norm.weight"),
        final_norm=has("norm.weight") or has("fc_norm.weight"),
        qk_norm=has("blocks.0.attn.q_norm.weight"),
        attn_norm=has("blocks.0.attn.norm.weight"),
        mlp_norm=has("blocks.0.mlp.norm.weight"),
        proj_bias=has("blocks.0.attn.proj.bias"),
        layer_scale_init=(config.layer_scale_init or 1e-5) if has("blocks.0.ls1.gamma") else None,
        norm="res_post" if config.norm == "res_post" else "pre",  # timm has no post-norm ViT; keys do not say which
    )


# what a bare file's keys show of its architecture, which the architecture it is named after must share
SHOWN_BY_KEYS = (
    "pool", "class_token", "reg_tokens", "distill_token", "fc_norm", "final_norm", "embed_norm", "qk_norm",
    "attn_norm", "mlp_norm", "patch_bias", "qkv_bias", "proj_bias",
)  # fmt: skip


def _contradicted(named: ViTConfig, weights: ViTConfig) -> str:
    """The switches where a file's weights contradict the architecture it is named after, said; '' if none."""
    shown = [(k, getattr(weights, k), getattr(named, k)) for k in SHOWN_BY_KEYS]
    differ = [f"{k}={theirs!r}, not {named_as!r}" for k, theirs, named_as in shown if theirs != named_as]
    if (weights.layer_scale_init is None) != (named.layer_scale_init is None):
        differ.append("layer scale " + ("present" if weights.layer_scale_init is not None else "absent"))
    return ", ".join(differ)


def architecture_named(path: Path) -> str | None:
    """The timm architecture a file or folder is named after (vit_small_patch16_224.augreg_in21k.pth), if any."""
    import timm

    stem = path.name.split(".")[0]
    return stem if timm.is_model(stem) else None


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
        source = replace(timm_config(state, named), rope=named.rope, rope_ref_grid=named.rope_ref_grid)
        if differ := _contradicted(named, source):  # saved from the architecture built otherwise (global_pool=...)
            raise ValueError(f"the file is named after timm's {name} but its weights differ from it: {differ}")
        return source, from_timm(state, source), {}
    source = timm_config(state, config)
    return source, from_timm(state, source), {}
