import ctypes
import os
import platform
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from vit.training.allocator import keep_freed_memory

# a fresh process, with glibc's own thresholds: a 64 MiB block (over the 32 MiB its adaptive threshold may rise to)
# is mapped by itself and unmapped when freed; with freed memory kept it comes from the heap, and stays there
FREE_A_BLOCK = """
import ctypes, torch
from vit.training.allocator import keep_freed_memory
FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
for keep in (False, True):
    kept = keep and keep_freed_memory()
    block = torch.empty(64 << 20, dtype=torch.uint8)
    mapped = libc.mallinfo2().hblkhd >= 64 << 20
    del block
    print(kept, mapped, libc.mallinfo2().fordblks >= 64 << 20)
"""
GLIBC_2_33 = platform.libc_ver()[0] == "glibc" and hasattr(ctypes.CDLL(None), "mallinfo2")


@pytest.mark.skipif(not GLIBC_2_33, reason="glibc's malloc, 2.33 or later (mallinfo2)")
def test_freed_activations_stay_in_the_process_for_the_next_step():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    run = subprocess.run(
        [sys.executable, "-c", FREE_A_BLOCK], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
    )
    assert run.stdout.split() == ["False", "True", "False", "True", "False", "True"], run.stderr[-2000:]


def test_a_user_s_own_malloc_tuning_is_left_alone(monkeypatch):
    monkeypatch.setattr("ctypes.CDLL", lambda *args: pytest.fail("mallopt called"))
    for name in ("MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        with monkeypatch.context() as env:
            env.setenv(name, "1")
            assert keep_freed_memory() is False
