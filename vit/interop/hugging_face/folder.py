"""A Hugging Face save_pretrained folder read: config.json's architecture (config.py), its weights in our layout
(keys.py, then timm's layout.py) and the preprocessing preprocessor_config.json records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from vit.interop.files import Converted, read_json_object, read_weights
from vit.interop.hugging_face.config import hugging_face_config, labels, tower_values
from vit.interop.hugging_face.keys import HF_CONFIG, HF_PICKLED_WEIGHTS, HF_WEIGHTS, hugging_face_to_timm
from vit.interop.timm import from_timm

HF_PREPROCESSOR = "preprocessor_config.json"


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
    model_type, family, v = tower_values(values)  # refused before reading the weights
    weights = next((folder / name for name in (HF_WEIGHTS, HF_PICKLED_WEIGHTS) if (folder / name).is_file()), None)
    if weights is None:
        raise ValueError(f"no {HF_WEIGHTS} or {HF_PICKLED_WEIGHTS} beside {HF_CONFIG}")
    state = read_weights(weights)
    timm_state = hugging_face_to_timm(state, model_type)
    config = hugging_face_config(values, "head.weight" in timm_state, "head_dist.weight" in timm_state)
    names = labels(values) if config.num_classes else {}  # a bare model: features, no classes
    classes = [names[k] for k in sorted(names)] if names and len(names) == config.num_classes else None
    facts = family.facts(state, v, {"classes": classes, **_preprocessing(folder)})
    return config, from_timm(family.placed(timm_state, config, v), config), facts
