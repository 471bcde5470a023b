"""Where an experiment's training step goes: each piece of train.py's step timed alone on the same device, and
(on CUDA) how busy the device is against the host while the model steps.

Pieces, for the experiment's model, batch and precision:
- the model's step: forward, loss, backward, fused AdamW (make_step of benchmarks/throughput.py), and the
  forward alone;
- the EMA update after each step, two ways: one formula per tensor (Lightning's EMAWeightAveraging) and
  torch's foreach update (vit.training.ema.EMA, what train.py runs);
- timm's Mixup on the batch, when the experiment mixes;
- the data: the training loader's next batch (of the experiment's size, whatever --batch says), its transfer
  and the on-device augmentation.

If the device's busy time is well under the host's time for the same steps, the step is launch-bound: the
device waits on Python and the dispatcher, and fewer, larger kernels (torch.compile, CUDA graphs, a larger
batch) pay more than faster ones.

Examples:
  python -m benchmarks.step_pieces --device cuda --experiment fashion_mnist_best
  python -m benchmarks.step_pieces                  # the default experiment on the CPU
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from timm.data import Mixup
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn, get_ema_multi_avg_fn
from torch.profiler import ProfilerActivity, profile

from benchmarks._common import alternate, compose, data_module, machine, parse, parser, report, synchronize, write_json
from benchmarks.throughput import make_step
from vit.model import VisionTransformer
from vit.model.config import ViTConfig
from vit.training.checks import model_fields

PROFILED_STEPS = 5
DEFAULT_EMA_DECAY = 0.9998  # timed when the experiment keeps no EMA: the update's cost does not depend on it


def pieces(args, workdir: Path) -> tuple[dict[str, Callable[[], Any]], Callable[[], None], int]:
    """The pieces to time by name, the model's step (for the profile), and the batch size."""
    cfg = compose(
        f"experiment={args.experiment}",
        f"output_dir={workdir}",
        *([f"data.root={args.data_root}"] if args.data_root else []),
    )
    batch = args.batch or cfg.data.batch_size
    model = VisionTransformer(ViTConfig.from_dict(model_fields(cfg)[0])).to(args.device)
    c = model.config
    images = torch.randn(batch, c.in_chans, *c.img_size, device=args.device)
    labels = torch.randint(0, c.num_classes, (batch,), device=args.device)
    step = make_step(model, "train", images, labels, args.device, args.precision)
    infer_model = VisionTransformer(c).to(args.device)
    forward = make_step(infer_model, "infer", images, labels, args.device, args.precision)
    decay = cfg.ema_decay or DEFAULT_EMA_DECAY
    per_tensor = AveragedModel(model, avg_fn=get_ema_avg_fn(decay), use_buffers=True)
    foreach = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    timed = {
        "model step (forward, backward, fused AdamW)": step,
        "model forward alone (inference)": forward,
        "EMA update, per tensor (Lightning's EMAWeightAveraging)": lambda: per_tensor.update_parameters(model),
        "EMA update, foreach (vit.training.ema.EMA, train.py)": lambda: foreach.update_parameters(model),
    }
    if cfg.mixup:
        mixup = Mixup(**cfg.mixup, label_smoothing=cfg.label_smoothing, num_classes=c.num_classes)
        timed["timm Mixup on the batch"] = lambda: mixup(images.clone(), labels)
    data = data_module(cfg)
    data.augment.to(args.device)
    loader = data.train_dataloader()
    batches = iter(loader)

    def next_batch() -> None:
        nonlocal batches
        try:
            x, _ = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, _ = next(batches)
        data.augment(x.to(args.device, non_blocking=True), train=True)

    timed["data: next batch, transfer, on-device augmentation"] = next_batch
    return timed, step, batch


def busy_against_host(step: Callable[[], None], device: torch.device) -> dict[str, float] | None:
    """Milliseconds a model step keeps the device busy (its kernels' total) and the host (the profiler's CPU
    total), averaged over a few steps; None on the CPU, where both are the same thing."""
    if device.type != "cuda":
        return None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        synchronize(device)
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events)
    host_us = sum(e.self_cpu_time_total for e in events)
    return {"device_ms": device_us / 1e3 / PROFILED_STEPS, "host_ms": host_us / 1e3 / PROFILED_STEPS}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--experiment", default="fashion_mnist", help="conf/experiment/NAME (default: %(default)s)")
    p.add_argument("--batch", type=int, help="default: the experiment's data.batch_size")
    p.add_argument("--data-root", help="data.root (default: the data config's)")
    p.add_argument("--repeats", type=int, default=5, help="timed samples per piece (default 5)")
    args = parse(p, argv)
    if args.quick:
        args.repeats, args.sample_seconds, args.batch = 2, 0.0, args.batch or 8
    facts = machine(args.device)
    with tempfile.TemporaryDirectory(prefix="pieces_") as tmp:
        timed, step, batch = pieces(args, Path(tmp))
        times = alternate(timed, args.repeats, warmup=2, device=args.device, sample_seconds=args.sample_seconds)
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    profile_ms = busy_against_host(step, args.device)
    rows = [[name, f"{value:.2f}"] for name, value in ms.items()]
    if profile_ms:
        rows.append(
            [
                "model step under the profiler: device busy / host",
                "{device_ms:.1f} / {host_ms:.1f}".format(**profile_ms),
            ]
        )
    report(
        f"A training step's pieces, experiment={args.experiment}, batch {batch} ({args.precision})",
        ["piece", "ms"],
        rows,
        facts,
    )
    args_json = {k: str(v) for k, v in vars(args).items()}  # the experiment and precision of the title
    payload = {"machine": facts, "args": args_json, "batch": batch, "milliseconds": ms, "profile": profile_ms}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
