"""The one way from a checkpoint file to a model: visualization, fine-tuning, export and prediction call
`load` (public as vit.checkpoint.load). The format is detected here and read by its own file beside this one
(timm/, torchvision.py, open_clip.py, jax.py, hugging_face.py; our training checkpoints' parts are checked in
training_checkpoint.py); nothing read from a file runs (files.py).

Our Lightning checkpoints carry the model's ViTConfig (hyper_parameters["model"]), its weights
(state_dict, keys "model.*") and the data facts the model was trained with (DATA_FACTS: per-channel
mean and std, class names, evaluation's crop_pct and interpolation), so that an image is preprocessed the
way evaluation did.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torchvision.transforms.functional import center_crop

from vit.data.augment import BatchAugment, average_over_views
from vit.data.encoded.images import to_channels
from vit.data.facts import DATA_FACTS, FRAMING, data_facts
from vit.data.native_size import Shrink, fit
from vit.interop.adapt import adapt, config_hint
from vit.interop.files import (
    CheckpointError,
    Converted,
    json_kind,
    parse_json,
    read,
    read_safetensors,
    refuse_nonfinite,
)
from vit.interop.frozen import FROZEN, FrozenRecord
from vit.interop.hub import resolve
from vit.interop.hugging_face import from_hugging_face, hugging_face_to_timm, is_hugging_face, refuse_bare_family
from vit.interop.jax import from_jax
from vit.interop.lora import add_lora, merged_weights
from vit.interop.open_clip import from_open_clip, from_open_clip_folder, is_open_clip, is_open_clip_folder
from vit.interop.sharded import CONSOLIDATE, is_sharded_checkpoint
from vit.interop.timm import from_timm_folder, from_timm_state, is_timm_folder
from vit.interop.torchvision import from_torchvision, is_torchvision
from vit.interop.training_checkpoint import read_training_checkpoint, recorded_config
from vit.model import VisionTransformer, ViTConfig
from vit.model.size import check_depth, check_memory, check_weights

MODEL_PREFIX = "model."  # ViTClassifier holds the network as self.model
_REBUILDING: set[Path] = set()  # checkpoints whose frozen weights are being read from their pretrained files
VIT_CONFIG = "vit_config"  # .safetensors metadata entry written by vit.cli.export: the ViTConfig as JSON
VIEWS = ("test_time_flip", "test_time_shift")  # how evaluation scored: a training checkpoint's hyper_parameters
CROP_MODES = ("center", "squash", "border")  # timm's pretrained_cfg crop_mode values
VIEWS_METADATA = "test_time_views"  # .safetensors metadata entry written by vit.cli.export: VIEWS as JSON


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
    crop_mode: str = "center"  # timm's: aspect kept, centre cropped; 'squash' resizes each side; 'border' pads
    interpolation: str = "bicubic"
    stats_recorded: bool = True  # mean and std are the file's record, not the [-1, 1] fallback of a file without one
    test_time_flip: bool = False  # evaluation averaged each image's logits with its mirror image's
    test_time_shift: int = 0  # ... and with those of the image moved this many pixels (vit.data.augment)
    source: dict[str, Any] | None = None  # a hub name's repo, commit and files (vit/interop/hub.py); None: a path
    max_tokens: int | None = None  # a model.naflex run's: each image at its own aspect ratio within this many patches

    def __post_init__(self) -> None:
        if not isinstance(self.test_time_flip, bool):
            raise CheckpointError(f"{self.path}: test_time_flip={self.test_time_flip!r} is not true or false")
        shift = self.test_time_shift
        if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
            raise CheckpointError(f"{self.path}: test_time_shift={self.test_time_shift!r} is not a pixel count >= 0")
        if self.crop_mode not in CROP_MODES:
            raise CheckpointError(f"{self.path}: {DATA_FACTS}.crop_mode={self.crop_mode!r} is not one of {CROP_MODES}")
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
        image folders; vit.data.augment.resize, the same PIL filter to one grey level, for in-memory data):
        converted to the model's channels, resized (aspect kept, with `interpolation`) to cover (H, W) / crop_pct,
        center-cropped to (H, W), then normalized with the training statistics. A timm import's crop_mode 'squash'
        resizes each side to (H, W) / crop_pct instead; 'border' (padding) is refused. A model.naflex run's keeps
        the image's aspect ratio: (1, C, h p_h, w p_w) on its budget's grid (vit/data/native_size.py)."""
        c = self.config
        (h, w), channels = c.img_size, c.in_chans
        if self.max_tokens is not None:  # as a model.naflex run evaluated: its aspect ratio, within the budget
            image = Shrink(self.max_tokens)(to_channels(image, channels))
            pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
            pixels = pixels.view(1, image.height, image.width, channels).permute(0, 3, 1, 2)
            return fit(BatchAugment(self.mean, self.std).normalize(pixels)[0], c.patch_size, self.max_tokens)[None]
        if self.crop_mode == "border":
            raise CheckpointError(
                f"{self.path}: crop_mode 'border' (timm pads the resized image): images cannot be read here as "
                "the model saw them; fine-tuning, which frames its own data, is unaffected"
            )
        image = to_channels(image, channels)
        cover_h, cover_w = math.floor(h / self.crop_pct), math.floor(w / self.crop_pct)
        if self.crop_mode == "squash":
            size = (cover_w, cover_h)  # (width, height), the aspect not kept
        elif cover_h == cover_w:  # the short side gets it, the other rounds down, as torchvision's Resize
            short = min(image.width, image.height)
            size = (int(cover_h * image.width / short), int(cover_h * image.height / short))
        else:  # timm's ResizeKeepRatio for a non-square input: both sides rounded
            ratio = min(image.height / cover_h, image.width / cover_w)
            size = (round(image.width / ratio), round(image.height / ratio))
        image = image.resize(size, Image.Resampling[self.interpolation.upper()])
        image = center_crop(image, [h, w])  # torchvision's, which rounds the offsets as evaluation does
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        pixels = pixels.view(1, h, w, channels).permute(0, 3, 1, 2)  # (1, C, H, W) uint8, as training batches
        return BatchAugment(self.mean, self.std).normalize(pixels)


