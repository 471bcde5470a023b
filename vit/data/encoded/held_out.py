"""The validation split held out of a training split that has none: one draw for image folders, Hugging Face datasets
and the shard writer, so that a folder or dataset holds out the same images whichever of them reads it."""

from __future__ import annotations

from torch import Generator
from torch.utils.data import random_split

from vit.data.errors import DataError


def hold_out(count: int, fraction: float, seed: int, key: str = "data.val_fraction") -> tuple[list[int], list[int]]:
    """Positions 0..count-1 of the usable training images as (kept, held out): round(fraction x count) held out, at
    least one, drawn from `seed` by torch's random_split (each list in the draw's order). `key` names the fraction."""
    held = max(1, round(fraction * count))
    if held >= count:
        raise DataError(f"{key}={fraction} holds out {held} of {count} training images, leaving none to train on")
    kept, out = random_split(range(count), [count - held, held], generator=Generator().manual_seed(seed))
    return list(kept), list(out)
