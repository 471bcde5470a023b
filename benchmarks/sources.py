"""Images per second that each source of image files delivers to the model, read with the same training
augmentation (timm's RandomResizedCrop to 224 px, flip, RandAugment) in DataLoader workers.

The benchmark writes the images itself: `--images` smooth random JPEGs of ImageNet's typical size (about
400x350, ~100 KB) in 10 class folders. Each source in SOURCES is timed with 1 worker (the rate one worker gives)
and with `--workers` (the total); the first batch, which pays for starting the workers, is left out. The sources:
the image folder; the same JPEGs as a Hugging Face dataset (data=hf, written with save_to_disk, bytes unchanged);
as LitData shards (data=stream, written by vit.cli.shards) of the original bytes, and resized once to a 256-px
short side; and the original shards served by an S3-compatible server on localhost (moto), read into an empty
litdata cache. A second table times whole epochs: the first from a cold page cache (the files dropped from it
with posix_fadvise; for S3 an empty cache, so the download) against the next.

From the per-worker rate it says how many workers would feed ViT-B/16 training on an H100 (H100_VIT_B16), on
cores like this machine's.

Examples:
  python -m benchmarks.sources                 # 10,000 images; about 25 minutes on 2 cores
  python -m benchmarks.sources --images 2000 --workers 2
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks._common import OTHER_JOBS, machine, parse, parser, report, write_json

CLASSES = 10
H100_VIT_B16 = 2551  # ViT-B/16 training images/s on one H100, eager bf16 (benchmarks/RESULTS.md)
IMAGE_SIZE = (400, 350)  # (W, H): ImageNet's typical photograph
QUALITY, NOISE = 95, 20  # JPEG quality and pixel noise that give ~100 KB files of that size
RESIZED = 256  # the short side of the shards resized once, as ImageNet pipelines store them
BUCKET = "vit-sources"


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


def images_per_second(data: Any, batches: int) -> float:
    """Training images/s of the data module's training loader over `batches` batches after its first, normalised
    in this process as a CPU run's model reads them (the CPU its workers use counts as ours in the disturbance
    reported under the table, not as other jobs')."""
    loader = data.train_dataloader()
    if batches >= len(loader):
        raise SystemExit(f"--batches {batches}: an epoch here has {len(loader)} batches; write more --images")
    iterator = iter(loader)
    next(iterator)  # starting the workers is paid once per run, not per image
    seen = 0
    with OTHER_JOBS.watch():  # its /proc reads (~5 ms) outside the clock
        start = time.perf_counter()
        for _ in range(batches):
            images, _ = data.on_after_batch_transfer(next(iterator), 0)  # normalised, as the model reads them
            seen += len(images)
        seconds = time.perf_counter() - start
    del iterator
    return seen / seconds


def epoch_seconds(data: Any) -> float:
    """Seconds for one whole training epoch (the first after a cold cache includes the download)."""
    start = time.perf_counter()
    for batch in data.train_dataloader():
        data.on_after_batch_transfer(batch, 0)
    return time.perf_counter() - start


@dataclass
class Bench:
    """Where a run's data lives: `work` holds folder/ (the JPEGs) and each source's copy; `endpoint` is the local S3
    server's URL; every cold start of a remote source gets a new, empty litdata cache under work/cache/."""

    work: Path
    batch: int
    endpoint: str | None = None
    caches: int = 0

    @property
    def folder(self) -> Path:
        return self.work / "folder"

    def new_cache(self) -> str:
        self.caches += 1
        return str(self.work / "cache" / str(self.caches))


def folder_data(bench: Bench, workers: int) -> tuple[Any, Path]:
    from vit.data.encoded.imagefolder import ImageFolderDataModule

    data = ImageFolderDataModule(
        root=str(bench.folder),
        num_classes=CLASSES,
        img_size=224,
        batch_size=bench.batch,
        num_workers=workers,
        verify_images=False,
    )
    data.setup()
    return data, bench.folder


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


def hf_data(bench: Bench, workers: int) -> tuple[Any, Path]:
    from vit.data.encoded.hf import HFDataModule

    hf = bench.work / "hf"
    if not hf.is_dir():
        write_hf(bench.folder, hf)
    data = HFDataModule(
        root=str(hf),
        num_classes=CLASSES,
        img_size=224,
        batch_size=bench.batch,
        num_workers=workers,
        verify_images=False,
    )
    data.setup()
    return data, hf


