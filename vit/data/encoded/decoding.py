"""Where a stored image becomes pixels: in the loader's workers (PIL, then timm's transforms), or on the training
device (`data.decode=device`): JPEGs travel from the workers as their bytes and are decoded a batch at a time by
torchvision.io (nvjpeg on a GPU), then cropped, resized, flipped and normalised there. A GPU decodes as many
photographs as a farm of CPU workers would, so it needs none (benchmarks/NOTES.md change 21).

The workers still draw each image's crop and flip, with timm's own transform objects in timm's order, so a seed
crops the same boxes wherever the image is decoded, and a resumed epoch draws what the whole one did. What the
device decoder would read otherwise than PIL (not a JPEG, CMYK, an EXIF rotation) is decoded in the worker as
before and travels as pixels. timm's RandAugment works on PIL images only: with it, decoding stays in workers.
"""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from timm.data.transforms import MaybeToTensor, RandomResizedCropAndInterpolation
from torch import Tensor
from torch.utils.data import default_collate
from torchvision import transforms as T
from torchvision.io import ImageReadMode, decode_jpeg

from vit.data.encoded.images import decode
from vit.data.encoded.resampling import FILTERS, Frame, resample
from vit.data.errors import DataError

log = logging.getLogger(__name__)

CPU = torch.device("cpu")
ORIENTATION = 0x0112  # the EXIF tag; 1 is upright
READ_MODES = {1: ImageReadMode.GRAY, 3: ImageReadMode.RGB}
CHUNK = 2**27  # decoded uint8 samples framed at once: 128 MB, and 4x that as the float products' input


def split_normalization(transform: T.Compose) -> tuple[list[Callable], tuple[float, ...], tuple[float, ...]]:
    """timm's transform as its stages on PIL images, and the mean and std of the Normalize that ends it (after its
    ToTensor), which the training device applies (`normalized`)."""
    *stages, to_tensor, normalize = transform.transforms
    if not (isinstance(to_tensor, MaybeToTensor | T.ToTensor) and isinstance(normalize, T.Normalize)):
        raise DataError(f"an image transform must end with ToTensor and Normalize, not {to_tensor} and {normalize}")
    mean, std = (tuple(torch.as_tensor(v).tolist()) for v in (normalize.mean, normalize.std))
    return stages, mean, std


