"""trainer.precision=auto: the precision this host computes fastest without losing accuracy, said in one line.

On a CPU, bf16 pays only where the cores have bf16 units (AVX-512 BF16 on Zen 4 and Cooper Lake and later, AMX on
Sapphire Rapids and later): elsewhere torch emulates bf16 matrix products, two orders of magnitude slower than
fp32 (benchmarks/NOTES.md change 5). With the units it pays at every width measured, the default 64-wide one-head
model included, eager or compiled: bf16 attention on a CPU is written out, and stays so under torch.compile, instead
of torch's CPU flash kernel (vit/model/attention.py; benchmarks/NOTES.md changes 11, 26 and 27). So auto
picks bf16-mixed on CPUs with those units, 32-true on the rest, and bf16-mixed on GPUs that support it
(16-mixed on older ones). Asking for bf16 on a CPU without the units is allowed, with one warning that measures
what it costs on this host."""

from __future__ import annotations

import logging
import platform
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

AUTO = "auto"
BF16_UNITS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names for the CPU's bf16 units
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel names them (empty where /proc/cpuinfo does not exist)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())


def cpu_name() -> str:
    try:
        text = CPUINFO.read_text()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "CPU")


def bf16_units(flags: set[str] | None = None) -> list[str]:
    """The bf16 units among the CPU's flags, in BF16_UNITS's order."""
    flags = cpu_flags() if flags is None else flags
    return [unit for unit in BF16_UNITS if unit in flags]


def uses_cuda(accelerator: str) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == AUTO and torch.cuda.is_available())


def resolve_precision(precision: str | int, accelerator: str) -> str | int:
    """Lightning's precision for trainer.precision on trainer.accelerator: 'auto' chosen for the host and logged;
    bf16 asked of a CPU without bf16 units warned about; anything else passed through."""
    if uses_cuda(accelerator):
        if precision != AUTO:
            return precision
        # torch's default counts emulated bf16 (V100, T4: a bf16 tensor can be made there) as support
        chosen = "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"
        log.info("trainer.precision=auto: %s on %s", chosen, torch.cuda.get_device_name())
        return chosen
    units = bf16_units()
    if precision == AUTO:
        if units:
            log.info(
                "trainer.precision=auto: bf16-mixed, since this CPU (%s) has bf16 units (%s)",
                cpu_name(),
                ", ".join(units),
            )
            return "bf16-mixed"
        log.info(
            "trainer.precision=auto: 32-true, since this CPU (%s) has no bf16 units (%s), so torch would emulate bf16",
            cpu_name(),
            " or ".join(BF16_UNITS),
        )
        return "32-true"
    if str(precision).startswith("bf16") and not units:
        fp32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
        log.warning(
            "trainer.precision=%s on a CPU without bf16 units (%s has no %s): torch emulates bf16 here, and a "
            "256x256 matrix product just ran at %.1f GFLOP/s in bf16 against %.1f in fp32 (%.0fx slower); "
            "trainer.precision=auto picks 32-true on this CPU",
            precision,
            cpu_name(),
            " or ".join(BF16_UNITS),
            bf16,
            fp32,
            fp32 / bf16,
        )
    return precision


def matmul_gflops(dtype: torch.dtype, n: int = 256, seconds: float = 0.05) -> float:
    """GFLOP/s of an n x n matrix product in `dtype` on this CPU, over about `seconds` (at least two calls)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # the first call pays for the kernel choice
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < seconds:
        a @ b
        calls += 1
    return 2 * n**3 * calls / (time.perf_counter() - start) / 1e9
