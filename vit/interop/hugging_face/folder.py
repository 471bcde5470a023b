"""A Hugging Face save_pretrained folder read: config.json's architecture (config.py), its weights in our layout
(keys.py, then timm's layout.py) and the preprocessing preprocessor_config.json records, read as its image processor
frames an image of any aspect ratio (a type not known here is refused by name: no guess at what its fields mean)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from vit.interop.files import Converted, read_json_object, read_weights
from vit.interop.hugging_face.config import hugging_face_config, labels, tower_values
from vit.interop.hugging_face.keys import HF_CONFIG, HF_PICKLED_WEIGHTS, HF_WEIGHTS, hugging_face_to_timm
from vit.interop.timm import from_timm

HF_PREPROCESSOR = "preprocessor_config.json"


# transformers' image processors whose preprocess is its base one (resize by `size`, centre crop, rescale, normalise)
# -> (their default resample, whether an int size is a square, whether they crop unless told not to); AIMv2's is
# CLIP's. DINOv3's rescales before it resizes (floats, not 8-bit pixels resized): equal to resampling rounding
_BASE = {
    "ViTImageProcessor": (2, True, False),
    "DeiTImageProcessor": (3, True, True),
    "CLIPImageProcessor": (3, False, True),
    "BitImageProcessor": (3, False, True),
    "SiglipImageProcessor": (3, False, False),
    "DINOv3ViTImageProcessor": (2, True, False),
    "Tipsv2ImageProcessor": (2, True, False),
}
_NAFLEX = "Siglip2ImageProcessor"  # each image at its own aspect ratio in max_num_patches: data.max_tokens's rule
_BILINEAR = 2  # PIL's filter number, which the NaFlex transform (vit/data/native_size.py) resizes with


def _kind(p: dict[str, Any]) -> str | None:
    """The processor preprocessor_config.json names (its Fast and Pil variants, older files' feature extractor, as
    it), refusing one whose framing is not known here; None where it names none."""
    name = p.get("image_processor_type") or p.get("feature_extractor_type")
    if name is None:
        return None
    if not isinstance(name, str):
        raise ValueError(f"{HF_PREPROCESSOR}: image_processor_type={name!r} is not a name")
    kind = name.removesuffix("Fast").removesuffix("Pil").replace("FeatureExtractor", "ImageProcessor")
    if kind not in _BASE and kind != _NAFLEX:
        raise ValueError(
            f"{HF_PREPROCESSOR}: {name} frames images in a way this loader does not know; it reads "
            f"{', '.join([*_BASE, _NAFLEX])} (and their Fast variants)"
        )
    return kind


def _size(p: dict[str, Any], key: str, square: bool | None) -> dict[str, int]:
    """An image processor's size or crop_size as transformers' get_size_dict reads it: {'height', 'width'} or
    {'shortest_edge'}; an int is a square where `square`, a short side where not, refused where unknown (None)."""
    size = p[key]
    if isinstance(size, int) and not isinstance(size, bool):
        if square is None:
            raise ValueError(
                f"{HF_PREPROCESSOR}: {key}={size} names no image_processor_type, which says whether an int is a "
                "square or a short side"
            )
        size = {"height": size, "width": size} if square else {"shortest_edge": size}
    if not isinstance(size, dict) or set(size) not in ({"height", "width"}, {"shortest_edge"}):
        raise ValueError(f"{HF_PREPROCESSOR}: {key}={p[key]!r} is neither height and width nor shortest_edge")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in size.values()):
        raise ValueError(f"{HF_PREPROCESSOR}: {key}={p[key]!r} is not a size in pixels")
    return size


def _framing(p: dict[str, Any], kind: str | None, patch: tuple[int, int]) -> dict[str, Any]:
    """How the processor fits an image to the network (FRAMING's facts): a fixed (H, W) by transformers' size rules
    and crop, or a NaFlex grid in max_num_patches patches of `patch` pixels."""
    resample, square, crops = _BASE.get(kind or "", (None, None, None))

    def stated(key: str, default: Any) -> Any:  # a null entry is the class's default, as transformers reads it
        return p[key] if p.get(key) is not None else default

    if kind == _NAFLEX:
        if (resample := stated("resample", _BILINEAR)) != _BILINEAR:
            raise ValueError(f"{HF_PREPROCESSOR}: resample={resample!r}: NaFlex images are resized bilinearly here")
        if (side := stated("patch_size", 16), side) != patch:
            raise ValueError(f"{HF_PREPROCESSOR}: patch_size={side!r}, but the network's patches are {patch}")
        return {"max_tokens": stated("max_num_patches", 256), "interpolation": "bilinear"}
    resample = stated("resample", resample)
    try:
        interpolation = None if resample is None else Image.Resampling(resample).name.lower()  # PIL's enum
    except ValueError:
        raise ValueError(f"{HF_PREPROCESSOR}: resample={resample!r} is not one of PIL's filters") from None
    if p.get("do_resize") is False:
        raise ValueError(f"{HF_PREPROCESSOR}: no resize: images at their own size, not the grid of a fixed size")
    if p.get("size") is None:  # statistics alone: framed as a file without a processor is (Loaded's defaults)
        return {"interpolation": interpolation}
    size = _size(p, "size", square)
    crops = stated("do_center_crop", crops)
    crop = _size(p, "crop_size", True) if p.get("crop_size") and (crops or crops is None) else None
    if crop is None and "shortest_edge" in size:
        raise ValueError(f"{HF_PREPROCESSOR}: size={size} without a crop keeps each image's own size and aspect")
    if crop is None:
        return {"input_size": [size["height"], size["width"]], "crop_pct": 1.0, "crop_mode": "height_width",
                "interpolation": interpolation}  # fmt: skip
    h, w = crop["height"], crop["width"]
    if "shortest_edge" in size:
        crop_pct, mode, fits = h / size["shortest_edge"], "shortest_edge", max(h, w) <= size["shortest_edge"]
    else:
        crop_pct, mode = h / size["height"], "height_width"
        fits = h <= size["height"] and round(w / crop_pct) == size["width"] and w <= size["width"]
    if not fits:
        raise ValueError(
            f"{HF_PREPROCESSOR}: crop_size={crop} of size={size}: a crop that pads, or one that keeps unequal shares "
            "of height and width, is not a framing this loader reads"
        )
    return {"input_size": [h, w], "crop_pct": crop_pct, "crop_mode": mode, "interpolation": interpolation}


def _preprocessing(folder: Path, patch: tuple[int, int]) -> dict[str, Any]:
    """mean, std and the framing (FRAMING's facts) from preprocessor_config.json, as its image processor reads an
    image of any aspect ratio; None for what it does not say."""
    if not (folder / HF_PREPROCESSOR).is_file():
        return {"mean": None, "std": None, "crop_pct": None, "interpolation": None}
    p = read_json_object(folder / HF_PREPROCESSOR)
    framing = _framing(p, _kind(p), patch)
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
    return {"mean": mean, "std": std, **framing}


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
    facts = family.facts(state, v, {"classes": classes, **_preprocessing(folder, config.patch_size)})
    return config, from_timm(family.placed(timm_state, config, v), config), facts
