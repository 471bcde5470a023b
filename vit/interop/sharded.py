"""Sharded training checkpoints (trainer=fsdp, vit/training/sharding.py): a folder of torch.distributed.checkpoint
(DCP) files, each rank's shard of the weights and optimizer state, with Lightning's meta.pt (loops, callbacks,
hyper-parameters). Read here without a process group: its recorded parts for a run that resumes it, and the whole
of it, as one training checkpoint, for `python -m vit.cli.consolidate`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from vit.interop.files import CheckpointError, read

META = "meta.pt"  # Lightning's name
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's
CONSOLIDATE = "python -m vit.cli.consolidate"


def is_sharded_checkpoint(path: Path) -> bool:
    """A folder of shards with DCP's metadata and Lightning's meta.pt, not a single-file checkpoint."""
    return path.is_dir() and (path / DCP_METADATA).is_file() and (path / META).is_file()


def read_meta(path: Path) -> dict[str, Any]:
    """meta.pt: everything of the checkpoint but the tensors of the weights and optimizer (state_dict: {})."""
    contents = read(path / META)
    if not isinstance(contents, dict):
        raise CheckpointError(f"{path / META}: not a mapping")
    return {**contents, "state_dict": {}}


def consolidated(path: Path) -> dict[str, Any]:
    """The sharded checkpoint at `path` as one training checkpoint's contents: meta.pt's parts and the whole
    state_dict of plain tensors, gathered from every shard in this one process (torch's dcp_to_torch_save);
    without the optimizer state, which only a resumed run (that reads the folder itself) needs."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    meta = read_meta(path)
    with tempfile.TemporaryDirectory(dir=path.parent) as folder:
        whole = Path(folder) / "whole.pt"
        try:
            dcp_to_torch_save(path, whole)
        except Exception as err:  # DCP's CheckpointException and whatever its reader meets in a broken folder
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CheckpointError(f"{path}: its shards cannot be read ({type(err).__name__}: {reason})") from None
        state = read(whole).get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: its shards hold no state_dict")
    return {**meta, "state_dict": state}
