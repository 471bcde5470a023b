"""Atomic writes: the temporary file a killed writer leaves behind is removed by the next write of the same
file on the same host, and nothing that may still be in use is touched; a failure is reported truly, before
the rename (the previous file is intact) and after it (the new file is in place). A folder of files is replaced
whole, by either way of swapping folders, or not at all."""

import errno
import logging
import os
import socket
import stat
import subprocess
import sys

import pytest

from vit import atomic
from vit.atomic import WriteError, write_atomically, write_folder_atomically


@pytest.mark.parametrize("name", ["out.bin", "out[v2].bin"])  # '[v2]' would be a glob character class
def test_the_next_write_removes_dead_writers_temporary_files_and_only_those(tmp_path, name):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # reaped: its process id is free
    dead, host = finished.pid, socket.gethostname()
    files = {
        "dead writer here": f".{name}.{host}.{dead}-1.partial",
        "live writer here (this process, another thread)": f".{name}.{host}.{os.getpid()}-999.partial",
        "writer on another host": f".{name}.other-node.{dead}-1.partial",
        "another file's dead writer": f".other.bin.{host}.{dead}-1.partial",
    }
    for partial in files.values():
        (tmp_path / partial).write_bytes(b"half a file")
    write_atomically(tmp_path / name, lambda partial: partial.write_bytes(b"whole"))
    assert (tmp_path / name).read_bytes() == b"whole"
    left = {what for what, partial in files.items() if (tmp_path / partial).exists()}
    assert left == set(files) - {"dead writer here"}


def _refuse_fsync(monkeypatch, folders: bool) -> None:
    """os.fsync fails with EINVAL on folders (as on some FUSE and network filesystems), or on files."""
    real = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode) == folders:
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_failure_before_the_rename_leaves_the_previous_file(tmp_path, monkeypatch):
    out = tmp_path / "last.ckpt"
    out.write_bytes(b"previous")
    _refuse_fsync(monkeypatch, folders=False)
    with pytest.raises(WriteError, match=r"last\.ckpt: could not be written .*previous file, if any, is intact"):
        write_atomically(out, lambda partial: partial.write_bytes(b"new"))
    assert out.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_folder_that_cannot_be_made_is_a_write_error(tmp_path):
    (tmp_path / "blocker").write_bytes(b"a file where the folder would be")
    out = tmp_path / "blocker" / "last.ckpt"
    with pytest.raises(WriteError) as error:
        write_atomically(out, lambda partial: partial.write_bytes(b"new"))
    blocked = f"FileExistsError: [Errno {errno.EEXIST}] {os.strerror(errno.EEXIST)}: '{tmp_path / 'blocker'}'"
    assert str(error.value) == f"{out}: could not be written ({blocked}); the previous file, if any, is intact"
    assert (tmp_path / "blocker").read_bytes() == b"a file where the folder would be"


def test_a_folder_that_cannot_be_synced_after_the_rename_is_a_warning_not_a_false_error(tmp_path, monkeypatch, caplog):
    out = tmp_path / "last.ckpt"
    out.write_bytes(b"previous")
    _refuse_fsync(monkeypatch, folders=True)
    with caplog.at_level(logging.WARNING, logger="vit.atomic"):
        write_atomically(out, lambda partial: partial.write_bytes(b"new"))
    assert out.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert "last.ckpt: written, but its folder could not be flushed to disk" in caplog.text


# folders ------------------------------------------------------------------------------------------------

NAMES = ("config.json", "model.safetensors")


def _fill(config: str, weights: str):
    def write(folder):
        (folder / "model.safetensors").write_text(weights)
        (folder / "config.json").write_text(config)

    return write


def _contents(folder) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir()}


@pytest.fixture(params=["exchange", "two renames"])
def swap(request, monkeypatch):
    """Both ways a folder is put in place: Linux's atomic exchange, and the two renames of other filesystems."""
    if request.param == "two renames":
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    return request.param


def test_a_folder_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path, swap):
    out = tmp_path / "export"
    write_folder_atomically(out, _fill("old config", "old weights"), NAMES)
    write_folder_atomically(out, _fill("new config", "new weights"), NAMES)
    assert _contents(out) == {"config.json": "new config", "model.safetensors": "new weights"}
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_a_failure_while_writing_a_folder_leaves_the_previous_one_whole(tmp_path, swap):
    out = tmp_path / "export"
    write_folder_atomically(out, _fill("old config", "old weights"), NAMES)

    def fail_at_the_second_file(folder):
        (folder / "model.safetensors").write_text("new weights")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError, match=r"export: could not be written .*No space.*the previous folder, if any, is"):
        write_folder_atomically(out, fail_at_the_second_file, NAMES)
    assert _contents(out) == {"config.json": "old config", "model.safetensors": "old weights"}
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_a_folder_holding_other_files_is_not_replaced(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "config.json").write_text("old config")
    with pytest.raises(WriteError, match=r"export: not replaced: it holds notes\.txt, which replacing the folder"):
        write_folder_atomically(out, _fill("new config", "new weights"), NAMES)
    assert _contents(out) == {"notes.txt": "mine", "config.json": "old config"}


def test_a_writer_killed_between_the_two_renames_has_its_previous_folder_put_back_by_the_next(tmp_path):
    """Where the filesystem cannot exchange two folders, `out` is absent between the renames: a writer killed
    there leaves the previous folder aside, and the next write of `out` restores it before its own attempt."""
    out = tmp_path / "export"
    write_folder_atomically(out, _fill("old config", "old weights"), NAMES)
    killed = f"""
import importlib.util, os, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("vit.atomic", {atomic.__file__!r})  # not through vit/__init__.py,
atomic = importlib.util.module_from_spec(spec)  # which imports torch: seconds of a fresh interpreter
spec.loader.exec_module(atomic)
atomic._exchange = lambda a, b: False
rename = os.rename
def rename_then_die(source, target):
    if str(source).endswith(".partial"):  # the new folder's rename into place: killed before it
        os._exit(9)
    rename(source, target)
os.rename = rename_then_die
def write(folder):
    (folder / "config.json").write_text("new config")
atomic.write_folder_atomically(Path({str(out)!r}), write, ["config.json", "model.safetensors"])
"""
    assert subprocess.run([sys.executable, "-c", killed]).returncode == 9
    assert not out.exists()
    with pytest.raises(WriteError):  # the next writer fails too: still, the previous folder is back
        write_folder_atomically(out, lambda folder: 1 / 0, NAMES)
    assert _contents(out) == {"config.json": "old config", "model.safetensors": "old weights"}
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
