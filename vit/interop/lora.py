"""LoRA (Hu et al. 2021) on our network, through peft: each chosen linear map W of every transformer layer becomes
W x + (α / r) B A x, with A (r x D_in) and B (D_out x r, zero at the start) the only weights that learn there.

The adapters are peft's own layers, put in place by peft.inject_adapter_in_model under our module names, so the
state dict keeps our keys and adds `<layer>.lora_A.default.weight` / `lora_B`; `merge` folds B A into W with peft's
merge and puts the plain nn.Linear back, giving a VisionTransformer that any reader of ours or timm's loads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from vit.model import VisionTransformer, ViTConfig
from vit.model.config import ConfigError
from vit.model.size import check_fits, first_layer, weight_bytes

# the attention's Q/K/V and output maps and the MLP's two layers, by their names in a TransformerLayer
TARGETS = ("attn.qkv", "attn.out_proj", "mlp.fc1", "mlp.fc2")
ADAPTER = "lora_"  # in the name of every weight peft adds


@dataclass(frozen=True)
class LoraSettings:
    """LoRA's settings (conf/finetune/lora.yaml), checked once, naming the finetune.* key at fault."""

    rank: int = 8  # r
    alpha: float = 16.0  # the adapters' output is scaled by alpha / r
    dropout: float = 0.0  # on the adapters' input
    targets: tuple[str, ...] = TARGETS  # within each transformer layer

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets) if _names(self.targets) else self.targets)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"finetune.rank={self.rank!r}: must be a whole number >= 1")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < math.inf:
            raise ConfigError(f"finetune.alpha={self.alpha!r}: must be a finite number > 0")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ConfigError(f"finetune.dropout={self.dropout!r}: must be a number from 0 to below 1")
        if not _names(self.targets) or not self.targets or set(self.targets) - set(TARGETS):
            raise ConfigError(f"finetune.targets={list(self.targets)!r}: give a list of {', '.join(TARGETS)}")

    @staticmethod
    def of(values: Mapping[str, Any]) -> LoraSettings:
        """The settings from a mapping that may hold more (finetune.kind), as configs and checkpoints give them."""
        return LoraSettings(**{k: values[k] for k in ("rank", "alpha", "dropout", "targets") if k in values})


def _names(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, str) for v in value)


def add_lora(model: VisionTransformer, settings: LoraSettings) -> VisionTransformer:
    """Put peft's LoRA layers on the targets (names within each transformer layer) of every layer of `model`, in
    place; ValueError naming a target that is not a linear map of every layer, ConfigError a rank (check_rank)."""
    from peft import LoraConfig, inject_adapter_in_model  # imported by the runs that adapt

    for target in settings.targets:
        if not model.layers or not all(isinstance(_get(layer, target), nn.Linear) for layer in model.layers):
            raise ValueError(
                f"LoRA target {target!r} is not a linear map of every layer (targets: {', '.join(TARGETS)})"
            )
    check_rank(model.config, settings.rank, settings.targets)
    pattern = rf"layers\.\d+\.({'|'.join(re.escape(t) for t in settings.targets)})"
    s = settings
    inject_adapter_in_model(
        LoraConfig(r=s.rank, lora_alpha=s.alpha, lora_dropout=s.dropout, target_modules=pattern), model
    )
    return model


def check_rank(config: ViTConfig, rank: int, targets: Sequence[str] = TARGETS) -> None:
    """Refuse, before any adapter is made, a rank the targets cannot use or the machine cannot hold, naming
    finetune.rank: B A has rank at most min(D_in, D_out) of its map, so a larger r adds nothing but memory (r = 10^8
    asked for 38 GB), and the adapters' r (D_in + D_out) weights per map and layer must fit beside the network."""
    layer = first_layer(config)
    maps = {t: m for t in targets if isinstance(m := _get(layer, t), nn.Linear)}
    if not maps:  # add_lora names the targets that are not linear maps
        return
    most = min(min(m.in_features, m.out_features) for m in maps.values())
    if rank > most:
        widths = ", ".join(f"{t} {m.in_features} -> {m.out_features}" for t, m in maps.items())
        raise ConfigError(
            f"finetune.rank={rank}: B A has rank at most {most} on the maps it adapts ({widths}): give a rank <= {most}"
        )
    adapters = 4 * config.depth * rank * sum(m.in_features + m.out_features for m in maps.values())  # fp32
    check_fits(weight_bytes(config) + adapters, f"finetune.rank={rank}: the network with its LoRA adapters")


def _get(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def merge(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (peft's merge) and put the base layer back, in place: the model
    computes what it did, with the plain layers and keys it had before add_lora."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())
    return model


def merged_weights(config: ViTConfig, weights: dict[str, Tensor], settings: LoraSettings) -> dict[str, Tensor]:
    """The plain network's state dict from a LoRA-adapted one (its base layers and adapters, as a run with
    finetune=lora saves them): built, adapted as `settings` say, loaded strictly, merged."""
    model = add_lora(VisionTransformer(config), settings)
    model.load_state_dict(weights)
    return merge(model).state_dict()
