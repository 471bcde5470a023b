"""Images/s an image folder delivers to the model at 224 px with crops and flips (no RandAugment, which needs PIL):
decoded in DataLoader workers (data.decode=workers: PIL, then timm's transforms) against on the training device
(data.decode=device: the workers read headers and draw crops; torchvision.io decodes each batch on the device,
nvjpeg on a GPU), issue #19. A batch counts once it is on the device as the model reads it (normalised, synchronised).

The JPEGs are benchmarks/sources.py's: smooth random photographs of ImageNet's typical size (~400x350, ~100 KB).

Examples:
  python -m benchmarks.decode --device cuda --workers 1 4 16
  python -m benchmarks.decode --quick
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from benchmarks._common import OTHER_JOBS, machine, parse, parser, report, synchronize, write_json
from benchmarks.sources import CLASSES, H100_VIT_B16, write_jpegs


def images_per_second(data: Any, device: torch.device, batches: int) -> float:
    """Training images/s through the loader and the device's half, over `batches` batches after the first."""
    iterator = iter(data.train_dataloader())
    data.on_after_batch_transfer(move_data_to_device(next(iterator), device), 0)  # workers start; kernels load
    synchronize(device)
    seen = 0
    with OTHER_JOBS.watch():
        start = time.perf_counter()
        for _ in range(batches):
            images, _ = data.on_after_batch_transfer(move_data_to_device(next(iterator), device), 0)
            seen += len(images)
        synchronize(device)
        seconds = time.perf_counter() - start
    del iterator
    return seen / seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from vit.data.imagefolder import ImageFolderDataModule

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
                    str(folder), CLASSES, batch_size=args.batch, num_workers=workers, auto_augment=None,
                    verify_images=False, decode=decode,
                )  # fmt: skip
                data.setup()
                rate = images_per_second(data, args.device, args.batches)
                results[f"{decode}/{workers}"] = rate
                rows.append([decode, workers, f"{rate:,.0f}", f"{rate / H100_VIT_B16:.2f}"])
    report(
        f"Images/s delivered to {args.device} at 224 px, crops and flips, batches of {args.batch}",
        ["decoded in", "workers", "images/s", "/ an H100's ViT-B/16 training (2,551/s)"],
        rows,
        facts,
    )
    write_json(args.json, {"machine": facts, "results": results})
    return results


if __name__ == "__main__":
    main()
