r"""A trained checkpoint as it would be served: test accuracy of the int8 ONNX exports against the float model, and
each runtime's images/s and p50 / p99 latency at batch 1 and 32, in one process: torch eager (Loaded.logits, the
run's test-time views), torch compiled, the torch.export program (`export --format pt2`), ONNX Runtime on the fp32
graph (`--format onnx`), on the dynamic int8 one (`--quantize int8`) and on the static int8 one (`--quantize
int8-static`, calibrated on the export's default count of the run's validation images). Every runtime scores the
same images, the checkpoint's test split read as its test read it (vit.cli.run_data); latency is one call's wall
time.

With --service it also starts `python -m vit.cli.serve` on the checkpoint and sends it PNGs of the test images from
32 client threads at once: images/s and each request's p50 / p99, against predict (vit.cli.predict's function, one
image a call, in this process).

    python -m benchmarks.deploy --checkpoint CKPT [--calls 200] [--service] [--json PATH]
    python -m benchmarks.deploy --quick   # a one-epoch tiny synthetic run: seconds
"""

from __future__ import annotations

import io
import signal
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
from vit.cli.export import CALIBRATION_IMAGES, to_int8_onnx, to_onnx, to_pt2
from vit.cli.run_data import calibration_images, evaluation_data
from vit.training.run import train

BATCHES = (1, 32)
CLIENTS = 32


def service(checkpoint: Path, pictures: list[bytes], port: int = 8911) -> dict[str, float]:
    """The server of `python -m vit.cli.serve` on loopback, answering CLIENTS threads that each send their share of
    `pictures` (PNG bytes) one request after another: images/s over all, and one request's p50 / p99 in ms."""
    import subprocess
    import sys
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    command = [sys.executable, "-m", "vit.cli.serve", "--checkpoint", str(checkpoint), "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                    if answer.read() == b"ok":
                        break
            except OSError:
                time.sleep(0.5)

        def send(picture: bytes) -> float:
            start = time.perf_counter()
            request = urllib.request.Request(f"{url}/predict", data=picture, headers={"Content-Type": "image/png"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                answer.read()
            return time.perf_counter() - start

        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(send, pictures[:CLIENTS]))  # warm-up
            start = time.perf_counter()
            seconds = list(pool.map(send, pictures))
            wall = time.perf_counter() - start
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    ms = np.array(seconds) * 1000
    return {"img_s": len(pictures) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99))}  # fmt: skip


def png(image: Tensor, mean: Sequence[float], std: Sequence[float]) -> bytes:
    """A model input (C, H, W) back to the 8-bit PNG a client would send."""
    from PIL import Image

    pixels = (image * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)).clamp(0, 1)
    array = (pixels * 255).round().byte().permute(1, 2, 0).squeeze(-1).numpy()
    out = io.BytesIO()
    Image.fromarray(array).save(out, "PNG")
    return out.getvalue()


def runtimes(checkpoint: Path, folder: Path, threads: int) -> dict[str, Callable[[Tensor], np.ndarray]]:
    """Each runtime as images (B, C, H, W) -> logits (B, K), numpy."""
    import onnxruntime

    loaded = load(checkpoint)
    loaded.model.eval()
    to_onnx(loaded, folder / "m.onnx")
    to_int8_onnx(loaded, folder / "m8.onnx")
    to_int8_onnx(loaded, folder / "m8s.onnx", calibration_images(checkpoint, [], loaded, CALIBRATION_IMAGES))
    to_pt2(loaded, folder / "m.pt2")
    program = torch.export.load(str(folder / "m.pt2")).module()
    compiled = torch.compile(loaded.logits)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    graphs = {
        name: onnxruntime.InferenceSession(str(folder / file), options, providers=["CPUExecutionProvider"])
        for name, file in (("onnx fp32", "m.onnx"), ("onnx int8", "m8.onnx"), ("onnx int8-static", "m8s.onnx"))
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
    p.add_argument("--service", action="store_true", help="also time the HTTP service against predict")
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
            if args.service:
                from PIL import Image

                from vit.cli.predict import predict

                count = 64 if args.quick else 2000
                pictures = [png(x, loaded.mean, loaded.std) for x in images[:count]]
                payload["service"] = service(checkpoint, pictures)
                start = time.perf_counter()
                for picture in pictures:
                    predict(loaded, Image.open(io.BytesIO(picture)))
                payload["predict_img_s"] = len(pictures) / (time.perf_counter() - start)
        payload["other_jobs_cores"] = others.cores
    reference = payload["torch eager"]["test_acc"]
    rows = [
        [name, f"{r['test_acc']:.2%}", f"{100 * (r['test_acc'] - reference):+.2f}",
         *(f"{r[b]['img_s']:,.0f}; {r[b]['p50_ms']:.2f} / {r[b]['p99_ms']:.2f}" for b in BATCHES)]
        for name, r in payload.items() if isinstance(r, dict) and "test_acc" in r
    ]  # fmt: skip
    header = ["runtime", "test acc", "points vs eager", *(f"batch {b}: img/s; p50 / p99 ms" for b in BATCHES)]
    if "service" in payload:
        served = payload["service"]
        rows.append([f"`vit.cli.serve`, {CLIENTS} clients (predict: {payload['predict_img_s']:,.0f} img/s)", "", "",
                     "", f"{served['img_s']:,.0f}; {served['p50_ms']:.2f} / {served['p99_ms']:.2f}"])  # fmt: skip
    report(f"Serving {checkpoint.name}: {len(labels):,} test images", header, rows, facts)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