def _floats(values: Sequence[float] | None, channels: int, what: str, path: Path) -> tuple[float, ...]:
    if values is None:
        return (0.5,) * channels  # no record of the training data: map [0, 1] to [-1, 1]
    values = tuple(float(v) for v in values)
    if len(values) == 1:
        return values * channels
    if len(values) != channels:
        raise CheckpointError(f"{path}: {DATA_FACTS}.{what} has {len(values)} values for {channels} channels")
    return values


def _build(
    path: Path,
    config: ViTConfig,
    weights: dict[str, Tensor],
    facts: dict[str, Any],
    views: dict[str, Any] | None = None,
) -> Loaded:
    refuse_nonfinite(weights, path)  # every format passes here: a NaN would give NaN probabilities, or be exported
    try:
        check_weights(config, weights)  # before building: a stated size may ask for more than the machine has
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None
    _check_facts(facts, config, path)
    model = VisionTransformer(config)
    model.load_state_dict(weights)
    classes = facts.get("classes")
    framing = {key: facts[key] for key in FRAMING if facts.get(key) is not None}
    return Loaded(
        model=model.eval(),
        mean=_floats(facts.get("mean"), config.in_chans, "mean", path),
        std=_floats(facts.get("std"), config.in_chans, "std", path),
        classes=tuple(classes) if classes else None,
        path=path,
        **framing,  # absent from older checkpoints: Loaded's defaults
        stats_recorded=facts.get("mean") is not None and facts.get("std") is not None,
        **{key: views[key] for key in VIEWS if isinstance(views, dict) and views.get(key) is not None},
    )


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


def _json_object(metadata: dict[str, str], key: str) -> dict[str, Any]:
    """An exported .safetensors file's metadata entry, a JSON object ({} where the entry is absent)."""
    value = parse_json(metadata.get(key, "{}"), f"its metadata {key}")
    if not isinstance(value, dict):
        raise ValueError(f"its metadata {key} holds {json_kind(value)}, not a JSON object")
    return value


def _from_lightning(path: Path, contents: dict[str, Any]) -> Loaded:
    checkpoint = read_training_checkpoint(path, contents)
    config, hparams, state = checkpoint.config, checkpoint.hyper_parameters, checkpoint.state_dict
    weights = {k.removeprefix(MODEL_PREFIX): v for k, v in state.items() if str(k).startswith(MODEL_PREFIX)}
    finetune = hparams.get("finetune") or {}
    lora = isinstance(finetune, dict) and finetune.get("kind") == "lora"
    if FROZEN in contents:  # a partly fine-tuned run's: the frozen rest, from the pretrained file it names
        weights = {
            **_frozen_weights(path, config, FrozenRecord.read(contents[FROZEN], path), finetune if lora else None),
            **weights,
        }
    if lora:  # peft's adapters, folded into the weights
        try:
            check_depth(config, weights)  # before building it, as _build checks a plain network
            check_memory(config)
            weights = merged_weights(config, weights, finetune)
        except (ValueError, TypeError, KeyError, RuntimeError) as err:
            raise CheckpointError(f"{path}: its LoRA adapters do not fit the network it records ({err})") from None
    return _build(path, config, weights, contents.get(DATA_FACTS, {}), hparams)


def _frozen_weights(
    path: Path, config: ViTConfig, record: FrozenRecord, lora: dict[str, Any] | None
) -> dict[str, Tensor]:
    """The weights a partly fine-tuned run froze, as it did: the pretrained file the record names read again
    (a hub name at the commit the run used), adapted to the run's network, LoRA's layers put on; checked against
    the record's digest."""
    if path.resolve() in _REBUILDING:  # a record naming its own file, or two naming each other
        raise CheckpointError(f"{path}: its frozen weights are to come from itself ({record.reference})")
    _REBUILDING.add(path.resolve())
    try:
        pretrained = load(record.reference, config=config_hint(config.to_dict()))
    except CheckpointError as err:
        raise CheckpointError(
            f"{path}: holds only the weights that learned; its frozen rest cannot be read ({err})"
        ) from None
    finally:
        _REBUILDING.discard(path.resolve())
    try:
        start, _ = adapt(pretrained.model.state_dict(), pretrained.config, config)
        check_memory(config)
        model = VisionTransformer(config)
        model.load_state_dict(start, strict=False)  # the heads learned: the checkpoint has them
        if lora is not None:
            add_lora(model, **{k: lora[k] for k in ("rank", "alpha", "dropout", "targets")})
    except (ValueError, TypeError, KeyError, RuntimeError) as err:
        raise CheckpointError(
            f"{path}: {record.reference} is not the start of the network it records ({err})"
        ) from None
    weights = dict(model.state_dict())
    record.check(weights, path)
    return {key: weights[key] for key in record.keys}


