"""finetune=linear|lora (FinetuneConfig): what learns once the network holds its pretrained weights, and the
checkpoints of such a run, which keep only the weights that learn and a record of the frozen rest
(vit/interop/frozen.py), rebuilt from the pretrained file on reading and checked against the record on resuming."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vit.interop.files import CheckpointError
from vit.interop.frozen import FROZEN, FinetuneConfig, FrozenRecord
from vit.model.config import ConfigError
from vit.training.feature import Feature
from vit.training.sharding import ShardedStrategy

if TYPE_CHECKING:
    from vit.training.module import ViTClassifier
    from vit.training.settings import Settings

MODEL_PREFIX = "model."  # ViTClassifier holds the network as self.model


class FrozenWeights(Feature):
    """Freezes what does not learn (FinetuneConfig.apply: LoRA's adapters put on first), and keeps the frozen
    weights out of checkpoints, putting them back from this run's own network when it resumes one."""

    def __init__(self, settings: FinetuneConfig, pretrained_from: dict[str, Any] | None, resized_table: bool):
        self.settings, self.pretrained_from, self.resized_table = settings, pretrained_from, resized_table
        self.record: FrozenRecord | None = None

    @staticmethod
    def check(settings: Settings, data: Any = None) -> None:
        """A partial fine-tune needs pretrained weights: on a random network frozen, its features are noise."""
        kind = settings.finetune.kind
        if kind != "full" and settings.pretrained is None:
            learns = "the head" if kind == "linear" else "adapters"
            raise ConfigError(
                f"finetune.kind={kind} without model.pretrained: it would train {learns} on a frozen random network; "
                "give model.pretrained=CHECKPOINT (a random network saved to a file, for a random-features "
                "baseline), or finetune=full to train from scratch"
            )

    def adapt(self, module: ViTClassifier) -> None:
        self.settings.apply(module.model, self.resized_table)
        if self.settings.kind != "full" and self.pretrained_from is not None:  # the rest: rebuilt from the file
            frozen = {name: p for name, p in module.model.named_parameters() if not p.requires_grad}
            self.record = FrozenRecord.of(frozen, self.pretrained_from)

    def on_save_checkpoint(self, module: ViTClassifier, checkpoint: dict[str, Any]) -> None:
        # a sharded strategy loads its own shards, the frozen ones included
        if self.record is None or isinstance(getattr(module._trainer, "strategy", None), ShardedStrategy):
            return
        for part in ("state_dict", "current_model_state"):  # the live weights and, with EMA, the average
            for key in self.record.keys:
                checkpoint.get(part, {}).pop(MODEL_PREFIX + key, None)
        checkpoint[FROZEN] = self.record.to_dict()

    def on_load_checkpoint(self, module: ViTClassifier, checkpoint: dict[str, Any]) -> None:
        """The frozen weights are this run's own: the same pretrained file, adapted alike, or refused."""
        if FROZEN not in checkpoint:
            return
        where = getattr(module._trainer, "ckpt_path", None) or "the checkpoint"
        record = FrozenRecord.read(checkpoint[FROZEN], where)
        if self.record is None or (record.keys, record.sha256) != (self.record.keys, self.record.sha256):
            raise CheckpointError(
                f"{where}: holds only the weights that learned from {record.reference}, and this run's frozen "
                "weights are not that file's: resume with the model.pretrained and finetune it was trained with"
            )
        own = module.model.state_dict()
        for part in ("state_dict", "current_model_state"):
            if part in checkpoint:
                checkpoint[part].update({MODEL_PREFIX + key: own[key] for key in record.keys})
