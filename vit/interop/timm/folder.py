"""timm's hub folders, read and written. One (config.json with `architecture` and `model_args`, as timm's
save_for_hf writes) names its architecture: timm builds it on the meta device and its class's reader
(architecture.py) reads every choice off the module. Ours are written so that timm.create_model('local-dir:FOLDER',
pretrained=True) builds the same network.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from vit.interop.files import Converted, parse_json, read_json_object, read_weights
from vit.interop.timm.architecture import read_timm_module, timm_architecture
from vit.interop.timm.build import ACTIVATIONS, timm_kwargs
from vit.interop.timm.layout import from_timm
from vit.model.config import ViTConfig

TIMM_CONFIG, TIMM_WEIGHTS, TIMM_PICKLED_WEIGHTS = "config.json", "model.safetensors", "pytorch_model.bin"


_TIMM_CROP_MODES = {"shortest_edge": "center", "height_width": "squash"}  # Loaded's CROP_MODES from transformers


def hub_config(config: ViTConfig, facts: dict[str, Any]) -> dict[str, Any]:
    """config.json of a timm hub folder holding `config`, so that timm.create_model('local-dir:FOLDER',
    pretrained=True) builds this network: timm's generic ViT architecture with every argument in model_args (JSON,
    so norms and activations by name). `facts` (our data facts) become its pretrained_cfg's preprocessing."""
    kwargs = timm_kwargs(config)
    refusals = {
        "act='swiglu' (timm names its packed SwiGLU by class only)": config.act == "swiglu",
        f"norm_eps={config.norm_eps} (timm names its norms with eps 1e-6 only)": config.norm_eps != 1e-6,
        "distill_token (timm's distilled ViT has no generic architecture)": config.distill_token,
        f"max_tokens={facts.get('max_tokens')} (images at their own aspect ratio; pretrained_cfg frames one size)": (
            facts.get("max_tokens") is not None
        ),
    }
    if refused := [what for what, applies in refusals.items() if applies]:
        raise ValueError(f"a timm hub folder cannot state {', '.join(refused)}")
    dropped = ("norm_layer", "act_layer", "drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate")
    args = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items() if k not in dropped}
    args |= {"norm_layer": config.norm_layer, "act_layer": ACTIVATIONS[config.act], "drop_path_rate": 0.0}
    classes = facts.get("classes")
    return {
        "architecture": "vit_base_patch16_224",  # timm's plain VisionTransformer; model_args say the rest
        "num_classes": config.num_classes,
        "num_features": config.embed_dim,
        "global_pool": config.pool,
        "model_args": args,
        "pretrained_cfg": {
            "input_size": [config.in_chans, *(facts.get("input_size") or config.img_size)],
            "mean": list(facts.get("mean") or (0.5,) * config.in_chans),
            "std": list(facts.get("std") or (0.5,) * config.in_chans),
            "crop_pct": facts.get("crop_pct") or 1.0,
            # a transformers processor's size rule as timm's nearest: its crop's odd margin may split a pixel apart
            "crop_mode": _TIMM_CROP_MODES.get(facts.get("crop_mode"), facts.get("crop_mode") or "center"),
            "interpolation": facts.get("interpolation") or "bicubic",
            "num_classes": config.num_classes,
            **({"label_names": list(classes)} if classes else {}),
        },
    }


def _weights_file(folder: Path) -> Path:
    if (folder / TIMM_WEIGHTS).is_file():
        return folder / TIMM_WEIGHTS
    if (folder / TIMM_PICKLED_WEIGHTS).is_file():
        return folder / TIMM_PICKLED_WEIGHTS
    raise ValueError(f"no {TIMM_WEIGHTS} or {TIMM_PICKLED_WEIGHTS} beside {TIMM_CONFIG}")


def is_timm_folder(folder: Path) -> bool:
    """timm's hub folders name an `architecture` in config.json; Hugging Face's name a `model_type`."""
    try:
        values = parse_json((folder / TIMM_CONFIG).read_text(), TIMM_CONFIG)
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
        # timm's transform crops to input_size (C, H, W), which a model of dynamic_img_size need not be built at
        "input_size": list(size[1:]) if isinstance(size := pretrained_cfg.get("input_size"), (list, tuple)) else None,
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
    # layers under a module of their own too (Gemma 4's classifier: encoder.blocks.N)
    held = len({m[1] for k in weights if (m := re.match(r"(?:[^.]+\.)?blocks\.(\d+)\.", k))})
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
    if facts["input_size"] == list(config.img_size):
        facts["input_size"] = None  # the model's own
    if facts["classes"] and len(facts["classes"]) != config.num_classes:
        facts["classes"] = None
    return config, from_timm(renamed(weights), config), facts
