"""Vision Transformers from the equations: readable, timm-exact, trained with Lightning and Hydra.

The package, floor by floor (each imports only the floors below it; tests/test_layers.py keeps it so):
  vit.model     the network, pure torch: config, patch embedding, positions, attention, layer, model, presets
  vit.data      data modules and augmentation; knows nothing of the model
  vit.interop   checkpoint formats, ours and other libraries', and the one loader (vit.checkpoint.load)
  vit.figures   analysis and figures of a model: tensors in, pictures out
  vit.training  the Lightning module, optimizer, callbacks, resume and train(cfg)
  vit.cli       the command lines: predict, export, visualize, sweep
"""

from vit.model import ConfigError, VisionTransformer, ViTConfig
from vit.model.presets import create_model, list_presets, preset_config

__all__ = ["ConfigError", "ViTConfig", "VisionTransformer", "create_model", "list_presets", "preset_config"]
