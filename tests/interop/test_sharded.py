"""Sharded checkpoints (trainer=fsdp's folders) read by vit/interop/dcp.py's reader: a folder as the strategy writes
one is made one file by `python -m vit.cli.consolidate` and loaded back into a module and its optimizer exactly;
a damaged folder (a shard cut short, missing or outside it, `.metadata` empty, garbage or malformed, a tensor's
bytes corrupted) is one line naming its file, from consolidate and from a resumed run alike; consolidate writes
nothing inside the folder it reads.

The folders are written in this one process, by DCP without a process group, as ShardedStrategy's save writes them
(the module's state dict, the optimizer's, Lightning's meta.pt): under a second, where a two-process run takes ten."""

from __future__ import annotations

import pickle
import re
import shutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from traceback import StackSummary

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from tests.helpers import TINY, classifier, compose
from vit.checkpoint import load
from vit.cli.consolidate import main as consolidate
from vit.interop.dcp import reading
from vit.interop.files import CheckpointError
from vit.interop.sharded import DCP_METADATA, META
from vit.model import ViTConfig
from vit.training.module import ViTClassifier
from vit.training.run import train
from vit.training.settings import model_fields
from vit.training.sharding import ShardedStrategy

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process: the point
RESUME = [*TINY, "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=1"]


@cache
def _tiny() -> ViTConfig:
    return ViTConfig.from_dict(model_fields(compose(*TINY))[0])


def tiny_module(rank: int | None = None) -> ViTClassifier:
    """TINY's network (what a train() of RESUME builds), LoRA's adapters on attn.qkv with `rank`."""
    config = _tiny()
    finetune = {"kind": "lora", "rank": rank, "alpha": 8.0, "dropout": 0.0, "targets": ["attn.qkv"]} if rank else None
    module = classifier(config, finetune=finetune)
    module.adapt()
    return module


def optimizer(module: ViTClassifier) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-3)


def write_sharded(
    folder: Path, module: ViTClassifier, threads: int = 1, change: Callable[[dict], None] | None = None, **meta
) -> torch.optim.Optimizer:
    """`module` after one AdamW step, saved as ShardedStrategy saves (DCP's files, Lightning's meta.pt with `meta`
    over its own parts): `threads` shard files, the state changed by `change` first. Returns the optimizer."""
    adamw = optimizer(module)
    module.model(torch.randn(2, 3, 16, 16)).sum().backward()
    adamw.step()
    state = {"state_dict": get_model_state_dict(module), "optimizer_0": get_optimizer_state_dict(module, adamw)}
    if change is not None:
        change(state)
    dcp.save(state, storage_writer=FileSystemWriter(folder, thread_count=threads))
    torch.save({"hyper_parameters": dict(module.hparams), "epoch": 0, "global_step": 1, **meta}, folder / META)
    return adamw


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, ViTClassifier, torch.optim.Optimizer]:
    folder = tmp_path_factory.mktemp("sharded") / "last.ckpt"
    module = tiny_module()
    return folder, module, write_sharded(folder, module, threads=2)


def _copy(written, to: Path) -> Path:
    return Path(shutil.copytree(written[0], to))


def test_consolidate_gathers_the_weights_the_folder_holds(written, tmp_path):
    folder, module, _ = written
    one = tmp_path / "one.ckpt"
    consolidate([str(folder), "--out", str(one)])
    saved = torch.load(one, weights_only=True)["state_dict"]
    assert saved.keys() == module.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in module.state_dict().items())
    assert load(one).config == module.config


def test_the_strategy_loads_the_weights_and_optimizer_state_exactly(written):
    folder, module, adamw = written
    fresh = tiny_module()
    strategy = ShardedStrategy(param_dtype=None)
    strategy.connect(fresh)
    strategy.optimizers = [optimizer(fresh)]
    meta = strategy.load_checkpoint(folder)
    assert meta["global_step"] == 1 and "state_dict" not in meta  # meta.pt, as Lightning's loader returns it
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in module.state_dict().items())
    theirs, ours = adamw.state_dict(), strategy.optimizers[0].state_dict()
    assert theirs["param_groups"] == ours["param_groups"]
    for k, state in theirs["state"].items():
        assert all(torch.equal(state[name], ours["state"][k][name]) for name in ("step", "exp_avg", "exp_avg_sq"))


@pytest.mark.parametrize(
    "inside",
    [DCP_METADATA, ".", "one.ckpt", "new/one.ckpt"],
    ids=["its metadata", "itself", "a new file", "a new folder"],
)
def test_consolidate_writes_nothing_inside_the_folder_it_reads(written, tmp_path, inside):
    folder = _copy(written, tmp_path / "last.ckpt")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(SystemExit) as stopped:
        consolidate([str(folder), "--out", str(folder / inside)])
    assert (
        str(stopped.value.code)
        == f"--out {folder / inside}: inside the checkpoint it reads, {folder}: write it elsewhere"
    )
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def _truncate(folder: Path) -> Path:
    shard = folder / "__0_1.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    return shard


