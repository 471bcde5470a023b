"""Config checks made before any data or device work, so that a mistake is one line naming the key."""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from timm.data import Mixup

from vit.data.encoded.transforms import image_transform
from vit.data.errors import DataError
from vit.interop.hub import is_hub_name
from vit.interop.lora import TARGETS
from vit.model.config import ConfigError, ViTConfig
from vit.model.presets import list_presets, preset_config
from vit.model.size import check_fits, check_memory
from vit.training.distill import KINDS as DISTILL_KINDS
from vit.training.loggers import check_logger_packages
from vit.training.optim import OptimConfig
from vit.training.sharding import is_sharded

MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision
MAX_SEED = 2**32 - 1  # Lightning's seed_everything seeds numpy too, which takes 32-bit unsigned seeds only
PRETRAINED = "pretrained"  # model.pretrained: a checkpoint to start from, not a ViTConfig field
DATA_FAULTS = (DataError, FileNotFoundError)  # what the data's own checks raise, each naming the file or key


def model_fields(cfg: DictConfig) -> tuple[dict[str, Any], str | None]:
    """cfg.model as ViTConfig fields, and the pretrained checkpoint path if one is set."""
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    return fields, fields.pop(PRETRAINED, None)


@dataclasses.dataclass(frozen=True)
class RunSwitches:
    """The top-level switches of conf/train.yaml, typed, so that `seed=abc` or `label_smoothing=high` is named
    before any work instead of failing inside a training step. No defaults: conf/train.yaml holds them."""

    seed: int
    matmul_precision: str
    label_smoothing: float
    mixup: dict[str, Any] | None  # timm.data.Mixup's arguments
    ema_decay: float | None
    compile: bool
    test_time_flip: bool
    test_time_shift: int
    resume: str | None

    def __post_init__(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed={self.seed}: must be a whole number from 0 to {MAX_SEED} (numpy's seeds)")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(f"matmul_precision={self.matmul_precision!r} is not one of {MATMUL_PRECISIONS}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ConfigError(f"ema_decay={self.ema_decay} must be in (0, 1), or null for no average")
        if self.test_time_shift < 0:
            raise ConfigError(f"test_time_shift={self.test_time_shift} must be a number of pixels >= 0")

    @classmethod
    def check(cls, cfg: DictConfig) -> None:
        values = {f.name: cfg.get(f.name) for f in dataclasses.fields(cls)}
        try:
            typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(cls), values))
        except OmegaConfBaseException as err:
            raise ConfigError(f"{err.full_key}: {str(err.msg).splitlines()[0]}") from None
        cls(**typed)


