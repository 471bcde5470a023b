"""--out, shared by the command lines that write one file or folder (export, visualize, consolidate)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vit.atomic import WriteError


def write_out(out: Path, write: Callable[[], None], bad_input: type[Exception] = ValueError) -> None:
    """Run `write`, which makes `out`, then say so; bad input (`bad_input`) or a failed write is one line and a
    non-zero exit instead of a traceback."""
    try:
        write()
    except bad_input as err:
        raise SystemExit(str(err)) from None
    except WriteError as err:
        raise SystemExit(f"--out {err}") from None
    print(f"wrote {out}")
