"""A finetune=lora run resumed from a checkpoint whose LoRA adapters have other shapes (another finetune.rank) is
one line naming the checkpoint, before Lightning's load_state_dict (a page of size mismatches) or DCP's load (a
traceback from every rank): from a single file (the module's on_load_checkpoint) and from a sharded folder (the
strategy's load_checkpoint, trainer=fsdp)."""

from __future__ import annotations

import pytest

from tests.interop.test_sharded import tiny_module, write_sharded
from vit.interop.files import CheckpointError
from vit.training.sharding import ShardedStrategy

UNFIT = (
    r"{path}: its LoRA adapters do not fit the network this run builds \(model\.layers\.0\.attn\.qkv\.lora_A\.default"
    r"\.weight is \[2, 32\] there, \[4, 32\] here, .*\); resume with the finetune settings it was trained with$"
)


def test_other_adapters_in_a_single_file_are_one_line_before_lightning_loads_them():
    checkpoint = {"state_dict": tiny_module(rank=2).state_dict()}
    with pytest.raises(CheckpointError, match=UNFIT.format(path="the checkpoint")):
        tiny_module(rank=4).on_load_checkpoint(checkpoint)
    tiny_module(rank=2).on_load_checkpoint(checkpoint)  # its own adapters' shapes: loaded


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process, no process group
def test_other_adapters_in_a_sharded_folder_are_one_line_before_dcp_reads_them(tmp_path):
    folder = tmp_path / "last.ckpt"
    write_sharded(folder, tiny_module(rank=2))
    strategy = ShardedStrategy(param_dtype=None)
    strategy.connect(tiny_module(rank=4))
    with pytest.raises(CheckpointError, match=UNFIT.format(path=folder)):
        strategy.load_checkpoint(folder)
