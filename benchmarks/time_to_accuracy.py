r"""Fashion-MNIST time to accuracy: our train.py against a plain PyTorch loop over timm's model; and the per-step
overhead of our Lightning loop against the same plain loop over our own model.

What the two runs share, so that only the code differs:
- the experiment's config (conf/experiment/<name>.yaml, composed as train.py composes it): model, batch, optimizer
  (fused, decay on weight matrices), linear warmup then cosine per step, label smoothing, Mixup and EMA if set;
- the data: the experiment's Fashion-MNIST module, its training loader and its on-device BatchAugment;
- the initial weights: timm's model is loaded with the weights our train.py starts from (same seed);
- the clock: training time only. Test accuracy on the 10,000 test images is measured after every epoch, off the
  clock (for ours by the AccuracyCurve callback, read from train()'s output folder).

Ours is vit.training.run.train(cfg), exactly what `python train.py experiment=NAME` runs. The overhead is measured
with trainer.limit_train_batches steps per epoch over two epochs, the second epoch of each compared, for three
loops in turn: train.py, LightningFloor (the bare loop's step in Lightning's Trainer and nothing else: what
Lightning itself costs) and the bare loop; per loop the epoch's mean step and its median step; median of the
rounds' ratios. With --overrides for a tiny model the differences are the loops' fixed costs per step.

Examples:
  python -m benchmarks.time_to_accuracy                          # CPU default: a short run of each, overhead
  python -m benchmarks.time_to_accuracy --epochs 10             # the default experiment's full schedule
  python -m benchmarks.time_to_accuracy --skip accuracy --overrides model.embed_dim=8 model.depth=1 \
      model.num_heads=1 model.mlp_ratio=1 data.batch_size=8     # fixed per-step costs, in microseconds
  python -m benchmarks.time_to_accuracy --device cuda --experiment fashion_mnist_best --epochs 30
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from benchmarks._common import (
    autocast,
    compose,
    data_module,
    machine,
    parse,
    parser,
    report,
    synchronize,
    timm_twin,
    watched,
    write_json,
)
from vit.data.memory.base import InMemoryDataModule
from vit.model import VisionTransformer
from vit.model.config import ViTConfig
from vit.training.checks import model_fields
from vit.training.clock import TrainingClock
from vit.training.ema import EMA
from vit.training.optim import OptimConfig, build_optimizer, warmup_cosine
from vit.training.run import train

TEST_CURVE = "test_curve.json"  # written by AccuracyCurve into the run's output folder
STEP_STARTS = "step_starts.json"  # written by StepClock into the run's output folder
TARGETS = {"cpu": [0.85, 0.88, 0.90], "cuda": [0.88, 0.90, 0.94, 0.95]}
DEFAULT_EPOCHS = {"cpu": 3, "cuda": None}  # None: the experiment's own; on CPU its 10 epochs, twice, take ~5 min
OVERHEAD_TARGET = 0.05  # train.py's loop at most 5% slower per step than the bare loop
LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed"}
LIGHTNING_ACCELERATOR = {"cpu": "cpu", "cuda": "gpu"}


# test accuracy, off the clock ------------------------------------------------------------------------------
@torch.no_grad()
def accuracy_on_test_set(
    model: nn.Module, data: InMemoryDataModule, device: torch.device, precision: str, limit: int | None
) -> float:
    """Top-1 accuracy on the test set (its first `limit` images, if given), in eval mode."""
    was_training = model.training
    model.eval()
    data.augment.to(device)
    correct = seen = 0
    for images, labels in data.test_dataloader():
        images, labels = images.to(device), labels.to(device)
        with autocast(device, precision):
            logits = model(data.augment(images, train=False))
        correct += (logits.argmax(-1) == labels).sum().item()
        seen += len(labels)
        if limit is not None and seen >= limit:
            break
    model.train(was_training)
    return correct / seen


def evaluated_model(trainer: L.Trainer, pl_module: L.LightningModule) -> nn.Module:
    """The network whose accuracy counts: the EMA of the weights when the run keeps one (train.py validates, tests
    and checkpoints that, and bare_loop evaluates its own), else the live weights."""
    ema = next((c for c in trainer.callbacks if isinstance(c, EMA)), None)
    averaged = getattr(ema, "_average_model", None)  # Lightning's AveragedModel of the LightningModule (private)
    return averaged.module.model if averaged is not None else pl_module.model


class AccuracyCurve(L.Callback):
    """After each training epoch (the training clock is paused by then), test accuracy against training seconds,
    rewritten to `path` as a JSON list of {epoch, train_seconds, test_acc}; of the EMA weights when there are."""

    def __init__(self, path: str, precision: str, limit: int | None = None):
        self.path, self.precision, self.limit = Path(path), precision, limit
        self.points: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        clock = next(c for c in trainer.callbacks if isinstance(c, TrainingClock))
        model = evaluated_model(trainer, pl_module)
        acc = accuracy_on_test_set(model, trainer.datamodule, pl_module.device, self.precision, self.limit)
        self.points.append({"epoch": trainer.current_epoch + 1, "train_seconds": clock.seconds, "test_acc": acc})
        self.path.write_text(json.dumps(self.points, indent=1))


class StepClock(L.Callback):
    """Host time at the start of every training batch, one list per epoch, rewritten to `path` as JSON after each
    epoch: the per-step durations of the overhead measurement (a step's start to the next one's)."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.epochs: list[list[float]] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epochs.append([])

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        self.epochs[-1].append(time.perf_counter())

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.path.write_text(json.dumps(self.epochs))


