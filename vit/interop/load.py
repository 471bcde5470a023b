"""The one way from a checkpoint file to a model: visualization, fine-tuning, export and prediction call
`load` (public as vit.checkpoint.load). The format is detected here and read by its own file beside this one
(timm/, torchvision.py, open_clip.py, jax.py, hugging_face.py; our training checkpoints' parts are checked in
training_checkpoint.py); nothing read from a file runs (files.py).

Our Lightning checkpoints carry the model's ViTConfig (hyper_parameters["model"]), its weights
(state_dict, keys "model.*") and the data facts the model was trained with (DATA_FACTS: per-channel
mean and std, class names, evaluation's crop_pct and interpolation), so that an image is preprocessed the
way evaluation did; and its task (hyper_parameters["task"]["kind"]) with a multi-label model's thresholds (THRESHOLDS),
so that its outputs are read as evaluation read them. Our exports carry the same (TASK_METADATA).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import Tensor

from vit.data.facts import DATA_FACTS
from vit.interop.adapt import config_hint
from vit.interop.files import (
    CheckpointError,
    Converted,
    json_kind,
    parse_json,
    read,
    read_json_object,
    read_safetensors,
)
from vit.interop.frozen import FROZEN, FinetuneConfig, FrozenRecord, rebuild
from vit.interop.hub import resolve
from vit.interop.hugging_face import from_hugging_face, hugging_face_to_timm, is_hugging_face, refuse_bare_family
from vit.interop.jax import from_jax
from vit.interop.loaded import TASK_METADATA, THRESHOLDS, VIEWS, Loaded, build, described
from vit.interop.lora import merged_weights
from vit.interop.open_clip import from_open_clip, from_open_clip_folder, is_open_clip, is_open_clip_folder
from vit.interop.sharded import CONSOLIDATE, is_sharded_checkpoint
from vit.interop.timm import TIMM_CONFIG, from_timm_folder, from_timm_state, is_timm_folder
from vit.interop.torchvision import from_torchvision, is_torchvision, with_weights_transform
from vit.interop.training_checkpoint import read_training_checkpoint, recorded_config
from vit.model import ViTConfig
from vit.model.size import check_depth, check_memory

__all__ = ["VIEWS", "Loaded", "load", "load_graph"]  # Loaded and its views are read from here by the callers of load

MODEL_PREFIX = "model."  # ViTClassifier holds the network as self.model
VIT_CONFIG = "vit_config"  # .safetensors metadata entry written by vit.cli.export: the ViTConfig as JSON
VIEWS_METADATA = "test_time_views"  # .safetensors metadata entry written by vit.cli.export: VIEWS as JSON
# what an export records beside its weights (.safetensors metadata, ONNX metadata_props), each a JSON object
EXPORT_METADATA = (VIT_CONFIG, DATA_FACTS, VIEWS_METADATA, TASK_METADATA)


def _json_object(metadata: dict[str, str], key: str) -> dict[str, Any]:
    """An export's metadata entry (.safetensors metadata, ONNX metadata_props), a JSON object ({} where absent)."""
    value = parse_json(metadata.get(key, "{}"), f"its metadata {key}")
    if not isinstance(value, dict):
        raise ValueError(f"its metadata {key} holds {json_kind(value)}, not a JSON object")
    return value


