"""Knowledge distillation as DeiT trains (Touvron et al. 2021): the student learns from the labels and from a frozen
teacher's logits, read by its distillation token's head where it has one (model.distill_token=true), else by its
class token's.

    soft:  L = (1 - α) L_labels(z_cls) + α τ² KL(softmax(z_t / τ) ‖ softmax(z_dist / τ))   (KL summed, per logit)
    hard:  L = (1 - α) L_labels(z_cls) + α CE(z_dist, argmax z_t)

The teacher is any checkpoint vit.checkpoint.load reads (hub names included): frozen, in eval mode, shown each
augmented image the student sees, at its own resolution and normalisation, in the run's precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.interop.load import Loaded

KINDS = ("soft", "hard")


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
        """The teacher's logits of a batch normalised for the student by (mean, std), each (C,): back to pixels,
        to the teacher's channels and size, normalised by its own statistics. (B, K) float."""
        config = self.loaded.config
        pixels = images * std.view(1, -1, 1, 1) + mean.view(1, -1, 1, 1)  # (B, C, H, W) in [0, 1]
        if pixels.shape[1] != config.in_chans:  # grayscale to an RGB teacher, or the reverse
            pixels = pixels.expand(-1, 3, -1, -1) if pixels.shape[1] == 1 else pixels.mean(1, keepdim=True)
        if tuple(pixels.shape[-2:]) != tuple(config.img_size):
            pixels = F.interpolate(pixels, size=tuple(config.img_size), mode="bicubic", align_corners=False)
        t_mean, t_std = (torch.tensor(v, device=images.device) for v in (self.loaded.mean, self.loaded.std))
        return self.loaded.model((pixels - t_mean.view(1, -1, 1, 1)) / t_std.view(1, -1, 1, 1)).float()
