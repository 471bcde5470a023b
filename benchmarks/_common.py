"""What the three benchmark scripts share: the command line, the machine's facts, alternating timing with
medians, the peak memory of one step, timm's twin of our model, and the markdown table / JSON output."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import lightning
import timm
import torch
import torchvision
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch.profiler import ProfilerActivity, profile

from vit.interop.timm import from_timm, read_timm_module, timm_kwargs, to_timm
from vit.model import VisionTransformer
from vit.model.presets import conf_dir
from vit.training.precision import cpu_flags, cpu_name
from vit.training.process import quiet_lightning_adverts, tune_process
from vit.training.registry import register

MIB = 2**20
PRECISIONS = ("fp32", "bf16")
MEMORY_EVENT = "[memory]"  # the profiler's name for one allocation (+bytes) or free (-bytes)
KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"  # the profiler library's: 0 verbose .. 4 error, 5 USDT markers
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc/stat counts in these per second
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")  # the vector and matrix units
BUSY_CORES = 0.25  # other jobs' mean CPU use above which a figure is marked busy


# command line ---------------------------------------------------------------------------------------------
def parser(description: str | None, samples: bool = True) -> argparse.ArgumentParser:
    """The flags every script takes: --quick, --json, --device, --precision, --threads; and --sample-seconds
    where `samples` (the scripts that time with `alternate`)."""
    prog = f"python -m benchmarks.{Path(sys.argv[0]).stem}"  # how the docstrings run them, not 'data.py'
    p = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke run (tests/test_benchmarks.py)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the measurements and machine facts here")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="default: %(default)s")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="bf16 = autocast to bfloat16; default bf16 on CUDA, fp32 on CPU (whose bf16 path may be emulated)",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, one per core)")
    if samples:
        p.add_argument(
            "--sample-seconds", type=float, default=0.5, help="length of one timed sample (calls repeat to fill it)"
        )
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, resolve --device into a torch.device and default --precision by device."""
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = torch.device(args.device)
    if args.precision is None:
        args.precision = "bf16" if args.device.type == "cuda" else "fp32"
    if args.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 work, as train.py's matmul_precision
    # as train() does, before any loop: every loop here, ours, timm's and the bare one, steps alike (no NVML question
    # a step where no GPU is visible) and reuses its freed activations alike; Lightning's warnings are left to show
    tune_process(None, training_warnings=False)
    quiet_lightning_adverts()
    quiet_profiler()
    return args


def quiet_profiler() -> None:
    """Where no GPU is visible, the profiler's C++ library (kineto) prints USDT profiler_start / profiler_stop lines
    and `ERROR ... gpuGetDeviceCount failed` to stderr on every peak_memory: noise, since it has no GPU to trace.
    Its log level is read once, when the first profiler starts; 6, above its highest level, silences it. With a GPU
    its errors stay: they can mean device times are missing. A KINETO_LOG_LEVEL already set is kept."""
    if not torch.cuda.is_available():
        os.environ.setdefault(KINETO_LOG_LEVEL, "6")


def autocast(device: torch.device, precision: str) -> AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# the machine ----------------------------------------------------------------------------------------------
def machine(device: torch.device) -> dict[str, Any]:
    """The facts a reader needs to compare a figure: date, versions, CPU, GPU and threads; describe() adds how
    busy the machine was."""
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "command": " ".join([Path(sys.executable).name, "-m", _module_name(), *sys.argv[1:]]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "timm": timm.__version__,
        "lightning": lightning.__version__,
        "cpu": cpu_name(),
        "cpu_flags": [flag for flag in CPU_FLAGS if flag in cpu_flags()],  # which kind of host a figure is from
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_avx512_bf16": torch.cpu._is_avx512_bf16_supported(),  # without it CPU bf16 matmuls are emulated
        "device": str(device),
        "load_average_start": os.getloadavg()[0],
    }
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
    return facts


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else sys.argv[0]


