"""Our VisionTransformer against timm's, side by side in one process: images/s of a training step (forward,
backward, fused AdamW) and of inference, eager and under torch.compile.

Both models are built from one ViTConfig and hold the same weights (benchmarks/_common.timm_twin). Each case
warms both up, then times them in turns (alternating who goes first) and reports medians; ours/timm is the
median of the back-to-back ratios, so a neighbour job slows both sides of a pair alike.

FLOPs: vit.model.flops.forward_flops, per image for the forward pass, counted from the equations (its docstring
gives the formula, and what it leaves out: about 1-2% for these shapes); the count is the full model's for both.
A training step costs 3x the forward pass (the backward computes gradients with respect to both the inputs and the
weights, each as costly as the forward); the optimizer is left out. Achieved TFLOP/s = FLOPs per image x images/s;
MFU = that over the device's dense peak: on GPUs the data sheet's (PEAK_TFLOPS: bf16, or TF32 for fp32 work); on
CPUs the peak measured in the same run (cpu_peak_tflops: the best square matrix product in the precision, with the
threads the cases use; measured before the cases and after each, the best taken), since no data sheet says what two
cores of a cloud VM deliver.

"Products alone" (eager cases): our step's matrix products, recorded and each replayed alone
(benchmarks/products.py), as a fraction of the same peak: the MFU the model's own shapes allow, on warm caches
and on cold ones (operands fetched from memory, as they are inside a step whose working set outgrows the caches).
MFU's distance from it is the rest of the step; a small model's products alone can sit far below the peak.

Examples:
  python -m benchmarks.throughput                         # CPU: Fashion-MNIST, CIFAR, Ti/16, eager
  python -m benchmarks.throughput --paths compiled        # the same under torch.compile
  python -m benchmarks.throughput --configs s16 b16
  python -m benchmarks.throughput --device cuda --compile-mode reduce-overhead   # CUDA graphs
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks._common import (
    alternate,
    autocast,
    machine,
    paired_speedup,
    parse,
    parser,
    peak_memory,
    report,
    synchronize,
    timm_twin,
    write_json,
)
from benchmarks.products import products_alone
from vit.model.flops import forward_flops
from vit.model.presets import create_model
from vit.training.optim import OptimConfig, build_optimizer
from vit.training.precision import matmul_gflops

# name: (preset in conf/model/, batch on CPU, batch on CUDA: the reference batches, preset overrides)
CONFIGS = {
    "fm": ("vit_fashion_mnist", 64, 1024, {}),  # what `python train.py` trains: 28x28, patch 7, D=64, depth 4, 1 head
    "cifar": ("vit_cifar", 16, 1024, {}),  # 32x32, patch 4, D=384, depth 7: 65 tokens
    "ti16": ("vit_tiny_16", 8, 256, {}),
    "s16": ("vit_small_16", 4, 256, {}),
    "b16": ("vit_base_16", 2, 256, {}),
    # the families, at the 224 px they are fine-tuned at: LayerScale, registers, ln_pre, MAP pooling
    "dinov2_s14": ("dinov2_small_14", 4, 256, {"img_size": 224}),
    "dinov2_reg_s14": ("dinov2_small_14_reg4", 4, 256, {"img_size": 224}),
    "clip_b16": ("clip_base_16", 2, 256, {}),
    "siglip_b16": ("siglip_base_16", 2, 256, {}),
    "eva02_s14": ("eva02_small_14", 4, 256, {"img_size": 224}),  # rotary phases, SwiGLU: twin is timm's Eva
}
TIMM_ARCHITECTURES = {"eva02_s14": "eva02_small_patch14_224"}  # twins of a timm class other than VisionTransformer
DEFAULT_CONFIGS = {"cpu": ["fm", "cifar", "ti16"], "cuda": list(CONFIGS)}  # ViT-S/B train at 1-5 img/s on 2 cores
PATHS = ("eager", "compiled")
DEFAULT_PATHS = {"cpu": ["eager"], "cuda": list(PATHS)}  # compiling the CPU defaults takes ~6 min with a cold cache
MODES = ("train", "infer")
TRAIN_FLOPS_FACTOR = 3  # forward + backward (twice the forward)

# Dense peak TFLOP/s from NVIDIA's data sheets (no sparsity); "fp32" is TF32 on tensor cores. First match wins.
PEAK_TFLOPS = {
    "H100 PCIe": {"bf16": 756.0, "fp32": 378.0},
    "H100": {"bf16": 989.4, "fp32": 494.7},  # SXM
    "H200": {"bf16": 989.4, "fp32": 494.7},
    "A100": {"bf16": 312.0, "fp32": 156.0},
}


def peak_tflops(gpu: str | None, precision: str) -> float | None:
    for name, peaks in PEAK_TFLOPS.items():
        if gpu and name in gpu:
            return peaks[precision]
    return None


def cpu_peak_tflops(precision: str, seconds: float = 1.0) -> float:
    """The CPU's matrix-product roof in `precision`, measured: the best TFLOP/s of n x n products (n = 256 up to
    2048), each size timed for a quarter of `seconds`; sizes stop growing once one call of the next would take
    longer than that (emulated bf16 runs at ~1 GFLOP/s, where a 2048 product would take 20 s)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    best = 0.0
    for n in (256, 512, 1024, 2048):
        best = max(best, matmul_gflops(dtype, n, seconds / 4) / 1e3)
        if 2 * (2 * n) ** 3 / (best * 1e12) > seconds / 4:
            break
    return best


