"""Images per second that each source of image files delivers to the model, read with the same training
augmentation (timm's RandomResizedCrop to 224 px, flip, RandAugment) in DataLoader workers (issue #19).

The benchmark writes the images itself: `--images` smooth random JPEGs of ImageNet's typical size (about
400x350, ~100 KB) in 10 class folders. Each source in SOURCES is timed with 1 worker (the rate one worker gives)
and with `--workers` (the total); the first batch, which pays for starting the workers, is left out. SOURCES
holds the image folder and the same JPEGs as a Hugging Face dataset (data=hf, written with save_to_disk, bytes
unchanged); LitData shards (data=stream) join with their data module.

From the per-worker rate it says how many workers would feed ViT-B/16 training on an H100 (2,551 images/s
eager, benchmarks/RESULTS.md), on cores like this machine's.

Examples:
  python -m benchmarks.sources                 # 10,000 images; about 15 minutes on 2 cores
  python -m benchmarks.sources --images 2000 --workers 2
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks._common import CLOCK_TICKS, OTHER_JOBS, machine, parse, parser, report, write_json

CLASSES = 10
H100_VIT_B16 = 2551  # ViT-B/16 training images/s on one H100, eager bf16 (benchmarks/RESULTS.md)
IMAGE_SIZE = (400, 350)  # (W, H): ImageNet's typical photograph
QUALITY, NOISE = 95, 20  # JPEG quality and pixel noise that give ~100 KB files of that size


def write_jpegs(root: Path, images: int, seed: int = 0) -> None:
    """root/train/<class>/*.jpg (images of them) and root/val/<class>/*.jpg (a tenth as many): smooth random
    colour fields plus noise, so that JPEG sizes and decoding costs are those of photographs, not of flat tiles."""
    rng = np.random.default_rng(seed)
    w, h = IMAGE_SIZE
    for split, count in (("train", images), ("val", max(CLASSES, images // 10))):
        for k in range(count):
            folder = root / split / f"class_{k % CLASSES}"
            folder.mkdir(parents=True, exist_ok=True)
            low = rng.integers(0, 256, (h // 25 + 1, w // 25 + 1, 3), dtype=np.uint8)
            field = np.asarray(Image.fromarray(low).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
            pixels = np.clip(field + rng.normal(0, NOISE, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{k:06d}.jpg", quality=QUALITY)


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (/proc/PID/stat), 0 for any that is gone."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
        except (OSError, IndexError, ValueError):
            pass
    return total / CLOCK_TICKS


def images_per_second(data: Any, batches: int) -> float:
    """Training images/s of the data module's training loader over `batches` batches after its first. The CPU
    its workers use counts as ours, not as other jobs', in the disturbance reported under the table."""
    loader = data.train_dataloader()
    if batches >= len(loader):
        raise SystemExit(f"--batches {batches}: an epoch here has {len(loader)} batches; write more --images")
    iterator = iter(loader)
    next(iterator)  # starting the workers is paid once per run, not per image
    # a loader that wraps its pass (ResumableLoader) keeps DataLoader's persistent iterator, workers and all
    workers = [w.pid for w in getattr(getattr(loader, "_iterator", None) or iterator, "_workers", [])]
    start, seen, worker_cpu = time.perf_counter(), 0, _cpu_seconds(workers)
    with OTHER_JOBS.watch():
        for _ in range(batches):
            images, _ = next(iterator)
            seen += len(images)
        OTHER_JOBS.cpu -= _cpu_seconds(workers) - worker_cpu
    rate = seen / (time.perf_counter() - start)
    del iterator
    return rate


def epoch_seconds(data: Any) -> float:
    """Seconds for one whole training epoch (the first after a cold cache includes the download)."""
    start = time.perf_counter()
    for _ in data.train_dataloader():
        pass
    return time.perf_counter() - start


def folder_data(root: Path, workers: int, batch: int) -> Any:
    from vit.data.imagefolder import ImageFolderDataModule

    data = ImageFolderDataModule(
        str(root), num_classes=CLASSES, img_size=224, batch_size=batch, num_workers=workers, verify_images=False
    )
    data.setup()
    return data


def write_hf(folder: Path, out: Path) -> None:
    """The folder's JPEGs, their bytes unchanged, as a save_to_disk DatasetDict (train, and val/ as test) with an
    Image column and a ClassLabel, as a user would convert an image folder to train with data=hf."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    names = sorted(p.name for p in (folder / "train").iterdir())
    features = Features({"image": Image(), "label": ClassLabel(names=names)})
    splits = {}
    for split, name in (("train", "train"), ("val", "test")):
        files = sorted((folder / split).rglob("*.jpg"))
        rows = {"image": [{"bytes": f.read_bytes(), "path": None} for f in files]}
        rows["label"] = [names.index(f.parent.name) for f in files]
        splits[name] = Dataset.from_dict(rows, features=features)
    DatasetDict(splits).save_to_disk(str(out))


def hf_data(root: Path, workers: int, batch: int) -> Any:
    from vit.data.hf import HFDataModule

    hf = root.parent / "hf"
    if not hf.is_dir():
        write_hf(root, hf)
    data = HFDataModule(
        str(hf), num_classes=CLASSES, img_size=224, batch_size=batch, num_workers=workers, verify_images=False
    )
    data.setup()
    return data


SOURCES: dict[str, Callable[[Path, int, int], Any]] = {  # (root of the image folder, workers, batch)
    "image folder": folder_data,
    "hf (save_to_disk, original JPEG bytes)": hf_data,
}


@contextmanager
def scratch(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    folder = Path(tempfile.mkdtemp(prefix="vit-sources-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--images", type=int, default=10_000, help="training JPEGs written (default: %(default)s)")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="workers of the total rate (default: cores)")
    p.add_argument("--batches", type=int, default=20, help="batches timed per case (default: %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="images a batch (default: %(default)s)")
    p.add_argument("--keep", type=Path, help="write the data here and keep it (default: a temporary folder)")
    args = parse(p, argv)
    if args.quick:
        args.images, args.batches, args.batch = 64, 2, 8
    facts = machine(args.device)
    rows, results = [], {}
    with scratch(args.keep) as work:
        folder = work / "folder"
        if not folder.is_dir():
            start = time.perf_counter()
            write_jpegs(folder, args.images)
            print(f"wrote {args.images} JPEGs in {time.perf_counter() - start:.0f} s", flush=True)
        jpegs = list((folder / "train").rglob("*.jpg"))
        facts["mean_jpeg_kb"] = round(disk_bytes(folder / "train") / len(jpegs) / 1e3, 1)
        for name, make in SOURCES.items():
            one = images_per_second(make(folder, 1, args.batch), args.batches)
            total = images_per_second(make(folder, args.workers, args.batch), args.batches)
            need = math.ceil(H100_VIT_B16 / one)
            disk = disk_bytes(folder if name == "image folder" else work / "hf") / 1e6
            results[name] = {"per_worker": one, "total": total, "workers_for_h100_vit_b16": need, "disk_mb": disk}
            rows.append([name, f"{one:.0f}", f"{total:.0f} ({args.workers} workers)", need, f"{disk:.0f}"])
    report(
        f"Images/s delivered at 224 px with training augmentation, {args.images} JPEGs of ~{facts['mean_jpeg_kb']} KB",
        ["source", "1 worker", "total", "workers for an H100's ViT-B/16 (2,551/s)", "disk MB"],
        rows,
        facts,
    )
    write_json(args.json, {"machine": facts, "results": results})


if __name__ == "__main__":
    main()
