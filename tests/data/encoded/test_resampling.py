"""The batched crop-resize-flip against PIL (what the workers run) and torchvision (torch's own resize), image by
image, on random boxes, sizes and flips."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import PIL
import pytest
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image
from torchvision.transforms import InterpolationMode

from tests.data.encoded.test_decoding import photo
from vit.data.encoded import resampling
from vit.data.encoded.resampling import FILTERS, Frame, resample

SIZE = (40, 56)  # (H, W) out: not square, so that a swapped axis fails


def photos(count: int, seed: int = 0) -> list[torch.Tensor]:
    """(3, h, w) uint8 photographs from 9 to 200 pixels a side: crops shrink and enlarge."""
    rng = np.random.default_rng(seed)
    return [F.pil_to_tensor(photo(rng, *rng.integers(9, 200, 2))) for _ in range(count)]


def boxes(images: list[torch.Tensor], seed: int = 1) -> list[Frame]:
    """A random region of each image to the output size, every other one flipped."""
    rng = np.random.default_rng(seed)
    frames = []
    for k, image in enumerate(images):
        h, w = image.shape[1:]
        top, left = rng.integers(0, h - 1), rng.integers(0, w - 1)
        height, width = rng.integers(1, h - top + 1), rng.integers(1, w - left + 1)
        frames.append(Frame(int(top), int(left), int(height), int(width), *SIZE, flip=k % 2 == 1))
    return frames


def pil(image: torch.Tensor, f: Frame, mode: InterpolationMode) -> torch.Tensor:
    box = (f.left, f.top, f.left + f.width, f.top + f.height)  # cropped, then resized: as torchvision on PIL
    resized = F.pil_to_tensor(F.to_pil_image(image).crop(box).resize(SIZE[::-1], Image.Resampling[mode.name]))
    return resized.flip(-1) if f.flip else resized


@pytest.mark.parametrize("mode", list(FILTERS))
def test_a_batch_of_crops_resizes_as_pil_does_image_by_image(mode):
    images = photos(48)
    frames = boxes(images)
    got = resample(images, frames, SIZE, mode)
    expected = torch.stack([pil(image, f, mode) for image, f in zip(images, frames, strict=True)]).float()
    difference = (got - expected).abs()
    # PIL weighs in fixed point, we in float32: a sum within float32's error of a half rounds either way, and
    # bicubic's weights past one carry that level into the second pass
    assert got.shape == (48, 3, *SIZE)
    assert difference.max() <= (1 if mode == InterpolationMode.BILINEAR else 2) and difference.mean() < 0.015


@pytest.mark.parametrize("mode", list(FILTERS))
@pytest.mark.parametrize("axis", [-2, -1])
def test_along_one_axis_it_computes_torchs_own_resize(mode, axis):
    """The weights are torch's (to float32), rounded half up: one axis resized, the other kept."""
    images = photos(24, seed=2)
    frames = [replace(f, **({"full_w": f.width} if axis == -2 else {"full_h": f.height})) for f in boxes(images, 3)]
    differ = []
    for image, f in zip(images, frames, strict=True):
        size = (f.full_h, f.full_w)
        out = resample([image], [f], size, mode)[0]
        region = image[:, f.top : f.top + f.height, f.left : f.left + f.width].float()
        expected = F.resize(region, list(size), mode, antialias=True).add(0.5).floor().clamp(0, 255)
        differ.append((out - (expected.flip(-1) if f.flip else expected)).abs().flatten())
    differ = torch.cat(differ)
    assert differ.max() <= 1 and (differ > 0).float().mean() < 2e-3  # sums within float32's error of a half


def test_a_window_past_the_resized_image_is_black_and_the_rest_is_the_resize():
    image = photos(1, seed=4)[0][:, :30, :20]
    whole = resample([image], [Frame(0, 0, 30, 20, *SIZE)], SIZE, InterpolationMode.BILINEAR)[0]
    shifted = resample([image], [Frame(0, 0, 30, 20, *SIZE, off_y=-5, off_x=7)], SIZE, InterpolationMode.BILINEAR)[0]
    assert torch.equal(shifted[:, :5], torch.zeros_like(shifted[:, :5]))  # above the image
    assert torch.equal(shifted[:, :, -7:], torch.zeros_like(shifted[:, :, -7:]))  # right of it
    assert torch.equal(shifted[:, 5:, :-7], whole[:, :-5, 7:])


def test_autocast_around_it_changes_nothing():
    """Products in float32 whatever autocast a training step left on (TF32 on CUDA: tests/test_gpu.py)."""
    images = photos(8, seed=5)
    frames = boxes(images, seed=6)
    expected = resample(images, frames, SIZE, InterpolationMode.BILINEAR)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(resample(images, frames, SIZE, InterpolationMode.BILINEAR), expected)


def test_before_pillow_13_the_width_is_always_resized_first(monkeypatch):
    """Pillow 13 runs the height first where it shrinks much more than the width; 12 and before never do."""
    tall = Frame(0, 0, 120, 40, *SIZE)  # the height shrinks by 80, the width by none
    assert resampling._down_first(tall) == (int(PIL.__version__.split(".")[0]) >= 13)
    monkeypatch.setattr(resampling, "PILLOW_PICKS_ORDER", False)
    assert not resampling._down_first(tall)
