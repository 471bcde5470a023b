"""A loaded model and what it needs to read an image as its evaluation did (`Loaded`), built from any format's
parts by `build`, which checks the data facts a file states (DATA_FACTS: per-channel mean and std, class names,
evaluation's framing) and the task its outputs answer (one label per image, or several, with each class's threshold)
before the network is made."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torchvision.transforms.functional import center_crop

from vit.data.augment import BatchAugment, average_over_views
from vit.data.encoded.images import to_channels
from vit.data.facts import DATA_FACTS, FRAMING, data_facts
from vit.data.native_size import native_transform
from vit.interop.files import CheckpointError, refuse_nonfinite
from vit.model import VisionTransformer, ViTConfig
from vit.model.size import check_weights

VIEWS = ("test_time_flip", "test_time_shift")  # how evaluation scored: a training checkpoint's hyper_parameters
# What a model's outputs answer (vit/training/tasks.py, the `task` group): one class an image (softmax), a yes or
# no for each class (a sigmoid each, `thresholds` saying where yes starts), or, pretrained by masked autoencoding,
# no class at all (the network's features: fine-tune or probe it)
CLASSIFY, MULTILABEL, MAE = "classify", "multilabel", "mae"
TASKS = (CLASSIFY, MULTILABEL, MAE)
THRESHOLDS = "thresholds"  # a training checkpoint's entry: each class's threshold, tuned on validation
TASK_METADATA = "vit_task"  # an export's record of the task (safetensors and ONNX metadata, a timm config.json key)
EVEN_ODDS = 0.5  # a class's threshold where none was tuned: the sigmoid's midpoint
# how evaluation fits an image to (H, W) / crop_pct before cropping (H, W) from its centre: timm's pretrained_cfg
# crop_mode values ('center': the aspect kept, floor(H / crop_pct) covering the input; 'squash': each side resized;
# 'border': padded), then transformers' image processors' size rules (the short side to round(H / crop_pct), the long
# one int(S long / short); each side to its own), whose crops floor the offsets where torchvision's round them
CROP_MODES = ("center", "squash", "border", "shortest_edge", "height_width")


@dataclass(frozen=True)
class Loaded:
    """A model in eval mode and what it needs to read an image as evaluation did. `crop_pct` and
    `interpolation` say how evaluation framed images (DATA_FACTS of the training data); checkpoints written
    before they were recorded get a bicubic resize that covers the model input, cropping as little as can be."""

    model: VisionTransformer
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...] | None
    path: Path
    crop_pct: float = 1.0
    crop_mode: str = "center"  # one of CROP_MODES
    interpolation: str = "bicubic"
    stats_recorded: bool = True  # mean and std are the file's record, not the [-1, 1] fallback of a file without one
    test_time_flip: bool = False  # evaluation averaged each image's logits with its mirror image's
    test_time_shift: int = 0  # ... and with those of the image moved this many pixels (vit.data.augment)
    source: dict[str, Any] | None = None  # a hub name's repo, commit and files (vit/interop/hub.py); None: a path
    max_tokens: int | None = None  # a data.max_tokens run's: each image at its own aspect ratio in this many patches
    input_size: tuple[int, int] | None = None  # (H, W) evaluation fed, where not the model's img_size (DINOv2's crop)
    task: str = CLASSIFY  # what the outputs answer: one of TASKS
    thresholds: tuple[float, ...] | None = None  # MULTILABEL: the probability from which each class is predicted

    def __post_init__(self) -> None:
        if not isinstance(self.test_time_flip, bool):
            raise CheckpointError(f"{self.path}: test_time_flip={self.test_time_flip!r} is not true or false")
        shift = self.test_time_shift
        if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
            raise CheckpointError(f"{self.path}: test_time_shift={self.test_time_shift!r} is not a pixel count >= 0")
        if self.crop_mode not in CROP_MODES:
            raise CheckpointError(f"{self.path}: {DATA_FACTS}.crop_mode={self.crop_mode!r} is not one of {CROP_MODES}")
        if self.input_size is not None and not (
            isinstance(self.input_size, tuple)
            and len(self.input_size) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in self.input_size)
        ):
            raise CheckpointError(f"{self.path}: {DATA_FACTS}.input_size={self.input_size!r} is not (height, width)")
        if not 0 < self.crop_pct <= 1:
            raise CheckpointError(f"{self.path}: {DATA_FACTS}.crop_pct={self.crop_pct} is not in (0, 1]")
        if self.interpolation.upper() not in Image.Resampling.__members__:
            raise CheckpointError(
                f"{self.path}: {DATA_FACTS}.interpolation={self.interpolation!r} is not one of "
                f"{[name.lower() for name in Image.Resampling.__members__]}"
            )

    @property
    def config(self) -> ViTConfig:
        return self.model.config

    @property
    def multilabel(self) -> bool:
        """Whether each class is a yes or no of its own (a sigmoid each), not one class an image (a softmax)."""
        return self.task == MULTILABEL

    def class_thresholds(self) -> tuple[float, ...]:
        """A multi-label model's threshold of each class: the file's, else EVEN_ODDS."""
        return self.thresholds or (EVEN_ODDS,) * self.config.num_classes

    def task_record(self) -> dict[str, Any]:
        """The task as exports record it (TASK_METADATA), and as `build` reads it back."""
        return {"kind": self.task, THRESHOLDS: list(self.thresholds) if self.thresholds is not None else None}

    def facts(self) -> dict[str, Any]:
        """The data facts as checkpoints store them (DATA_FACTS): what an export must carry to read images alike."""
        return data_facts(self)

    def views(self) -> dict[str, Any]:
        """The test-time views evaluation scored with, as checkpoints and exports record them (VIEWS)."""
        return {key: getattr(self, key) for key in VIEWS}

    def logits(self, images: Tensor) -> Tensor:
        """The logits as evaluation scored images: averaged over the test-time views the run validated and tested
        with (none unless it recorded them), moved views filled with black. (B, C, H, W) -> (B, K)"""
        black = -torch.tensor(self.mean) / torch.tensor(self.std)  # a 0 pixel, normalised
        return average_over_views(self.model, images, self.test_time_flip, self.test_time_shift, black)

    def preprocess(self, image: Image.Image) -> Tensor:
        """A PIL image of any mode and size -> (1, C, H, W) float, as evaluation read it (timm's transform for
        image folders and timm imports; vit.data.augment.resize, the same PIL filter to one grey level, for in-memory
        data; a Hugging Face folder's image processor): converted to the model's channels, resized with
        `interpolation` by `crop_mode` (CROP_MODES) to cover (H, W) / crop_pct, center-cropped to (H, W), then
        normalized with the training statistics. (H, W) is `input_size`, else the model's img_size; crop_mode
        'border' (padding) is refused. A data.max_tokens run's, and a NaFlex image processor's, keep the image's
        aspect ratio: (1, C, h p_h, w p_w) on its budget's grid, by the run's own evaluation transform
        (vit/data/native_size.py)."""
        c = self.config
        (h, w), channels = self.input_size or c.img_size, c.in_chans
        if self.max_tokens is not None:  # as a data.max_tokens run evaluated: its aspect ratio, within the budget
            transform = native_transform(False, self.max_tokens, c.patch_size, None, False, self.mean, self.std)
            return transform(to_channels(image, channels))[None]
        if self.crop_mode == "border":
            raise CheckpointError(
                f"{self.path}: crop_mode 'border' (timm pads the resized image): images cannot be read here as "
                "the model saw them; fine-tuning, which frames its own data, is unaffected"
            )
        image = to_channels(image, channels)
        image = image.resize(self._resized(image.width, image.height), Image.Resampling[self.interpolation.upper()])
        if self.crop_mode in ("shortest_edge", "height_width"):  # transformers' crop: offsets floored
            top, left = (image.height - h) // 2, (image.width - w) // 2
            image = image.crop((left, top, left + w, top + h))
        else:
            image = center_crop(image, [h, w])  # torchvision's, which rounds the offsets as timm's evaluation does
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        pixels = pixels.view(1, h, w, channels).permute(0, 3, 1, 2)  # (1, C, H, W) uint8, as training batches
        return BatchAugment(self.mean, self.std).normalize(pixels)

    def _resized(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) an image of `width` x `height` is resized to before its crop, by `crop_mode`."""
        h, w = self.input_size or self.config.img_size
        if self.crop_mode == "shortest_edge":  # transformers' get_resize_output_image_size
            side, short = round(h / self.crop_pct), min(width, height)
            return (side, int(side * height / short)) if width == short else (int(side * width / short), side)
        if self.crop_mode == "height_width":
            return round(w / self.crop_pct), round(h / self.crop_pct)
        cover_h, cover_w = math.floor(h / self.crop_pct), math.floor(w / self.crop_pct)
        if self.crop_mode == "squash":
            return cover_w, cover_h  # the aspect not kept
        if cover_h == cover_w:  # the short side gets it, the other rounds down, as torchvision's Resize
            short = min(width, height)
            return int(cover_h * width / short), int(cover_h * height / short)
        ratio = min(height / cover_h, width / cover_w)  # timm's ResizeKeepRatio for a non-square input: both rounded
        return round(width / ratio), round(height / ratio)


def _floats(values: Sequence[float] | None, channels: int, what: str, path: Path) -> tuple[float, ...]:
    if values is None:
        return (0.5,) * channels  # no record of the training data: map [0, 1] to [-1, 1]
    values = tuple(float(v) for v in values)
    if len(values) == 1:
        return values * channels
    if len(values) != channels:
        raise CheckpointError(f"{path}: {DATA_FACTS}.{what} has {len(values)} values for {channels} channels")
    return values


def build(
    path: Path,
    config: ViTConfig,
    weights: dict[str, Tensor],
    facts: dict[str, Any],
    views: dict[str, Any] | None = None,
    task: dict[str, Any] | None = None,
) -> Loaded:
    """The model of `config` with `weights`, the data facts, the test-time views and the task (`task_record`'s form)
    the file states, each checked first."""
    refuse_nonfinite(weights, path)  # every format passes here: a NaN would give NaN probabilities, or be exported
    try:
        check_weights(config, weights)  # before building: a stated size may ask for more than the machine has
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None
    return _around(path, config, facts, views, task, weights)


def described(
    path: Path, config: ViTConfig, facts: dict[str, Any], views: dict[str, Any] | None, task: dict[str, Any] | None
) -> Loaded:
    """How to read images and outputs for a model that runs elsewhere (an ONNX graph): the data facts, test-time
    views and task a file states, checked as `build` checks them, around the network of `config` on the meta device
    (its shapes, no weights and no memory), whose logits cannot be computed here."""
    return _around(path, config, facts, views, task, None)


def _around(
    path: Path,
    config: ViTConfig,
    facts: dict[str, Any],
    views: dict[str, Any] | None,
    task: dict[str, Any] | None,
    weights: dict[str, Tensor] | None,
) -> Loaded:
    """The Loaded of `config` with `weights` (None: on the meta device) and the checked facts, views and task."""
    _check_facts(facts, config, path)
    kind, thresholds = read_task(task or {}, config.num_classes, path)
    if weights is None:
        with torch.device("meta"):
            model = VisionTransformer(config)
    else:
        model = VisionTransformer(config)
        model.load_state_dict(weights)
    classes = facts.get("classes")
    framing = {key: facts[key] for key in FRAMING if facts.get(key) is not None}
    if isinstance(framing.get("input_size"), list):  # as JSON keeps it
        framing["input_size"] = tuple(framing["input_size"])
    return Loaded(
        model=model.eval(),
        mean=_floats(facts.get("mean"), config.in_chans, "mean", path),
        std=_floats(facts.get("std"), config.in_chans, "std", path),
        classes=tuple(classes) if classes else None,
        path=path,
        **framing,  # absent from older checkpoints: Loaded's defaults
        stats_recorded=facts.get("mean") is not None and facts.get("std") is not None,
        **{key: views[key] for key in VIEWS if isinstance(views, dict) and views.get(key) is not None},
        task=kind,
        thresholds=thresholds,
    )


def read_task(record: Any, num_classes: int, path: Path | str) -> tuple[str, tuple[float, ...] | None]:
    """The task a file records ({'kind', THRESHOLDS}; CLASSIFY where it says none) and its thresholds, refusing in
    one line a record that predict would misread: an unknown kind, or thresholds that are not one probability per
    class of a multi-label model."""
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: its task record is {type(record).__name__}, not a mapping")
    kind, thresholds = record.get("kind") or CLASSIFY, record.get(THRESHOLDS)
    if kind not in TASKS:
        raise CheckpointError(f"{path}: task {kind!r} is not one of {', '.join(TASKS)}")
    if thresholds is None:
        return kind, None
    if kind != MULTILABEL:
        raise CheckpointError(f"{path}: {THRESHOLDS} recorded for task {kind}, which predicts the top classes")
    if not (
        isinstance(thresholds, (list, tuple))
        and len(thresholds) == num_classes
        and all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 1 for t in thresholds)
    ):
        raise CheckpointError(f"{path}: {THRESHOLDS} must be {num_classes} probabilities in [0, 1], one a class")
    return kind, tuple(float(t) for t in thresholds)


