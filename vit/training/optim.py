"""AdamW (or Muon for the layers' weight matrices) with weight decay on weight matrices only, and a per-step
linear-warmup, cosine-decay schedule."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import nn

from vit.model.config import ConfigError
from vit.training.muon import FUSED_ADAMW_DEVICES, Muon

NONFINITE_POLICIES = ("halt", "skip")
OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class OptimConfig:
    """The optimisation recipe, mirrored key for key by conf/optim/*.yaml."""

    # 'muon': Muon for the transformer layers' weight matrices, AdamW for the rest, at the same lr and decay
    optimizer: str = "adamw"
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    weight_decay: float = 0.05  # on weight matrices only
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.95  # muon's
    warmup_epochs: float = 1.0  # linear warmup length; fractions of an epoch allowed
    min_lr_ratio: float = 0.0  # the cosine ends at min_lr_ratio * lr
    layer_decay: float | None = None  # fine-tuning: layer l of L learns at lr * layer_decay^(L + 1 - l)
    nonfinite: str = "halt"  # a NaN/inf gradient: 'halt' the run, or 'skip' that step (at most max_skipped_steps)
    max_skipped_steps: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            object.__setattr__(self, "betas", tuple(self.betas))
        numbers = {f.name: getattr(self, f.name) for f in fields(self) if f.type in ("float", "float | None")}
        if bad := [f"optim.{k}={v}" for k, v in numbers.items() if v is not None and not math.isfinite(v)]:
            raise ConfigError(f"{', '.join(bad)}: must be a finite number")  # NaN passes every comparison below
        if self.nonfinite not in NONFINITE_POLICIES or self.max_skipped_steps < 0:
            raise ConfigError(
                f"optim.nonfinite={self.nonfinite!r} must be one of {NONFINITE_POLICIES} and "
                f"optim.max_skipped_steps={self.max_skipped_steps} >= 0"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optim.optimizer={self.optimizer!r} must be one of {OPTIMIZERS}")
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be positive, got {self.lr}")
        if self.weight_decay < 0 or self.warmup_epochs < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(
                f"optim.weight_decay={self.weight_decay}, optim.warmup_epochs={self.warmup_epochs} must be >= 0 "
                f"and optim.min_lr_ratio={self.min_lr_ratio} in [0, 1]"
            )
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ConfigError(f"optim.layer_decay must be in (0, 1] or null, got {self.layer_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"optim.momentum must be in [0, 1), got {self.momentum}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> OptimConfig:
        """Type-checked by OmegaConf, so a wrong type or unknown key names its full key under optim."""
        try:
            typed = OmegaConf.merge(OmegaConf.structured(cls), values)
        except OmegaConfBaseException as err:
            raise ConfigError(f"optim: {err.msg} (key: optim.{err.full_key})") from None
        plain = OmegaConf.to_container(typed)
        return cls(**{f.name: tuple(plain[f.name]) if f.name == "betas" else plain[f.name] for f in fields(cls)})


def param_groups(
    model: nn.Module,
    weight_decay: float,
    lr: float | None = None,
    layer_decay: float | None = None,
    muon: Callable[[str], bool] | None = None,
) -> list[dict]:
    """Decay only weight matrices (p.dim() >= 2): not biases, norms, position tables or the class token.

    With layer_decay (and the model's `layer_of(name)`, 0 for the embeddings .. L + 1 for the head), each
    depth gets its own groups at lr * layer_decay^(L + 1 - layer): layer-wise learning-rate decay, as BEiT
    and MAE fine-tune. With `muon(name)`, the decayed 2-D matrices it names get groups flagged `muon`.
    Frozen parameters (requires_grad False) are left out.
    """
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    groups: dict[tuple[int, bool, bool], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        depth = model.layer_of(name) if layer_decay is not None else 0
        decayed = p.dim() >= 2 and name not in skip
        groups.setdefault((depth, decayed, decayed and p.dim() == 2 and muon is not None and muon(name)), []).append(p)
    result = []
    for (depth, decayed, is_muon), params in sorted(groups.items(), key=lambda item: (item[0][0], not item[0][1])):
        group = {"params": params, "weight_decay": weight_decay if decayed else 0.0}
        if layer_decay is not None:
            group["lr"] = lr * layer_decay ** (model.config.depth + 1 - depth)
        if muon is not None:
            group["muon"] = is_muon
        result.append(group)
    return result


def warmup_cosine(warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0):
    """The multiplier of the base learning rate at each step: linear from ~0 to 1 over warmup_steps,
    then half a cosine down to min_lr_ratio at total_steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_optimizer(
    model: nn.Module, config: OptimConfig, hidden: Callable[[str], bool] | None = None, extra: Sequence[nn.Module] = ()
) -> torch.optim.Optimizer:
    """AdamW as one fused kernel over all tensors where torch has one (CPU and CUDA): torch's default
    per-tensor loop costs more than a small model's forward pass (benchmarks/NOTES.md, change 0a).

    Or Muon for the weight matrices of the transformer layers, `hidden(name)`: by default those the model's
    `layer_of` puts between the embeddings (0) and the head (depth + 1). Muon is meant for hidden layers only;
    the embeddings and the classifier keep AdamW (Jordan et al. 2024).

    `extra`: modules that learn beside the network (MAE's decoder, a distillation projector), with AdamW at the full
    learning rate, decay on their weight matrices."""
    if config.optimizer == "muon":
        if hidden is None and not hasattr(model, "layer_of"):
            raise ConfigError(f"optim.optimizer=muon: {type(model).__name__} does not say which are its layers")

        def in_layers(name: str) -> bool:
            return 0 < model.layer_of(name) <= model.config.depth

        groups = param_groups(model, config.weight_decay, config.lr, config.layer_decay, muon=hidden or in_layers)
        groups += _extra_groups(extra, config, muon=True)
        return Muon(groups, config.lr, momentum=config.momentum, betas=config.betas, eps=config.eps)
    device = next(model.parameters()).device.type
    groups = param_groups(model, config.weight_decay, config.lr, config.layer_decay) + _extra_groups(extra, config)
    fused = True if device in FUSED_ADAMW_DEVICES else None
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=fused)


def _extra_groups(modules: Sequence[nn.Module], config: OptimConfig, muon: bool = False) -> list[dict]:
    """The trainable parameters of `modules` as AdamW groups at the full learning rate: decayed matrices, the rest."""
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    groups = []
    for decayed in (True, False):
        chosen = [p for p in params if (p.dim() >= 2) == decayed]
        if chosen:
            group = {"params": chosen, "weight_decay": config.weight_decay if decayed else 0.0, "lr": config.lr}
            groups.append({**group, "muon": False} if muon else group)
    return groups
