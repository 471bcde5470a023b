"""--out, shared by the command lines that write one file or folder (export, visualize, consolidate, probe)."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from vit.atomic import WriteError


def check_out(out: Path, folder: bool = False) -> None:
    """Refuse, before the work whose result it is to hold, an `out` that cannot be written: a folder where a file
    goes (`folder`: a folder is what is written), a file in the way of its folder, or a folder this process may not
    write in. The write itself would find each only after the work, its result lost. One line in the words the
    write would use, and a non-zero exit; the folder is made, as the write would make it."""
    try:
        if out.is_dir() and not folder:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(out))
        out.parent.mkdir(parents=True, exist_ok=True)
        # a file made and removed where the write makes its own: permissions, a read-only disk, ACLs, all as they are
        fd, probe = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".check")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        kind = "folder" if folder else "file"
        raise SystemExit(
            f"--out {out}: could not be written ({err.__class__.__name__}: {err}); the previous {kind}, if any, is "
            "intact"
        ) from None


def write_out(
    out: Path, write: Callable[[], None], bad_input: type[Exception] = ValueError, folder: bool = False
) -> None:
    """check_out, then run `write`, which makes `out` (a folder where `folder`), then say so; bad input
    (`bad_input`) or a failed write is one line and a non-zero exit instead of a traceback."""
    check_out(out, folder)
    try:
        write()
    except bad_input as err:
        raise SystemExit(str(err)) from None
    except WriteError as err:
        raise SystemExit(f"--out {err}") from None
    print(f"wrote {out}")
