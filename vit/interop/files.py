"""Reading checkpoint files so that nothing in them runs: torch.load(weights_only=True) and safetensors."""

from __future__ import annotations

import errno
import json
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from vit.model.config import ViTConfig

# What every format's reader returns: the architecture, our state dict, and the data facts the file records.
Converted = tuple[ViTConfig, dict[str, Tensor], dict[str, Any]]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file."""


def read(path: str | Path) -> dict[str, Any]:
    """The checkpoint's contents on the CPU, read without running any pickled code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        contents = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        unsafe = re.search(r"GLOBAL (\S+)", str(err))
        if unsafe:  # weights_only refused a global: loading it would have run code
            raise CheckpointError(
                f"{path}: refused: it pickles {unsafe[1]}, not only tensors and plain containers, and that could "
                "run code when loaded"
            ) from None
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated, corrupt, or another kind of file)"
        ) from None
    except OSError as err:
        if err.errno in (errno.EINVAL, None):  # torch's zip reader on a file cut short: not the disk's fault
            raise CheckpointError(f"{path}: not a readable checkpoint (truncated or corrupt)") from None
        raise CheckpointError(f"{path}: cannot be read: {err.strerror or err}") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, KeyError, IndexError) as err:
        # torch's RuntimeErrors say what is wrong (e.g. a truncated zip); a pickle's KeyError says nothing useful
        what = str(err).splitlines()[0] if isinstance(err, RuntimeError) else "truncated, corrupt, or not a checkpoint"
        raise CheckpointError(f"{path}: not a readable checkpoint ({what})") from None
    if not isinstance(contents, dict):
        raise CheckpointError(f"{path}: holds a {type(contents).__name__}, not a checkpoint dictionary")
    return contents


# configs nest a few levels (a CLIP config's text_config.rope_scaling); json.loads itself meets Python's recursion
# limit near 1000 levels, and what reads the values recurses too
MAX_JSON_DEPTH = 32


def parse_json(text: str, name: str) -> Any:
    """The JSON value in `text`, at most MAX_JSON_DEPTH arrays and objects deep; ValueError naming `name` (a file,
    an entry) where it is not JSON or nests deeper."""
    try:
        value = json.loads(text)
    except RecursionError:
        deepest = MAX_JSON_DEPTH + 1
    except ValueError as err:
        raise ValueError(f"{name} is not JSON: {err}") from None
    else:
        deepest, stack = 0, [(value, 1)]
        while stack and deepest <= MAX_JSON_DEPTH:
            node, depth = stack.pop()
            if isinstance(node, (dict, list)):
                deepest = max(deepest, depth)
                stack += [(child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)]
    if deepest > MAX_JSON_DEPTH:
        raise ValueError(f"{name} nests arrays or objects more than {MAX_JSON_DEPTH} deep, which no config does")
    return value


def read_json_object(path: Path) -> dict[str, Any]:
    """A config file that must hold a JSON object; anything else is refused naming the file, not a traceback."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path.name} is not JSON: {err}") from None
    values = parse_json(text, path.name)
    if not isinstance(values, dict):
        raise ValueError(f"{path.name} holds {json_kind(values)}, not a JSON object")
    return values


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words: 'an array', 'null', ..."""
    if value is None:
        return "null"
    return {list: "an array", str: "a string", bool: "a boolean", dict: "an object"}.get(type(value), "a number")


def read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors and metadata of a .safetensors file (a format that cannot carry code)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"not a readable .safetensors file (truncated or corrupt?): {err}") from None


def read_weights(path: Path) -> dict[str, Tensor]:
    """A hub folder's weights file (.safetensors, or a torch.save'd state dict such as pytorch_model.bin): tensors
    by name, any other entry refused naming the file and the entry."""
    if path.suffix == ".safetensors":
        return read_safetensors(path)[0]
    contents = read(path)
    for key, value in contents.items():
        if not isinstance(key, str):
            raise CheckpointError(f"{path}: an entry is named {key!r}, a {type(key).__name__}, not a weight's name")
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{path}: {key} is not a tensor (a Python {type(value).__name__})")
    return contents


def refuse_nonfinite(tensors: dict[str, Any], path: Path) -> None:
    """Refuse, naming the file and the first tensors, weights holding NaN or infinity (nonfinite)."""
    if bad := nonfinite(tensors):
        raise CheckpointError(f"{path}: non-finite values (NaN or infinity) in {', '.join(bad[:5])}")


def nonfinite(tensors: dict[str, Any]) -> list[str]:
    """The names of floating-point tensors holding NaN or infinity: weights no reader may use and no writer write."""
    return sorted(
        k for k, v in tensors.items() if isinstance(v, Tensor) and v.is_floating_point() and not v.isfinite().all()
    )
