"""Sharded training checkpoints (trainer=fsdp, vit/training/sharding.py): a folder of torch.distributed.checkpoint
(DCP) files, each rank's shard of the weights and optimizer state, with Lightning's meta.pt (loops, callbacks,
hyper-parameters). Read here, through vit/interop/dcp.py's reader, so that nothing in the folder runs: its recorded
parts and its shapes for a run that resumes it, its tensors into that run's shards, and the whole of it, as one
training checkpoint without a process group, for `python -m vit.cli.consolidate`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from vit.interop.files import CheckpointError, read

META = "meta.pt"  # Lightning's name
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's
CONSOLIDATE = "python -m vit.cli.consolidate"
STATE = "state_dict."  # the Lightning module's tensors, as DCP flattens their names (the optimizer's: optimizer_0.)


def is_sharded_checkpoint(path: Path) -> bool:
    """A folder of shards with DCP's metadata and Lightning's meta.pt, not a single-file checkpoint."""
    return path.is_dir() and (path / DCP_METADATA).is_file() and (path / META).is_file()


def read_meta(path: Path) -> dict[str, Any]:
    """meta.pt: everything of the checkpoint but the tensors of the weights and optimizer (state_dict: {})."""
    contents = read(path / META)
    if not isinstance(contents, dict):
        raise CheckpointError(f"{path / META}: not a mapping")
    return {**contents, "state_dict": {}}


def check(path: Path) -> Any:
    """Refuse, naming the file, a folder of shards that cannot be read whole or would run code when read, before
    any process starts reading it. Returns the folder's reader (vit/interop/dcp.py), which reads it without a
    second check."""
    from vit.interop.dcp import SafeReader

    return SafeReader(path)


def saved_shapes(shards: Any) -> dict[str, torch.Size]:
    """The shape of each of the Lightning module's tensors in the `check`ed folder (not the optimizer's)."""
    return {name: item.size for name, item in _module_tensors(shards.metadata).items()}


def load_into(shards: Any, state: dict[str, Any]) -> None:
    """DCP's load of the tensors in `state` from the `check`ed folder (each rank its own part, where a process group
    runs), through the reader that runs nothing; what DCP raises is one line naming the folder or file."""
    from torch.distributed.checkpoint import load

    from vit.interop.dcp import reading

    with reading(Path(shards.path)):
        load(state, storage_reader=shards)


def consolidated(path: Path) -> dict[str, Any]:
    """The sharded checkpoint at `path` as one training checkpoint's contents: meta.pt's parts and the whole
    state_dict of plain tensors, gathered from every shard in this one process; without the optimizer state, which
    only a resumed run (that reads the folder itself) needs."""
    meta = read_meta(path)
    shards = check(path)
    tensors = _module_tensors(shards.metadata)
    if not tensors:
        raise CheckpointError(f"{path}: its shards hold no state_dict")
    state = {name: torch.empty(item.size, dtype=item.properties.dtype) for name, item in tensors.items()}
    with warnings.catch_warnings():  # one process, no process group: what it warns of is the point
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        load_into(shards, {"state_dict": state})
    return {**meta, "state_dict": state}


def _module_tensors(metadata: Any) -> dict[str, Any]:
    """The Lightning module's tensors among DCP's records, by the module's names."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return {
        name.removeprefix(STATE): item
        for name, item in metadata.state_dict_metadata.items()
        if name.startswith(STATE) and isinstance(item, TensorStorageMetadata)
    }
