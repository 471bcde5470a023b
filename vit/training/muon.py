"""Muon (Jordan et al. 2024): the transformer layers' weight matrices step along their momentum orthogonalised
by a Newton-Schulz iteration; every other parameter steps as AdamW. One optimizer, so one schedule and one
checkpoint hold both.

Ours rather than torch.optim.Muon or timm's: both orthogonalise one matrix at a time in bf16, which a CPU
without bf16 units emulates and which is slow on the default model's small matrices even with them; here matrices
of one shape are orthogonalised together, in fp32 on a CPU (benchmarks/NOTES.md change 20).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim.adamw import adamw

# Jordan's quintic: the steepest slope at zero (small singular values grow ~3.4x a step) that still keeps those
# near 1 within ~[0.7, 1.2]
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)
FUSED_ADAMW_DEVICES = ("cpu", "cuda")  # where torch has AdamW as one fused kernel


def orthogonalize(g: Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> Tensor:
    """(S, m, n) -> (S, m, n): each matrix's singular values pushed towards 1, its singular vectors kept.

    X <- aX + b(XXᵀ)X + c(XXᵀ)²X is an odd polynomial in X, so X = U S Vᵀ becomes U p(S) Vᵀ; after dividing by
    the Frobenius norm every singular value starts in [0, 1], and five steps of p leave roughly UVᵀ.
    """
    a, b, c = NEWTON_SCHULZ
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.mT  # (S, m, m), m <= n
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.mT if tall else x).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Param groups with `muon: True` hold 2-D weight matrices and take Muon's step; the rest take AdamW's.

    The Muon step, per matrix W (m x n) with gradient G, momentum mu and learning rate lr:
        B <- mu B + (1 - mu) G;  U = orthogonalize((1 - mu) G + mu B)   (Nesterov)
        W <- (1 - lr wd) W - lr 0.2 sqrt(max(m, n)) U
    The factor 0.2 sqrt(max(m, n)) gives the update the root-mean-square of a typical AdamW update (Liu et al.
    2025, "Muon is scalable"), so AdamW's learning rate and weight decay carry over unchanged.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        ns_steps: int = 5,
    ) -> None:
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, betas=betas, eps=eps, ns_steps=ns_steps, muon=False
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"] and (shapes := [tuple(p.shape) for p in group["params"] if p.dim() != 2]):
                raise ValueError(f"Muon steps 2-D weight matrices only, got shapes {shapes}")

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if params := [p for p in group["params"] if p.grad is not None]:
                (self._muon if group["muon"] else self._adamw)(group, params)
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, then each AdamW step count on its parameter's device: torch's loader leaves counts on the
        CPU unless the saved group says `fused`, and the fused CUDA kernel refuses a count on the CPU."""
        super().load_state_dict(state_dict)
        for p, state in self.state.items():
            if "step" in state:
                state["step"] = state["step"].to(p.device)

    def _muon(self, group: dict[str, Any], params: list[Tensor]) -> None:
        grads = [p.grad for p in params]
        for p in params:
            if not (state := self.state[p]):
                state["momentum_buffer"] = torch.zeros_like(p)
        buffers = [self.state[p]["momentum_buffer"] for p in params]
        mu, lr = group["momentum"], group["lr"]
        # torch's private foreach ops, as torch.optim's: tests/training/test_muon.py pins each to its public op
        torch._foreach_lerp_(buffers, grads, 1 - mu)
        updates = torch._foreach_lerp(grads, buffers, mu)
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        # on a GPU bf16 is what Jordan's Newton-Schulz runs in; on a CPU fp32 is as fast for these sizes and exact
        dtype = torch.bfloat16 if params[0].is_cuda else torch.float32
        by_shape: dict[torch.Size, list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(p.shape, []).append(i)
        for shape, index in by_shape.items():
            orthogonal = orthogonalize(torch.stack([updates[i] for i in index]), group["ns_steps"], dtype)
            scale = 0.2 * max(shape) ** 0.5
            torch._foreach_add_([params[i] for i in index], orthogonal.unbind(0), alpha=-lr * scale)

    def _adamw(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """torch's AdamW step, its fused kernel where the device has one: what torch.optim.AdamW would do."""
        for p in params:
            if not (state := self.state[p]):  # the step count a device tensor, as the fused kernel wants
                state.update(step=p.new_zeros((), dtype=torch.float32), exp_avg=torch.zeros_like(p))
                state["exp_avg_sq"] = torch.zeros_like(p)
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            fused=params[0].device.type in FUSED_ADAMW_DEVICES,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )
