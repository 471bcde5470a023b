"""Ending the processes a block started when it fails, grandchildren included: litdata's writer terminates its
workers, but not the processes each worker started, which, orphaned, would run on holding the terminal's output."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # Linux's prctl options, <linux/prctl.h>


@contextlib.contextmanager
def no_processes_left_on_failure():
    """Where the block fails, end the processes it started that still run. litdata terminates its workers but not
    the processes each worker started, which, orphaned, run on forever holding stdout (so `... | tail` never ends):
    on Linux this process adopts its descendants' orphans meanwhile (a child subreaper), so that none escapes."""
    before = _descendants()
    adopting = _child_subreaper(True)
    try:
        yield
    except BaseException:
        _end(_descendants() - before)
        raise
    finally:
        if adopting is not None:
            _child_subreaper(adopting)


def _child_subreaper(on: bool) -> bool | None:
    """Set whether this process adopts its descendants' orphans (instead of init); returns the setting it had, or
    None where it cannot be set (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    was = ctypes.c_int()
    if prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) or prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0):
        return None
    return bool(was.value)


def _descendants() -> set[int]:
    """The processes below this one, by pid, as /proc lists them (Linux; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # it ended meanwhile
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])  # after '(name)': state, ppid
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [os.getpid()]
    while todo:
        below = children.get(todo.pop(), [])
        found.update(below)
        todo.extend(below)
    return found


def _end(pids: set[int], patience: float = 5.0) -> None:
    """Terminate the processes `pids`, kill those still there after `patience` seconds, and reap those that are
    children of this one by then (multiprocessing reaps its own: reaped here, it would wait on them forever)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + patience
        while pids and time.monotonic() < deadline:
            started = {child.pid for child in multiprocessing.active_children()}  # reaps those that ended
            for pid in pids - started:
                with contextlib.suppress(ChildProcessError):  # not this process's child, or not yet
                    os.waitpid(pid, os.WNOHANG)
            pids = {pid for pid in pids if Path(f"/proc/{pid}").exists()}
            time.sleep(0.02)