def make_step(
    model: nn.Module,
    mode: str,
    images: Tensor,
    labels: Tensor,
    device: torch.device,
    precision: str,
    compile_mode: str | None = None,
) -> Callable[[], None]:
    """One training step (forward, cross-entropy, backward, fused AdamW) or one inference forward pass, of the
    model compiled with `compile_mode` (None: eager)."""
    network = torch.compile(model, mode=compile_mode) if compile_mode else model
    if mode == "infer":
        model.eval()

        def infer() -> None:
            with torch.inference_mode(), autocast(device, precision):
                network(images)

        return infer
    model.train()
    optimizer = build_optimizer(model, OptimConfig())

    def train() -> None:
        with autocast(device, precision):
            loss = F.cross_entropy(network(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train


def measure(name: str, mode: str, path: str, args, peak: float | None) -> dict[str, Any]:
    preset, cpu_batch, cuda_batch, overrides = CONFIGS[name]
    batch = args.batch or (cuda_batch if args.device.type == "cuda" else cpu_batch)
    torch.manual_seed(0)
    ours = create_model(preset, **overrides).to(args.device)
    theirs = timm_twin(ours, TIMM_ARCHITECTURES.get(name))
    c = ours.config
    images = torch.randn(batch, c.in_chans, *c.img_size, device=args.device)
    labels = torch.randint(0, c.num_classes, (batch,), device=args.device)
    models = {"ours": ours, "timm": theirs}
    compile_mode = args.compile_mode if path == "compiled" else None
    steps = {
        side: make_step(model, mode, images, labels, args.device, args.precision, compile_mode)
        for side, model in models.items()
    }
    first_call = {}
    for side, step in steps.items():  # the first call compiles: timed on its own
        start = time.perf_counter()
        step()
        synchronize(args.device)
        first_call[side] = time.perf_counter() - start
    times = alternate(steps, args.repeats, args.warmup, args.device, args.sample_seconds)
    memory = {side: peak_memory(step, args.device) for side, step in steps.items()}
    alone = products_alone(steps["ours"], args.device) if path == "eager" else None
    rate = {side: batch / statistics.median(t) for side, t in times.items()}
    flops = forward_flops(c) * (TRAIN_FLOPS_FACTOR if mode == "train" else 1)
    tflops = flops * rate["ours"] / 1e12
    return {
        "config": name,
        "preset": preset,
        "tokens": c.num_patches + c.num_prefix_tokens,
        "embed_dim": c.embed_dim,
        "depth": c.depth,
        "mode": mode,
        "path": path,
        "batch": batch,
        "precision": args.precision,
        "images_per_second": rate,
        "ours_over_timm": paired_speedup(times["ours"], times["timm"]),
        "seconds": times,
        "first_call_seconds": first_call,
        "peak_memory_mib": memory,
        "gflops_per_image": flops / 1e9,
        "achieved_tflops_ours": tflops,
        "mfu_ours": tflops / peak if peak else None,
        "products_alone_tflops": alone and alone["tflops"],
        "products_alone_mfu": alone and peak and alone["tflops"] / peak,
        "products_alone_cold_tflops": alone and alone["tflops_cold"],
        "products_alone_cold_mfu": alone and peak and alone["tflops_cold"] / peak,
    }


def row(r: dict[str, Any]) -> list[str]:
    mfu = f"{r['mfu_ours']:.1%}" if r["mfu_ours"] is not None else "—"
    alone = f"{r['products_alone_mfu']:.1%} / {r['products_alone_cold_mfu']:.1%}" if r["products_alone_mfu"] else "—"
    return [
        f"{r['config']} ({r['tokens']} tok, D{r['embed_dim']}, L{r['depth']})",
        r["mode"],
        r["path"] + (f" (1st call {r['first_call_seconds']['ours']:.0f} s)" if r["path"] == "compiled" else ""),
        str(r["batch"]),
        f"{r['images_per_second']['ours']:,.1f}",
        f"{r['images_per_second']['timm']:,.1f}",
        f"**{r['ours_over_timm']:.3f}**",
        f"{r['peak_memory_mib']['ours']:,.1f} / {r['peak_memory_mib']['timm']:,.1f}",
        f"{r['achieved_tflops_ours']:.3g}",
        mfu,
        alone,
    ]


HEADER = ["model", "step", "path", "batch", "ours img/s", "timm img/s", "ours/timm", "peak MiB ours / timm"]
HEADER += ["TFLOP/s ours", "MFU ours", "products alone: warm / cold"]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = parser(__doc__)
    p.add_argument("--configs", nargs="+", choices=CONFIGS, help="default: fm cifar ti16 on CPU, all on CUDA")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument(
        "--paths", nargs="+", choices=PATHS, help="default: eager on CPU (compiling takes minutes), both on CUDA"
    )
    p.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead", "max-autotune"])
    p.add_argument(
        "--sdpa",
        default="default",
        choices=["default", "cudnn"],
        help="fused attention's backends in torch's order, or cuDNN's first (Hopper), for both models alike",
    )
    p.add_argument("--batch", type=int, help="default per config and device (CONFIGS)")
    p.add_argument("--repeats", type=int, help="timed samples per side (default 5 on CPU, 10 on CUDA)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per side after the first (default 2)")
    args = parse(p, argv)
    cuda = args.device.type == "cuda"
    if args.quick:
        args.configs, args.paths, args.batch = ["fm"], ["eager"], 8
        args.repeats, args.warmup, args.sample_seconds = 2, 1, 0.0
    args.configs = args.configs or DEFAULT_CONFIGS[args.device.type]
    args.paths = args.paths or DEFAULT_PATHS[args.device.type]
    args.repeats = args.repeats or (10 if cuda else 5)
    facts = machine(args.device)
    # a CPU's roof is measured before the cases and again after each (a cloud host's speed drifts by a third within
    # minutes): MFU is against the best of them, so a slow moment at the start cannot make it exceed 100%
    peaks = [] if cuda else [cpu_peak_tflops(args.precision, 0.2 if args.quick else 1.0)]
    peak = peak_tflops(facts.get("gpu"), args.precision) if cuda else peaks[0]
    if not cuda:
        print(f"{args.precision} matrix-product peak of this CPU, {torch.get_num_threads()} threads: "
              f"{peak * 1e3:,.1f} GFLOP/s (measured again after each case)", flush=True)  # fmt: skip
    results = []
    first = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(first, set_priority=True) if args.sdpa == "cudnn" else contextlib.nullcontext():
        for name, path, mode in itertools.product(args.configs, args.paths, args.modes):
            results.append(measure(name, mode, path, args, max(peaks) if peaks else peak))  # the best so far
            print(" | ".join(row(results[-1])), flush=True)
            if not cuda:
                peaks.append(cpu_peak_tflops(args.precision, 0.2 if args.quick else 1.0))
    if cuda:
        roof = "the data sheet's dense peak"
    else:
        peak = facts["cpu_peak_tflops"] = max(peaks)
        facts["cpu_peak_tflops_each"] = peaks
        for r in results:
            r["mfu_ours"] = r["achieved_tflops_ours"] / peak
            r["products_alone_mfu"] = r["products_alone_tflops"] and r["products_alone_tflops"] / peak
            r["products_alone_cold_mfu"] = r["products_alone_cold_tflops"] and r["products_alone_cold_tflops"] / peak
        roof = (
            f"the measured {args.precision} matrix-product peak, the best of {len(peaks)} measurements: "
            f"{peak * 1e3:,.1f} GFLOP/s (lowest {min(peaks) * 1e3:,.1f})"
        )
    title = f"Throughput, ours against timm ({args.precision}; MFU against {roof})"
    report(title, HEADER, [row(r) for r in results], facts)
    write_json(args.json, {"machine": facts, "args": {k: str(v) for k, v in vars(args).items()}, "results": results})
    return results


if __name__ == "__main__":
    main()
