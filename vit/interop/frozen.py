"""The frozen weights of a partly fine-tuned run (finetune=lora or linear from model.pretrained): its checkpoints
keep only the weights that learn, and a record of the rest, which is the pretrained file's as the run adapted it
(vit/interop/adapt.py). The record names that file (pretrained_from: a hub name's repo and commit, or the path), the
frozen weights' names and a SHA-256 of their values, so that a reader rebuilds them from the file and refuses,
naming both, a file that no longer holds them: a checkpoint of a ViT-L LoRA run is megabytes, not gigabytes."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vit.interop.files import CheckpointError, json_kind

FROZEN = "frozen_weights"  # the checkpoint's key for the record


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
