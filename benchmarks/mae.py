r"""Masked-autoencoder pretraining on Fashion-MNIST without its labels, then fine-tuning with 1% of them: the default
model (experiment=fashion_mnist) pretrained with task=mae on the 55,000 training images (labels unread), against the
same model from random initialisation, each fine-tuned on the same 600 labelled images (data.train_subset=600, drawn
by split_seed), with the same seed, steps and recipe; and the frozen features of both, probed as `vit.cli.probe`
probes them (a linear probe and a weighted k-NN on the pooled features, all 55,000 training labels).

- MAE: `python train.py experiment=fashion_mnist task=mae trainer.max_epochs=E`, its images/s against the
  supervised run's on the same data (one epoch, task=classify, compile=false: MAE's steps run eager, as
  compile=true compiles the network's forward, which they do not call).
- Fine-tuning: `python train.py experiment=fashion_mnist model.pretrained=<MAE best.ckpt> data.train_subset=600`,
  and without model.pretrained: test accuracy.

    python -m benchmarks.mae [--pretrain-epochs 8] [--finetune-epochs 40] [--labels 600] [--data-root DIR] [--json P]
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import compose, machine, parse, parser, report, watched, write_json
from vit.checkpoint import Loaded, load
from vit.cli import probe
from vit.cli.export import to_safetensors
from vit.model import VisionTransformer
from vit.training.run import train

EXPERIMENT = "experiment=fashion_mnist"
# --quick: a one-layer model, a few batches of each run: seconds
QUICK = ["compile=false", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1", "data.batch_size=8", "data.eval_batch_size=64", "model.embed_dim=32",
         "model.depth=1", "model.num_heads=1"]  # fmt: skip


def run(folder: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """vit.training.run.train as train.py runs it; its results and how busy the machine was."""
    with watched() as others:
        results = train(compose(EXPERIMENT, f"output_dir={folder}", "callbacks.pos_embed_figure=null", *overrides))
    return {**results, "other_jobs_cores": others.cores}


def probed(checkpoint: Path, out: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """vit.cli.probe on the pooled features (--blocks 0: the default model pools its patch tokens, no class token)."""
    probe.main(["--checkpoint", str(checkpoint), "--blocks", "0", "--k", "20", "--out", str(out), *overrides])
    figures = json.loads(out.read_text())
    return {"linear": figures["linear"]["best"]["test_acc"], "knn": figures["knn"]["accuracy"]["20"]}


def random_init(mae_checkpoint: Path, path: Path) -> Path:
    """The MAE run's network at a random initialisation (seed 0), exported with the checkpoint's normalisation: the
    features of the same network untrained."""
    loaded = load(mae_checkpoint)
    torch.manual_seed(0)
    to_safetensors(Loaded(VisionTransformer(loaded.config), loaded.mean, loaded.std, loaded.classes, path), path)
    return path


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__.split("\n\n")[0], samples=False)
    p.add_argument("--pretrain-epochs", type=int, default=8, help="MAE's epochs on the training images")
    p.add_argument("--finetune-epochs", type=int, default=40, help="each fine-tune's epochs on the labelled few")
    p.add_argument("--labels", type=int, default=600, help="the labelled training images the fine-tunes see")
    p.add_argument("--data-root", help="data.root: where Fashion-MNIST is read or unpacked (default: the configs')")
    args = parse(p, argv)
    shared = [*([f"data.root={args.data_root}"] if args.data_root else []), *(QUICK if args.quick else [])]
    few = [f"data.train_subset={args.labels}", f"trainer.max_epochs={1 if args.quick else args.finetune_epochs}"]
    facts = machine(args.device)
    payload: dict[str, Any] = {"machine": facts}
    with tempfile.TemporaryDirectory(prefix="mae_") as tmp:
        work = Path(tmp)
        epochs = 1 if args.quick else args.pretrain_epochs
        payload["mae"] = run(work / "mae", ["task=mae", f"trainer.max_epochs={epochs}", *shared])
        payload["supervised_epoch"] = run(work / "supervised", ["trainer.max_epochs=1", "compile=false", *shared])
        pretrained = Path(payload["mae"]["best_checkpoint"])
        payload["from_mae"] = run(work / "from_mae", [f"model.pretrained={pretrained}", *few, *shared])
        payload["from_scratch"] = run(work / "from_scratch", [*few, *shared])
        data = [o for o in shared if o.startswith("data.")]
        payload["probe_mae"] = probed(pretrained, work / "probe_mae.json", data)
        payload["probe_random"] = probed(random_init(pretrained, work / "random.safetensors"), work / "r.json", data)
    mae, supervised = payload["mae"], payload["supervised_epoch"]
    rows = [
        ["fine-tuned from MAE", f"{payload['from_mae']['test_acc']:.2%}", f"{payload['probe_mae']['linear']:.2%}",
         f"{payload['probe_mae']['knn']:.2%}", f"{mae['train_images_per_second']:.0f}",
         f"{mae['train_seconds'] + payload['from_mae']['train_seconds']:.0f}"],
        ["from random init", f"{payload['from_scratch']['test_acc']:.2%}", f"{payload['probe_random']['linear']:.2%}",
         f"{payload['probe_random']['knn']:.2%}", f"{supervised['train_images_per_second']:.0f}",
         f"{payload['from_scratch']['train_seconds']:.0f}"],
    ]  # fmt: skip
    header = [
        "network",
        f"test acc, {args.labels} labels",
        "linear probe",
        "k-NN (k=20)",
        "pretraining img/s (MAE; supervised)",
        "train s",
    ]
    report(f"Fashion-MNIST, MAE {epochs} epochs then {args.labels} labels", header, rows, facts)
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
