"""Atomic writes: the temporary file a killed writer leaves behind is removed by the next write of the same
file on the same host, and nothing that may still be in use is touched."""

import os
import socket
import subprocess
import sys

from vit.atomic import write_atomically


def test_the_next_write_removes_dead_writers_temporary_files_and_only_those(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # reaped: its process id is free
    dead, host = finished.pid, socket.gethostname()
    files = {
        "dead writer here": f".out.bin.{host}.{dead}-1.partial",
        "live writer here (this process, another thread)": f".out.bin.{host}.{os.getpid()}-999.partial",
        "writer on another host": f".out.bin.other-node.{dead}-1.partial",
        "another file's dead writer": f".other.bin.{host}.{dead}-1.partial",
    }
    for name in files.values():
        (tmp_path / name).write_bytes(b"half a file")
    write_atomically(tmp_path / "out.bin", lambda partial: partial.write_bytes(b"whole"))
    assert (tmp_path / "out.bin").read_bytes() == b"whole"
    left = {what for what, name in files.items() if (tmp_path / name).exists()}
    assert left == set(files) - {"dead writer here"}
