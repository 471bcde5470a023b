"""The arithmetic of several labels per image that the multi-label task (vit/training/tasks.py) calls: Ridnik et al.
2021's asymmetric loss, and the per-class thresholds that give each class its best F1."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.functional.classification import multilabel_precision_recall_curve

from vit.interop.loaded import EVEN_ODDS


def asymmetric_loss(logits: Tensor, targets: Tensor, gamma_neg: float, gamma_pos: float, clip: float) -> Tensor:
    """ASL (Ridnik et al. 2021, "Asymmetric Loss For Multi-Label Classification") of logits (B, K) and
    targets (B, K) in [0, 1], with p = σ(z) and the shifted probability p_m = max(p - m, 0) of the negatives:

        L+ = (1 - p)^γ+ log(p)          L- = p_m^γ- log(1 - p_m)          L = -y L+ - (1 - y) L-

    Soft targets (label smoothing, Mixup) weigh the two terms. Averaged over images and labels, as
    BCEWithLogits is, so that a run's learning rate serves both losses; γ+ = γ- = m = 0 is BCE."""
    logits = logits.float()
    p = logits.sigmoid()
    p_m = (p - clip).clamp(min=0)
    # log(1 - p) from the logit: 1 - σ(z) rounds to 0 from z ≈ 17 in fp32; past a margin 1 - p_m >= m > 0
    log_not_p_m = F.logsigmoid(-logits) if clip == 0 else torch.log1p(-p_m)
    positive = (1 - p).pow(gamma_pos) * F.logsigmoid(logits)
    negative = p_m.pow(gamma_neg) * log_not_p_m
    return -(targets * positive + (1 - targets) * negative).mean()


def best_f1_thresholds(scores: Tensor, targets: Tensor) -> Tensor:
    """Each class's threshold of best F1 over scores (N, K) in [0, 1] with multi-hot targets (N, K): the score
    from which (>=) the class is predicted; EVEN_ODDS for a class no image holds, which has no best F1. (K,)"""
    out = torch.full((scores.shape[1],), EVEN_ODDS)
    held = targets.any(0).nonzero()[:, 0].tolist()  # the classes some image holds
    if not held:
        return out
    curves = multilabel_precision_recall_curve(scores[:, held], targets[:, held].int(), num_labels=len(held))
    for k, precision, recall, cut in zip(held, *curves, strict=True):
        # the curve's last point (precision 1, recall 0) has no threshold
        f1 = (2 * precision * recall / (precision + recall)).nan_to_num(0)[: len(cut)]
        out[k] = cut[f1.argmax()]
    return out
