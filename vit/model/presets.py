"""Named model variants. The YAML files in conf/model/ are the only table: Hydra composes them for
train.py, and create_model reads the same files (inside the installed package too), so no width or depth is
written twice."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vit.model import VisionTransformer
from vit.model.config import ConfigError, ViTConfig

CONF_DIR_ENV = "VIT_CONF_DIR"


def conf_dir() -> Path:
    """The project's conf/: $VIT_CONF_DIR, else vit/conf, which a wheel carries and a checkout links to conf/."""
    override = os.environ.get(CONF_DIR_ENV)
    path = Path(override) if override else Path(__file__).resolve().parent.parent / "conf"
    if not (path / "model").is_dir():
        raise FileNotFoundError(f"no model presets at {path / 'model'}: point {CONF_DIR_ENV} at the project's conf/")
    return path


def list_presets() -> list[str]:
    return sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))


def preset_config(name: str, **overrides: Any) -> ViTConfig:
    """The ViTConfig of conf/model/<name>.yaml with fields replaced by `overrides`."""
    path = conf_dir() / "model" / f"{name}.yaml"
    if name not in list_presets():  # a name, not a path: '../train' would read conf/train.yaml as a model
        raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(list_presets())}")
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    try:
        return ViTConfig.from_dict({**values, **overrides})
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def create_model(name: str, **overrides: Any) -> VisionTransformer:
    """Build a preset, e.g. create_model("vit_small_16", num_classes=10, pos_embed="sincos2d")."""
    return VisionTransformer(preset_config(name, **overrides))
