"""A step's matrix products, recorded once and replayed alone: the FLOP rate the step's own shapes reach.

MFU divides a step's model FLOPs by the device's peak, which the benchmark measures on large square products.
A model's products are not square: K = 64 or a 16-token attention runs far below that peak whatever the rest of
the step costs. Replaying every product of one step alone, each shape timed on warm caches, gives the shapes'
own limit; MFU's distance from it is the rest of the step (element-wise work, attention kernels, the optimizer,
caches refilled between operations). Attention kernels (SDPA) are not replayed, only counted.

Each call is also timed right after the caches are flushed ("cold"). The two bracket what the products can do
inside a step: warm where the step's working set fits the caches (the Fashion-MNIST model, whose step runs its
products faster than cold), cold where it does not and the operands come from memory (CIFAR's and Ti/16's bf16
steps on a CPU; benchmarks/NOTES.md, "How the scripts measure").
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks._common import synchronize

aten = torch.ops.aten
# each matrix product op and the position of its first multiplied operand (addmm's first argument is the bias);
# under inference_mode a dispatch mode sees linear and matmul themselves, not their decompositions
PRODUCTS = {
    aten.mm.default: 0,
    aten.bmm.default: 0,
    aten.matmul.default: 0,
    aten.linear.default: 0,
    aten.addmm.default: 1,
    aten.baddbmm.default: 1,
}


@dataclass(frozen=True)
class Product:
    """One call: the op and each argument as (shape, stride, dtype) for tensors, as itself for scalars."""

    op: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]

    @property
    def flops(self) -> int:
        """2 m k n per matrix product, times the (broadcast) batch; linear's weight is (out, in)."""
        first = PRODUCTS[self.op]
        a, b = self.args[first][0], self.args[first + 1][0]
        if self.op == aten.linear.default:
            return 2 * math.prod(a) * b[0]
        return 2 * math.prod(torch.broadcast_shapes(a[:-2], b[:-2])) * a[-2] * a[-1] * b[-1]

    def replay(self, device: torch.device) -> Callable[[], Any]:
        """A call of the same op on random tensors of the same shapes, strides and dtypes."""
        args = [_random(*spec, device) if isinstance(spec, tuple) else spec for spec in self.args]
        kwargs = dict(self.kwargs)
        return lambda: self.op(*args, **kwargs)


def _random(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Random values laid out as recorded, broadcast (stride 0) and transposed views included."""
    storage = 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    return torch.randn(storage, device=device).to(dtype).as_strided(shape, stride)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.products: list[Product] = []
        self.attention_calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in PRODUCTS:
            specs = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
            self.products.append(Product(func, specs, tuple(sorted(kwargs.items()))))
        elif "scaled_dot_product" in func.name():
            self.attention_calls += 1
        return func(*args, **kwargs)


def record(step: Callable[[], Any]) -> tuple[list[Product], int]:
    """The matrix products of one call of `step` (eager), and how many attention kernels it called."""
    recorder = _Recorder()
    with recorder:
        step()
    return recorder.products, recorder.attention_calls


def time_alone(
    products: list[Product], device: torch.device, seconds: float = 0.1, samples: int = 5, cold: bool = False
) -> float:
    """Seconds the products take one after another, each distinct call timed alone and counted as often as the
    step made it. Each call's time is the best of `samples` samples of about `seconds` / `samples`: a limit, as
    the peak it is set against is the best of its measurements (a cloud host's speed drifts within minutes).
    `cold`: each sample is one call, made right after the caches were flushed."""
    flush = torch.empty(2 * largest_cache_bytes(device), dtype=torch.uint8, device=device) if cold else None
    total = 0.0
    for product, count in Counter(products).items():
        call = product.replay(device)
        call()  # the first call picks the kernel
        best = math.inf
        for _ in range(samples):
            if flush is not None:
                flush.fill_(1)  # writing twice the largest cache evicts the operands
                synchronize(device)
            calls, start = 0, time.perf_counter()  # cold: one call a sample, warm: as many as fit `seconds`
            while calls == 0 or (not cold and (calls < 2 or time.perf_counter() - start < seconds / samples)):
                call()
                calls += 1
            synchronize(device)
            best = min(best, (time.perf_counter() - start) / calls)
        total += best * count
    return total


def largest_cache_bytes(device: torch.device, cpu_caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The device's last-level cache: a CPU's as Linux lists it, a GPU's L2; 64 MiB where none is listed."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    sizes = []
    for size in cpu_caches.glob("index*/size"):
        text = size.read_text().strip()  # e.g. "32768K"
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=64 * 2**20)


def products_alone(step: Callable[[], Any], device: torch.device) -> dict[str, float]:
    """FLOPs of the step's matrix products, the seconds they take replayed alone on warm caches and on cold ones,
    and the attention calls."""
    products, attention = record(step)
    flops = sum(p.flops for p in products)
    warm, cold = time_alone(products, device), time_alone(products, device, samples=7, cold=True)
    return {
        "flops": flops,
        "seconds": warm,
        "tflops": flops / warm / 1e12,
        "seconds_cold": cold,
        "tflops_cold": flops / cold / 1e12,
        "attention_calls": attention,
    }