def normalized(pixels: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """(B, C, H, W) whole numbers 0..255, uint8 or float (then overwritten) -> (x / 255 - mean) / std, float32."""
    pixels = pixels.float() if pixels.dtype == torch.uint8 else pixels
    scale = torch.tensor(std, device=pixels.device).view(1, -1, 1, 1) * 255
    shift = torch.tensor(mean, device=pixels.device).view(1, -1, 1, 1) * 255
    return pixels.sub_(shift).div_(scale)


class InWorkers:
    """Decode with PIL (`decode`) and augment with timm's transforms in the loader's worker, up to whole pixels:
    (C, H, W) uint8 travel to the training process, a quarter of float32's bytes, and the device normalises the
    batch (as timm's prefetching loader does), so a worker delivers more images (benchmarks/NOTES.md change 29)."""

    def __init__(self, channels: int, transform: T.Compose):
        stages, _, _ = split_normalization(transform)  # the data module normalises with its mean and std
        self.channels, self.transform = channels, T.Compose([*stages, T.PILToTensor()])

    def read(self, source: str | bytes, name: str) -> Image.Image:
        return decode(source, self.channels)

    def __call__(self, image: Image.Image) -> Tensor:
        return self.transform(image)  # (C, H, W) uint8


@dataclass(frozen=True)
class DeviceSteps:
    """What the device does to a decoded image: timm's transform less its random draws."""

    channels: int
    size: tuple[int, int]  # (H, W) the model reads
    interpolation: T.InterpolationMode
    resize: list[int] | None  # evaluation: torchvision's Resize to this (one number: the shorter side), then a
    # centre crop to `size`; training resizes the drawn box straight to `size`
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass
class Item:
    """One image as a worker hands it over: its JPEG bytes (1-D uint8) or its pixels (C, H, W uint8), with the
    draws of its training crop (top, left, height, width) and flip."""

    data: Tensor
    height: int
    width: int
    name: str  # for messages: the file, row or shard item
    steps: DeviceSteps
    box: tuple[int, int, int, int] | None = None
    flip: bool = False


class OnDevice:
    """Worker side of data.decode=device: read a JPEG's header (not its pixels) and draw its crop and flip."""

    def __init__(self, channels: int, transform: T.Compose):
        self.channels, self.crop, self.flip = channels, None, 0.0
        geometry, mean, std = split_normalization(transform)
        kinds = [type(stage) for stage in geometry]
        resize = None
        if kinds in ([RandomResizedCropAndInterpolation], [RandomResizedCropAndInterpolation, T.RandomHorizontalFlip]):
            self.crop, size, interpolation = geometry[0], geometry[0].size, geometry[0].interpolation
            self.flip = geometry[1].p if len(geometry) > 1 else 0.0
        elif kinds == [T.Resize, T.CenterCrop]:
            resize = _as_list(geometry[0].size)
            size, interpolation = tuple(geometry[1].size), geometry[0].interpolation
        else:
            names = ", ".join(type(stage).__name__ for stage in geometry)
            raise DataError(
                f"data.decode=device decodes and augments on the training device, which cannot run this "
                f"augmentation ({names}): set data.auto_augment=null, or data.decode=workers"
            )
        if interpolation not in FILTERS:
            modes = ", ".join(mode.value for mode in FILTERS)
            raise DataError(f"data.decode=device resizes with {modes}, not {interpolation}: set data.decode=workers")
        self.steps = DeviceSteps(channels, tuple(size), interpolation, resize, mean, std)

    def read(self, source: str | bytes, name: str) -> Item:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        with Image.open(io.BytesIO(data)) as image:  # the header only
            width, height = image.size
            if image.format == "JPEG" and image.mode in ("L", "RGB") and image.getexif().get(ORIENTATION, 1) == 1:
                return Item(torch.frombuffer(bytearray(data), dtype=torch.uint8), height, width, name, self.steps)
        pixels = F.pil_to_tensor(decode(data, self.channels))  # upright, on black, 8 bits
        return Item(pixels, pixels.shape[1], pixels.shape[2], name, self.steps)

    def __call__(self, item: Item) -> Item:
        """The draws of timm's RandomResizedCrop then flip, in that order, from the same random streams."""
        if self.crop is None:
            return item
        shape = torch.empty((), dtype=torch.uint8).expand(1, item.height, item.width)  # what get_params reads
        box = tuple(int(v) for v in self.crop.get_params(shape, self.crop.scale, self.crop.ratio))
        flip = bool(torch.rand(1) < self.flip) if self.flip else False
        return replace(item, box=box, flip=flip)


def _as_list(size: int | list[int]) -> list[int]:
    return [size] if isinstance(size, int) else list(size)


def _frame(item: Item, steps: DeviceSteps) -> Frame:
    """Training: the drawn box, resized to the model's size, maybe flipped. Evaluation: torchvision's Resize (one
    number: the shorter side, the longer one truncated) of the whole image, then its CenterCrop (where the crop
    is larger than the image, black around it)."""
    if item.box is not None:
        return Frame(*item.box, *steps.size, flip=item.flip)
    if len(steps.resize) == 1:
        short, long = sorted((item.height, item.width))
        resized = (steps.resize[0], int(steps.resize[0] * long / short))
        full_h, full_w = resized if item.height <= item.width else resized[::-1]
    else:
        full_h, full_w = steps.resize
    off_y, off_x = (
        round((full - crop) / 2.0) if full >= crop else -((crop - full) // 2)
        for full, crop in ((full_h, steps.size[0]), (full_w, steps.size[1]))
    )
    return Frame(0, 0, item.height, item.width, full_h, full_w, off_y, off_x)


def _chunks(items: list[Item], channels: int) -> Iterator[list[Item]]:
    """Consecutive runs of `items` whose decoded pixels, counted as the run's largest image, stay within CHUNK
    (one image at least): a batch of twelve-megapixel photographs would otherwise take ~9 GB at once."""
    run: list[Item] = []
    largest = 0
    for item in items:
        pixels = item.height * item.width * channels
        if run and (len(run) + 1) * max(largest, pixels) > CHUNK:
            yield run
            run, largest = [], 0
        run.append(item)
        largest = max(largest, pixels)
    yield run


def collate(samples: list[tuple[Item, int | Tensor]]) -> tuple[EncodedBatch, Tensor]:
    """The items, and their labels (B,) or multi-hot targets (B, K) stacked as torch's own collate stacks them."""
    items = [item for item, _ in samples]
    return EncodedBatch(items), default_collate([label for _, label in samples])


class EncodedBatch:
    """A batch still encoded; Lightning's transfer calls `to` (the bytes stay where the decoder reads them), and
    `pixels` decodes it on that device. Not a dataclass: Lightning's input conversion (fp64, bf16-true) recurses
    into dataclasses, and would convert the JPEG bytes."""

    def __init__(self, items: list[Item], device: torch.device = CPU):
        self.items, self.device = items, device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> EncodedBatch:
        return EncodedBatch(self.items, torch.device(device))

    def pixels(self) -> Tensor:
        """(B, C, H, W) float32 on `device`: decoded, cropped or resized, flipped and normalised, a few images at
        a time where they are large (CHUNK)."""
        steps = self.items[0].steps
        runs = [self._framed(run, steps) for run in _chunks(self.items, steps.channels)]
        batch = runs[0] if len(runs) == 1 else torch.cat(runs)  # (B, C, H, W), ours to normalise in place
        return normalized(batch, steps.mean, steps.std)

    def _framed(self, items: list[Item], steps: DeviceSteps) -> Tensor:
        """(B, C, H, W) float, whole numbers 0..255: `items` decoded, then framed all at once (resampling.py)."""
        images = [item.data.to(self.device, non_blocking=True) if item.data.dim() == 3 else None for item in items]
        jpegs = [k for k, image in enumerate(images) if image is None]
        for k, image in zip(jpegs, self._decode([items[k] for k in jpegs], steps.channels), strict=True):
            images[k] = image
        return resample(images, [_frame(item, steps) for item in items], steps.size, steps.interpolation)

    def _decode(self, items: list[Item], channels: int) -> list[Tensor]:
        """JPEG bytes to (C, H, W) uint8 on the device, all at once. Where the device's decoder fails on an image
        (nvjpeg reads less of the JPEG standard than libjpeg-turbo), PIL decodes it, with a warning naming it; an
        image that neither decodes stops the run, named."""
        if not items:
            return []
        try:
            return decode_jpeg([item.data for item in items], mode=READ_MODES[channels], device=self.device)
        except RuntimeError:
            return [self._decode_one(item, channels) for item in items]

    def _decode_one(self, item: Item, channels: int) -> Tensor:
        try:
            return decode_jpeg(item.data, mode=READ_MODES[channels], device=self.device)
        except RuntimeError as err:
            try:
                pixels = F.pil_to_tensor(decode(item.data.numpy().tobytes(), channels))
            except Exception as pil_err:
                raise DataError(
                    f"{item.name} does not decode (on {self.device}: {_brief(err)}; with PIL: "
                    f"{pil_err.__class__.__name__}: {pil_err})"
                ) from err
            log.warning(f"{item.name}: decoded with PIL; the decoder on {self.device} failed ({_brief(err)})")
            return pixels.to(self.device)


def _brief(err: Exception) -> str:
    """An error's last line: its reason, after any source location or context torch prints first."""
    return str(err).strip().splitlines()[-1] if str(err).strip() else err.__class__.__name__


@functools.cache
def cannot_decode_on(device: torch.device) -> str | None:
    """Why torchvision cannot decode JPEGs on `device` (a build without nvJPEG, say), or None: tried once, on an
    8x8 JPEG, so that a run finds out before its first batch rather than at every image."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    try:
        decode_jpeg(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8), device=device)
    except RuntimeError as err:
        return _brief(err)
    return None


def pipeline(channels: int, transform: T.Compose, on_device: bool) -> InWorkers | OnDevice:
    """What a source's dataset calls: `read(source, name)` in its error handling, then the result on what it read."""
    return OnDevice(channels, transform) if on_device else InWorkers(channels, transform)


def collate_for(on_device: bool) -> Callable[[list[Any]], Any] | None:
    """The loader's collate_fn: torch's default for pixels, `collate` for images still encoded."""
    return collate if on_device else None