def _remove(folder: Path) -> Path:
    (folder / "__0_1.distcp").unlink()
    return folder / "__0_1.distcp"


def _empty(folder: Path) -> Path:
    (folder / DCP_METADATA).write_bytes(b"")
    return folder / DCP_METADATA


def _garbage(folder: Path) -> Path:
    (folder / DCP_METADATA).write_bytes(b"\x80\x04not a pickle at all" * 10)
    return folder / DCP_METADATA


def _edit_metadata(folder: Path, change) -> Path:
    with (folder / DCP_METADATA).open("rb") as file:
        metadata = pickle.load(file)
    change(metadata)
    (folder / DCP_METADATA).write_bytes(pickle.dumps(metadata))
    return folder / DCP_METADATA


def _elsewhere(folder: Path) -> Path:
    """Items whose file lies outside the folder: DCP would read whatever they name."""
    return _edit_metadata(
        folder, lambda m: [setattr(info, "relative_path", "../../secret") for info in m.storage_data.values()]
    )


def _unrecorded(folder: Path) -> Path:
    """An item whose record (file, offset, length) is gone."""
    return _edit_metadata(
        folder, lambda m: m.storage_data.pop(next(k for k in m.storage_data if k.fqn == "state_dict.model.head.bias"))
    )


def _malformed(folder: Path) -> Path:
    """Records of DCP's own classes, holding the wrong things: sizes where file records go."""
    return _edit_metadata(folder, lambda m: m.storage_data.update({k: torch.Size([1]) for k in m.storage_data}))


DAMAGE = {
    "a shard cut short": (_truncate, r"truncated: [\d,]+ bytes, its items end at byte [\d,]+"),
    "a shard missing": (_remove, r"missing: every rank's shard must be in the folder"),
    "empty metadata": (_empty, r"not DCP's metadata \(empty, truncated, corrupt or another file\)"),
    "garbage metadata": (_garbage, r"not DCP's metadata \(empty, truncated, corrupt or another file\)"),
    "a shard outside": (_elsewhere, r"names the shard '\.\./\.\./secret', not a file beside it"),
    "an item unrecorded": (_unrecorded, r"no shard holds state_dict\.model\.head\.bias$"),
    "records malformed": (_malformed, r"not DCP's metadata of files \(.*\)$"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_folder_is_one_line_naming_its_file(written, tmp_path, damage):
    change, said = DAMAGE[damage]
    folder = _copy(written, tmp_path / "last.ckpt")
    bad = change(folder)
    with pytest.raises(SystemExit) as stopped:
        consolidate([str(folder), "--out", str(tmp_path / "one.ckpt")])
    assert isinstance(stopped.value.code, str) and stopped.value.code.startswith(f"{bad}: ")
    assert re.search(said, stopped.value.code) and "\n" not in stopped.value.code
    assert not (tmp_path / "one.ckpt").exists()
    # a resumed run refuses it before any process starts, or any folder is made
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(bad))}: {said}"):
        train(compose(*RESUME, f"resume={folder}", f"output_dir={tmp_path / 'run'}"))
    assert not (tmp_path / "run").exists()


def test_a_shard_corrupted_in_place_is_one_line_naming_the_folder(written, tmp_path):
    """Bytes changed inside a tensor's record, the file's length kept: only reading the tensor finds it, in DCP,
    whose CheckpointException (a BaseException, each rank's traceback in its message) becomes one line."""
    folder = _copy(written, tmp_path / "last.ckpt")
    with (folder / DCP_METADATA).open("rb") as file:
        stored = pickle.load(file).storage_data
    info = next(info for index, info in stored.items() if index.fqn == "state_dict.model.head.weight")
    shard = folder / info.relative_path
    data = bytearray(shard.read_bytes())
    data[info.offset : info.offset + 40] = b"\xff" * 40  # the tensor's zip header
    shard.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as stopped:
        consolidate([str(folder), "--out", str(tmp_path / "one.ckpt")])
    assert re.match(rf"^{re.escape(str(folder))}: its shards cannot be read \(\w+: [^\n]+\)$", stopped.value.code)


def test_an_interrupt_inside_dcp_stays_an_interrupt(tmp_path):
    """DCP catches BaseException and wraps it: Ctrl-C while reading must still stop the program as Ctrl-C."""
    failure = CheckpointException("read", {0: (KeyboardInterrupt(), StackSummary())})
    with pytest.raises(KeyboardInterrupt), reading(tmp_path):
        raise failure
