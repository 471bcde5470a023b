"""Knowledge distillation from a frozen teacher (`distill`, on with distill.teacher). distill.target=logits is DeiT's
(Touvron et al. 2021): the student learns from the labels and from the teacher's logits, read by its distillation
token's head where it has one (model.distill_token=true), else by its class token's.

    soft:  L = (1 - α) L_labels(z_cls) + α τ² KL(softmax(z_t / τ) ‖ softmax(z_dist / τ))   (KL summed, per logit)
    hard:  L = (1 - α) L_labels(z_cls) + α CE(z_dist, argmax z_t)

distill.target=features regresses the teacher's features (AM-RADIO's and timm's feature distillation): the student's
patch tokens and pooled features, each through a linear projector to the teacher's width, against the teacher's
patch tokens (its grid resampled bilinearly to the student's) and pooled features, by cosine distance plus
smooth-L1:

    L = (1 - α) L_labels + α Σ_{patches, pooled} [ (1 - cos(W s, t)) + smoothL1(W s, t) ]   (means over tokens)

α = 1 learns from the teacher alone, the labels unread.

The teacher is any checkpoint vit.checkpoint.load reads (hub names included): frozen, in eval mode, shown each
augmented image the student sees, at its own resolution and normalisation, in the run's precision. `distill` in a
run's config (DistillConfig) turns it on with distill.teacher; Distillation is the feature that carries it out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.interop.files import CheckpointError
from vit.interop.hub import is_hub_name
from vit.interop.load import Loaded
from vit.model.config import ConfigError, ViTConfig
from vit.training.feature import Feature

KINDS = ("soft", "hard")
TARGETS = ("logits", "features")


@dataclass(frozen=True)
class DistillConfig:
    """The `distill` settings, named before the teacher is read."""

    teacher: str | None = None  # any checkpoint or hub name; None: no distillation
    target: Literal["logits", "features"] = "logits"  # DeiT's, or the teacher's patch tokens and pooled features
    kind: Literal["soft", "hard"] = "soft"  # logits: hard takes the teacher's top class as the label
    alpha: float = 0.5  # the teacher's share of the loss
    tau: float = 1.0  # soft: the temperature of both softmaxes

    def __post_init__(self) -> None:
        if self.teacher is not None and not Path(str(self.teacher)).exists() and not is_hub_name(str(self.teacher)):
            raise ConfigError(f"distill.teacher={self.teacher}: no such file or folder (nor a hub name)")
        if self.target not in TARGETS:
            raise ConfigError(f"distill.target={self.target!r}: give one of {', '.join(TARGETS)}")
        if self.kind not in KINDS:
            raise ConfigError(f"distill.kind={self.kind!r}: give one of {', '.join(KINDS)}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 <= self.alpha <= 1:
            raise ConfigError(f"distill.alpha={self.alpha!r}: the teacher's share of the loss, from 0 to 1")
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not 0 < self.tau < math.inf:
            raise ConfigError(f"distill.tau={self.tau!r}: must be a finite temperature > 0")


def distillation_loss(
    base: Tensor, distill_logits: Tensor, teacher_logits: Tensor, kind: str, alpha: float, tau: float
) -> Tensor:
    """DeiT's loss from the label loss `base` (of the class token's logits), the student's distillation logits and
    the teacher's, each (B, K)."""
    if kind == "soft":
        log_student = F.log_softmax(distill_logits.float() / tau, dim=-1)
        log_teacher = F.log_softmax(teacher_logits.float() / tau, dim=-1)
        kl = F.kl_div(log_student, log_teacher, reduction="sum", log_target=True)
        distill = kl * tau * tau / distill_logits.numel()
    else:
        distill = F.cross_entropy(distill_logits.float(), teacher_logits.argmax(dim=-1))
    return (1 - alpha) * base + alpha * distill