def shards(bench: Bench, short_side: int | None = None) -> Path:
    """The image folder as shards (python -m vit.cli.shards), written once: each JPEG's bytes, or resized once."""
    from vit.data.shards.writer import write_shards

    out = bench.work / (f"shards{short_side}" if short_side else "shards")
    if not (out / "shards.json").is_file():
        start = time.perf_counter()
        write_shards(str(bench.folder), str(out), kind="imagefolder", resize_short_side=short_side)
        print(f"wrote {out.name} in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def stream(root: str, bench: Bench, workers: int, **options: Any) -> Any:
    from vit.data.encoded.stream import StreamDataModule

    data = StreamDataModule(
        root=root, num_classes=CLASSES, img_size=224, batch_size=bench.batch, num_workers=workers, **options
    )
    data.setup()
    return data


def stream_data(bench: Bench, workers: int) -> tuple[Any, Path]:
    where = shards(bench)
    return stream(str(where), bench, workers), where


def stream_resized_data(bench: Bench, workers: int) -> tuple[Any, Path]:
    where = shards(bench, RESIZED)
    return stream(str(where), bench, workers), where


def stream_s3_data(bench: Bench, workers: int) -> tuple[Any, Path]:
    """The original-bytes shards from the local S3 server, into an empty cache: every run starts cold."""
    where = shards(bench)
    if bench.endpoint is None:
        raise SystemExit("the S3 source needs the local server: run it through main()")
    options = dict(storage_options={"endpoint_url": bench.endpoint}, cache_dir=bench.new_cache())
    return stream(f"s3://{BUCKET}/shards", bench, workers, **options), where


SOURCES: dict[str, Callable[[Bench, int], tuple[Any, Path]]] = {  # (bench, workers) -> (data module, its files)
    "image folder": folder_data,
    "hf (save_to_disk, original JPEG bytes)": hf_data,
    "stream (shards of the original JPEG bytes, local disk)": stream_data,
    f"stream (shards resized once to a {RESIZED}-px short side)": stream_resized_data,
    "stream from S3 (local moto server, empty cache)": stream_s3_data,
}


@contextmanager
def local_s3(bench: Bench) -> Iterator[None]:
    """An S3-compatible server on localhost (moto's server mode) holding work/shards under s3://BUCKET/shards,
    for as long as the benchmark runs; the endpoint is in bench.endpoint."""
    import boto3
    from moto.server import ThreadedMotoServer

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "benchmark")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        bench.endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=bench.endpoint)
        client.create_bucket(Bucket=BUCKET)
        where = shards(bench)
        for path in sorted(where.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), BUCKET, f"shards/{path.relative_to(where).as_posix()}")
        yield
    finally:
        server.stop()
        bench.endpoint = None


def evict(folder: Path) -> None:
    """Drop the folder's files from the page cache (posix_fadvise DONTNEED), so that the next read is from disk."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # pages still dirty from writing stay cached; written back, they can go
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cached_fraction(folder: Path) -> float:
    """The fraction of the folder's bytes in the page cache (mincore through fincore), NaN where it cannot say."""
    files = [str(p) for p in folder.rglob("*") if p.is_file()]
    try:
        out = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE", *files], capture_output=True, text=True)
        pairs = [tuple(map(int, line.split())) for line in out.stdout.splitlines() if line.strip()]
    except (OSError, ValueError):
        return math.nan
    size = sum(size for _, size in pairs)
    return sum(res for res, _ in pairs) / size if size else math.nan


def first_and_next_epoch(make: Callable[[Bench, int], tuple[Any, Path]], bench: Bench, workers: int) -> list[float]:
    """Seconds of a cold first epoch (the files out of the page cache, a remote source's cache empty) and of the
    epoch after it, on the same data module."""
    data, where = make(bench, workers)
    evict(where)
    cold = cached_fraction(where)
    if cold > 0.05:
        print(f"note: {cold:.0%} of {where.name} stayed in the page cache", flush=True)
    return [epoch_seconds(data), epoch_seconds(data)]


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
    p.add_argument("--no-epochs", action="store_true", help="leave out the first-against-next epoch table")
    p.add_argument("--keep", type=Path, help="write the data here and keep it (default: a temporary folder)")
    args = parse(p, argv)
    if args.quick:
        args.images, args.batches, args.batch = 64, 2, 8
    facts = machine(args.device)
    rows, results, epochs = [], {}, []
    with scratch(args.keep) as work:
        bench = Bench(work, args.batch)
        if not bench.folder.is_dir():
            start = time.perf_counter()
            write_jpegs(bench.folder, args.images)
            print(f"wrote {args.images} JPEGs in {time.perf_counter() - start:.0f} s", flush=True)
        jpegs = list((bench.folder / "train").rglob("*.jpg"))
        facts["mean_jpeg_kb"] = round(disk_bytes(bench.folder / "train") / len(jpegs) / 1e3, 1)
        with local_s3(bench):
            for name, make in SOURCES.items():
                one = images_per_second(make(bench, 1)[0], args.batches)
                total_data, where = make(bench, args.workers)
                total = images_per_second(total_data, args.batches)
                need = math.ceil(H100_VIT_B16 / one)
                disk = disk_bytes(where) / 1e6
                results[name] = dict(per_worker=one, total=total, workers_for_h100_vit_b16=need, disk_mb=disk)
                rows.append([name, f"{one:.0f}", f"{total:.0f} ({args.workers} workers)", need, f"{disk:.0f}"])
                if not args.no_epochs:
                    first, then = first_and_next_epoch(make, bench, args.workers)
                    results[name].update(first_epoch_s=first, next_epoch_s=then)
                    epochs.append([name, f"{first:.1f}", f"{then:.1f}", f"{first / then:.2f}"])
    report(
        f"Images/s delivered at 224 px with training augmentation, {args.images} JPEGs of ~{facts['mean_jpeg_kb']} KB",
        ["source", "1 worker", "total", "workers for an H100's ViT-B/16 (2,551/s)", "disk MB"],
        rows,
        facts,
    )
    if epochs:
        report(
            f"Seconds per training epoch with {args.workers} workers: the first from a cold page cache (and an "
            "empty litdata cache for S3), the next",
            ["source", "first epoch s", "next epoch s", "first / next"],
            epochs,
            facts,
        )
    write_json(args.json, {"machine": facts, "results": results})


if __name__ == "__main__":
    main()
