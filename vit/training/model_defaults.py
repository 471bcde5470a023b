"""ViTConfig's defaults as the Hydra node under every model preset: conf/model/*.yaml state only what differs
from them, and every field can still be overridden (model.dropout=0.1) without Hydra's '+'."""

from __future__ import annotations

from dataclasses import asdict, fields, is_dataclass

from hydra.core.config_store import ConfigStore

from vit.model.config import ViTConfig

MODEL_DEFAULTS = "vit_config"  # conf/train.yaml's defaults list merges it into `model` before the preset


def model_defaults() -> dict:
    """ViTConfig's declared defaults as plain YAML values, with the `_target_` that builds it. Declared, not
    those of ViTConfig(): a default of None (class_token) is resolved against the preset's other fields."""
    return {
        "_target_": f"{ViTConfig.__module__}.{ViTConfig.__qualname__}",
        # the nested choices (pos_resample, rope) as plain mappings: OmegaConf reads no Literal annotations
        **{f.name: asdict(f.default) if is_dataclass(f.default) else f.default for f in fields(ViTConfig)},
    }


def register_model_defaults() -> None:
    """Store the node in Hydra's ConfigStore; call before Hydra composes conf/train.yaml, which names it."""
    ConfigStore.instance().store(name=MODEL_DEFAULTS, node=model_defaults())