def check_config(cfg: DictConfig) -> None:
    """Fail before any device work: every value resolves (data.num_classes by reading the data's classes), no
    required value is missing, the model can be built and tells the data's classes apart. Messages name the
    full key."""
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
    except OmegaConfBaseException as err:  # a key that interpolates a missing value
        raise (
            data_fault(err) or _config_fault(err) or ConfigError(f"{_first_line(err)} (needed by {err.full_key})")
        ) from None
    if missing:
        raise ConfigError(
            f"missing value(s) for {', '.join(missing)}: set them on the command line, e.g. {missing[0]}=..."
        )
    try:
        OmegaConf.resolve(cfg)
    except Exception as err:  # an interpolation that does not resolve, with its full key
        where = f" (needed by {err.full_key})" if isinstance(err, OmegaConfBaseException) else ""
        raise (
            data_fault(err) or _config_fault(err) or ConfigError(f"config does not resolve: {_first_line(err)}{where}")
        ) from None
    fields, pretrained = model_fields(cfg)
    _check_follows_data(fields, cfg.data)
    if pretrained is not None and not Path(pretrained).exists() and not is_hub_name(pretrained):
        raise ConfigError(
            f"model.pretrained={pretrained}: no such file or folder (nor a hub name: hf-hub:ORG/REPO, torchvision:ARCH)"
        )
    if pretrained is None:  # else the file is the network, checked against the run when it is read
        try:
            config = ViTConfig.from_dict(fields)
        except ConfigError as err:
            raise ConfigError(str(err).replace("ViTConfig.", "model.") + _presets_that_fit(fields)) from None
        check_memory(config, where="model.")  # model.depth=1000000 would fill the memory before failing
    OptimConfig.from_dict(OmegaConf.to_container(cfg.optim))
    _check_arguments(cfg.data, "data")
    _check_data_values(cfg.data)  # before the run's switches, some of which follow data keys (test_time_shift)
    RunSwitches.check(cfg)
    _check_arguments(cfg.trainer, "trainer")
    _check_trainer_values(cfg.trainer)
    if cfg.trainer.get("accelerator") in ("gpu", "cuda") and not torch.cuda.is_available():  # else torch's traceback
        raise ConfigError(
            f"trainer.accelerator={cfg.trainer.accelerator}, but torch sees no GPU here: add trainer=cpu "
            "(or trainer.accelerator=cpu)"
        )
    if is_sharded(cfg.trainer) and str(cfg.trainer.get("precision")) not in ("32-true", "32"):
        raise ConfigError(
            f"trainer.precision={cfg.trainer.precision} with trainer=fsdp: FSDP2 computes in "
            "trainer.strategy.param_dtype (bf16, fp16, or null for fp32) with fp32 master weights; keep "
            "trainer.precision=32-true"
        )
    if cfg.trainer.get("max_steps", -1) not in (-1, None):
        raise ConfigError(
            f"trainer.max_steps={cfg.trainer.max_steps}: runs are counted in epochs here (trainer.max_epochs; "
            "trainer.limit_train_batches for shorter epochs): the schedule's warm-up is in epochs, and Lightning 2.6 "
            "resumes an end-of-epoch checkpoint wrongly under max_steps (it repeats the epoch's end, skips an epoch)"
        )
    _check_native_size(cfg, fields)
    check_logger_packages(cfg.get("logger"))
    _check_finetune(cfg.get("finetune"), pretrained)
    _check_batch_memory(cfg)
    _check_distill(cfg.get("distill"))
    if cfg.mixup:  # train() passes label_smoothing and num_classes itself
        _check_arguments(cfg.mixup, "mixup", Mixup, taken=("label_smoothing", "num_classes"))
        _check_mixup(OmegaConf.to_container(cfg.mixup))


FINETUNE_KINDS = ("full", "linear", "lora")


def _check_finetune(node: DictConfig | None, pretrained: str | None) -> None:
    """finetune=full|linear|lora and LoRA's settings, named before the network is built; the rank against the
    network's widths and the memory once the pretrained file gives them (vit.interop.lora.check_rank)."""
    if node is None:
        return
    if node.get("kind") not in FINETUNE_KINDS:
        raise ConfigError(f"finetune.kind={node.get('kind')!r}: give one of {', '.join(FINETUNE_KINDS)}")
    if node.kind != "full" and pretrained is None:  # a random network, frozen: its features are noise
        learns = "the head" if node.kind == "linear" else "adapters"
        raise ConfigError(
            f"finetune.kind={node.kind} without model.pretrained: it would train {learns} on a frozen random "
            "network; give model.pretrained=CHECKPOINT (a random network saved to a file, for a random-features "
            "baseline), or finetune=full to train from scratch"
        )
    if node.kind != "lora":
        return
    rank, alpha, dropout, targets = (node.get(k) for k in ("rank", "alpha", "dropout", "targets"))
    if not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1):
        raise ConfigError(f"finetune.rank={rank!r}: must be a whole number >= 1")
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"finetune.alpha={alpha!r}: must be a finite number > 0")
    if not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
        raise ConfigError(f"finetune.dropout={dropout!r}: must be a number from 0 to below 1")
    if not isinstance(targets, Sequence) or isinstance(targets, str) or not targets or set(targets) - set(TARGETS):
        raise ConfigError(f"finetune.targets={targets!r}: give a list of {', '.join(TARGETS)}")