@dataclass
class Teacher:
    """A loaded teacher, and how to show it the student's batches."""

    loaded: Loaded

    @torch.no_grad()
    def __call__(self, images: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """The teacher's logits of a batch normalised for the student by (mean, std), each (C,). (B, K) float."""
        return self.loaded.model(self.inputs(images, mean, std)).float()

    @torch.no_grad()
    def features(self, images: Tensor, mean: Tensor, std: Tensor) -> tuple[Tensor, Tensor]:
        """The teacher's patch tokens (B, N_t, D_t) and pooled features (B, D_t) of a student batch, float."""
        model = self.loaded.model
        tokens = model.forward_features(self.inputs(images, mean, std))
        pooled = model.forward_head(tokens, pre_logits=True)
        return tokens[:, model.config.num_prefix_tokens :].float(), pooled.float()

    def inputs(self, images: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """A batch normalised for the student by (mean, std), each (C,), as the teacher reads it: back to pixels, to
        the teacher's channels and size, normalised by its own statistics."""
        config = self.loaded.config
        pixels = images * std.view(1, -1, 1, 1) + mean.view(1, -1, 1, 1)  # (B, C, H, W) in [0, 1]
        if pixels.shape[1] != config.in_chans:  # grayscale to an RGB teacher, or the reverse
            pixels = pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels.mean(1, keepdim=True)
        if tuple(pixels.shape[-2:]) != tuple(config.img_size):
            pixels = F.interpolate(pixels, size=tuple(config.img_size), mode="bicubic", align_corners=False)
        t_mean, t_std = (torch.tensor(v, device=images.device) for v in (self.loaded.mean, self.loaded.std))
        return (pixels - t_mean.view(1, -1, 1, 1)) / t_std.view(1, -1, 1, 1)


class Distillation(Feature):
    """DeiT's two heads in training: the class token's logits learn from the labels, the distillation token's (or,
    without one, the class token's again) from the teacher; the metrics score their mean, as forward() gives it."""

    def __init__(self, settings: DistillConfig, teacher: Loaded, student: ViTConfig):
        if teacher.config.num_classes != student.num_classes:
            raise CheckpointError(
                f"distill.teacher={settings.teacher} predicts {teacher.config.num_classes} classes, the student (the "
                f"data) {student.num_classes}: distil from a teacher of the data's classes"
            )
        teacher.model.requires_grad_(False)
        self.settings, self.teacher = settings, Teacher(teacher)  # not a submodule: never saved with the student

    def on_fit_start(self, module: Any) -> None:
        self.teacher.loaded.model.to(module.device)

    def training_outputs(self, module: Any, images: Tensor) -> tuple[Tensor, Tensor, Any]:
        logits, distilled = module.model.forward_heads(images)
        return logits, (logits + distilled) / 2, distilled

    def loss(self, module: Any, images: Tensor, distilled: Any, loss: Tensor) -> Tensor:
        data = module.trainer.datamodule  # the mean and std the batches are normalised by: the way back to pixels
        mean, std = (torch.tensor(v, device=module.device) for v in (data.mean, data.std))
        s = self.settings
        return distillation_loss(loss, distilled, self.teacher(images, mean, std), s.kind, s.alpha, s.tau)


def feature_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """Cosine distance plus smooth-L1 of student and teacher features (..., D), each a mean over the tokens."""
    student, teacher = student.float(), teacher.float()
    cosine = 1 - F.cosine_similarity(student, teacher, dim=-1).mean()
    return cosine + F.smooth_l1_loss(student, teacher)


def resample_grid(tokens: Tensor, grid: tuple[int, int], to: tuple[int, int]) -> Tensor:
    """Patch tokens (B, h w, D) of a grid, bilinearly resampled to another: (B, h' w', D)."""
    if tuple(grid) == tuple(to):
        return tokens
    maps = tokens.transpose(1, 2).unflatten(-1, grid)  # (B, D, h, w)
    return F.interpolate(maps.float(), size=to, mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)


class FeatureDistillation(Feature):
    """distill.target=features: the student's patch tokens and pooled features regress the teacher's through two
    linear projectors (`projectors`, which learn with the network and are saved beside it), the teacher shown each
    image at its own resolution and normalisation (Teacher's way)."""

    def __init__(self, settings: DistillConfig, teacher: Loaded, student: ViTConfig):
        s, t = student, teacher.config
        (sh, sw), (th, tw) = s.grid_size, t.grid_size
        if abs(sh / sw - th / tw) > 1e-6:
            raise CheckpointError(
                f"distill.teacher={settings.teacher}: its {th}x{tw} patch grid cannot be resampled to the student's "
                f"{sh}x{sw} without distorting it (other aspect ratios): give a teacher of the student's aspect ratio"
            )
        teacher.model.requires_grad_(False)
        self.settings, self.teacher = settings, Teacher(teacher)
        pooled = t.pooled_dim
        self.projectors = torch.nn.ModuleDict(
            {"patches": torch.nn.Linear(s.embed_dim, t.embed_dim), "pooled": torch.nn.Linear(s.pooled_dim, pooled)}
        )

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"distill": self.projectors}

    def on_fit_start(self, module: Any) -> None:
        self.teacher.loaded.model.to(module.device)

    def training_outputs(self, module: Any, images: Tensor) -> tuple[Tensor, Tensor, Any]:
        model = module.model
        tokens = model.forward_features(images)  # (B, P + N, D)
        pooled = model.forward_head(tokens, pre_logits=True)
        logits = model.forward_head(tokens)
        return logits, logits, (tokens[:, model.config.num_prefix_tokens :], pooled)

    def loss(self, module: Any, images: Tensor, student: Any, loss: Tensor) -> Tensor:
        patches, pooled = student
        data = module.trainer.datamodule
        mean, std = (torch.tensor(v, device=module.device) for v in (data.mean, data.std))
        teacher_patches, teacher_pooled = self.teacher.features(images, mean, std)
        teacher_patches = resample_grid(teacher_patches, self.teacher.loaded.config.grid_size, module.config.grid_size)
        distilled = feature_loss(self.projectors["patches"](patches), teacher_patches)
        distilled = distilled + feature_loss(self.projectors["pooled"](pooled), teacher_pooled)
        alpha = self.settings.alpha
        return distilled if alpha == 1 else (1 - alpha) * loss + alpha * distilled
