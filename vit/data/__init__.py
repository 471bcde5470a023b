"""Data modules: each yields (images (B, C, H, W) float, normalised, on the device; labels (B,) int64). Knows nothing
of the model. Nothing is imported here, so that the loader can read data facts (facts.py) without Lightning."""
