"""Any decoded image to the pixels a model reads, whatever its mode.

PIL's own convert() gets several modes wrong for this purpose: it ignores EXIF orientation, drops
transparency onto whatever colour the hidden pixels happen to hold, and clips 16-bit images at 255
instead of scaling them. `to_channels` fixes each of those, then gives 'L' (one channel) or 'RGB'; `decode`
reads a file or its bytes (image folders, Hugging Face datasets and shards alike) through it.
"""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image, ImageOps

from vit.data.errors import DataError

BACKGROUND = 0  # transparent pixels become black: the background of Fashion-MNIST and of most cut-outs


def _scaled_to_8_bits(image: Image.Image) -> Image.Image:
    """Integer modes with more than 8 bits ('I;16', 'I;16B', 'I', 'F'): scale by the type's range, not clip."""
    pixels = np.asarray(image)
    if image.mode == "F":
        top = 1.0 if pixels.size and pixels.max() <= 1.0 else 255.0
    elif image.mode.startswith("I;16"):
        top = 65535.0
    else:  # 'I': 32-bit; PNGs decode 16-bit grayscale to it, so scale by 16 bits when the values fit
        top = 65535.0 if pixels.size and pixels.max() > 255 else 255.0
    scaled = np.clip(pixels.astype(np.float64) * (255.0 / top), 0, 255)
    return Image.fromarray(np.round(scaled).astype(np.uint8))  # mode L


def to_channels(image: Image.Image, channels: int) -> Image.Image:
    """The image upright, transparency composited on black, 8 bits per channel, in mode 'L' (channels=1)
    or 'RGB' (channels=3)."""
    if channels not in (1, 3):
        raise DataError(f"models read 1 (grayscale) or 3 (RGB) channels, not {channels}")
    image = ImageOps.exif_transpose(image)
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        image = _scaled_to_8_bits(image)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (BACKGROUND, BACKGROUND, BACKGROUND, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("L" if channels == 1 else "RGB")


def decode(source: str | bytes, channels: int, reduced: bool = False) -> Image.Image:
    """A file (path) or its encoded bytes as the model's pixels; `reduced` lets JPEGs decode at 1/8 scale (for
    checking, not training)."""
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
        if reduced:
            # at least 1 px a side: a JPEG under 8 px wide or tall would ask for 0 and fail
            image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
        return to_channels(image, channels)


def problem(source: str | bytes, channels: int, verify: bool) -> str | None:
    """Why a file (path) or encoded bytes cannot be trained on, or None; `verify` decodes, else only emptiness
    is checked."""
    try:
        size = len(source) if isinstance(source, bytes) else os.path.getsize(source)
        if size == 0:
            return "empty file (0 bytes)"
        if verify:
            decode(source, channels, reduced=True)
    except Exception as err:  # whatever the OS or PIL raises makes the image unusable
        return f"{err.__class__.__name__}: {err}"
    return None
