"""Atomic writes: the temporary file a killed writer leaves behind is removed by the next write of the same
file on the same host, and nothing that may still be in use is touched; a failure is reported truly, before
the rename (the previous file is intact) and after it (the new file is in place)."""

import errno
import logging
import os
import socket
import stat
import subprocess
import sys

import pytest

from vit.atomic import WriteError, write_atomically


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