def _from_lightning(path: Path, contents: dict[str, Any], seen: frozenset[Path]) -> Loaded:
    checkpoint = read_training_checkpoint(path, contents)
    config, hparams, state = checkpoint.config, checkpoint.hyper_parameters, checkpoint.state_dict
    weights = {k.removeprefix(MODEL_PREFIX): v for k, v in state.items() if str(k).startswith(MODEL_PREFIX)}
    try:
        finetune = FinetuneConfig.of(hparams.get("finetune"))
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{path}: hyper_parameters.finetune: {err}") from None
    if FROZEN in contents:  # a partly fine-tuned run's: the frozen rest, from the pretrained file it names
        record = FrozenRecord.read(contents[FROZEN], path)
        if path.resolve() in seen:  # a record naming its own file, or two naming each other
            raise CheckpointError(f"{path}: its frozen weights are to come from itself ({record.reference})")
        try:
            start = _load(record.reference, config_hint(config.to_dict()), seen | {path.resolve()})
        except CheckpointError as err:
            raise CheckpointError(
                f"{path}: holds only the weights that learned; its frozen rest cannot be read ({err})"
            ) from None
        weights = {**rebuild(path, record, (start.config, start.model.state_dict()), config, finetune), **weights}
    if finetune.lora is not None:  # peft's adapters, folded into the weights
        try:
            check_depth(config, weights)  # before building it, as build checks a plain network
            check_memory(config)
            weights = merged_weights(config, weights, finetune.lora)
        except (ValueError, TypeError, KeyError, RuntimeError) as err:
            raise CheckpointError(f"{path}: its LoRA adapters do not fit the network it records ({err})") from None
    task = hparams.get("task")  # the run's task settings, whose kind says what the outputs answer
    kind = task.get("kind") if isinstance(task, dict) else task  # read_task names a record of another kind
    task = {"kind": kind, THRESHOLDS: contents.get(THRESHOLDS)}
    return build(path, config, weights, contents.get(DATA_FACTS, {}), hparams, task)


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
    return _load(path, config, frozenset())


def _load(path: str | Path, config: ViTConfig | None, seen: frozenset[Path]) -> Loaded:
    """load(), within the reading of the partly fine-tuned checkpoints `seen`, whose frozen weights come from it."""
    resolved = resolve(path)
    loaded = _load_path(resolved.path, config, seen)
    source = resolved.source
    if source is None:
        return loaded
    if "weights" in source:  # torchvision's: its evaluation transform says how its weights read images
        loaded = with_weights_transform(loaded, source)
    return replace(loaded, source=source)


def _load_path(path: Path, config: ViTConfig | None, seen: frozenset[Path]) -> Loaded:
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
            elif is_timm_folder(path):  # ours (vit.cli.export) record the task beside what timm reads
                task = read_json_object(path / TIMM_CONFIG).get(TASK_METADATA)
                return build(path, *from_timm_folder(path), task=task)
            else:
                converted = from_hugging_face(path)
        elif path.suffix == ".npz":
            converted = from_jax(path, config)
        elif path.suffix == ".safetensors":
            tensors, metadata = read_safetensors(path)
            if VIT_CONFIG in metadata:  # written by vit.cli.export
                config, facts, views, task = (_json_object(metadata, key) for key in EXPORT_METADATA)
                return build(path, recorded_config(config, path), tensors, facts, views, task)
            converted = from_state_dict(tensors, config, path)
        else:
            contents = read(path)
            if "hyper_parameters" in contents:
                return _from_lightning(path, contents, seen)
            converted = from_state_dict(_unwrap(contents), config, path)
    except CheckpointError:
        raise
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"{path}: {err.args[0] if err.args else err}") from None
    return build(path, *converted)


def load_graph(path: str | Path) -> Loaded:
    """How to read images and outputs for an ONNX graph of `python -m vit.cli.export --format onnx` (fp32 or int8):
    the ViTConfig, data facts, test-time views and task its metadata_props record (EXPORT_METADATA), around a
    network without weights (loaded.described). The graph computes the logits, the views included. A graph without
    those records (another tool's, or an export of before they were kept) is refused: its images' size, channels
    and normalisation would be guesses."""
    try:
        import onnx
        from google.protobuf.message import DecodeError
    except ImportError:
        raise CheckpointError(f"{path}: reading an ONNX graph's records needs onnx: pip install onnx") from None
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such ONNX file")
    try:
        graph = onnx.load(str(path), load_external_data=False)  # the records only: weights beside it stay there
    except (OSError, DecodeError, ValueError) as err:
        raise CheckpointError(f"{path}: not an ONNX graph ({str(err).splitlines()[0] if str(err) else err})") from None
    metadata = {entry.key: entry.value for entry in graph.metadata_props}
    if missing := [key for key in (VIT_CONFIG, DATA_FACTS) if key not in metadata]:
        raise CheckpointError(
            f"{path}: its metadata_props record no {missing[0]}, so how it reads images is unknown: export it again "
            "with python -m vit.cli.export --format onnx"
        )
    try:
        config, facts, views, task = (_json_object(metadata, key) for key in EXPORT_METADATA)
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None
    return described(path, recorded_config(config, path), facts, views, task)
