"""Every checkpoint Lightning saves, written atomically (vit/atomic.py): a temporary file in the same folder,
flushed to disk, then renamed over the old one, so a crash, a full disk or a kill at any moment leaves the
previous checkpoint whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from vit.atomic import WriteError, write_atomically
from vit.interop.files import CheckpointError, nonfinite


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, made atomic, and refusing weights that are not finite (a checkpoint
    to resume from must never hold NaN or infinity)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if bad := nonfinite(checkpoint.get("state_dict", {})):
            raise CheckpointError(f"{path}: not written: non-finite values in {', '.join(bad[:5])}")
        try:
            write_atomically(Path(path), lambda partial: torch.save(checkpoint, partial))
        except WriteError as err:
            raise CheckpointError(str(err)) from err
