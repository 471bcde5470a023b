"""Training memory and step time of finetune=full against finetune=lora (vit/interop/lora.py) at the shapes of
ViT-B/16 and ViT-L/16: what the weights, their gradients and AdamW's moments hold, the peak a step allocates above
them, the median step, and the bytes of a checkpoint (the weights that learn and AdamW's state, as a run saves them:
a partly fine-tuned run's leaves its frozen weights to the pretrained file, vit/interop/frozen.py).

    python -m benchmarks.lora [--models vit_base_16 vit_large_16] [--batch 8] [--steps 3] [--precision bf16]
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks._common import MIB, autocast, machine, parse, parser, peak_memory, report, synchronize, write_json
from vit.interop.lora import ADAPTER, TARGETS, LoraSettings, add_lora
from vit.model import VisionTransformer
from vit.model.presets import preset_config

RANK, ALPHA = 8, 16.0  # conf/finetune/lora.yaml's


def measure(name: str, kind: str, args: Any) -> dict[str, Any]:
    """One model and kind: build, adapt, then time `args.steps` AdamW steps after one that creates the moments."""
    config = preset_config(name)
    config = replace(config, num_classes=10, img_size=32, patch_size=8, depth=1) if args.quick else config
    torch.manual_seed(0)
    model = VisionTransformer(config).to(args.device)
    if kind == "lora":
        add_lora(model, LoraSettings(rank=RANK, alpha=ALPHA, targets=TARGETS))
        for key, p in model.named_parameters():
            p.requires_grad_(ADAPTER in key or key.startswith("head."))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    images = torch.randn(args.batch, config.in_chans, *config.img_size, device=args.device)
    labels = torch.randint(0, config.num_classes, (args.batch,), device=args.device)

    def step() -> None:
        with autocast(args.device, args.precision):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the gradients stay allocated, as they do between steps

    step()  # AdamW's moments and the gradients exist from here on
    seconds = []
    for _ in range(args.steps):
        synchronize(args.device)
        start = time.perf_counter()
        step()
        synchronize(args.device)
        seconds.append(time.perf_counter() - start)
    held = lambda tensors: sum(t.numel() * t.element_size() for t in tensors) / MIB  # noqa: E731
    moments = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    weights, grads = held(model.parameters()), held(p.grad for p in params if p.grad is not None)
    peak = peak_memory(step, args.device)
    learns = {name for name, p in model.named_parameters() if p.requires_grad}
    saved = io.BytesIO()
    torch.save({"state_dict": {k: v for k, v in model.state_dict().items() if k in learns},
                "optimizer": optimizer.state_dict()}, saved)  # fmt: skip
    return {
        "model": name,
        "kind": kind,
        "params": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in params),
        "weights_mib": weights,
        "grads_and_moments_mib": grads + held(moments),
        "step_peak_mib": peak,
        "total_mib": weights + grads + held(moments) + peak,
        "step_seconds": statistics.median(seconds),
        "checkpoint_mib": saved.tell() / MIB,
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--models", nargs="+", default=["vit_base_16", "vit_large_16"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    args = parse(p, argv)
    if args.quick:
        args.models, args.batch, args.steps = args.models[:1], 2, 1
    facts = machine(args.device)
    results = [measure(name, kind, args) for name in args.models for kind in ("full", "lora")]
    header = ["model", "finetune", "trainable / all params", "weights MiB", "grads + AdamW MiB", "step peak MiB",
              "total MiB", "step s", "checkpoint MiB"]  # fmt: skip
    rows = [
        [
            r["model"],
            r["kind"],
            f"{r['trainable']:,} / {r['params']:,}",
            f"{r['weights_mib']:.0f}",
            f"{r['grads_and_moments_mib']:.0f}",
            f"{r['step_peak_mib']:.0f}",
            f"{r['total_mib']:.0f}",
            f"{r['step_seconds']:.2f}",
            f"{r['checkpoint_mib']:.1f}",
        ]
        for r in results
    ]
    title = f"finetune=full against lora (rank {RANK}), batch {args.batch}, {args.precision}, {args.device}"
    report(title, header, rows, facts)
    write_json(args.json, {"facts": facts, "results": results})


if __name__ == "__main__":
    main()
