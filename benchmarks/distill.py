r"""Feature distillation on Fashion-MNIST: the default model (`python train.py`) trained with a larger supervised
teacher's features against the same model trained alone, with the same seed, steps and recipe.

- Teacher: `python train.py model.embed_dim=96 model.depth=6 model.num_heads=2 trainer.max_epochs=E`, a wider and
  deeper ViT at the same patch size (7 px: the same 4x4 grid of tokens), trained on the labels as the default is.
- Student: `python train.py distill.teacher=<teacher best.ckpt> distill.target=features` (its patch tokens and pooled
  features regress the teacher's, distill.alpha=0.5 of the loss beside the labels'), and `python train.py` alone.

Each run's test accuracy and training seconds (the student's include the teacher's forward on every batch).
--train-batches F trains each epoch of every run on that share of the batches (trainer.limit_train_batches), the
schedule kept, where the machine allows less than the default's ten epochs.

    python -m benchmarks.distill [--teacher-epochs 6] [--train-batches 1.0] [--data-root DIR] [--json PATH]
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import machine, parse, parser, report, write_json
from benchmarks.mae import QUICK, run

TEACHER = ["model.embed_dim=96", "model.depth=6", "model.num_heads=2"]  # 3.4x the default's parameters
QUICK_TEACHER = ["model.embed_dim=48", "model.depth=2", "model.num_heads=1"]  # still wider and deeper than QUICK's


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--teacher-epochs", type=int, default=6, help="the teacher's epochs on the labelled images")
    p.add_argument("--train-batches", type=float, default=1.0, help="each epoch's share of the training batches")
    p.add_argument("--data-root", help="data.root: where Fashion-MNIST is read or unpacked (default: the configs')")
    args = parse(p, argv)
    shared = [*([f"data.root={args.data_root}"] if args.data_root else []), *(QUICK if args.quick else [])]
    if args.train_batches != 1.0 and not args.quick:
        shared.append(f"trainer.limit_train_batches={args.train_batches}")
    student = ["trainer.max_epochs=1"] if args.quick else []  # the default run's own epochs otherwise
    teacher = [
        *(QUICK_TEACHER if args.quick else TEACHER),
        f"trainer.max_epochs={1 if args.quick else args.teacher_epochs}",
    ]
    facts = machine(args.device)
    payload: dict[str, Any] = {"machine": facts}
    with tempfile.TemporaryDirectory(prefix="distill_") as tmp:
        work = Path(tmp)
        payload["teacher"] = run(work / "teacher", [*shared, *teacher])
        best = payload["teacher"]["best_checkpoint"]
        payload["alone"] = run(work / "alone", [*shared, *student])
        features = [f"distill.teacher={best}", "distill.target=features"]
        payload["distilled"] = run(work / "distilled", [*shared, *student, *features])
        recorded = torch.load(payload["distilled"]["best_checkpoint"], weights_only=True)["hyper_parameters"]
        payload["distilled"]["distill"] = recorded["distill"]  # what the student learnt from, as its checkpoint says
    rows = [
        [name, f"{payload[key]['params']:,}", f"{payload[key]['test_acc']:.2%}", f"{payload[key]['train_seconds']:.0f}"]
        for name, key in (
            (f"teacher ({', '.join(o.removeprefix('model.') for o in teacher[:3])})", "teacher"),
            ("default model alone", "alone"),
            ("default model, distilled from the teacher's features", "distilled"),
        )
    ]
    report("Fashion-MNIST, feature distillation", ["network", "parameters", "test acc", "train s"], rows, facts)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
