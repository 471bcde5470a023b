"""What conf/ names, made known to Hydra and OmegaConf by one call, `register()`, which train.py (and every other
composer of conf/train.yaml) makes before Hydra composes a config: the resolvers (vit/training/resolvers.py), and
each typed group's defaults (vit/training/settings.py) as a ConfigStore node that conf/train.yaml's defaults list
places under the group, so that a group's YAML states only what differs and every field can be overridden without
Hydra's '+'. Nothing is registered on import."""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

from vit.interop.frozen import FinetuneConfig
from vit.model.config import ViTConfig
from vit.training.distill import DistillConfig
from vit.training.optim import OptimConfig
from vit.training.resolvers import register_resolvers
from vit.training.tasks import TaskConfig

# conf/train.yaml's defaults list names each node: `- <name>@<group>`, before the group's choice
NODES = {
    "vit_config": ViTConfig,
    "optim_config": OptimConfig,
    "finetune_config": FinetuneConfig,
    "distill_config": DistillConfig,
    "task_config": TaskConfig,
}


def defaults(kind: type) -> dict[str, Any]:
    """A config dataclass's declared defaults as plain YAML values (nested choices as mappings, tuples as lists).
    Declared, not those of kind(): a default of None (ViTConfig.class_token) is resolved against the other
    fields. ViTConfig's node also names its `_target_`, which builds it."""
    out: dict[str, Any] = {"_target_": f"{kind.__module__}.{kind.__qualname__}"} if kind is ViTConfig else {}
    for f in fields(kind):
        if f.init and f.default is not MISSING:
            value = asdict(f.default) if is_dataclass(f.default) else f.default
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def register() -> None:
    """The resolvers and the typed groups' nodes; call before Hydra composes conf/train.yaml."""
    register_resolvers()
    store = ConfigStore.instance()
    for name, kind in NODES.items():
        store.store(name=name, node=defaults(kind))