def _check_batch_memory(cfg: DictConfig) -> None:
    """The images the data keys ask to hold at once must fit in this machine's memory, checked before any is made:
    data.img_size=70000 asked for 235 GB of images at the first batch (a network without a position table states
    no image size in its weights, so check_memory passes it), and data.crop_padding and test_time_shift pad every
    image of a batch by their pixels. Lower bounds: one batch as the pipeline makes it (uint8 padded crops, fp32
    inputs), and data.train_size / test_size images made up at once; the activations come on top."""
    data = cfg.data
    if not {"img_size", "batch_size"} <= data.keys() or data.get("max_tokens") is not None:  # images at own sizes
        return
    side, channels, pad = data.img_size, data.get("in_chans", 3), data.get("crop_padding", 0)
    images = f"images of data.img_size={side} pixels"
    train, evaluation = data.batch_size, data.get("eval_batch_size", data.batch_size)
    shift, made_up = cfg.get("test_time_shift") or 0, max(data.get("train_size", 0), data.get("test_size", 0))
    for need, what in (
        (4 * train * channels * side**2, f"data.batch_size={train} {images}"),
        (train * channels * (2 * pad + 1) ** 2, f"data.crop_padding={pad} around data.batch_size={train} images"),
        (4 * evaluation * channels * (side + 2 * shift) ** 2, f"test_time_shift={shift} around "
         f"data.eval_batch_size={evaluation} {images}"),
        (4 * made_up * channels * side**2, f"data.train_size={data.get('train_size')}, data.test_size="
         f"{data.get('test_size')} {images}"),
    ):  # fmt: skip
        check_fits(need, what)


def _check_native_size(cfg: DictConfig, fields: dict[str, Any]) -> None:
    """model.naflex and data.max_tokens go together, without what needs square batches of one size, and within this
    machine's memory."""
    naflex, budget = bool(fields.get("naflex")), cfg.data.get("max_tokens")
    if naflex != (budget is not None):
        said = (
            "model.naflex=true without data.max_tokens"
            if naflex
            else f"data.max_tokens={budget} without model.naflex=true"
        )
        raise ConfigError(f"{said}: images at their own size need both (e.g. model.naflex=true data.max_tokens=256)")
    if not naflex:
        return
    square = {
        "mixup": bool(cfg.get("mixup")),
        "test_time_shift": bool(cfg.get("test_time_shift")),
        "distill.teacher": cfg.get("distill") is not None and cfg.distill.get("teacher") is not None,
    }
    if clash := [key for key, on in square.items() if on]:
        raise ConfigError(
            f"model.naflex=true with {', '.join(clash)}: not built for batches of images of their own sizes yet; "
            "turn it off"
        )
    if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1:  # else the data module names it
        _check_budget_memory(cfg, fields, budget)


def _check_budget_memory(cfg: DictConfig, fields: dict[str, Any], budget: int) -> None:
    """A batch at the budget must fit in memory: data.max_tokens=1000000000 asked for exabytes at the first batch.
    Each image is fitted to nearly `budget` patches, so no two share a sequence, and each sequence carries its
    (L, L) attention mask; a lower bound at 16 bits a number: the images' pixels, their tokens and the masks (a
    pretrained file's patch and width are known once it is read: the masks alone then)."""
    key = max(("batch_size", "eval_batch_size"), key=lambda k: cfg.data.get(k) or 0)
    batch, per_token, prefix, sizes = cfg.data[key], 0, 0, ""
    if cfg.model.get("pretrained") is None:
        config = ViTConfig.from_dict(fields)
        (ph, pw), width, prefix = config.patch_size, config.embed_dim, config.num_prefix_tokens
        per_token, sizes = config.in_chans * ph * pw + width, f" of {ph}x{pw} patches, model.embed_dim={width} wide,"
    length = budget + prefix
    need = 2 * batch * (budget * per_token + length**2)
    masks = f"each with its {length}x{length} attention mask,"
    check_fits(need, f"data.max_tokens={budget}: data.{key}={batch} images{sizes} {masks}")


