"""Steps never taken with a NaN or infinite gradient: the check, run once a step, and the policy (optim.nonfinite:
halt the run, or skip the step up to optim.max_skipped_steps times); and the running mean that leaves a skipped
step's NaN loss out of the epoch's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torchmetrics import MeanMetric

if TYPE_CHECKING:
    from vit.training.optim import OptimConfig


class NonFiniteError(RuntimeError):
    """A NaN or infinite gradient (or loss) that the run may not step with."""


# GradScaler's fused check, private to torch: faster than the public inf-norm (benchmarks/NOTES.md change 9). No bf16
# on CUDA. tests/training/test_nonfinite.py pins what it does and that torch still has it.
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


def skip_or_halt(
    optimizer: torch.optim.Optimizer, trainer: Any, loss: Tensor | None, skipped: int, optim: OptimConfig
) -> int:
    """Before an optimizer step: if any gradient is not finite, raise NonFiniteError (optim.nonfinite=halt, or
    optim.max_skipped_steps skipped already) or drop the step's gradients (the optimizer leaves parameters without
    one untouched); returns the run's skipped steps, `skipped` before this one. The message names the trainer's step
    and the step's `loss`. Under DDP the gradients are already averaged over ranks, so every rank takes the same
    decision. One fused check and one sync a step."""
    # the optimizer's list, not the module's parameters(): walking the module tree costs more than the check itself
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not any_nonfinite([p.grad for p in params if p.grad is not None]):
        return skipped
    step, batch, most = trainer.global_step, trainer.fit_loop.epoch_loop.batch_idx, optim.max_skipped_steps
    value = float(loss) if loss is not None else float("nan")
    where = f"non-finite gradient at step {step} (epoch {trainer.current_epoch}, batch {batch}; loss {value})"
    if optim.nonfinite == "halt":
        raise NonFiniteError(f"{where}: run halted before the optimizer step (optim.nonfinite=halt)")
    if skipped >= most:
        raise NonFiniteError(f"{where}: {skipped} steps skipped already, optim.max_skipped_steps={most}: run halted")
    for p in params:
        p.grad = None
    rank_zero_warn(f"{where}: step skipped ({skipped + 1} of at most {most})")
    return skipped + 1


class FiniteMean(MeanMetric):
    """The weighted mean of the finite values: a skipped step's NaN loss stays out of the epoch's mean. Every
    update stays on the device: MeanMetric's own NaN check reads a flag on the host (a sync per step on a GPU),
    and its nan_strategy="disable" also drops the weights (torchmetrics 1.9)."""

    def update(self, value: Tensor, weight: float = 1.0) -> None:
        finite = value.isfinite()
        self.mean_value += torch.where(finite, value * weight, 0.0).sum()
        self.weight += (finite * weight).sum()
