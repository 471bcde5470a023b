"""What a fine-tuning run lets learn (FinetuneConfig: every weight, the heads, or LoRA's adapters), and the frozen
weights of a partly fine-tuned one (finetune=lora or linear from model.pretrained): its checkpoints keep only the
weights that learn, and a record of the rest, which is the pretrained file's as the run adapted it
(vit/interop/adapt.py). The record names that file (pretrained_from: a hub name's repo and commit, or the path), the
frozen weights' names and a SHA-256 of their values, so that a reader rebuilds them from the file (`rebuild`) and
refuses, naming both, a file that no longer holds them: a checkpoint of a ViT-L LoRA run is megabytes, not
gigabytes."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from vit.interop.adapt import adapt
from vit.interop.files import CheckpointError, json_kind
from vit.interop.lora import ADAPTER, LoraSettings, add_lora
from vit.model import VisionTransformer, ViTConfig
from vit.model.config import ConfigError
from vit.model.size import check_memory

FROZEN = "frozen_weights"  # the checkpoint's key for the record
FINETUNE_KINDS = ("full", "linear", "lora")
HEADS = ("head.", "head_dist.")  # what learns under 'linear' (a distilled model averages two heads)


@dataclass(frozen=True)
class FinetuneConfig:
    """What learns (conf/finetune/): every weight ('full'), the heads alone ('linear'), or LoRA's adapters, the heads
    and a resized position table ('lora', whose settings `lora` holds, checked once). Checkpoints keep it as a mapping
    of these fields (their hyper_parameters' finetune)."""

    kind: Literal["full", "linear", "lora"] = "full"
    rank: int = LoraSettings.rank
    alpha: float = LoraSettings.alpha
    dropout: float = LoraSettings.dropout
    targets: tuple[str, ...] = LoraSettings.targets
    lora: LoraSettings | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in FINETUNE_KINDS:
            raise ConfigError(f"finetune.kind={self.kind!r}: give one of {', '.join(FINETUNE_KINDS)}")
        lora = LoraSettings(self.rank, self.alpha, self.dropout, self.targets)
        object.__setattr__(self, "targets", lora.targets)
        object.__setattr__(self, "lora", lora if self.kind == "lora" else None)

    @staticmethod
    def of(values: Mapping[str, Any] | None) -> FinetuneConfig:
        """From a config node or a checkpoint's record (none in checkpoints before fine-tuning kinds: 'full')."""
        values = {k: v for k, v in dict(values or {}).items() if k != "_target_"}
        if unknown := sorted(set(values) - {"kind", "rank", "alpha", "dropout", "targets"}):
            raise ConfigError(f"finetune.{unknown[0]}: not a setting (kind, rank, alpha, dropout, targets)")
        return FinetuneConfig(**values)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "targets": list(self.targets)}  # fmt: skip

    def learns(self, name: str, resized_table: bool = False) -> bool:
        """Whether the weight `name` learns: every one under 'full'; the heads, LoRA's adapters and, where the run
        resampled the position table to a new grid (`resized_table`), the table under 'lora'."""
        if self.kind == "full":
            return True
        table = ("pos_embed.",) if self.kind == "lora" and resized_table else ()
        return name.startswith(HEADS + table) or ADAPTER in name

    def apply(self, model: VisionTransformer, resized_table: bool = False) -> None:
        """LoRA's adapters put on (peft), and every weight that does not learn frozen, in place."""
        if self.lora is not None:
            add_lora(model, self.lora)
        for name, p in model.named_parameters():
            p.requires_grad_(self.learns(name, resized_table))


def digest(weights: Mapping[str, Tensor]) -> str:
    """SHA-256 of the weights' names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach()
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class FrozenRecord:
    source: dict[str, Any]  # pretrained_from: {"name", "repo", "revision", ...} of a hub name, or {"path"}
    keys: tuple[str, ...]  # the frozen weights' names in the network's state dict
    sha256: str

    @staticmethod
    def of(weights: Mapping[str, Tensor], source: dict[str, Any]) -> FrozenRecord:
        return FrozenRecord(source, tuple(sorted(weights)), digest(weights))

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.source, "keys": list(self.keys), "sha256": self.sha256}

    @staticmethod
    def read(value: Any, path: Path | str) -> FrozenRecord:
        """The record as a checkpoint holds it, its parts checked, naming the file."""
        if not isinstance(value, dict):
            raise CheckpointError(f"{path}: {FROZEN} holds {json_kind(value)}, not a mapping")
        source, keys, sha256 = value.get("from"), value.get("keys"), value.get("sha256")
        if not isinstance(source, dict) or not isinstance(source.get("name", source.get("path")), str):
            raise CheckpointError(f"{path}: {FROZEN}.from={source!r} names no pretrained file")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise CheckpointError(f"{path}: {FROZEN}.keys is not a list of names")
        if not isinstance(sha256, str):
            raise CheckpointError(f"{path}: {FROZEN}.sha256={sha256!r} is not a digest")
        return FrozenRecord(source, tuple(keys), sha256)

    @property
    def reference(self) -> str:
        """What the loader reads again: the hub name pinned to the commit the run used, or the path."""
        if "repo" in self.source and "revision" in self.source:
            return f"hf-hub:{self.source['repo']}@{self.source['revision']}"
        return str(self.source.get("name") or self.source["path"])

    def check(self, weights: Mapping[str, Tensor], path: Path | str) -> None:
        """Refuse, naming the checkpoint and the pretrained file, rebuilt weights that are not those the run froze."""
        if missing := sorted(set(self.keys) - set(weights)):
            raise CheckpointError(
                f"{path}: {self.reference} has no frozen weight {missing[0]} (of {len(missing)} missing) of the "
                "network the run trained"
            )
        if digest({k: weights[k] for k in self.keys}) != self.sha256:
            raise CheckpointError(
                f"{path}: the weights in {self.reference} are not those the run started from (their SHA-256 "
                "differs from the one the checkpoint records): the checkpoint holds only the weights that learned"
            )


def rebuild(
    path: Path | str,
    record: FrozenRecord,
    start: tuple[ViTConfig, Mapping[str, Tensor]],
    config: ViTConfig,
    finetune: FinetuneConfig,
) -> dict[str, Tensor]:
    """The weights a partly fine-tuned run (the checkpoint at `path`) froze, as it did: its start, the pretrained
    network (config and weights) read again from record.reference, adapted to the run's network `config` and with
    LoRA's layers put on as `finetune` says; checked against the record's digest."""
    source, weights = start
    try:
        adapted, _ = adapt(dict(weights), source, config)
        check_memory(config)
        model = VisionTransformer(config)
        model.load_state_dict(adapted, strict=False)  # the heads learned: the checkpoint has them
        if finetune.lora is not None:
            add_lora(model, finetune.lora)
    except (ValueError, TypeError, KeyError, RuntimeError) as err:
        raise CheckpointError(
            f"{path}: {record.reference} is not the start of the network it records ({err})"
        ) from None
    state = model.state_dict()
    record.check(state, path)
    return {key: state[key] for key in record.keys}
