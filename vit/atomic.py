"""Writing a file so that no crash, full disk or kill leaves it half written: a temporary file in the same
folder, flushed to disk, then renamed over the old one. Checkpoints, exports, figures and unpacked datasets
use it."""

from __future__ import annotations

import glob
import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_HOST = socket.gethostname()  # in temporary names: process ids identify a writer only on its own host


class WriteError(OSError):
    """A file that could not be written; the message names it, and the previous file is intact."""


def write_atomically(out: Path, write: Callable[[Path], None]) -> None:
    """write(temporary path), fsync it, rename it to `out`, fsync the folder. On any failure up to the rename
    the temporary file is removed, `out` is as it was, and a WriteError names `out` and the cause.

    A failed folder fsync after the rename (some FUSE and network filesystems refuse it) is logged as a
    warning, not raised: `out` is already the new, whole file, and the most a power loss can then undo is
    the rename, leaving the previous whole file. Raising would call a written file unwritten and, on such
    a filesystem, fail every checkpoint save and so stop training.

    The temporary name is the writer's own (process and thread), so concurrent writers of one file never
    share it: the last rename wins and every reader sees some writer's whole file. A writer killed outright
    (SIGKILL, a node lost) leaves its temporary file behind; the next write of `out` on the same host
    removes it."""
    out = Path(out)
    partial = out.with_name(f".{out.name}.{_HOST}.{os.getpid()}-{threading.get_ident()}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # a file in the way, or no permission: a WriteError too
        _remove_stale_partials(out)
        try:
            write(partial)
            _fsync(partial)
            os.replace(partial, out)
        finally:  # only once the folder exists: under a file in the way, unlink itself would fail
            partial.unlink(missing_ok=True)
    except Exception as err:
        raise WriteError(
            f"{out}: could not be written ({err.__class__.__name__}: {err}); the previous file, if any, is intact"
        ) from err
    try:
        _fsync(out.parent)
    except OSError as err:
        log.warning(
            "%s: written, but its folder could not be flushed to disk (%s); a power loss now may bring back "
            "the previous file",
            out,
            err,
        )


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_partials(out: Path) -> None:
    """Delete the temporary files of `out` left by writers of this host whose process is gone. Other hosts'
    files (a shared filesystem) are left alone: their process ids mean nothing here."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?P<host>.+)\.(?P<pid>\d+)-\d+\.partial")
    for path in out.parent.glob(f".{glob.escape(out.name)}.*.partial"):  # a name may hold [ ] * ?
        match = pattern.fullmatch(path.name)
        if match and match["host"] == _HOST and not _alive(int(match["pid"])):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True
