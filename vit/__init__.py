"""Vision Transformers from the equations: readable, timm-exact, trained with Lightning and Hydra."""

from vit.config import ConfigError, ViTConfig
from vit.model import VisionTransformer
from vit.presets import create_model, list_presets, preset_config

__all__ = ["ConfigError", "ViTConfig", "VisionTransformer", "create_model", "list_presets", "preset_config"]
