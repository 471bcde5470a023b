"""The Lightning module: the network, the optimizer and its schedule, and the bookkeeping every run shares (the
training loss, steps skipped for non-finite gradients, what checkpoints keep). What the labels are and how the run
learns from them is its task's (vit/training/tasks.py); what a feature adds (frozen weights, distillation, images at
their own size) is the feature's own (vit/training/feature.py), called through the hooks below in order.

Metric names every task shares are defined here once; callbacks and train() import them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import Metric, SumMetric

from vit.data.augment import average_over_views
from vit.data.facts import DATA_FACTS
from vit.interop.files import read
from vit.interop.load import load
from vit.model import ConfigError, VisionTransformer, ViTConfig
from vit.training.feature import Feature
from vit.training.nonfinite import FiniteMean, skip_or_halt
from vit.training.optim import OptimConfig, build_optimizer, warmup_cosine
from vit.training.resume import refuse_unfit
from vit.training.sharding import ShardedStrategy, learners
from vit.training.task import Task
from vit.training.tasks import TaskConfig

TRAIN_LOSS, TRAIN_LOSS_STEP, LR, VAL_SAMPLES = "train/loss", "train/loss_step", "train/lr", "val/samples"
SKIPPED_STEPS = "skipped_steps"  # checkpoint entry: optimizer steps dropped for non-finite gradients
TRAIN_METRICS = "train_metrics"  # checkpoint entry: the epoch's running training metrics, summed over ranks


class ViTClassifier(L.LightningModule):
    """Trains VisionTransformer(config) on `task` with `optim`.

    Args:
        config: the network.
        task: targets, loss and metrics (tasks.py).
        optim: AdamW or Muon, decay on weight matrices; warmup then cosine, per step.
        test_time_flip: validate and test on the mean logits of each image and its mirror image, as the speed-run
            recipes do (airbench): a second look for free in training time, for models trained with flips.
        test_time_shift: also on the image moved this many pixels up-left and down-right (border black, as
            training's crops pad), the two moved views weighing as much as the unmoved ones (airbench's
            mirror-translate views): for models trained with random crops; 0: none.
        compile: compile the network with torch.compile, in place.
        features: the run's features, whose hooks this module calls (feature.py).
        record: what checkpoints keep of the run's settings (Settings.record), plain values, as hyper_parameters.
    """

    def __init__(
        self,
        config: ViTConfig,
        task: Task,
        optim: OptimConfig | None = None,
        *,
        test_time_flip: bool = False,
        test_time_shift: int = 0,
        compile: bool = False,
        features: Sequence[Feature] = (),
        record: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(record or {"model": config.to_dict()}, logger=False)  # loggers get the whole config
        self.config, self.task, self.optim = config, task, optim or OptimConfig()
        self.test_time_flip, self.test_time_shift = test_time_flip, test_time_shift
        self.features = list(features)
        self.model = VisionTransformer(config)
        # what the features learn beside the network (a projector): held here, so it trains, moves and is saved
        self.feature_modules = nn.ModuleDict({k: m for f in self.features for k, m in f.modules().items()})
        if compile and not (self.task.compile(self) or any(feature.compile(self) for feature in self.features)):
            self.model.compile()  # in place: the state dict keeps one set of keys, model.*
        self.train_loss, self.val_samples = FiniteMean(), SumMetric()
        self.skipped_steps = 0
        self._loss: Tensor | None = None
        self._black: Tensor | None = None  # the data's black after normalisation, per channel: setup()

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, **kwargs: Any) -> ViTClassifier:
        """A training checkpoint's module, for evaluation: its network as vit.checkpoint.load reads it (a partly
        fine-tuned run's frozen weights read again, LoRA's adapters merged), its task and test-time views from the
        checkpoint's record. Lightning's own would build the module from its hyper_parameters, which are that record,
        not the constructor's arguments."""
        loaded = load(checkpoint_path)
        contents = read(checkpoint_path)
        hparams = contents.get("hyper_parameters", {})
        task = TaskConfig(**hparams.get("task", {})).build(loaded.config, hparams.get("label_smoothing", 0))
        task.on_load_checkpoint(contents)
        module = cls(loaded.config, task, record=hparams, **loaded.views())
        module.model.load_state_dict(loaded.model.state_dict())
        return module.to(map_location) if map_location is not None else module

    def _first(self, hook: str, *args: Any) -> Any:
        """The first feature's answer to `hook` that is not None."""
        return next((out for f in self.features if (out := getattr(f, hook)(self, *args)) is not None), None)

    def forward(self, images: Tensor | list[Tensor]) -> Tensor:
        out = self._first("forward", images)
        return self.model(images) if out is None else out

    def adapt(self) -> None:
        """Once the starting weights are in: what learns, by the features (finetune=linear|lora)."""
        for feature in self.features:
            feature.adapt(self)

    # training ---------------------------------------------------------------------------------------
    # Lightning's bookkeeping on every self.log call, whatever the value, is a noticeable share of a small model's
    # step (benchmarks/NOTES.md change 0b). So steps accumulate on the device, and self.log runs only when a row is
    # due (every trainer.log_every_n_steps) and once an epoch, at its last batch: before validation and the
    # epoch-end callbacks, which print these values.
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        images, targets = self.task.mix(images, labels)
        if (own := self.task.outputs(self, images)) is not None:  # a task of its own forward (mae)
            outputs = (own, own, None)
        elif (outputs := self._first("training_outputs", images)) is None:
            logits = self(images)
            outputs = (logits, logits, None)
        logits, scored, extra = outputs
        loss = self.task.loss(logits, targets)
        for feature in self.features:
            loss = feature.loss(self, images, extra, loss)
        self.task.update_train(scored, labels, targets)
        self._loss = loss.detach()
        self.train_loss.update(self._loss, len(labels))
        if (self.trainer.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self.log(TRAIN_LOSS_STEP, loss.detach(), prog_bar=True, batch_size=len(labels))
            lr = max(group["lr"] for group in self.optimizers().param_groups)  # the head's under layer decay
            self.log(LR, lr, batch_size=len(labels))
        if batch_idx + 1 == self.trainer.num_training_batches:
            self._log_epoch_means()
        return loss

    def on_fit_start(self) -> None:
        for feature in self.features:
            feature.on_fit_start(self)

    def _train_metrics(self) -> dict[str, Metric]:
        return {TRAIN_LOSS: self.train_loss, **self.task.train_metrics()}

    def _log_epoch_means(self) -> None:
        """Log the epoch's means and reset them, so that a checkpoint holds the running epoch's sums only
        (on_save_checkpoint). Not in on_train_epoch_start: Lightning skips it for the epoch a run resumes in."""
        for name, metric in self._train_metrics().items():
            if metric.update_count:  # one value an epoch, its mean already: batch_size spares Lightning a guess
                self.log(name, metric.compute(), on_step=False, on_epoch=True, batch_size=1)
            metric.reset()

    # evaluation -------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """The task's look at the data (set up before this hook); the data's black, which test-time shifts fill the
        border with: the normalised value of a 0 pixel."""
        if (data := self.trainer.datamodule) is not None:
            self.task.setup(data)
        if self.test_time_shift:  # each fit, validate or test: its data module's normalisation
            if not hasattr(data := self.trainer.datamodule, "facts"):
                raise ConfigError("test_time_shift needs a data module that states its mean and std (facts())")
            facts = data.facts()
            self.set_black(facts["mean"], facts["std"])

    def set_black(self, mean: list[float], std: list[float]) -> None:
        """Normalisation by mean and std (pixels in [0, 1]) maps a black pixel to -mean / std."""
        self._black = -torch.tensor(mean) / torch.tensor(std)  # (C,) or (1,)

    def views(self, images: Tensor | list[Tensor]) -> Tensor:
        """(B, C, H, W) -> (B, K): the logits, averaged over the test-time views that are switched on."""
        out = self._first("views", images)
        if out is not None:
            return out
        return average_over_views(self, images, self.test_time_flip, self.test_time_shift, self._black)

    def _evaluate(self, stage: str, batch: tuple[Tensor, Tensor], batch_idx: int) -> int:
        """Update `stage`'s metrics on a batch and log them; returns its size."""
        images, labels = batch
        scores = self.task.outputs(self, images, evaluation_batch=batch_idx)
        scores = self.views(images) if scores is None else scores
        for name, metric in self.task.evaluate(stage, scores, labels).items():
            prog_bar = name == self.task.monitor
            self.log(name, metric, on_step=False, on_epoch=True, prog_bar=prog_bar, batch_size=len(labels))
        return len(labels)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        n = self._evaluate("val", batch, batch_idx)
        self.val_samples(n)
        self.log(VAL_SAMPLES, self.val_samples, on_step=False, on_epoch=True, reduce_fx="sum", batch_size=n)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate("test", batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_end("test")

    def _log_epoch_end(self, stage: str) -> None:
        """What the task computes from the whole epoch's scores, logged once."""
        for name, value in self.task.epoch_end(stage).items():
            self.log(name, value, on_step=False, on_epoch=True, batch_size=1)

    # optimisation -----------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """trainer=fsdp: each transformer layer, then the rest, sharded across the processes (sharding.py)."""
        if isinstance(strategy := getattr(self._trainer, "strategy", None), ShardedStrategy):
            strategy.shard_(self.model, self.model.layers, [*learners(self.task), *learners(self.feature_modules)])

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.optim, extra=[self.task, self.feature_modules])
        total = int(self.trainer.estimated_stepping_batches)
        per_epoch = max(1, total // max(1, self.trainer.max_epochs or 1))
        warmup = max(1, round(self.optim.warmup_epochs * per_epoch))
        factor = warmup_cosine(warmup, total, self.optim.min_lr_ratio)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Never step with a non-finite gradient: halt, or skip the step (optim.nonfinite; nonfinite.py)."""
        if self.trainer.precision != "16-mixed":  # fp16's grad scaler skips overflows itself
            self.skipped_steps = skip_or_halt(optimizer, self.trainer, self._loss, self.skipped_steps, self.optim)

    # checkpoints ------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep what a reader of the checkpoint needs to preprocess images as training did, and what a resumed
        run needs to continue: the skip count and the epoch's running metrics, so that an epoch resumed mid-way
        logs the means of all its batches; and what the task and the features keep."""
        self.task.on_save_checkpoint(checkpoint)
        for feature in self.features:
            feature.on_save_checkpoint(self, checkpoint)
        data = self.trainer.datamodule
        if data is not None and hasattr(data, "facts"):
            checkpoint[DATA_FACTS] = data.facts()
        checkpoint[SKIPPED_STEPS] = self.skipped_steps
        checkpoint[TRAIN_METRICS] = {}
        for name, metric in self._train_metrics().items():
            with metric.sync_context():  # every rank saves; the states are sums, so the ranks' sum is the epoch's
                state = {k: v.detach().cpu().clone() for k, v in metric.metric_state.items()}
                checkpoint[TRAIN_METRICS][name.replace("/", "_")] = state  # train/loss as 'train_loss'

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.task.on_load_checkpoint(checkpoint)
        for feature in self.features:
            feature.on_load_checkpoint(self, checkpoint)
        # before Lightning's load_state_dict, whose size mismatches are a page (a sharded one's shapes: its strategy)
        if saved := {k: v.shape for k, v in checkpoint.get("state_dict", {}).items() if isinstance(v, Tensor)}:
            where = getattr(self._trainer, "ckpt_path", None) or "the checkpoint"
            refuse_unfit(where, saved, {k: v.shape for k, v in self.state_dict().items()})
        self.skipped_steps = checkpoint.get(SKIPPED_STEPS, 0)
        metrics = {name.replace("/", "_"): metric for name, metric in self._train_metrics().items()}
        for name, state in checkpoint.get(TRAIN_METRICS, {}).items():  # absent from older checkpoints
            if (metric := metrics.get(name)) is None:
                continue
            metric.reset()
            if self.global_rank == 0:  # the sums once: the other ranks start from zero
                metric.merge_state({k: v.to(metric.device) for k, v in state.items()})
