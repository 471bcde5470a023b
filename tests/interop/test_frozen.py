"""What a fine-tuning run lets learn (FinetuneConfig), and the record of the frozen rest a partly fine-tuned
checkpoint keeps instead of the weights (FrozenRecord): its digest, its reading, and the rebuilding of the frozen
weights from the pretrained start, refused where the start no longer holds them."""

import pytest
import torch

from tests.helpers import perturb_, tiny_config
from vit.interop.files import CheckpointError
from vit.interop.frozen import FinetuneConfig, FrozenRecord, digest, rebuild
from vit.interop.lora import TARGETS
from vit.model import VisionTransformer
from vit.model.config import ConfigError


def test_the_digest_changes_with_any_name_shape_dtype_or_value():
    weights = {"a": torch.ones(2, 3), "b": torch.zeros(4)}
    same = digest({"b": torch.zeros(4), "a": torch.ones(2, 3)})  # order does not matter
    assert digest(weights) == same
    for changed in (
        {"a": torch.ones(2, 3), "c": torch.zeros(4)},
        {"a": torch.ones(3, 2), "b": torch.zeros(4)},
        {"a": torch.ones(2, 3, dtype=torch.float64), "b": torch.zeros(4)},
        {"a": torch.ones(2, 3), "b": torch.tensor([0.0, 0.0, 0.0, 1e-8])},
    ):
        assert digest(changed) != same


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ([], "holds an array, not a mapping"),
        ({"from": {}, "keys": [], "sha256": "x"}, "names no pretrained file"),
        ({"from": {"path": "/p"}, "keys": "a", "sha256": "x"}, "keys is not a list of names"),
        ({"from": {"path": "/p"}, "keys": ["a"], "sha256": 3}, "sha256=3 is not a digest"),
    ],
)
def test_a_malformed_record_is_one_line_naming_the_checkpoint(value, said):
    with pytest.raises(CheckpointError, match=rf"^run\.ckpt: frozen_weights.*{said}"):
        FrozenRecord.read(value, "run.ckpt")


def test_the_record_reads_back_and_names_a_hub_start_at_its_commit():
    record = FrozenRecord.of({"w": torch.ones(2)}, {"name": "hf-hub:o/r", "repo": "o/r", "revision": "abc"})
    assert FrozenRecord.read(record.to_dict(), "x") == record
    assert record.reference == "hf-hub:o/r@abc"
    assert FrozenRecord.of({}, {"path": "/p.ckpt"}).reference == "/p.ckpt"


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (dict(kind="adapters"), r"finetune\.kind='adapters': give one of full, linear, lora"),
        (dict(kind="lora", rank=0), r"finetune\.rank=0: must be a whole number >= 1"),
        (dict(kind="lora", alpha=float("inf")), r"finetune\.alpha=inf: must be a finite number > 0"),
        (dict(kind="lora", dropout=1.0), r"finetune\.dropout=1\.0: must be a number from 0 to below 1"),
        (dict(kind="lora", targets=["attn.q"]), r"finetune\.targets=\['attn\.q'\]: give a list of"),
        (dict(kind="full", size=3), r"finetune\.size: not a setting"),
    ],
)
def test_bad_finetune_settings_are_one_line_naming_the_key(settings, said):
    with pytest.raises(ConfigError, match=said):
        FinetuneConfig.of(settings)


def test_what_learns_by_kind():
    full, linear, lora = (FinetuneConfig.of({"kind": k}) for k in ("full", "linear", "lora"))
    assert full.lora is None and linear.lora is None and lora.lora.targets == TARGETS
    assert all(full.learns(n) for n in ("head.weight", "layers.0.attn.qkv.weight", "pos_embed.table"))
    assert linear.learns("head_dist.bias") and not linear.learns("pos_embed.table")
    assert lora.learns("layers.0.attn.qkv.lora_A.default.weight") and not lora.learns("layers.0.attn.qkv.weight")
    assert lora.learns("pos_embed.table", resized_table=True) and not lora.learns("pos_embed.table")
    assert FinetuneConfig.of(lora.to_dict()) == lora  # as checkpoints keep it


def test_rebuilt_frozen_weights_are_the_starts_and_a_changed_start_is_refused():
    config = tiny_config()
    start = perturb_(VisionTransformer(config)).state_dict()
    finetune = FinetuneConfig.of({"kind": "lora", "rank": 2})
    model = VisionTransformer(config)
    model.load_state_dict(start)
    finetune.apply(model)
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    record = FrozenRecord.of(frozen, {"path": "/start.ckpt"})
    rebuilt = rebuild("run.ckpt", record, (config, start), config, finetune)
    assert rebuilt.keys() == frozen.keys() and all(torch.equal(rebuilt[k], frozen[k]) for k in frozen)
    changed = {**start, "layers.0.mlp.fc1.weight": start["layers.0.mlp.fc1.weight"] + 1e-3}
    with pytest.raises(CheckpointError, match=r"^run\.ckpt: the weights in /start\.ckpt are not those the run started"):
        rebuild("run.ckpt", record, (config, changed), config, finetune)
