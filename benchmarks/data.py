"""Does the data or the model bound training? Images/s of each data path next to the training images/s of the
model it feeds, on the same device.

1. In memory (Fashion-MNIST, CIFAR, synthetic): uint8 images held in memory, a batch cut by one index op,
   moved to the device, then augmented there by BatchAugment in one op per batch (random crop, flip,
   normalise). Timed twice: the augmentation alone on a batch already on the device, and the whole path as
   training reads it (the data module's training loader, the transfer, the augmentation). It feeds the
   experiment's own model (Fashion-MNIST: the default run's p7, D=64 model at its batch of 128).
2. Image folder (ImageNet-style JPEGs): decoding and timm's training transforms (RandomResizedCrop, flip,
   RandAugment) per image, in DataLoader workers. Timed with num_workers=0, so the rate is one worker's; W
   workers give at most W times it, on cores the model then cannot use. The folder is synthetic: smooth random
   JPEGs of Imagenette's size (320 px short side), written to a temporary directory, read with the imagenette
   experiment's data config (160 px crops). It feeds ViT-Ti/16 at that size (and ViT-S/16 on CUDA).

Target: the in-memory path runs at least 10x faster than the model consumes.

Examples:
  python -m benchmarks.data
  python -m benchmarks.data --device cuda
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks._common import (
    OTHER_JOBS,
    alternate,
    compose,
    data_module,
    machine,
    parse,
    parser,
    report,
    synchronize,
    write_json,
)
from benchmarks.throughput import make_step
from vit.model import VisionTransformer
from vit.model.config import ViTConfig
from vit.model.presets import preset_config
from vit.training.checks import model_fields

IN_MEMORY_TARGET = 10  # augmentation at least 10x the model's consumption
IN_MEMORY_CASES = {  # name: overrides of the experiment's data config
    "as configured": [],
    "crop 2 + flip": ["data.crop_padding=2", "data.flip=true"],  # what fashion_mnist_best adds
}
# the models an image folder feeds (preset: batch): the smallest is the hardest for the data path to keep up with
FOLDER_MODELS = {"cpu": {"vit_tiny_16": 8}, "cuda": {"vit_tiny_16": 256, "vit_small_16": 256}}
FOLDER_CLASSES = 2
FOLDER_EXPERIMENT = "imagenette"  # its data config is the image-folder path, at its img_size
JPEG_SIDES = (320, 426)  # Imagenette's "320 px" release: short side 320, 4:3 landscape
JPEG_QUALITY = 90


def model_rate(config: ViTConfig, batch: int, args, repeats: int) -> float:
    """Training images/s of our model (eager, fused AdamW) at this batch, median of `repeats` steps."""
    torch.manual_seed(0)
    model = VisionTransformer(config).to(args.device)
    images = torch.randn(batch, config.in_chans, *config.img_size, device=args.device)
    labels = torch.randint(0, config.num_classes, (batch,), device=args.device)
    step = make_step(model, "train", images, labels, args.device, args.precision)
    times = alternate({"model": step}, repeats, warmup=2, device=args.device, sample_seconds=args.sample_seconds)
    return batch / statistics.median(times["model"])


# 1. in memory ----------------------------------------------------------------------------------------------
def in_memory(args, workdir: Path) -> list[dict[str, Any]]:
    results = []
    model_ips = None
    for case, overrides in IN_MEMORY_CASES.items():
        extra = [f"data.root={args.data_root}"] if args.data_root else []
        cfg = compose(f"experiment={args.experiment}", f"output_dir={workdir}", *extra, *overrides)
        data = data_module(cfg)
        data.augment.to(args.device)
        batch = cfg.data.batch_size

        loader = data.train_dataloader()
        batches = iter(loader)
        resident = next(batches)[0].to(args.device)
        augment_s = alternate(
            {"augment": lambda data=data, resident=resident: data.augment(resident, train=True)},
            args.repeats,
            warmup=3,
            device=args.device,
            sample_seconds=args.sample_seconds,
        )["augment"]

        timed = min(args.loader_batches, len(loader) - 1)
        with OTHER_JOBS.watch():
            synchronize(args.device)
            start = time.perf_counter()
            for _ in range(timed):
                images, labels = next(batches)
                images, labels = images.to(args.device, non_blocking=True), labels.to(args.device, non_blocking=True)
                data.augment(images, train=True)
            synchronize(args.device)
            path_ips = timed * batch / (time.perf_counter() - start)

        config = ViTConfig.from_dict(model_fields(cfg)[0])
        if model_ips is None:  # the model is the same for every case
            model_ips = model_rate(config, batch, args, args.repeats)
        augment_ips = batch / statistics.median(augment_s)
        results.append(
            {
                "path": f"in memory, {cfg.data._target_.rsplit('.', 1)[-1]}, {case}",
                "batch": batch,
                "augment_images_per_second": augment_ips,
                "data_images_per_second": path_ips,
                "model": f"{args.experiment}: patch {config.patch_size[0]}, D={config.embed_dim}, depth {config.depth}",
                "model_images_per_second": model_ips,
            }
        )
    return results


# 2. image folder -------------------------------------------------------------------------------------------
def write_jpegs(root: Path, per_class: int) -> None:
    """root/{train,val}/<class>/*.jpg: smooth random colour fields (upsampled noise), so that they compress
    and decode like photographs rather than like noise."""
    rng = np.random.default_rng(0)
    short, long = JPEG_SIDES
    for split, count in (("train", per_class), ("val", 1)):
        for k in range(FOLDER_CLASSES):
            folder = root / split / f"class{k}"
            folder.mkdir(parents=True)
            for i in range(count):
                coarse = rng.integers(0, 256, (short // 16, long // 16, 3), dtype=np.uint8)
                image = Image.fromarray(coarse).resize((long, short), Image.BICUBIC)
                image.save(folder / f"{i}.jpg", quality=JPEG_QUALITY)


def image_folder(args, workdir: Path) -> list[dict[str, Any]]:
    root = workdir / "folder"
    write_jpegs(root, args.folder_images // FOLDER_CLASSES)
    batch = args.folder_batch
    cfg = compose(
        f"experiment={FOLDER_EXPERIMENT}",
        f"data.root={root}",
        "data.num_workers=0",
        f"data.batch_size={batch}",
        "data.val_fraction=0.01",
        f"output_dir={workdir}",
    )
    data = data_module(cfg)
    loader = iter(data.train_dataloader())
    next(loader)  # the first batch pays for opening the iterator
    with OTHER_JOBS.watch():
        seen, start = 0, time.perf_counter()
        for images, _ in loader:
            seen += len(images)
        per_worker = seen / (time.perf_counter() - start)
    results = []
    for preset, model_batch in args.folder_models.items():
        config = preset_config(preset, img_size=cfg.data.img_size, num_classes=cfg.data.num_classes)
        results.append(
            {
                "path": f"image folder ({FOLDER_EXPERIMENT}), one worker",
                "batch": model_batch,
                "augment_images_per_second": None,
                "data_images_per_second": per_worker,
                "model": f"{preset} at {cfg.data.img_size} px",
                "model_images_per_second": model_rate(config, model_batch, args, max(2, args.repeats // 2)),
            }
        )
    return results


def row(r: dict[str, Any]) -> list[str]:
    ratio = r["data_images_per_second"] / r["model_images_per_second"]
    augment = r["augment_images_per_second"]
    in_memory = augment is not None
    return [
        r["path"],
        f"{augment:,.0f}" if in_memory else "—",
        f"{r['data_images_per_second']:,.0f}",
        f"{r['model']} (batch {r['batch']})",
        f"{r['model_images_per_second']:,.1f}",
        f"**{ratio:,.1f}x**",
        "data" if ratio < 1 else "model",
        str(math.ceil(1 / ratio)) if ratio < 1 else "1",
        ("met" if ratio >= IN_MEMORY_TARGET else "not met") if in_memory else "—",
    ]


HEADER = ["data path", "augment only img/s", "whole path img/s", "model (training)", "model img/s"]
HEADER += ["data / model", "bound by", "workers needed", f"in memory ≥ {IN_MEMORY_TARGET}x"]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = parser(__doc__)
    p.add_argument("--experiment", default="fashion_mnist", help="its data config is the in-memory path")
    p.add_argument("--data-root", help="data.root (default: the data config's)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--loader-batches", type=int, default=200, help="batches read through the whole in-memory path")
    p.add_argument("--folder-images", type=int, default=128, help="training JPEGs in the synthetic folder")
    p.add_argument("--folder-batch", type=int, default=16, help="batch of the image-folder loader")
    p.add_argument("--skip-folder", action="store_true", help="measure the in-memory path only")
    args = parse(p, argv)
    if args.quick:
        args.repeats, args.sample_seconds, args.loader_batches, args.folder_images, args.folder_batch = 2, 0.0, 5, 8, 2
    args.folder_models = {"vit_tiny_16": 2} if args.quick else FOLDER_MODELS[args.device.type]
    facts = machine(args.device)
    with tempfile.TemporaryDirectory(prefix="data_bench_") as tmp:
        results = in_memory(args, Path(tmp))
        if not args.skip_folder:
            results += image_folder(args, Path(tmp))
    report("Data path against model consumption (training)", HEADER, [row(r) for r in results], facts)
    write_json(args.json, {"machine": facts, "args": {k: str(v) for k, v in vars(args).items()}, "results": results})
    return results


if __name__ == "__main__":
    main()