def _check_distill(node: DictConfig | None) -> None:
    """DeiT's distillation settings, named before the teacher is read."""
    if node is None or node.get("teacher") is None:
        return
    teacher = str(node.teacher)
    if not Path(teacher).exists() and not is_hub_name(teacher):
        raise ConfigError(f"distill.teacher={teacher}: no such file or folder (nor a hub name)")
    if node.get("kind") not in DISTILL_KINDS:
        raise ConfigError(f"distill.kind={node.get('kind')!r}: give one of {', '.join(DISTILL_KINDS)}")
    alpha, tau = node.get("alpha"), node.get("tau")
    if not (isinstance(alpha, (int, float)) and 0 <= alpha <= 1):
        raise ConfigError(f"distill.alpha={alpha!r}: the teacher's share of the loss, from 0 to 1")
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        raise ConfigError(f"distill.tau={tau!r}: must be a finite temperature > 0")


def data_fault(err: Exception) -> Exception | None:
    """The data's own error (a missing folder, one without classes) behind OmegaConf's: a resolver that reads the
    data raised it, and OmegaConf keeps it only as the exception being handled when it raised its own."""
    return _behind(err, DATA_FAULTS)


def _config_fault(err: Exception) -> Exception | None:
    """A resolver's own ConfigError (vit.required's) behind OmegaConf's, which wraps it in three lines."""
    return _behind(err, (ConfigError,))


def _behind(err: Exception, kinds: tuple[type[Exception], ...]) -> Exception | None:
    """The first exception of `kinds` among those being handled when `err` and its predecessors were raised."""
    cause = err.__context__
    while cause is not None and not isinstance(cause, kinds):
        cause = cause.__context__
    return cause


def _first_line(err: Exception) -> str:
    """OmegaConf's message without the full_key and object_type lines it appends (the caller names the key)."""
    return str(getattr(err, "msg", None) or err).splitlines()[0]


# the model fields that are the data's shape, each with how a message counts it
FOLLOWS_DATA = {"num_classes": "{} classes", "img_size": "{}-pixel images", "in_chans": "{}-channel images"}


def _check_follows_data(fields: dict[str, Any], data: DictConfig) -> None:
    """The model's input and outputs are the data's: a model.num_classes, img_size or in_chans typed by hand must
    agree with them. A model of 8-pixel inputs trained on 16-pixel images (its position table resampled at every
    step) reported the 16-pixel accuracy, while its checkpoint had predict and export read images at 8 pixels."""
    for key, count in FOLLOWS_DATA.items():
        if key not in data or _sides(fields.get(key)) == _sides(data[key]):
            continue
        where = f" in data.root={data.root}" if "root" in data else ""
        also = "" if key == "num_classes" else f"; data.{key} sets both"
        raise ConfigError(
            f"model.{key}={fields.get(key)}, but the data{where} has {count.format(data[key])} "
            f"(data.{key}): leave model.{key} out, it follows the data{also}"
        )