def _unwrap(contents: dict[str, Any]) -> dict[str, Tensor]:
    """A bare state dict, from the common wrappers ({'state_dict': ...}, {'model': ...}, DDP's 'module.')."""
    for key in ("state_dict", "model", "module"):
        if isinstance(contents.get(key), dict):
            contents = contents[key]
    return {k.removeprefix("module."): v for k, v in contents.items() if isinstance(k, str) and isinstance(v, Tensor)}


def from_state_dict(state: dict[str, Tensor], config: ViTConfig | None, path: Path | None = None) -> Converted:
    """A bare state dict of torchvision's, OpenCLIP's, Hugging Face's or timm's ViT (keys tell which); Hugging
    Face's families other than the classic ViT are refused, only their config.json saying their architecture."""
    if is_torchvision(state):
        return from_torchvision(state, config)
    if is_open_clip(state):
        return from_open_clip(state, config, path)
    refuse_bare_family(state, path)
    if is_hugging_face(state):
        state = hugging_face_to_timm(state)
    if "patch_embed.proj.weight" not in state:
        raise ValueError(
            "not a ViT checkpoint of a known kind: neither ours (hyper_parameters), timm's (patch_embed.proj.weight), "
            "Hugging Face's (embeddings.patch_embeddings.*), torchvision's (conv_proj.*) nor OpenCLIP's (visual.*)"
        )
    return from_timm_state(state, config, path)


def load(path: str | Path, config: ViTConfig | None = None) -> Loaded:
    """Any checkpoint of a ViT -> the model (eval mode, CPU) and the data facts it carries. The format is
    detected: our Lightning .ckpt and exported .safetensors; timm hub folders (config.json naming an
    architecture), OpenCLIP hub folders (open_clip_config.json) and Hugging Face save_pretrained folders
    (config.json naming a model_type); bare state dicts
    (.pth, .bin, .safetensors) of timm, torchvision, OpenCLIP and Hugging Face's classic ViT (its other families'
    are refused, given a config or not: only their config.json says the rest of their architecture); JAX .npz files.
    A hub name (hf-hub:ORG/REPO[@REVISION], torchvision:ARCH[.WEIGHTS]; vit/interop/hub.py) reads the files it
    names from its cache, downloaded where needed; a local path of the same spelling wins.

    `config` supplies what a bare file does not say (heads, activation, norm eps, position kind) unless the file
    is named after a timm architecture or an open_clip model; everything the weights do say comes from them.
    """
    resolved = resolve(path)
    loaded = _load_path(resolved.path, config)
    source = resolved.source
    if source is None:
        return loaded
    if "weights" in source:  # torchvision's: its evaluation transform says how its weights read images
        framing = {key: source[key] for key in ("crop_pct", "interpolation")}
        stats = {"mean": tuple(source["mean"]), "std": tuple(source["std"]), "stats_recorded": True}
        classes = (
            tuple(source["classes"])
            if source["classes"] and len(source["classes"]) == loaded.config.num_classes
            else None
        )
        loaded = replace(loaded, **framing, **stats, classes=classes or loaded.classes)
    return replace(loaded, source=source)


def _load_path(path: Path, config: ViTConfig | None) -> Loaded:
    """load() of a local file or folder."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if is_sharded_checkpoint(path):
        raise CheckpointError(
            f"{path}: a sharded checkpoint (trainer=fsdp): make one file of it first, {CONSOLIDATE} {path} --out "
            "model.ckpt"
        )
    try:
        if path.is_dir():
            if is_open_clip_folder(path):
                converted = from_open_clip_folder(path)
            else:
                converted = from_timm_folder(path) if is_timm_folder(path) else from_hugging_face(path)
        elif path.suffix == ".npz":
            converted = from_jax(path, config)
        elif path.suffix == ".safetensors":
            tensors, metadata = read_safetensors(path)
            if VIT_CONFIG in metadata:  # written by vit.cli.export
                config, facts, views = (_json_object(metadata, key) for key in (VIT_CONFIG, DATA_FACTS, VIEWS_METADATA))
                return _build(path, recorded_config(config, path), tensors, facts, views)
            converted = from_state_dict(tensors, config, path)
        else:
            contents = read(path)
            if "hyper_parameters" in contents:
                return _from_lightning(path, contents)
            converted = from_state_dict(_unwrap(contents), config, path)
    except CheckpointError:
        raise
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"{path}: {err.args[0] if err.args else err}") from None
    return _build(path, *converted)
