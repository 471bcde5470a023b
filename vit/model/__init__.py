"""The Vision Transformer in pure torch, one concept per file, read top-down in vision_transformer.py."""

from vit.model.config import ConfigError, ViTConfig
from vit.model.vision_transformer import VisionTransformer

__all__ = ["ConfigError", "ViTConfig", "VisionTransformer"]
