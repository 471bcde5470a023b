"""glibc's malloc gives large freed blocks back to the kernel: those over its mmap threshold are unmapped as they are
freed, and the heap's free top is trimmed. A training step frees its activations and allocates them again, so every
step then faults in fresh zeroed pages. Keeping freed memory in the process, as jemalloc and tcmalloc do and as
PyTorch's CPU tuning guide advises, ends the faults. The cost: memory is not handed back until the process ends,
and fragments more (benchmarks/NOTES.md change 32).

Left alone where the user has tuned malloc (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES) or
where the C library is not glibc."""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)
KEEP = 2**31 - 1  # the largest value mallopt takes (an int): blocks up to 2 GiB come from the heap and stay there
USER_TUNING = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks for reuse instead of returning them to the kernel; whether it now does."""
    if platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in USER_TUNING):
        return False
    libc = ctypes.CDLL(None)
    return libc.mallopt(M_MMAP_THRESHOLD, KEEP) == 1 and libc.mallopt(M_TRIM_THRESHOLD, KEEP) == 1
