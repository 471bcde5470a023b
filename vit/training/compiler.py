"""compile=true on a machine that cannot compile: torch.compile builds CPU kernels with the machine's C++ compiler
and Python's headers, which a fresh machine may lack, and would fail at the first training step with a compiler's
traceback. A two-op function compiled before training finds out (milliseconds once inductor has cached it); where it
fails, one warning names the cause and the run trains eager.

Inductor's CPU cache is kept per vector instruction set (isa_cache_dir): torch 2.14 takes kernels cached by a process
that built them for another (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 host, or one cache folder shared by AVX2 and
AVX-512 nodes) as hits, and the run then corrupts memory ('corrupted size vs. prev_size') or trains on NaN. Its
kernels are built with -march=native, so two CPUs of one vector ISA (a Zen 4 with avx512_bf16, a Skylake-X without)
still need two folders: the folder's name carries a digest of the CPU's feature flags too.

What compile=true compiles of a network: the whole of it (ViTClassifier), or its layers where a feature's batches
need it (vit/training/native_size.py)."""

from __future__ import annotations

import hashlib
import logging
import os

import torch

from vit.training.precision import cpu_flags, uses_cuda

log = logging.getLogger(__name__)


def _probe(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin()


def compile_problem(device: str = "cpu") -> str | None:
    """Why torch.compile cannot build kernels for `device` here, in one line; None where it can."""
    try:
        torch.compile(_probe, dynamic=False)(torch.ones(4, device=device))
    except Exception as err:  # a missing compiler or header surfaces as any of inductor's error types
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        return f"{type(err).__name__}: {lines[0] if lines else 'no message'}"
    finally:
        torch.compiler.reset()  # the probe's graph stays out of the run's recompile counts
    return None


CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"


def isa_cache_dir() -> str:
    """Point inductor's cache at a folder of this host's vector ISA and CPU flags inside the one it would use (the
    user's TORCHINDUCTOR_CACHE_DIR, else torch's default), unless it is one already; returns it."""
    # private to torch: tests/training/test_compiler.py pins what it returns
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    flags = cpu_flags()
    isa = torch.backends.cpu.get_cpu_capability().lower() + ("-amx" if "amx_tile" in flags else "")
    name = f"cpu-{isa}-{hashlib.sha256(' '.join(sorted(flags)).encode()).hexdigest()[:8]}"
    folder = cache_dir()
    if os.path.basename(folder) != name:
        os.environ[CACHE_DIR] = folder = os.path.join(folder, name)
    return folder


def _not_about_cuda(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("No CUDA runtime is found")


def resolve_compile(compile: bool, accelerator: str) -> bool:
    """compile, unless it was asked of a CPU whose kernels cannot be built here: then False, with one warning."""
    if not compile or uses_cuda(accelerator):  # GPUs: triton ships its own compiler
        return compile
    # torch's warning, as inductor first builds CPU kernels on a machine with a CUDA toolkit, concerns GPUs only
    extension_log = logging.getLogger("torch.utils.cpp_extension")
    if _not_about_cuda not in extension_log.filters:
        extension_log.addFilter(_not_about_cuda)
    isa_cache_dir()
    problem = compile_problem("cpu")
    if problem is None:
        return True
    log.warning("compile=true: torch.compile cannot build CPU kernels on this machine (%s); training eager", problem)
    return False
