r"""Fashion-MNIST mosaics (data=fashion_mnist_multilabel, vit/data/memory/fashion_mnist_mosaics.py): the multi-label
experiment's test macro mAP and training time, beside a reference that classifies the same tiles one by one.

- ViT on mosaics: `python train.py experiment=fashion_mnist_multilabel`, run by vit.training.run.train as train.py
  runs it; its test/map from results.json.
- Tiles one by one: the default single-label run (`python train.py`, experiment=fashion_mnist) trained on the 28x28
  images the training mosaics are made of (the same 55,000, the same 5,000 held out), then applied to each item of
  every test mosaic with the run's own test-time views; a mosaic's score for a class is the highest probability
  (a softmax over the classes, per tile) that any of its tiles gives the class. The reference is told where the
  items are (the cells that are not black), which the ViT must learn.

Both are scored by the same macro mean average precision over the 10 classes, torchmetrics' (as task=multilabel's
test/map), on the same 10,000 test mosaics.

    python -m benchmarks.multilabel [--skip reference] [--data-root DIR] [--json PATH]
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import Tensor
from torchmetrics.functional.classification import multilabel_average_precision

from benchmarks._common import compose, data_module, machine, parse, parser, report, watched, write_json
from vit.data.memory.fashion_mnist_mosaics import GRID
from vit.training.module import ViTClassifier
from vit.training.run import train

EXPERIMENT, REFERENCE = "fashion_mnist_multilabel", "fashion_mnist"
# --quick: one batch of two through a one-layer model, a few mosaics, eager: seconds
QUICK = ["compile=false", "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1", "data.batch_size=2", "data.eval_batch_size=64", "model.embed_dim=32",
         "model.depth=1", "model.num_heads=1", "callbacks.pos_embed_figure=null"]  # fmt: skip
QUICK_MOSAICS = ["data.train_size=8", "data.val_size=64", "data.test_size=64"]


def run(experiment: str, folder: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """vit.training.run.train on the experiment, as train.py runs it; its results and how busy the machine was."""
    with watched() as others:
        results = train(compose(f"experiment={experiment}", f"output_dir={folder}", *overrides))
    return {**results, "other_jobs_cores": others.cores}


@torch.no_grad()
def tile_scores(module: ViTClassifier, data: Any, mosaics: Tensor, batch: int = 1000) -> Tensor:
    """Each mosaic's score for each class: the highest probability of the class that the single-label module gives
    any of its items, each read as the module's data reads a test image (`data.augment`) with its test-time views.
    uint8 (M, C, 2h, 2w) -> (M, K)"""
    M, C, H, W = mosaics.shape
    cells = mosaics.view(M, C, GRID, H // GRID, GRID, W // GRID).permute(0, 2, 4, 1, 3, 5)  # (M, 2, 2, C, h, w)
    cells = cells.reshape(M, GRID * GRID, C, H // GRID, W // GRID)
    items = cells.flatten(2).amax(-1) > 0  # (M, 4): a black cell holds nothing
    tiles, owner = cells[items], torch.arange(M)[:, None].expand_as(items)[items]  # (T, C, h, w), (T,)
    probabilities = torch.cat(
        [module.views(data.augment(part, train=False)).softmax(-1) for part in tiles.split(batch)]
    )  # (T, K)
    scores = torch.zeros(M, probabilities.shape[1])
    return scores.scatter_reduce_(0, owner[:, None].expand_as(probabilities), probabilities, "amax")


def reference(folder: Path, overrides: Sequence[str], mosaic_overrides: Sequence[str]) -> dict[str, Any]:
    """The single-label run on the tiles, then its macro mAP on the test mosaics."""
    results = run(REFERENCE, folder, overrides)
    tiles = instantiate(compose(f"experiment={REFERENCE}", f"output_dir={folder}", *overrides).data)
    module = ViTClassifier.load_from_checkpoint(results["best_checkpoint"]).eval()
    module.set_black(tiles.mean, tiles.std)  # the border of test-time shifts, as the run's test filled it
    mosaics = data_module(compose(f"experiment={EXPERIMENT}", f"output_dir={folder}", *mosaic_overrides)).test_set
    scores, targets = tile_scores(module, tiles, mosaics.images), mosaics.labels.int()
    classes = targets.shape[1]
    return {
        **results,
        "test_map": float(multilabel_average_precision(scores, targets, classes, average="macro")),
        "test_map_micro": float(multilabel_average_precision(scores, targets, classes, average="micro")),
        "tile_test_acc": results["test_acc"],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--data-root", help="data.root: where Fashion-MNIST is read or unpacked (default: the configs')")
    p.add_argument("--skip", choices=["reference"], help="leave the tiles-one-by-one reference out")
    args = parse(p, argv)
    root = [f"data.root={args.data_root}"] if args.data_root else []
    quick = QUICK if args.quick else []
    mosaic_overrides = [*root, *quick, *(QUICK_MOSAICS if args.quick else [])]
    facts = machine(args.device)
    payload: dict[str, Any] = {"machine": facts}
    with tempfile.TemporaryDirectory(prefix="multilabel_") as tmp:
        payload["mosaics"] = run(EXPERIMENT, Path(tmp) / "mosaics", mosaic_overrides)
        if args.skip != "reference":
            payload["tiles"] = reference(Path(tmp) / "tiles", [*root, *quick], mosaic_overrides)
    rows = [
        [name, f"{r['test_map']:.4f}", f"{r['test_map_micro']:.4f}", f"{r['train_seconds']:.1f}", r["epochs"],
         f"{r['params']:,}", f"{r['other_jobs_cores']:.2f}"]
        for name, r in (("ViT on the mosaics", payload["mosaics"]), ("tiles one by one", payload.get("tiles")))
        if r is not None
    ]  # fmt: skip
    header = ["model", "test mAP (macro)", "test mAP (micro)", "train s", "epochs", "params", "other jobs (cores)"]
    report(f"Fashion-MNIST mosaics, experiment={EXPERIMENT}", header, rows, facts)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