def _check_facts(facts: Any, config: ViTConfig, path: Path) -> None:
    """The data facts of a file written by hand or by other code: a name per class, numbers where numbers go."""
    if not isinstance(facts, dict):
        raise CheckpointError(f"{path}: {DATA_FACTS} is a {type(facts).__name__}, not a mapping")
    classes = facts.get("classes")
    if classes is not None and (
        not isinstance(classes, (list, tuple)) or (config.num_classes and len(classes) != config.num_classes)
    ):
        count = len(classes) if isinstance(classes, (list, tuple)) else type(classes).__name__
        raise CheckpointError(f"{path}: {DATA_FACTS}.classes names {count} classes, the model has {config.num_classes}")
    crop_pct, interpolation = facts.get("crop_pct"), facts.get("interpolation")
    if crop_pct is not None and (isinstance(crop_pct, bool) or not isinstance(crop_pct, (int, float))):
        raise CheckpointError(f"{path}: {DATA_FACTS}.crop_pct={crop_pct!r} is not a number")
    if facts.get("crop_mode") is not None and not isinstance(facts["crop_mode"], str):
        raise CheckpointError(f"{path}: {DATA_FACTS}.crop_mode={facts['crop_mode']!r} is not a name")
    if interpolation is not None and not isinstance(interpolation, str):
        raise CheckpointError(f"{path}: {DATA_FACTS}.interpolation={interpolation!r} is not a name")
    budget = facts.get("max_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget <= 1 << 20):
        raise CheckpointError(f"{path}: {DATA_FACTS}.max_tokens={budget!r} is not a patch count in 1..{1 << 20}")
    for key in ("mean", "std"):
        values = facts.get(key)
        if values is not None and not (
            isinstance(values, (list, tuple)) and all(isinstance(v, (int, float)) for v in values)
        ):
            raise CheckpointError(f"{path}: {DATA_FACTS}.{key}={values!r} is not a list of numbers")
        if values is not None and not all(math.isfinite(v) and (key == "mean" or v > 0) for v in values):
            # a std of 0 divides every pixel by zero: the logits would be NaN or inf, with no word
            raise CheckpointError(
                f"{path}: {DATA_FACTS}.{key}={list(values)} must be finite{' and > 0' * (key == 'std')}"
            )
