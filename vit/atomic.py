"""Writing a file so that no crash, full disk or kill leaves it half written: a temporary file in the same
folder, flushed to disk, then renamed over the old one. Checkpoints, exports, figures and unpacked datasets
use it; a folder of files that belong together (a timm export) is written the same way, as a whole."""

from __future__ import annotations

import ctypes
import errno
import functools
import glob
import logging
import os
import re
import shutil
import socket
import sys
import threading
from collections.abc import Callable, Collection
from pathlib import Path

log = logging.getLogger(__name__)

_HOST = socket.gethostname()  # in temporary names: process ids identify a writer only on its own host
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # Linux's: paths relative to the working folder; swap the two


class WriteError(OSError):
    """A file or folder that could not be written; the message names it and says what is left."""


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


def write_folder_atomically(out: Path, write: Callable[[Path], None], names: Collection[str]) -> None:
    """write(temporary folder) fills a new folder beside `out` with the files `names`; each is flushed to disk, then
    the folder takes `out`'s place in one step, so that a reader finds the previous folder whole or the new one
    whole, never one's files beside the other's (an export whose weights and config.json belong together). On any
    failure before that step the temporary folder is removed, `out` is as it was, and a WriteError says so.

    An existing `out` holding anything but `names` is refused before any writing: the swap would delete it.

    The step is Linux's renameat2(RENAME_EXCHANGE), which swaps the two folders at once. Where the filesystem or
    system lacks it (NFS, many FUSE mounts, macOS), `out` is renamed aside and the new folder renamed into its
    place: between the two renames `out` is absent for an instant, and a writer killed there leaves the previous
    folder under a hidden name beside it, which the next write of `out` on the same host first puts back."""
    place = Path(out).resolve()  # a link's target, and a name for '.': the swap renames the folder itself
    if place.is_dir() and (others := sorted(p.name for p in place.iterdir() if p.name not in names)):
        raise WriteError(
            f"{out}: not replaced: it holds {', '.join(others[:5])}{', ...' * (len(others) > 5)}, which replacing "
            f"the folder would delete; name a new folder, or one holding only {', '.join(sorted(names))}"
        )
    partial = place.with_name(f".{place.name}.{_HOST}.{os.getpid()}-{threading.get_ident()}.partial")
    try:
        if place.exists() and not place.is_dir():
            raise NotADirectoryError("a file, not a folder, is in the way")
        place.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(place)
        swapped = False
        try:
            partial.mkdir()
            write(partial)
            for path in partial.iterdir():
                _fsync(path)
            _fsync(partial)
            previous = _swap(partial, place)
            swapped = True
        finally:
            if not swapped:
                shutil.rmtree(partial, ignore_errors=True)
    except Exception as err:
        raise WriteError(
            f"{out}: could not be written ({err.__class__.__name__}: {err}); the previous folder, if any, is intact"
        ) from err
    try:
        _fsync(place.parent)
    except OSError as err:
        log.warning("%s: written, but its folder could not be flushed to disk (%s)", out, err)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
        if previous.exists():
            log.warning("%s: written; the previous folder could not be removed and is left at %s", out, previous)


def _swap(new: Path, out: Path) -> Path | None:
    """Put the folder `new` in `out`'s place in one step; returns where the previous folder now is (None: none)."""
    if not out.exists():
        os.rename(new, out)  # fails, rather than merging, should another writer have made a non-empty `out` since
        return None
    if _exchange(new, out):
        return new
    aside = new.with_suffix(".previous")  # found and put back by _remove_stale_partials, should this writer die now
    os.rename(out, aside)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(aside, out)
        raise
    return aside


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths at once by Linux's renameat2(RENAME_EXCHANGE), which Python's os does not offer; False where
    the system or the filesystem lacks it."""
    rename = getattr(_libc(), "renameat2", None) if sys.platform == "linux" else None
    if rename is None:
        return False
    if rename(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    if (err := ctypes.get_errno()) in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_partials(out: Path) -> None:
    """Delete the temporary files and folders of `out` left by writers of this host whose process is gone, first
    putting back a previous folder that such a writer had renamed aside (write_folder_atomically) where `out` is
    missing. Other hosts' (a shared filesystem) are left alone: their process ids mean nothing here."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?P<host>.+)\.(?P<pid>\d+)-\d+\.(?P<kind>partial|previous)")
    for path in out.parent.glob(f".{glob.escape(out.name)}.*.p*"):  # a name may hold [ ] * ?
        match = pattern.fullmatch(path.name)
        if not match or match["host"] != _HOST or _alive(int(match["pid"])):
            continue
        if match["kind"] == "previous" and not out.exists():
            os.rename(path, out)
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True