def _sides(value: Any) -> Any:
    """An image size as (height, width) whether given as one number or two; any other value as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def _presets_that_fit(fields: dict[str, Any]) -> str:
    """Where the model's patches do not tile the data's images (data=cifar10 alone keeps the default model's patch
    7, made for 28 px): the model presets whose patches do, as the command to add."""
    size = fields.get("img_size")
    sides = (size, size) if isinstance(size, int) else tuple(size or ())
    patch = fields.get("patch_size")
    if len(sides) != 2 or not patch or all(side % p == 0 for side, p in zip(sides, _pair(patch), strict=True)):
        return ""
    fit = [
        name
        for name in list_presets()
        if all(side % p == 0 for side, p in zip(sides, _pair(preset_config(name).patch_size), strict=True))
    ]
    return f"; a model preset whose patches fit {sides[0]}x{sides[1]} images: {', '.join(f'model={n}' for n in fit)}"


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (value[0], value[1])


IMAGE_CHANNELS = (1, 3)  # what images decode to ('L' or 'RGB'), for training and for predict alike


def _check_data_values(data: DictConfig) -> None:
    """Values the data groups share, checked before any file is read (torch or timm would fail later, in a
    traceback, or a checkpoint reader would refuse the finished run's files)."""
    _check_types(data, "data")
    for key in ("img_size", "batch_size", "eval_batch_size", "train_size", "test_size"):
        if key in data and not data[key] > 0:
            raise ConfigError(f"data.{key}={data[key]}: must be a positive whole number")
    for key in ("crop_padding", "noise", "val_size"):
        if key in data and data[key] < 0:
            raise ConfigError(f"data.{key}={data[key]}: must be >= 0")
    if "in_chans" in data and data.in_chans not in IMAGE_CHANNELS:
        raise ConfigError(f"data.in_chans={data.in_chans}: images are read as 1 (grayscale) or 3 (RGB) channels")
    if "crop_pct" in data and not 0 < data.crop_pct <= 1:
        raise ConfigError(f"data.crop_pct={data.crop_pct}: the share of the image evaluation keeps, in (0, 1]")
    if "val_fraction" in data and not 0 <= data.val_fraction < 1:
        raise ConfigError(f"data.val_fraction={data.val_fraction}: the share held out for validation, in [0, 1)")
    if "num_classes" in data and data.num_classes < 2:
        where = f" in data.root={data.root}" if "root" in data else ""
        raise ConfigError(f"data.num_classes={data.num_classes}{where}: a classifier needs at least 2 classes")
    if data.get("auto_augment"):
        try:
            image_transform(32, True, data.auto_augment, False, 1.0, "bicubic", (0.5,), (0.5,))
        except (AssertionError, ValueError, KeyError, IndexError) as err:  # timm's parser asserts
            raise ConfigError(
                f"data.auto_augment={data.auto_augment!r}: not a timm augmentation policy ({err})"
            ) from None


SCALARS = {int: (int,), float: (int, float), bool: (bool,), str: (str,), type(None): (type(None),)}


def _check_types(node: DictConfig, name: str) -> None:
    """Each scalar setting under `name` of the kind its _target_'s constructor declares (`noise: float`,
    `split_seed: int`, the Trainer's `accumulate_grad_batches: int`), and finite: data.noise=abc or
    trainer.max_epochs=abc is named here, not met as a TypeError inside setup or the first step, and data.noise=nan
    no longer trains on NaN images."""
    hints: dict[str, Any] = {}
    for cls in reversed(get_class(node._target_).__mro__):  # a subclass's settings override its base's
        if "__init__" in vars(cls):
            try:
                hints |= typing.get_type_hints(cls.__init__)
            except NameError:  # an annotation naming what only a type checker imports
                continue
    for key, value in node.items():
        if key.startswith("_") or key not in hints:
            continue
        union = typing.get_origin(hints[key]) in (typing.Union, types.UnionType)
        kinds = typing.get_args(hints[key]) if union else (hints[key],)
        if not all(kind in SCALARS for kind in kinds):
            continue  # a container or a class: not a command-line scalar
        allowed = tuple(t for kind in kinds for t in SCALARS[kind])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
            raise ConfigError(f"{name}.{key}={_shown(value)}: must be {names}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}.{key}={value}: must be a finite number")


def _shown(value: Any) -> str:
    """A config value as the command line writes it: null, [16, 16] for a list (not ListConfig's repr)."""
    if value is None:
        return "null"
    return repr(OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value)


# Trainer numbers that Lightning takes unchecked and then fails on in the first step (a division by zero: 0 batches
# to accumulate, logging every 0 steps), runs on for 1000 epochs (max_epochs=null) or forever (-1), or quietly
# ignores (a negative clipping norm): the values allowed, in words. Lightning checks the others itself (build()).
TRAINER_NUMBERS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_epochs": (lambda v: v is not None and v >= 1, "a number of epochs >= 1 (the schedule needs an end)"),
    "accumulate_grad_batches": (lambda v: v >= 1, "a number of batches >= 1"),
    "log_every_n_steps": (lambda v: v is None or v >= 1, "a number of steps >= 1"),
    "check_val_every_n_epoch": (lambda v: v is None or v >= 1, "a number of epochs >= 1, or null"),
    "val_check_interval": (lambda v: v is None or v > 0, "a share of the epoch in (0, 1], or a number of batches"),
    "num_sanity_val_steps": (lambda v: v is None or v >= -1, "a number of batches >= 0, or -1 for all"),
    "gradient_clip_val": (lambda v: v is None or v >= 0, "a gradient norm >= 0 (0 or null: no clipping)"),
    "limit_train_batches": (lambda v: v is None or v > 0, "a share of the epoch in (0, 1], or a number of batches"),
}


