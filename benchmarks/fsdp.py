"""Training memory and step time per process under DDP and under FSDP2 as trainer=fsdp shards (vit/training/
sharding.py), with and without activation checkpointing, ours and timm's network under the same wrapping: what each
process holds (weights, gradients, AdamW's moments), the peak a step allocates above that, and the median step.
The processes run on this machine: gloo on the CPU, NCCL on GPUs.

    python -m benchmarks.fsdp [--models vit_base_16 vit_large_16] [--processes 2] [--batch 2] [--steps 2]
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from benchmarks._common import MIB, autocast, machine, parse, parser, peak_memory, report, synchronize, write_json
from vit.model import VisionTransformer
from vit.model.presets import preset_config
from vit.training.sharding import shard

TIMM = {"vit_base_16": "vit_base_patch16_224", "vit_large_16": "vit_large_patch16_224",
        "vit_huge_14": "vit_huge_patch14_224", "vit_giant_14": "vit_giant_patch14_224"}  # fmt: skip
# (wrapping, network, activation checkpointing)
VARIANTS = [("ddp", "ours", False), ("fsdp", "ours", False), ("fsdp", "ours", True), ("fsdp", "timm", False)]


def _network(name: str, source: str, checkpointing: bool, quick: bool) -> tuple[torch.nn.Module, Any, Any]:
    """The network, its transformer layers and its config (ours: the preset; timm's: the same architecture)."""
    config = preset_config(name)
    if quick:
        config = replace(config, img_size=(32, 32), patch_size=(8, 8), depth=2, num_classes=10)
    if source == "ours":
        model = VisionTransformer(config)
        model.set_grad_checkpointing(checkpointing)
        return model, model.layers, config
    overrides = dict(img_size=32, patch_size=8, depth=2, num_classes=10) if quick else {}
    model = timm.create_model(TIMM[name], **overrides)
    model.set_grad_checkpointing(checkpointing)
    return model, model.blocks, config


def _worker(rank: int, world: int, port: int, jobs: list[dict[str, Any]], out: str, args: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(f"cuda:{rank}") if args["device"] == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    else:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    results = [_measure(job, device, world, args) for job in jobs]
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def _measure(job: dict[str, Any], device: torch.device, world: int, args: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    model, layers, config = _network(job["model"], job["network"], job["checkpointing"], args["quick"])
    model = model.to(device)
    params = sum(p.numel() for p in model.parameters())
    bf16 = args["precision"] == "bf16"
    if job["wrapping"] == "fsdp":
        mesh = init_device_mesh(device.type, (world,))
        shard(model, layers, mesh, param_dtype="bf16" if bf16 else None)
        wrapped = model
    else:
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(args["batch"], config.in_chans, *config.img_size, device=device)
    labels = torch.randint(0, config.num_classes, (args["batch"],), device=device)

    def step() -> None:  # FSDP computes in bf16 by its policy; DDP by autocast
        with autocast(device, "bf16" if bf16 and job["wrapping"] == "ddp" else "fp32"):
            loss = F.cross_entropy(wrapped(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients stay allocated, as they do between steps

    step()
    seconds = []
    for _ in range(args["steps"]):
        synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        step()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    held = lambda tensors: sum(local(t).numel() * local(t).element_size() for t in tensors) / MIB  # noqa: E731
    moments = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]
    weights = held(model.parameters())
    grads = held(p.grad for p in model.parameters() if p.grad is not None) + held(moments)
    peak = peak_memory(step, device)
    here = sum(local(p).numel() for p in model.parameters())
    return {**job, "params_here": here, "params": params,
            "weights_mib": weights, "grads_and_moments_mib": grads, "step_peak_mib": peak,
            "total_mib": weights + grads + peak, "step_seconds": statistics.median(seconds)}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--models", nargs="+", default=["vit_base_16", "vit_large_16"], choices=sorted(TIMM))
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--batch", type=int, default=2, help="images a process")
    p.add_argument("--steps", type=int, default=2)
    args = parse(p, argv)
    if args.quick:
        args.models, args.steps = args.models[:1], 1
    facts = machine(args.device)
    jobs = [dict(model=m, wrapping=w, network=n, checkpointing=c) for m in args.models for w, n, c in VARIANTS]
    settings = {"device": args.device.type, "precision": args.precision, "quick": args.quick, "batch": args.batch,
                "steps": args.steps}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "results.json")
        mp.spawn(_worker, (args.processes, _free_port(), jobs, out, settings), nprocs=args.processes)
        results = json.loads(Path(out).read_text())
    header = ["model", "network", "wrapping", "params here / all", "weights MiB", "grads + AdamW MiB",
              "step peak MiB", "total MiB", "step s"]  # fmt: skip
    rows = [
        [r["model"], r["network"], r["wrapping"] + " + ckpt" * r["checkpointing"],
         f"{r['params_here']:,} / {r['params']:,}", f"{r['weights_mib']:.0f}", f"{r['grads_and_moments_mib']:.0f}",
         f"{r['step_peak_mib']:.0f}", f"{r['total_mib']:.0f}", f"{r['step_seconds']:.2f}"]
        for r in results
    ]  # fmt: skip
    title = (f"per process of {args.processes}: DDP against FSDP2, batch {args.batch} a process, {args.precision}, "
             f"{args.device}")  # fmt: skip
    report(title, header, rows, facts)
    write_json(args.json, {"facts": facts, "results": results})


if __name__ == "__main__":
    main()
