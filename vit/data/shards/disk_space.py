"""A shard write's disk space: checked before writing where the bytes are known, and watched while writing, so that
a disk that fills up stops the write with one line naming the folder and the bytes instead of hanging it.

litdata's writer fails on a full disk in the worker that writes, and where that is the worker's last write (its
index), the worker never exits (it waits for a helper process that nothing tells to stop) and the writer waits for
it for ever. The watch interrupts the main thread when the disk is full and nothing has been written for a while.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from vit.data.errors import DataError

STALL_SECONDS = 30.0  # no byte written for this long with the disk full: the writer is stuck, not slow
POLL_SECONDS = 0.5
INDEX_BYTES = 4096  # litdata's index.json and its checkpoint beside the chunks, generously


def free_bytes(folder: Path) -> int:
    """The bytes free to this process on the disk that holds `folder` (its nearest existing parent)."""
    return shutil.disk_usage(_existing(folder)).free


def _existing(folder: Path) -> Path:
    """`folder`, or its nearest parent that exists."""
    existing = folder.expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    return existing


def block_size(folder: Path) -> int:
    """The disk's block, the least space a file takes there."""
    return os.statvfs(_existing(folder)).f_frsize


def written_bytes(folder: Path) -> int:
    """The bytes of the files under `folder` (0 where it does not exist yet)."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):  # renamed or removed meanwhile
                total += os.path.getsize(os.path.join(parent, name))
    return total


def check_space(folder: Path, need: int, what: str) -> None:
    """Refuse, before writing, a write of about `need` bytes into `folder` that its disk has no room for."""
    free = free_bytes(folder)
    if need > free:
        raise DataError(
            f"the disk of {folder} has {free:,} bytes free, but {what} needs about {need:,} bytes: free "
            f"{need - free:,} bytes there (or choose another folder), then rerun to continue"
        )


def full_disk(folder: Path, need: int | None, what: str) -> str:
    """The line that names a disk found full while writing into `folder`."""
    needs = f"{what} needs about {need:,} bytes in all" if need else f"{what} needs more"
    return (
        f"the disk of {folder} is full ({free_bytes(folder):,} bytes free; {needs}): free space there (or choose "
        f"another folder), then rerun to continue"
    )


@contextlib.contextmanager
def stop_when_full(folder: Path, room: int, need: int | None, what: str) -> Iterator[None]:
    """Watch the write into `folder` from a thread: once its disk has less than `room` bytes free (the next chunk's)
    and nothing has been written under it for STALL_SECONDS, raise a DataError naming it (and `need`, the bytes of
    the whole write, where known) in the main thread, by a signal, which ends the wait a stuck writer leaves that
    thread in. Outside the main thread, nothing is watched."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    full: list[str] = []

    def interrupt(signum: int, frame: object) -> None:
        if full:  # only the watch's own signal stops the write
            raise DataError(full[0])

    previous = signal.signal(signal.SIGUSR2, interrupt)
    done = threading.Event()

    def watch() -> None:
        last, still = -1, 0.0
        while not done.wait(POLL_SECONDS):
            written = written_bytes(folder)
            still = still + POLL_SECONDS if written == last else 0.0
            last = written
            free = free_bytes(folder)
            if free < room and still >= STALL_SECONDS:
                full.append(full_disk(folder, need, what))
                signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
                return

    watcher = threading.Thread(target=watch, name="disk-space watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGUSR2, previous)