def _check_trainer_values(trainer: DictConfig) -> None:
    _check_types(trainer, "trainer")
    for key, (allowed, words) in TRAINER_NUMBERS.items():
        if key in trainer and isinstance(trainer[key], (int, float, type(None))) and not allowed(trainer[key]):
            raise ConfigError(f"trainer.{key}={_shown(trainer[key])}: must be {words}")


MIXUP_NUMBERS = {"mixup_alpha": math.inf, "cutmix_alpha": math.inf, "prob": 1, "switch_prob": 1}  # each in [0, max]


def _check_mixup(mixup: dict[str, Any]) -> None:
    """timm's Mixup compares its arguments as the module is built (a TypeError for mixup_alpha=abc, a bare
    AssertionError for cutmix_minmax=[0.2]) or at the first step (an AssertionError when nothing would be mixed),
    and takes prob=2 or NaN without a word."""
    for key, most in MIXUP_NUMBERS.items():
        value = mixup.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= most:
            allowed = ">= 0" if most == math.inf else f"in [0, {most}]"
            raise ConfigError(f"mixup.{key}={_shown(value)}: must be a number {allowed}")
    defaults = {k: p.default for k, p in inspect.signature(Mixup).parameters.items()}
    if not any(mixup.get(k, defaults[k]) for k in ("mixup_alpha", "cutmix_alpha", "cutmix_minmax")):
        raise ConfigError("mixup: mixes nothing (mixup_alpha and cutmix_alpha 0): raise one, or set mixup=null")
    try:
        Mixup(**mixup, num_classes=2)
    except (AssertionError, TypeError, ValueError) as err:
        reason = str(err) or "cutmix_minmax must be [low, high]"  # its one bare assert
        raise ConfigError(f"mixup={_shown(mixup)}: timm's Mixup refuses it ({reason})") from None


def _check_arguments(node: DictConfig, key: str, target: Any = None, taken: tuple[str, ...] = ()) -> None:
    """Every setting under `key` must be an argument of `target` (default: the node's _target_): an experiment
    written for one data group can set keys that another group's module does not take (fashion_mnist_best's
    crop_padding, data=imagefolder); a misspelt Trainer or Mixup argument would fail after the data is read."""
    target = target or get_class(node._target_)
    parameters = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    settings = [name for name in parameters if name not in taken]
    unknown = sorted(k for k in node if not k.startswith("_") and k not in settings)
    if unknown:
        where = f" ({key}._target_={node._target_})" if "_target_" in node else ""
        raise ConfigError(
            f"{', '.join(f'{key}.{k}' for k in unknown)}: not a setting of {target.__name__}{where}; "
            f"drop it with {' '.join(f'~{key}.{k}' for k in unknown)}, or choose another {key} group; "
            f"its settings: {', '.join(settings)}"
        )
