r"""A trained checkpoint as it would be served: test accuracy of the int8 ONNX export against the float model, and
each runtime's images/s and p50 / p99 latency at batch 1 and 32, in one process: torch eager (Loaded.logits, the
run's test-time views), torch compiled, the torch.export program (`export --format pt2`), ONNX Runtime on the fp32
graph (`--format onnx`) and on the int8 one (`--format onnx --quantize int8`). Every runtime scores the same images,
the checkpoint's test split read as its test read it (vit.cli.run_data); latency is one call's wall time.

    python -m benchmarks.deploy --checkpoint CKPT [--calls 200] [--json PATH]
    python -m benchmarks.deploy --quick   # a one-epoch tiny synthetic run: seconds
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from benchmarks._common import compose, machine, parse, parser, report, watched, write_json
from vit.checkpoint import load
from vit.cli.export import to_int8_onnx, to_onnx, to_pt2
from vit.cli.run_data import evaluation_data
from vit.training.run import train

BATCHES = (1, 32)


def runtimes(checkpoint: Path, folder: Path, threads: int) -> dict[str, Callable[[Tensor], np.ndarray]]:
    """Each runtime as images (B, C, H, W) -> logits (B, K), numpy."""
    import onnxruntime

    loaded = load(checkpoint)
    loaded.model.eval()
    to_onnx(loaded, folder / "m.onnx")
    to_int8_onnx(loaded, folder / "m8.onnx")
    to_pt2(loaded, folder / "m.pt2")
    program = torch.export.load(str(folder / "m.pt2")).module()
    compiled = torch.compile(loaded.logits)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    graphs = {
        name: onnxruntime.InferenceSession(str(folder / file), options, providers=["CPUExecutionProvider"])
        for name, file in (("onnx fp32", "m.onnx"), ("onnx int8", "m8.onnx"))
    }

    def torch_call(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], np.ndarray]:
        def call(images: Tensor) -> np.ndarray:
            with torch.inference_mode():
                return fn(images).float().numpy()

        return call

    def onnx_call(graph: Any) -> Callable[[Tensor], np.ndarray]:
        return lambda images: graph.run(["logits"], {"images": images.numpy()})[0]

    return {
        "torch eager": torch_call(loaded.logits),
        "torch compiled": torch_call(compiled),
        "torch.export (pt2)": torch_call(program),
        **{name: onnx_call(graph) for name, graph in graphs.items()},
    }


def timed(call: Callable[[Tensor], np.ndarray], images: Tensor, calls: int) -> dict[str, float]:
    """images/s and the p50 / p99 of one call's wall time in ms, after a few calls that warm it up."""
    for _ in range(5):
        call(images)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        call(images)
        seconds.append(time.perf_counter() - start)
    ms = np.array(seconds) * 1000
    return {"img_s": len(images) / np.mean(seconds), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99))}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--checkpoint", type=Path, help="a run's checkpoint (default with --quick: a tiny run's)")
    p.add_argument("--calls", type=int, default=200, help="timed calls per runtime and batch")
    args = parse(p, argv)
    facts = machine(args.device)
    payload: dict[str, Any] = {"machine": facts}
    with tempfile.TemporaryDirectory(prefix="deploy_") as tmp:
        folder = Path(tmp)
        checkpoint = args.checkpoint
        if checkpoint is None:
            if not args.quick:
                p.error("--checkpoint: the run to serve (or --quick for a tiny one)")
            cfg = compose("data=synthetic", "model.embed_dim=32", "model.depth=1", "model.num_heads=4",
                          "model.patch_size=4", "trainer.max_epochs=1", "compile=false",
                          "callbacks.pos_embed_figure=null", f"output_dir={folder / 'run'}")  # fmt: skip
            checkpoint = Path(train(cfg)["best_checkpoint"])
        loaded = load(checkpoint)
        data = evaluation_data(checkpoint, [], loaded)
        batches = [data.on_after_batch_transfer(batch, 0) for batch in data.test_dataloader()]
        images, labels = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
        calls = runtimes(checkpoint, folder, torch.get_num_threads())
        with watched() as others:
            for name, call in calls.items():
                logits = np.concatenate([call(part) for part in images.split(500)])
                row = {"test_acc": float((logits.argmax(-1) == labels.numpy()).mean())}
                for batch in BATCHES:
                    row[batch] = timed(call, images[:batch], 2 if args.quick else args.calls)
                payload[name] = row
        payload["other_jobs_cores"] = others.cores
    reference = payload["torch eager"]["test_acc"]
    rows = [
        [name, f"{r['test_acc']:.2%}", f"{100 * (r['test_acc'] - reference):+.2f}",
         *(f"{r[b]['img_s']:,.0f}; {r[b]['p50_ms']:.2f} / {r[b]['p99_ms']:.2f}" for b in BATCHES)]
        for name, r in payload.items() if isinstance(r, dict) and "test_acc" in r
    ]  # fmt: skip
    header = ["runtime", "test acc", "points vs eager", *(f"batch {b}: img/s; p50 / p99 ms" for b in BATCHES)]
    report(f"Serving {checkpoint.name}: {len(labels):,} test images", header, rows, facts)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