# the loops ---------------------------------------------------------------------------------------------------
def experiment_config(args, output_dir: Path, *overrides: str) -> DictConfig:
    """The experiment as train.py composes it, on the requested device and precision."""
    return compose(
        f"experiment={args.experiment}",
        f"output_dir={output_dir}",
        f"trainer.accelerator={LIGHTNING_ACCELERATOR[args.device.type]}",
        f"trainer.precision={LIGHTNING_PRECISION[args.precision]}",
        *([f"data.root={args.data_root}"] if args.data_root else []),
        *args.overrides,
        *overrides,
    )


def run_ours(
    args, output_dir: Path, epochs: int | None, limit_batches: int | None, curve: bool, step_clock: bool = False
) -> dict[str, Any]:
    """vit.training.train on the experiment, with an AccuracyCurve callback when `curve` and a StepClock when
    `step_clock`; returns its results (and the curve under "curve", each epoch's step starts under "step_starts")."""
    overrides = [f"trainer.max_epochs={epochs}"] if epochs else []
    if limit_batches:  # a partial run: validate and test on one batch
        overrides += [f"trainer.limit_train_batches={limit_batches}"]
        overrides += ["trainer.limit_val_batches=1", "trainer.limit_test_batches=1"]
    if curve:
        overrides += [
            f"+callbacks.test_curve._target_={__spec__.name}.{AccuracyCurve.__name__}",  # by name: Hydra imports it
            f"+callbacks.test_curve.path={output_dir / TEST_CURVE}",
            f"+callbacks.test_curve.precision={args.precision}",
            f"+callbacks.test_curve.limit={args.test_images or 'null'}",
        ]
    if step_clock:
        overrides += [
            f"+callbacks.step_clock._target_={__spec__.name}.{StepClock.__name__}",
            f"+callbacks.step_clock.path={output_dir / STEP_STARTS}",
        ]
    with watched() as others:
        results = train(experiment_config(args, output_dir, *overrides))
    results["other_jobs_cores"] = others.cores
    if curve:
        results["curve"] = json.loads((output_dir / TEST_CURVE).read_text())
    if step_clock:
        results["step_starts"] = json.loads((output_dir / STEP_STARTS).read_text())
    return results