class OtherJobs:
    """The CPU that other processes used while we measured, in cores: the busy time of all CPUs (/proc/stat,
    hypervisor steal included) less this process's own CPU time, over the wall time watched. On a shared
    machine it says how disturbed a figure is: 0 is undisturbed; 1 on two cores means half of them were taken."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    @staticmethod
    def _busy_seconds() -> float:
        try:
            with open("/proc/stat") as f:
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        except (OSError, ValueError):  # not Linux: nothing to report
            return 0.0
        return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS

    @staticmethod
    def _own_seconds() -> float:
        """CPU seconds of this process and every process it started: the ones still running read from /proc (a
        DataLoader's workers), the ones that ended from os.times()'s waited-for children."""
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system + _live_descendants_seconds()

    @contextmanager
    def watch(self) -> Iterator[None]:
        wall, busy, own = time.perf_counter(), self._busy_seconds(), self._own_seconds()
        try:
            yield
        finally:
            self.wall += time.perf_counter() - wall
            self.cpu += max(0.0, (self._busy_seconds() - busy) - (self._own_seconds() - own))

    @property
    def cores(self) -> float:
        return self.cpu / self.wall if self.wall else 0.0


def _live_descendants_seconds() -> float:
    """User + system CPU seconds so far of the running processes descended from this one (/proc/PID/stat)."""
    parents, seconds = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we read, or not Linux
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])  # ppid, field 4 of proc(5); utime and stime are fields 14 and 15
        seconds[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        total += seconds[pid]
        stack += children.get(pid, [])
    return total


OTHER_JOBS = OtherJobs()  # every timed sample adds to it; describe() reports it


@contextmanager
def watched() -> Iterator[OtherJobs]:
    """Watch other jobs during one run: the OtherJobs yielded holds this run's figure; OTHER_JOBS gets it too."""
    run = OtherJobs()
    with run.watch(), OTHER_JOBS.watch():
        yield run


def describe(facts: dict[str, Any]) -> str:
    """One line under each table: what ran where, and how much of the machine other jobs took meanwhile."""
    facts["load_average_end"] = os.getloadavg()[0]
    facts["other_jobs_cores"] = round(OTHER_JOBS.cores, 3)
    busy = "busy" if OTHER_JOBS.cores > BUSY_CORES else "quiet"
    where = facts.get("gpu") or f"{facts['cpu']} ({facts['torch_threads']} threads, {facts['cpu_capability']})"
    return (
        f"`{facts['command']}` on {where}, {facts['date']}; torch {facts['torch']}, timm {facts['timm']}, "
        f"lightning {facts['lightning']}. Other jobs used {OTHER_JOBS.cores:.2f} of {facts['cpu_cores']} cores "
        f"while we timed ({busy}; load average {facts['load_average_start']:.1f} -> {facts['load_average_end']:.1f})."
    )


# timing ---------------------------------------------------------------------------------------------------
def alternate(
    candidates: dict[str, Callable[[], Any]], repeats: int, warmup: int, device: torch.device, sample_seconds: float
) -> dict[str, list[float]]:
    """Seconds per call of each candidate: `repeats` samples each, after `warmup` untimed calls of each.

    A sample repeats the call often enough to last about `sample_seconds` (counted from one more call of each,
    the slowest deciding), so that short steps are not timed one by one. The candidates take turns, and the
    first of each turn alternates, so that a neighbour job starting or stopping slows every candidate alike;
    compare them with `paired_speedup`, sample by sample.
    """
    for _ in range(warmup):
        for step in candidates.values():
            step()
    slowest = 0.0
    for step in candidates.values():
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        slowest = max(slowest, time.perf_counter() - start)
    calls = max(1, round(sample_seconds / slowest))
    times: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            with OTHER_JOBS.watch():
                start = time.perf_counter()
                for _ in range(calls):
                    candidates[name]()
                synchronize(device)
                times[name].append((time.perf_counter() - start) / calls)
    return times


def paired_speedup(ours: list[float], theirs: list[float]) -> float:
    """The median over repeats of theirs/ours time, each pair measured back to back: > 1 means ours is faster."""
    return statistics.median(t / o for o, t in zip(ours, theirs, strict=True))


def peak_memory(step: Callable[[], Any], device: torch.device) -> float:
    """MiB allocated at the peak of one call above what was allocated before it (activations, gradients,
    temporaries). CUDA: the caching allocator's counters. CPU: the profiler's allocation events, summed in
    time order (the profiler slows the call; its time is not used)."""
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / MIB
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == MEMORY_EVENT), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak / MIB


# configs and models ---------------------------------------------------------------------------------------
def compose(*overrides: str) -> DictConfig:
    """The training config as `python train.py OVERRIDES` composes it, without Hydra's run folder (so the
    overrides must set output_dir)."""
    register()  # the nodes conf/train.yaml names, and the data configs' class counts
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


def data_module(cfg: DictConfig) -> Any:
    """The config's data module, its files fetched and its splits set up."""
    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup()
    return data


def timm_twin(model: VisionTransformer, architecture: str | None = None) -> torch.nn.Module:
    """timm's VisionTransformer with the same configuration and the same weights as ours: only the code differs.
    A fixed position table (sincos) is a parameter of timm's model: frozen, so that both train the same weights.

    `architecture` names a timm model of another class (EVA-02's Eva: rotary phases, SwiGLU, sub-norms): timm
    builds it at our image size and class count, its configuration must read as ours, and its weights are read
    into ours through the loader's renaming, so that again only the code differs."""
    if architecture is not None:
        twin = timm.create_model(
            architecture, pretrained=False, img_size=model.config.img_size, num_classes=model.config.num_classes
        )
        config, renaming = read_timm_module(twin)
        if config != model.config:
            raise ValueError(f"timm's {architecture} is not the model measured: {config} != {model.config}")
        model.load_state_dict(from_timm(renaming(twin.state_dict()), config))
        return twin.to(next(model.parameters()).device)
    twin = TimmViT(**timm_kwargs(model.config))
    twin.load_state_dict(to_timm(model.state_dict(), model.config))
    if model.pos_embed is not None and not model.pos_embed.learned:
        twin.pos_embed.requires_grad_(False)
    return twin.to(next(model.parameters()).device)


# output ---------------------------------------------------------------------------------------------------
def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def report(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]], facts: dict[str, Any]) -> None:
    print(f"\n### {title}\n\n{table(header, rows)}\n\n{describe(facts)}\n", flush=True)


def write_json(path: Path | None, payload: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {path}")
