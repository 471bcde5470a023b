"""ViTConfig's defaults as the Hydra node under every model preset: conf/model/*.yaml state only what differs
from them, and every field can still be overridden (model.dropout=0.1) without Hydra's '+'."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from vit.model.config import ViTConfig

MODEL_DEFAULTS = "vit_config"  # conf/train.yaml's defaults list merges it into `model` before the preset


def model_defaults() -> dict:
    """ViTConfig() as plain YAML values, with the `_target_` that builds it."""
    return {"_target_": f"{ViTConfig.__module__}.{ViTConfig.__qualname__}", **ViTConfig().to_dict()}


def register_model_defaults() -> None:
    """Store the node in Hydra's ConfigStore; call before Hydra composes conf/train.yaml, which names it."""
    ConfigStore.instance().store(name=MODEL_DEFAULTS, node=model_defaults())