class Recipe:
    """The experiment's training recipe outside train.py, for the loops that stand beside it: the optimizer and
    its schedule, the loss (label smoothing, Mixup) and the EMA of the weights, built as ViTClassifier builds them."""

    def __init__(self, model: nn.Module, cfg: DictConfig, steps_per_epoch: int, epochs: int):
        optim = OptimConfig.from_dict(OmegaConf.to_container(cfg.optim))
        # timm's twin has no layer_of: its transformer layers are its blocks
        hidden = None if hasattr(model, "layer_of") else lambda name: name.startswith("blocks.")
        self.optimizer = build_optimizer(model, optim, hidden)
        warmup = max(1, round(optim.warmup_epochs * steps_per_epoch))  # as ViTClassifier.configure_optimizers
        factor = warmup_cosine(warmup, steps_per_epoch * epochs, optim.min_lr_ratio)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        k, self.label_smoothing = cfg.data.num_classes, cfg.label_smoothing
        self.mixup = Mixup(**cfg.mixup, label_smoothing=cfg.label_smoothing, num_classes=k) if cfg.mixup else None
        self.soft_loss = SoftTargetCrossEntropy()
        self.ema = None
        if cfg.ema_decay:  # the fused update, as train.py's EMA callback
            self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay), use_buffers=True)
        self.network = torch.compile(model) if cfg.compile else model

    def loss(self, images: Tensor, labels: Tensor) -> Tensor:
        if self.mixup is not None and len(images) % 2 == 0:
            images, targets = self.mixup(images, labels)
            return self.soft_loss(self.network(images), targets)
        return F.cross_entropy(self.network(images), labels, label_smoothing=self.label_smoothing)


def bare_loop(
    model: nn.Module,
    data: InMemoryDataModule,
    cfg: DictConfig,
    args,
    epochs: int,
    limit_batches: int | None = None,
    after_epoch: Callable[[int, float, nn.Module], None] | None = None,
    step_starts: list[list[float]] | None = None,
) -> list[float]:
    """The plain loop a PyTorch user writes, on the same recipe as train.py: returns each epoch's seconds, calls
    after_epoch(epoch, training seconds so far, the model to evaluate) off the clock, and appends each epoch's
    step start times to `step_starts` if given."""
    loader = data.train_dataloader()
    per_epoch = min(len(loader), limit_batches or len(loader))
    recipe = Recipe(model, cfg, per_epoch, epochs)
    data.augment.to(args.device)
    model.train()
    seconds, total = [], 0.0
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)  # a new order each epoch, as Lightning's Trainer sets it for train.py
        starts: list[float] = []
        synchronize(args.device)
        start = time.perf_counter()
        for step, (images, labels) in enumerate(loader):
            if step == per_epoch:
                break
            starts.append(time.perf_counter())
            images, labels = images.to(args.device, non_blocking=True), labels.to(args.device, non_blocking=True)
            images = data.augment(images, train=True)
            with autocast(args.device, args.precision):
                loss = recipe.loss(images, labels)
            loss.backward()
            recipe.optimizer.step()
            recipe.optimizer.zero_grad(set_to_none=True)
            recipe.schedule.step()
            if recipe.ema is not None:
                recipe.ema.update_parameters(model)
        synchronize(args.device)
        seconds.append(time.perf_counter() - start)
        total += seconds[-1]
        if step_starts is not None:
            step_starts.append(starts)
        if after_epoch is not None:
            after_epoch(epoch + 1, total, recipe.ema.module if recipe.ema is not None else model)
    return seconds


class LightningFloor(L.LightningModule):
    """Lightning's own cost: bare_loop's step (model, loss, AdamW, schedule, EMA) as a LightningModule with
    automatic optimisation, and nothing of train.py's own (metrics, logging, non-finite check, checkpoints,
    callbacks, progress)."""

    def __init__(self, model: nn.Module, cfg: DictConfig, steps_per_epoch: int, epochs: int):
        super().__init__()
        self.model, self.cfg, self.steps, self.epochs = model, cfg, steps_per_epoch, epochs
        self.recipe: Recipe | None = None

    def configure_optimizers(self) -> dict[str, Any]:
        self.recipe = Recipe(self.model, self.cfg, self.steps, self.epochs)
        schedule = {"scheduler": self.recipe.schedule, "interval": "step"}
        return {"optimizer": self.recipe.optimizer, "lr_scheduler": schedule}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self.recipe.loss(*batch)  # the data module's on_after_batch_transfer has augmented the images

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.recipe.ema is not None:
            self.recipe.ema.update_parameters(self.model)


def lightning_floor(args, cfg: DictConfig, data: InMemoryDataModule, steps: int, path: Path) -> list[list[float]]:
    """Two epochs of `steps` steps of LightningFloor on the experiment's data; each epoch's step start times."""
    module = LightningFloor(initial_model(cfg, args.device), cfg, steps, epochs=2)
    trainer = L.Trainer(
        accelerator=LIGHTNING_ACCELERATOR[args.device.type],
        devices=1,
        precision=LIGHTNING_PRECISION[args.precision],
        max_epochs=2,
        limit_train_batches=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StepClock(str(path))],
        default_root_dir=str(path.parent),
    )
    with watched():
        trainer.fit(module, datamodule=data)
    return json.loads(path.read_text())


