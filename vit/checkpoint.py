"""The one loader under its public name: `vit.checkpoint.load(path)` (README, notebooks). It lives in
vit/interop/load.py, beside the formats it reads."""

from vit.interop.files import CheckpointError, read
from vit.interop.load import Loaded, load

__all__ = ["CheckpointError", "Loaded", "load", "read"]
