"""Images at their own aspect ratio (data.max_tokens) against the square pipeline, at one token budget.

(a) speed, one run side by side: a batch of images of five aspect ratios, each fitted to the budget, through our
    forward_packed (several images a sequence, block-diagonal masks), timm's NaFlexVit (each image its own sequence,
    padded to the budget, as timm's NaFlex loader batches them) and our square forward (each image squashed to the
    budget's square grid); a training step (forward, cross-entropy, backward, AdamW) and inference, images/s. One
    model on every path: timm's naflexvit_base_patch16_gap at --width, --heads and --depth (four registers an image,
    LayerScale, the norm after pooling), and ours read from it, its weights included (the same logits).
(b) accuracy: Fashion-MNIST padded with black to random aspect ratios (1:3 to 3:1; the stand-in for non-square
    images), an image folder of it, trained by train.py with data.max_tokens=N against the square
    pipeline at data.img_size = sqrt(N) patches a side, the same model, steps and seed.

    python -m benchmarks.naflex [--budget 256] [--batch 16] [--train 6000] [--epochs 3] [--repeats 3] [--skip accuracy]
"""

from __future__ import annotations

import gzip
import math
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data.naflex_transforms import patchify_image

from benchmarks._common import autocast, compose, machine, parse, parser, report, synchronize, write_json
from vit.data.native_size import budget_grid, fit
from vit.interop.timm import from_timm, read_timm_module
from vit.model import VisionTransformer
from vit.training.run import train

RATIOS = [(1, 3), (1, 2), (1, 1), (2, 1), (3, 1)]  # width : height of (a)'s images and (b)'s padding
VAL_FRACTION = 0.1  # of (b)'s training images, held out for validation
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def speed(args: Any) -> list[dict[str, Any]]:
    """(a): seconds a training step and an inference pass of one batch, each path, alternating, median."""
    patch, budget = (16, 16), args.budget
    theirs = timm.create_model("naflexvit_base_patch16_gap", num_classes=10, embed_dim=args.width,
                               depth=args.depth, num_heads=args.heads)  # fmt: skip
    config, renaming = read_timm_module(theirs)  # the same model: its registers, LayerScale, norm after pooling
    ours = VisionTransformer(config)
    ours.load_state_dict(from_timm(renaming(theirs.state_dict()), config))  # and the same weights
    prefix = config.num_prefix_tokens  # timm's registers
    sequence = budget + prefix  # an image's patches and its registers, as timm's sequences hold
    rng = random.Random(0)
    images = [torch.rand(3, 224 * h // max(w, h), 224 * w // max(w, h)) for w, h in
              (rng.choice(RATIOS) for _ in range(args.batch))]  # fmt: skip
    fitted = [fit(image, patch, budget) for image in images]
    side = math.isqrt(budget)
    square = torch.stack([F.interpolate(i[None], size=(side * 16, side * 16), mode="bilinear")[0] for i in images])
    patches, coords, valid = zip(*(patchify_image(i, patch) for i in fitted), strict=True)
    padded = {  # timm's NaFlex batch: every image its own sequence of `budget` patches
        "patches": torch.stack([F.pad(p, (0, 0, 0, budget - len(p))) for p in patches]),
        "patch_coord": torch.stack([F.pad(c, (0, 0, 0, budget - len(c))) for c in coords]),
        "patch_valid": torch.stack([F.pad(v, (0, budget - len(v))) for v in valid]),
    }
    labels = torch.randint(0, 10, (args.batch,))
    device = args.device  # everything on it: the models, the images of each path, the labels
    ours, theirs, labels, square = ours.to(device), theirs.to(device), labels.to(device), square.to(device)
    fitted, padded = [image.to(device) for image in fitted], {k: v.to(device) for k, v in padded.items()}
    paths = {
        "ours, packed": (ours, lambda: ours.forward_packed(fitted, sequence)),
        "timm NaFlexVit, padded": (theirs, lambda: theirs(padded)),
        "ours, square": (ours, lambda: ours(square)),
    }
    tokens = {"ours, packed": sum(math.prod(budget_grid(*i.shape[-2:], patch, budget)) + prefix for i in images),
              "timm NaFlexVit, padded": args.batch * sequence,
              "ours, square": args.batch * (side * side + prefix)}  # fmt: skip
    with torch.no_grad():  # one function on both NaFlex paths, before either trains
        agreement = (ours.forward_packed(fitted, sequence) - theirs(padded)).abs().max().item()
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, (model, _) in paths.items()}
    times: dict[str, dict[str, list[float]]] = {name: {"train": [], "infer": []} for name in paths}
    for _ in range(args.repeats + 1):  # the first round warms up
        for name, (_, forward) in paths.items():
            synchronize(device)
            start = time.perf_counter()
            with autocast(device, args.precision):
                loss = F.cross_entropy(forward(), labels)
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad()
            synchronize(device)
            middle = time.perf_counter()
            with torch.no_grad(), autocast(device, args.precision):
                forward()
            synchronize(device)
            times[name]["train"].append(middle - start)
            times[name]["infer"].append(time.perf_counter() - middle)
    return [{"path": name, "tokens": tokens[name], "max_logit_difference_from_timm": agreement,
             **{f"{mode}_images_per_second": args.batch / statistics.median(t[1:]) for mode, t in times[name].items()}}
            for name in paths]  # fmt: skip