def initial_model(cfg: DictConfig, device: torch.device) -> VisionTransformer:
    """The model train() starts from: seeded as train() seeds before building it."""
    L.seed_everything(cfg.seed, workers=True)
    return VisionTransformer(ViTConfig.from_dict(model_fields(cfg)[0])).to(device)


def run_timm(args, output_dir: Path, epochs: int | None) -> dict[str, Any]:
    """timm's twin of the experiment's initial model, trained by bare_loop on the experiment's data."""
    cfg = experiment_config(args, output_dir)
    epochs = epochs or cfg.trainer.max_epochs
    data = data_module(cfg)
    model = timm_twin(initial_model(cfg, args.device))
    curve = []

    def evaluate(epoch: int, seconds: float, trained: nn.Module) -> None:
        acc = accuracy_on_test_set(trained, data, args.device, args.precision, args.test_images)
        curve.append({"epoch": epoch, "train_seconds": seconds, "test_acc": acc})
        print(f"timm, bare loop: epoch {epoch}/{epochs} | test acc {acc:.4f} | {seconds:.1f} s training", flush=True)

    with watched() as others:
        bare_loop(model, data, cfg, args, epochs, args.limit_batches, evaluate)
    last = curve[-1]
    return {
        "curve": curve,
        "train_seconds": last["train_seconds"],
        "test_acc": last["test_acc"],
        "other_jobs_cores": others.cores,
    }


def time_to(curve: list[dict[str, float]], target: float) -> float | None:
    """Training seconds at the end of the first epoch whose test accuracy reached `target`."""
    return next((p["train_seconds"] for p in curve if p["test_acc"] >= target), None)


# overhead --------------------------------------------------------------------------------------------------
LOOPS = ("train.py", "Lightning floor", "bare loop")


