"""Writing a file so that no crash, full disk or kill leaves it half written: a temporary file in the same
folder, flushed to disk, then renamed over the old one. Checkpoints, exports and unpacked datasets use it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path


class WriteError(OSError):
    """A file that could not be written; the message names it, and the previous file is intact."""


def write_atomically(out: Path, write: Callable[[Path], None]) -> None:
    """write(temporary path), fsync it, rename it to `out`, fsync the folder. On any failure the temporary
    file is removed, `out` is as it was, and a WriteError names `out` and the cause. The temporary name
    is the writer's own (process and thread), so concurrent writers of one file never share it: the last
    rename wins and every reader sees some writer's whole file."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}-{threading.get_ident()}.partial")
    try:
        write(partial)
        _fsync(partial)
        os.replace(partial, out)
        _fsync(out.parent)
    except Exception as err:
        raise WriteError(
            f"{out}: could not be written ({err.__class__.__name__}: {err}); the previous file, if any, is intact"
        ) from err
    finally:
        partial.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
