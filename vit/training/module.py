"""The Lightning module: a ViT classifier, its loss, optimizer, schedule and metrics.

Metric names are defined here once; callbacks and train() import them.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import Tensor
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from vit.data.augment import average_over_views
from vit.data.facts import DATA_FACTS
from vit.data.native_size import fit_all
from vit.interop.files import CheckpointError
from vit.interop.frozen import FROZEN, FrozenRecord
from vit.interop.load import MODEL_PREFIX
from vit.interop.lora import ADAPTER, add_lora
from vit.model import ConfigError, VisionTransformer, ViTConfig
from vit.training.compiler import compile_network
from vit.training.distill import Teacher, distillation_loss
from vit.training.optim import OptimConfig, build_optimizer, warmup_cosine
from vit.training.resume import refuse_unfit
from vit.training.sharding import ShardedStrategy

TRAIN_LOSS, TRAIN_LOSS_STEP, TRAIN_ACC, LR = "train/loss", "train/loss_step", "train/acc", "train/lr"
VAL_LOSS, VAL_ACC, VAL_ACC5, VAL_SAMPLES = "val/loss", "val/acc", "val/acc5", "val/samples"
TEST_LOSS, TEST_ACC, TEST_ACC5 = "test/loss", "test/acc", "test/acc5"
SKIPPED_STEPS = "skipped_steps"  # checkpoint entry: optimizer steps dropped for non-finite gradients
TRAIN_METRICS = "train_metrics"  # checkpoint entry: the epoch's running train/loss and train/acc, summed over ranks


class NonFiniteError(RuntimeError):
    """A NaN or infinite gradient (or loss) that the run may not step with."""


# GradScaler's fused check, private to torch: faster than the public inf-norm (benchmarks/NOTES.md change 9). No bf16
# on CUDA. tests/training/test_module.py pins what it does and that torch still has it.
_FUSED_NONFINITE_CHECK = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)


def any_nonfinite(tensors: list[Tensor]) -> bool:
    """Whether any of the tensors holds a NaN or an infinity: one pass per device and dtype, by GradScaler's
    check (multiplying by 1, which changes no value), or by the public inf-norm where that is missing."""
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    found = []
    for (device, dtype), group in groups.items():
        if _FUSED_NONFINITE_CHECK is not None and dtype != torch.bfloat16:
            flag = torch.zeros((), device=device)
            _FUSED_NONFINITE_CHECK(group, flag, torch.ones((), device=device))  # flag = 1 if any is not finite
            found.append(flag)
        else:  # max |x| is inf or NaN if any value is
            found.append(torch.nn.utils.get_total_norm(group, float("inf")).isfinite().logical_not())
    return bool(sum(found))  # sum([]) is 0: no tensors, nothing non-finite


class FiniteMean(MeanMetric):
    """The weighted mean of the finite values: a skipped step's NaN loss stays out of the epoch's mean. Every
    update stays on the device: MeanMetric's own NaN check reads a flag on the host (a sync per step on a GPU),
    and its nan_strategy="disable" also drops the weights (torchmetrics 1.9)."""

    def update(self, value: Tensor, weight: float = 1.0) -> None:
        finite = value.isfinite()
        self.mean_value += torch.where(finite, value * weight, 0.0).sum()
        self.weight += (finite * weight).sum()


class ViTClassifier(L.LightningModule):
    """Trains VisionTransformer(ViTConfig(**model)). Every argument is a plain Python value, so the saved
    hyperparameters load with torch.load(weights_only=True).

    Args:
        model: ViTConfig fields.
        optim: OptimConfig fields (AdamW with decay on weight matrices; warmup then cosine, per step).
        label_smoothing: for the hard-label cross-entropy (and for Mixup's soft targets).
        mixup: timm.data.Mixup arguments (mixup_alpha, cutmix_alpha, prob, switch_prob, ...), or None.
        compile: compile the network with torch.compile, in place (compiler.compile_network).
        test_time_flip: validate and test on the mean logits of each image and its mirror image, as the
            speed-run recipes do (airbench): a second look for free in training time, for models trained with flips.
        test_time_shift: also on the image moved this many pixels up-left and down-right (border black, as
            training's crops pad), the two moved views weighing as much as the unmoved ones (airbench's
            mirror-translate views): for models trained with random crops; 0: none.
        finetune: what learns, {'kind': 'full' | 'linear' | 'lora', and LoRA's rank, alpha, dropout, targets}:
            conf/finetune/, carried out by adapt() once the starting weights are in.
        distill: DeiT's distillation from a teacher (vit/training/distill.py): {'teacher': its name or path,
            'kind': 'soft' | 'hard', 'alpha', 'tau'}; the run sets `teacher` to the loaded network.
        pretrained_from: the weights the run started from (a hub name's repo, commit and files, or a path), kept
            in the checkpoints as a record.
        max_tokens: with model.naflex, each image's budget of patches (data.max_tokens): batches are lists of
            images of their own sizes, each fitted to it and all packed into sequences of that many patches.
    """

    def __init__(
        self,
        model: dict[str, Any],
        optim: dict[str, Any] | None = None,
        label_smoothing: float = 0.1,
        mixup: dict[str, Any] | None = None,
        compile: bool = False,
        test_time_flip: bool = False,
        test_time_shift: int = 0,
        finetune: dict[str, Any] | None = None,
        pretrained_from: dict[str, Any] | None = None,
        distill: dict[str, Any] | None = None,
        max_tokens: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(logger=False)  # into checkpoints; the loggers get the run's whole config
        self.config = ViTConfig.from_dict(model)
        self.optim = OptimConfig.from_dict(optim or {})
        self.finetune = dict(finetune or {"kind": "full"})
        self.model = VisionTransformer(self.config)
        self.teacher: Teacher | None = None  # set by the run with distill.teacher; not a submodule, so not saved
        # adapt(): the pretrained weights that do not learn, left out of checkpoints
        self.frozen: FrozenRecord | None = None
        if compile:
            compile_network(self.model)
        k = self.config.num_classes
        self.mixup = Mixup(**mixup, label_smoothing=label_smoothing, num_classes=k) if mixup else None
        self.soft_loss = SoftTargetCrossEntropy()
        # top-1 and top-5 accuracy: the fraction of images classified right ("micro"), not torchmetrics' default
        # mean over classes ("macro", balanced accuracy), which differs wherever the classes are not equally many
        top1 = partial(MulticlassAccuracy, k, average="micro")
        top5 = partial(top1, top_k=min(5, k))
        self.train_acc = top1(validate_args=False)  # every step: no label-range check (a host sync on a GPU)
        self.val_acc, self.val_acc5 = top1(), top5()
        self.test_acc, self.test_acc5 = top1(), top5()
        self.train_loss = FiniteMean()
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_samples = SumMetric()
        self.skipped_steps = 0
        self._loss: Tensor | None = None
        self._black: Tensor | None = None  # the data's black after normalisation, per channel: setup()

    def forward(self, images: Tensor | list[Tensor]) -> Tensor:
        if isinstance(images, list):  # model.naflex: each at its own aspect ratio, within max_tokens patches, packed
            budget, patch = self.hparams.max_tokens, self.config.patch_size
            fitted = fit_all(images, patch, budget)
            return self.model.forward_packed(fitted, budget + self.config.num_prefix_tokens)
        return self.model(images)

    def adapt(self, resized_table: bool = False) -> None:
        """What learns, by finetune.kind, once the starting weights are in: every weight ('full'); the heads alone
        ('linear': a distilled model averages two); or peft's LoRA adapters on finetune.targets, the heads and,
        where the position table was resampled to a new grid (`resized_table`), the table ('lora')."""
        kind = self.finetune["kind"]
        if kind == "full":
            return
        learn = ("head.", "head_dist.")
        if kind == "lora":
            add_lora(self.model, **{k: self.finetune[k] for k in ("rank", "alpha", "dropout", "targets")})
            learn += ("pos_embed.",) if resized_table else ()
        for name, p in self.model.named_parameters():
            p.requires_grad_(name.startswith(learn) or ADAPTER in name)
        if self.hparams.pretrained_from is not None:  # the rest is the pretrained file's: rebuilt from it on reading
            frozen = {name: p for name, p in self.model.named_parameters() if not p.requires_grad}
            self.frozen = FrozenRecord.of(frozen, self.hparams.pretrained_from)

    # training ---------------------------------------------------------------------------------------
    # Lightning's bookkeeping on every self.log call, whatever the value, is a noticeable share of a small model's
    # step (benchmarks/NOTES.md change 0b). So steps accumulate on the device, and self.log runs only when a row is
    # due (every trainer.log_every_n_steps) and once an epoch, at its last batch: before validation and the
    # epoch-end callbacks, which print these values.
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        mixed = self.mixup is not None and len(images) % 2 == 0  # timm's Mixup pairs images within the batch
        if mixed:
            images, targets = self.mixup(images, labels)
        if self.teacher is None:
            logits = distilled = self(images)
        else:  # DeiT's two heads: the class token's learns from the labels, the distillation token's from the teacher
            logits, distilled = self.model.forward_heads(images)
        if mixed:
            loss = self.soft_loss(logits, targets)
        else:
            loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
            self.train_acc.update((logits + distilled) / 2, labels)
        if self.teacher is not None:
            taught = self.teacher(images, *self._data_stats())
            d = self.hparams.distill
            loss = distillation_loss(loss, distilled, taught, d["kind"], d["alpha"], d["tau"])
        self._loss = loss.detach()
        self.train_loss.update(self._loss, len(labels))
        if (self.trainer.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self.log(TRAIN_LOSS_STEP, loss.detach(), prog_bar=True, batch_size=len(labels))
            lr = max(group["lr"] for group in self.optimizers().param_groups)  # the head's under layer decay
            self.log(LR, lr, batch_size=len(labels))
        if batch_idx + 1 == self.trainer.num_training_batches:
            self._log_epoch_means()
        return loss

    def _data_stats(self) -> tuple[Tensor, Tensor]:
        """The mean and std the batches are normalised by, (C,) each on the device: the teacher's way back to pixels."""
        data = self.trainer.datamodule
        return tuple(torch.tensor(v, device=self.device) for v in (data.mean, data.std))  # type: ignore[return-value]

    def on_fit_start(self) -> None:
        if self.teacher is not None:
            self.teacher.loaded.model.to(self.device)

    def _log_epoch_means(self) -> None:
        """Log the epoch's means and reset them, so that a checkpoint holds the running epoch's sums only
        (on_save_checkpoint). Not in on_train_epoch_start: Lightning skips it for the epoch a run resumes in."""
        # one value an epoch, its mean already: batch_size only spares Lightning guessing it from the batch
        self.log(TRAIN_LOSS, self.train_loss.compute(), on_step=False, on_epoch=True, batch_size=1)
        if self.train_acc.update_count:
            self.log(TRAIN_ACC, self.train_acc.compute(), on_step=False, on_epoch=True, batch_size=1)
        self.train_loss.reset()
        self.train_acc.reset()

    # evaluation -------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """The data's black, which test-time shifts fill the border with: the normalised value of a 0 pixel."""
        if self.hparams.test_time_shift:  # each fit, validate or test: its data module's normalisation
            if not hasattr(data := self.trainer.datamodule, "facts"):
                raise ConfigError("test_time_shift needs a data module that states its mean and std (facts())")
            facts = data.facts()
            self.set_black(facts["mean"], facts["std"])

    def set_black(self, mean: list[float], std: list[float]) -> None:
        """Normalisation by mean and std (pixels in [0, 1]) maps a black pixel to -mean / std."""
        self._black = -torch.tensor(mean) / torch.tensor(std)  # (C,) or (1,)

    def views(self, images: Tensor | list[Tensor]) -> Tensor:
        """(B, C, H, W) -> (B, K): the logits, averaged over the test-time views that are switched on."""
        flip, shift_px = self.hparams.test_time_flip, self.hparams.test_time_shift
        if isinstance(images, list):  # of their own sizes (model.naflex): each and, with flip, its mirror image
            logits = self(images)
            return (logits + self([image.flip(-1) for image in images])) / 2 if flip else logits
        return average_over_views(self, images, flip, shift_px, self._black)

    def _evaluate(self, batch: tuple[Tensor, Tensor], names: tuple[str, str, str], loss, acc, acc5) -> int:
        """Update the loss, top-1 and top-5 metrics on a batch and log them under `names`; returns its size."""
        images, labels = batch
        logits = self.views(images)
        loss(F.cross_entropy(logits, labels), len(labels))
        acc(logits, labels)
        acc5(logits, labels)
        for name, metric in zip(names, (loss, acc, acc5), strict=True):
            self.log(name, metric, on_step=False, on_epoch=True, prog_bar=name == VAL_ACC, batch_size=len(labels))
        return len(labels)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        n = self._evaluate(batch, (VAL_LOSS, VAL_ACC, VAL_ACC5), self.val_loss, self.val_acc, self.val_acc5)
        self.val_samples(n)
        self.log(VAL_SAMPLES, self.val_samples, on_step=False, on_epoch=True, reduce_fx="sum", batch_size=n)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, (TEST_LOSS, TEST_ACC, TEST_ACC5), self.test_loss, self.test_acc, self.test_acc5)

    # optimisation -----------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """trainer=fsdp: each transformer layer, then the rest, sharded across the processes (sharding.py)."""
        if isinstance(strategy := getattr(self._trainer, "strategy", None), ShardedStrategy):
            strategy.shard_(self.model, self.model.layers)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(self.model, self.optim)
        total = int(self.trainer.estimated_stepping_batches)
        per_epoch = max(1, total // max(1, self.trainer.max_epochs or 1))
        warmup = max(1, round(self.optim.warmup_epochs * per_epoch))
        factor = warmup_cosine(warmup, total, self.optim.min_lr_ratio)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Never step with a non-finite gradient. Under DDP the gradients are already averaged over ranks,
        so every rank sees the same values and takes the same decision. One fused check and one sync a step."""
        if self.trainer.precision == "16-mixed":  # fp16's grad scaler skips overflows itself
            return
        # the optimizer's list, not self.parameters(): walking the module tree costs more than the check itself
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not any_nonfinite([p.grad for p in params if p.grad is not None]):
            return
        loss = float(self._loss) if self._loss is not None else float("nan")
        step, batch = self.trainer.global_step, self.trainer.fit_loop.epoch_loop.batch_idx
        where = f"non-finite gradient at step {step} (epoch {self.current_epoch}, batch {batch}; loss {loss})"
        if self.optim.nonfinite == "halt":
            raise NonFiniteError(f"{where}: run halted before the optimizer step (optim.nonfinite=halt)")
        if self.skipped_steps >= self.optim.max_skipped_steps:
            raise NonFiniteError(
                f"{where}: {self.skipped_steps} steps skipped already, optim.max_skipped_steps="
                f"{self.optim.max_skipped_steps}: run halted"
            )
        for p in params:
            p.grad = None  # the optimizer leaves parameters without a gradient untouched: a skipped step
        self.skipped_steps += 1
        rank_zero_warn(f"{where}: step skipped ({self.skipped_steps} of at most {self.optim.max_skipped_steps})")

    # checkpoints ------------------------------------------------------------------------------------
    def _train_metrics(self) -> dict[str, FiniteMean | MulticlassAccuracy]:
        return {"train_loss": self.train_loss, "train_acc": self.train_acc}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep what a reader of the checkpoint needs to preprocess images as training did, and what a resumed
        run needs to continue: the skip count and the epoch's running metrics, so that an epoch resumed mid-way
        logs the means of all its batches. A partly fine-tuned run keeps the weights that learn (`frozen`)."""
        sharded = isinstance(getattr(self._trainer, "strategy", None), ShardedStrategy)  # loads its shards itself
        if self.frozen is not None and not sharded:  # the live weights and, with EMA, the average (current_model_state)
            for part in ("state_dict", "current_model_state"):
                for key in self.frozen.keys:
                    checkpoint.get(part, {}).pop(MODEL_PREFIX + key, None)
            checkpoint[FROZEN] = self.frozen.to_dict()
        data = self.trainer.datamodule
        if data is not None and hasattr(data, "facts"):
            checkpoint[DATA_FACTS] = data.facts()
        checkpoint[SKIPPED_STEPS] = self.skipped_steps
        checkpoint[TRAIN_METRICS] = {}
        for name, metric in self._train_metrics().items():
            with metric.sync_context():  # every rank saves; the states are sums, so the ranks' sum is the epoch's
                checkpoint[TRAIN_METRICS][name] = {k: v.detach().cpu().clone() for k, v in metric.metric_state.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if FROZEN in checkpoint:  # the frozen weights, this run's own: the same pretrained file, adapted alike
            where = getattr(self._trainer, "ckpt_path", None) or "the checkpoint"
            record = FrozenRecord.read(checkpoint[FROZEN], where)
            if self.frozen is None or (record.keys, record.sha256) != (self.frozen.keys, self.frozen.sha256):
                raise CheckpointError(
                    f"{where}: holds only the weights that learned from {record.reference}, and this run's "
                    "frozen weights are not that file's: resume with the model.pretrained and finetune it was "
                    "trained with"
                )
            own = self.model.state_dict()
            for part in ("state_dict", "current_model_state"):
                if part in checkpoint:
                    checkpoint[part].update({MODEL_PREFIX + key: own[key] for key in record.keys})
        # before Lightning's load_state_dict, whose size mismatches are a page (a sharded one's shapes: its strategy)
        if saved := {k: v.shape for k, v in checkpoint.get("state_dict", {}).items() if isinstance(v, Tensor)}:
            where = getattr(self._trainer, "ckpt_path", None) or "the checkpoint"
            refuse_unfit(where, saved, {k: v.shape for k, v in self.state_dict().items()})
        self.skipped_steps = checkpoint.get(SKIPPED_STEPS, 0)
        for name, state in checkpoint.get(TRAIN_METRICS, {}).items():  # absent from older checkpoints
            metric = self._train_metrics()[name]
            metric.reset()
            if self.global_rank == 0:  # the sums once: the other ranks start from zero
                metric.merge_state({k: v.to(metric.device) for k, v in state.items()})