def _step_seconds(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


def overhead(args, workdir: Path) -> dict[str, Any]:
    """Per-step seconds of train.py's loop, of LightningFloor and of bare_loop over our model, same batch, the three
    in turn, each over two epochs of which the second counts. Per loop and round: the epoch's mean step (all-in) and
    its median step (robust to other jobs' bursts on a shared machine, blind to work done every N steps)."""
    cfg = experiment_config(args, workdir)
    data = data_module(cfg)
    steps, batch = args.overhead_steps, cfg.data.batch_size
    mean: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    median: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    for r in range(args.overhead_repeats):
        results = run_ours(args, workdir / f"overhead_{r}", 2, steps, curve=False, step_clock=True)
        mean["train.py"].append(batch / results["train_images_per_second"])
        median["train.py"].append(statistics.median(_step_seconds(results["step_starts"][-1])))
        floor = lightning_floor(args, cfg, data, steps, workdir / f"floor_{r}.json")
        median["Lightning floor"].append(statistics.median(_step_seconds(floor[-1])))
        mean["Lightning floor"].append((floor[-1][-1] - floor[-1][0]) / (len(floor[-1]) - 1))  # no last step's end
        starts: list[list[float]] = []
        with watched():
            epochs = bare_loop(initial_model(cfg, args.device), data, cfg, args, 2, steps, step_starts=starts)
        mean["bare loop"].append(epochs[-1] / steps)
        median["bare loop"].append(statistics.median(_step_seconds(starts[-1])))
        line = ", ".join(f"{loop} {mean[loop][-1] * 1e3:.2f} (median {median[loop][-1] * 1e3:.2f})" for loop in LOOPS)
        print(f"overhead round {r + 1}, ms/step: {line}", flush=True)

    def over_bare(times: dict[str, list[float]], loop: str) -> float:  # median of the rounds' ratios, minus 1
        return statistics.median(a / b for a, b in zip(times[loop], times["bare loop"], strict=True)) - 1

    return {
        "steps_per_epoch": steps,
        "batch": batch,
        "mean_step_s": mean,
        "median_step_s": median,
        "train_py": {"mean": over_bare(mean, "train.py"), "median": over_bare(median, "train.py")},
        "floor": {"mean": over_bare(mean, "Lightning floor"), "median": over_bare(median, "Lightning floor")},
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, samples=False)
    p.add_argument("--experiment", default="fashion_mnist", help="conf/experiment/NAME (default: %(default)s)")
    p.add_argument("--epochs", type=int, help="epochs of each run (default: 3 on CPU, the experiment's on CUDA)")
    p.add_argument("--targets", type=float, nargs="+", help="test accuracies to time (default by device)")
    p.add_argument("--limit-batches", type=int, help="training batches per epoch (default: all)")
    p.add_argument("--test-images", type=int, help="evaluate on the first N test images (default: all 10,000)")
    p.add_argument("--data-root", help="data.root (default: the data config's)")
    p.add_argument("--overhead-steps", type=int, default=100, help="steps per epoch of the overhead runs")
    p.add_argument("--overhead-repeats", type=int, default=3)
    p.add_argument("--skip", choices=["accuracy", "overhead"], help="leave one of the two measurements out")
    p.add_argument(
        "--overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra overrides of the experiment for every run, e.g. a tiny model to time the fixed cost of a step",
    )
    args = parse(p, argv)
    if args.quick:  # seconds: no compiling either
        args.epochs, args.limit_batches, args.test_images = 1, 5, 1000
        args.overhead_steps, args.overhead_repeats = 5, 1
        args.overrides = ["compile=false", *args.overrides]
    epochs = args.epochs or DEFAULT_EPOCHS[args.device.type]
    targets = args.targets or TARGETS[args.device.type]
    facts = machine(args.device)
    payload: dict[str, Any] = {"machine": facts, "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="tta_") as tmp:
        workdir = Path(tmp)
        if args.skip != "accuracy":
            ours = run_ours(args, workdir / "ours", epochs, args.limit_batches, curve=True)
            theirs = run_timm(args, workdir / "timm", epochs)
            payload["ours"], payload["timm"] = ours, theirs
            for r in (ours, theirs):  # target accuracy: training seconds, or None if not reached
                r["seconds_to"] = {str(t): time_to(r["curve"], t) for t in targets}
            rows = [
                [name, len(r["curve"]), f"{r['train_seconds']:.1f}", f"{r['curve'][-1]['test_acc']:.2%}"]
                + [_seconds(seconds) for seconds in r["seconds_to"].values()]
                + [f"{r['other_jobs_cores']:.2f}"]
                for name, r in (("ours: train.py (Lightning)", ours), ("timm: bare PyTorch loop", theirs))
            ]
            header = ["run", "epochs", "train s", "final test acc", *(f"s to {t:.0%}" for t in targets)]
            header += ["other jobs (cores)"]
            report(f"Time to accuracy, experiment={args.experiment}", header, rows, facts)
        if args.skip != "overhead":
            payload["overhead"] = o = overhead(args, workdir)
            rows = _overhead_rows(o)
            header = ["loop", "ms/step (mean)", "ms/step (median)", "µs over bare (mean)", "µs over bare (median)"]
            header += ["over bare (mean)", "over bare (median)"]
            verdict = "met" if o["train_py"]["mean"] <= OVERHEAD_TARGET else "not met"
            title = f"Lightning overhead, batch {o['batch']}, {o['steps_per_epoch']} steps/epoch"
            report(f"{title}; train.py's ≤ {OVERHEAD_TARGET:.0%} target: {verdict}", header, rows, facts)
    write_json(args.json, payload)
    return payload


def _overhead_rows(o: dict[str, Any]) -> list[list[str]]:
    """Per loop: ms/step, µs over the bare loop and the ratio, each by the mean and by the median step."""
    stats = ("mean", "median")
    step = {(loop, stat): statistics.median(o[f"{stat}_step_s"][loop]) for loop in LOOPS for stat in stats}
    rows = []
    for loop, key in zip(LOOPS, ("train_py", "floor", None), strict=True):
        row = [loop, *(f"{step[loop, stat] * 1e3:.3f}" for stat in stats)]
        row += [f"{(step[loop, stat] - step['bare loop', stat]) * 1e6:+.0f}" for stat in stats]
        row += [f"**{o[key][stat]:+.1%}**" if key else "" for stat in stats]
        rows.append(row)
    return rows


def _seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "not reached"


if __name__ == "__main__":
    main()
