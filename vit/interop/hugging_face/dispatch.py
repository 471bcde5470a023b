"""The one dispatch from a config.json's model_type to its family (a dual encoder's: its vision tower's), or to the
reason it is refused."""

from __future__ import annotations

from vit.interop.hugging_face import classic, contrastive, dinov2, radio, rope
from vit.interop.hugging_face.family import Family

FAMILIES: dict[str, Family] = {
    **classic.FAMILIES,
    **dinov2.FAMILIES,
    **rope.FAMILIES,
    **contrastive.FAMILIES,
    **radio.FAMILIES,
}
# dual encoders (and their classifiers) -> their vision tower's model_type, read from config.json's vision_config
VISION_TOWERS = {
    "clip": "clip_vision_model",
    "metaclip_2": "metaclip_2_vision_model",
    "siglip": "siglip_vision_model",
    "siglip2": "siglip2_vision_model",
    "aimv2": "aimv2_vision_model",
    "tipsv2": "tipsv2_vision_model",
}
_MLCD = (
    "MLCD's class token turns by learned rotary phases (class_pos_emb), which this ViT's rotary embedding leaves "
    "unturned"
)
REFUSED = {"mlcd": _MLCD, "mlcd_vision_model": _MLCD}


def family_of(model_type: str) -> Family:
    """The family of a model_type (a dual encoder's: its vision tower's), refusing the rest in one line."""
    if not isinstance(model_type, str):
        raise ValueError(f"config.json: model_type={model_type!r} is not a name")
    if model_type in REFUSED:
        raise ValueError(f"model_type {model_type}: {REFUSED[model_type]}")
    name = VISION_TOWERS.get(model_type, model_type)
    if name not in FAMILIES:
        towers = set(VISION_TOWERS.values())  # each named by its dual encoder: clip for clip_vision_model
        known = ", ".join([*(name for name in FAMILIES if name not in towers), *VISION_TOWERS])
        raise ValueError(f"model_type {model_type} is not one this loader reads ({known})")
    return FAMILIES[name]
