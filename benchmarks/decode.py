"""Images/s an image folder delivers to the model at 224 px with crops and flips (no RandAugment, which needs PIL):
decoded in DataLoader workers (data.decode=workers: PIL, then timm's transforms) against on the training device
(data.decode=device: the workers read headers and draw crops; torchvision.io decodes each batch on the device,
nvjpeg on a GPU). A batch counts once it is on the device as the model reads it (normalised,
synchronised); the milliseconds it spent in the training process after the loader handed it over are what a step
waits for. For one batch on the device, the decoder's own milliseconds are set against the whole device half.

The JPEGs are benchmarks/sources.py's: smooth random photographs of ImageNet's typical size (~400x350, ~100 KB).

Examples:
  python -m benchmarks.decode --device cuda --workers 1 4 16
  python -m benchmarks.decode --quick
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torchvision.io import ImageReadMode, decode_jpeg

from benchmarks._common import OTHER_JOBS, alternate, machine, parse, parser, report, synchronize, write_json
from benchmarks.sources import CLASSES, H100_VIT_B16, write_jpegs


def images_per_second(data: Any, device: torch.device, batches: int) -> tuple[float, float]:
    """Training images/s through the loader and the device's half, over `batches` batches after the first, and
    the milliseconds a batch spends in the training process once the loader hands it over (the transfer and,
    decoding on the device, the decode, crops and resizes: time a training step waits for)."""
    iterator = iter(data.train_dataloader())
    data.on_after_batch_transfer(move_data_to_device(next(iterator), device), 0)  # workers start; kernels load
    synchronize(device)
    seen, in_process = 0, 0.0
    with OTHER_JOBS.watch():
        start = time.perf_counter()
        for _ in range(batches):
            batch = next(iterator)
            handed_over = time.perf_counter()
            images, _ = data.on_after_batch_transfer(move_data_to_device(batch, device), 0)
            synchronize(device)  # as a step's loss would
            in_process += time.perf_counter() - handed_over
            seen += len(images)
        seconds = time.perf_counter() - start
    del iterator
    return seen / seconds, in_process / batches * 1e3


def one_batch_split(data: Any, device: torch.device, repeats: int) -> dict[str, float]:
    """Milliseconds of one training batch on the device: nvjpeg's (torchvision.io's) decode of its JPEG bytes
    alone, and the whole device half (`EncodedBatch.pixels`: decode, framing, normalising), medians of `repeats`
    calls taken in turns; the difference is what our framing adds to the decoder."""
    encoded, _ = next(iter(data.train_dataloader()))
    encoded = encoded.to(device)
    jpegs = [item.data for item in encoded.items if item.data.dim() == 1]
    candidates = {
        "decode_ms": lambda: decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=device),
        "device_half_ms": encoded.pixels,
    }
    times = alternate(candidates, repeats, warmup=1, device=device, sample_seconds=0.0)  # one call a sample
    return {name: statistics.median(seconds) * 1e3 for name, seconds in times.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from vit.data.encoded.imagefolder import ImageFolderDataModule

    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--images", type=int, default=4000, help="training JPEGs written (default: %(default)s)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count()], help="worker counts timed")
    p.add_argument("--batches", type=int, default=20, help="batches timed per case (default: %(default)s)")
    p.add_argument("--batch", type=int, default=256, help="images a batch (default: %(default)s)")
    args = parse(p, argv)
    if args.quick:
        args.images, args.batches, args.batch, args.workers = 48, 2, 8, [0, 1]
    facts = machine(args.device)
    rows, results = [], {}
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        write_jpegs(folder, args.images)
        for decode in ("workers", "device"):
            for workers in args.workers:
                data = ImageFolderDataModule(
                    root=str(folder), num_classes=CLASSES, batch_size=args.batch, num_workers=workers,
                    auto_augment=None, verify_images=False, decode=decode,
                )  # fmt: skip
                data.setup()
                rate, ms = images_per_second(data, args.device, args.batches)
                results[f"{decode}/{workers}"] = dict(images_per_second=rate, ms_in_training_process=ms)
                rows.append([decode, workers, f"{rate:,.0f}", f"{ms:.1f}", f"{rate / H100_VIT_B16:.2f}"])
        results["device/one batch"] = split = one_batch_split(data, args.device, repeats=3 if args.quick else 10)
    report(
        f"Images/s delivered to {args.device} at 224 px, crops and flips, batches of {args.batch}",
        ["decoded in", "workers", "images/s", "ms a batch in the training process", "/ an H100's ViT-B/16 (2,551/s)"],
        rows,
        facts,
    )
    print(
        f"One batch of {args.batch} on {args.device}: the decode alone {split['decode_ms']:.1f} ms, the whole device "
        f"half (decode, crops, resizes, flips, normalising) {split['device_half_ms']:.1f} ms (medians)\n"
    )
    write_json(args.json, {"machine": facts, "results": results})
    return results


if __name__ == "__main__":
    main()