def _idx(path: Path, header: int) -> np.ndarray:
    """An idx file's bytes past its header (Debian's gzipped copies)."""
    return np.frombuffer(gzip.open(path).read(), dtype=np.uint8, offset=header)


def write_padded_fashion_mnist(root: Path, train_count: int, test_count: int) -> None:
    """Fashion-MNIST's first images, each padded with black to a random aspect ratio, as an image folder."""
    rng = np.random.default_rng(0)
    for split, prefix, count in (("train", "train", train_count), ("val", "t10k", test_count)):
        pixels = _idx(FASHION_MNIST / f"{prefix}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)[:count]
        labels = _idx(FASHION_MNIST / f"{prefix}-labels-idx1-ubyte.gz", 8)[:count]
        for k, (image, label) in enumerate(zip(pixels, labels, strict=True)):
            w, h = RATIOS[rng.integers(len(RATIOS))]
            canvas = np.zeros((28 * h // min(w, h), 28 * w // min(w, h)), dtype=np.uint8)
            top, left = rng.integers(canvas.shape[0] - 27), rng.integers(canvas.shape[1] - 27)
            canvas[top : top + 28, left : left + 28] = image
            folder = root / split / str(int(label))
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(canvas).save(folder / f"{k}.png")


def accuracy(args: Any) -> list[dict[str, Any]]:
    """(b): test accuracy and training seconds of the two pipelines on the padded Fashion-MNIST; each pipeline trained
    `repeats` times, alternating (the same seed: the same accuracy), its median seconds taken."""
    side = math.isqrt(args.fm_budget)
    seconds: dict[str, list[float]] = {"square": [], "naflex": []}
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "data"
        write_padded_fashion_mnist(root, args.train, args.test)
        common = ["data=imagefolder", f"data.root={root}", "data.in_chans=1", "data.auto_augment=null",
                  "data.num_workers=2", "data.batch_size=64", f"data.val_fraction={VAL_FRACTION}",
                  "model=vit_fashion_mnist", f"model.img_size={7 * side}", "trainer=cpu",
                  f"trainer.max_epochs={args.epochs}", "seed=0", "callbacks.pos_embed_figure=null",
                  "compile=false"]  # fmt: skip
        pipelines = {"square": [f"data.img_size={7 * side}"],
                     "naflex": [f"data.img_size={7 * side}", f"data.max_tokens={args.fm_budget}"]}  # fmt: skip
        for repeat in range(args.repeats):
            for name, more in pipelines.items():
                r = train(compose(*common, *more, f"output_dir={Path(folder) / f'{name}{repeat}'}"))
                seconds[name].append(r["train_seconds"])
                results[name] = {"pipeline": name, "test_acc": r["test_acc"], "runs": seconds[name]}
    square = statistics.median(seconds["square"])
    for r in results.values():
        r["train_seconds"] = statistics.median(r["runs"])
        r["images_per_second"] = args.epochs * round(args.train * (1 - VAL_FRACTION)) / r["train_seconds"]
        r["throughput_vs_square"] = square / r["train_seconds"]
    return list(results.values())


def main(argv: Sequence[str] | None = None) -> None:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--budget", type=int, default=256, help="(a): patches an image")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--width", type=int, default=384, help="(a): D; 64 with --heads 1 --depth 4: (b)'s model's shapes")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fm-budget", type=int, default=16, help="(b): patches of 7 px an image")
    p.add_argument("--train", type=int, default=6000)
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], choices=["speed", "accuracy"])
    args = parse(p, argv)
    if args.quick:
        args.budget, args.batch, args.depth, args.repeats = 16, 4, 1, 1
        args.train, args.test, args.epochs = 200, 100, 1
    facts, out = machine(args.device), {}
    if "speed" not in args.skip:
        out["speed"] = speed(args)
        rows = [[r["path"], f"{r['tokens']:,}", f"{r['train_images_per_second']:.1f}",
                 f"{r['infer_images_per_second']:.1f}"] for r in out["speed"]]  # fmt: skip
        report(f"(a) patch 16, width {args.width}, {args.heads} heads, depth {args.depth}, {args.budget} patches an "
               f"image, batch {args.batch}",
               ["path", "tokens computed", "train img/s", "infer img/s"], rows, facts)  # fmt: skip
    if "accuracy" not in args.skip:
        out["accuracy"] = accuracy(args)
        rows = [[r["pipeline"], f"{r['test_acc']:.4f}", f"{r['images_per_second']:.0f}", f"{r['train_seconds']:.1f}",
                 " ".join(f"{s:.1f}" for s in r["runs"]), f"{r['throughput_vs_square']:.2f}x"]
                for r in out["accuracy"]]  # fmt: skip
        report(f"(b) padded Fashion-MNIST, {args.fm_budget} patches, {args.epochs} epochs of {args.train}, median of "
               f"{args.repeats} runs", ["pipeline", "test acc", "train img/s", "train s", "runs s", "throughput"],
               rows, facts)  # fmt: skip
    write_json(args.json, {"facts": facts, **out})


if __name__ == "__main__":
    main()
