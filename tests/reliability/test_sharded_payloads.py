"""Sharded checkpoints (trainer=fsdp's folders) crafted to run code when read: torch's own reader unpickles
`.metadata` with plain pickle and its planners unpickle a shard's non-tensor items with weights_only=False, and a
folder's meta.pt is a pickle too. Each of consolidate, `resume=PATH`, `resume=auto` (a sibling run's
checkpoints/last.ckpt crafted) and the strategy's own load (what every rank runs) refuses the folder naming the
file, and the payload never runs."""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from tests.helpers import compose
from tests.interop.test_sharded import RESUME, tiny_module, write_sharded
from vit.cli.consolidate import main as consolidate
from vit.interop import dcp
from vit.interop.files import CheckpointError
from vit.interop.sharded import DCP_METADATA, META, check, load_into
from vit.training.run import train
from vit.training.run_folder import CHECKPOINT_DIR, LAST, RUN_CONFIG
from vit.training.sharding import ShardedStrategy

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process: the point


class Payload:
    """Unpickled, it creates the file it names: the proof that reading the folder ran code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _in_metadata(folder: Path, marker: Path) -> Path:
    """DCP's own metadata, with a payload among its records."""
    write_sharded(folder, tiny_module())
    with (folder / DCP_METADATA).open("rb") as file:
        metadata = pickle.load(file)
    metadata.planner_data["extra"] = Payload(marker)
    (folder / DCP_METADATA).write_bytes(pickle.dumps(metadata))
    return folder / DCP_METADATA


def _in_a_shard(folder: Path, marker: Path) -> Path:
    """A non-tensor item (one of the optimizer's settings, as DCP stores them) that is a payload."""
    write_sharded(folder, tiny_module(), change=lambda state: state["optimizer_0"]["param_groups"][0].update(
        eps=Payload(marker)))  # fmt: skip
    return folder / "__0_0.distcp"


def _in_meta(folder: Path, marker: Path) -> Path:
    """Lightning's meta.pt, pickling a payload beside its parts."""
    write_sharded(folder, tiny_module(), loops=Payload(marker))
    return folder / META


PAYLOADS = {"in .metadata": _in_metadata, "in a shard's item": _in_a_shard, "in meta.pt": _in_meta}


@pytest.fixture(scope="module")
def payloads(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each crafted folder and the file holding its payload; their payloads would make one marker file."""
    root = tmp_path_factory.mktemp("payloads")
    return {kind: (root / kind, craft(root / kind, root / "ran")) for kind, craft in PAYLOADS.items()}


@pytest.fixture(params=PAYLOADS)
def crafted(request, payloads, tmp_path) -> tuple[Path, Path, Path]:
    """A crafted folder as a run's last checkpoint (runs/1), the file holding its payload, the marker it makes."""
    original, bad = payloads[request.param]
    folder = Path(shutil.copytree(original, tmp_path / "runs" / "1" / CHECKPOINT_DIR / LAST))
    return folder, folder / bad.name, original.parent / "ran"


def _refused(bad: Path) -> str:
    return rf"^{re.escape(str(bad))}: refused: .*pickles \S+, not only .* could run code when loaded$"


def test_consolidate_runs_nothing_in_the_folder(crafted, tmp_path):
    folder, bad, marker = crafted
    with pytest.raises(SystemExit) as stopped:
        consolidate([str(folder), "--out", str(tmp_path / "one.ckpt")])
    assert re.match(_refused(bad), str(stopped.value.code))
    assert not marker.exists() and not (tmp_path / "one.ckpt").exists()


def test_resume_from_the_folder_runs_nothing_in_it(crafted, tmp_path):
    folder, bad, marker = crafted
    with pytest.raises(CheckpointError, match=_refused(bad)):
        train(compose(*RESUME, f"resume={folder}", f"output_dir={tmp_path / 'runs' / '2'}"))
    assert not marker.exists()
    assert not (tmp_path / "runs" / "2").exists()  # refused before the run starts its processes


def test_resume_auto_runs_nothing_in_a_sibling_runs_folder(crafted, tmp_path):
    folder, bad, marker = crafted
    cfg = compose(*RESUME, "resume=auto", f"output_dir={tmp_path / 'runs' / '2'}")
    (folder.parent.parent / RUN_CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))  # the same run, earlier
    with pytest.raises(CheckpointError, match=_refused(bad)):
        train(cfg)
    assert not marker.exists()
    assert not (tmp_path / "runs" / "2").exists()


def test_the_strategys_load_on_every_rank_runs_nothing_in_the_folder(crafted):
    """What each process runs once the run has started (Lightning's load_checkpoint), checked or not before."""
    folder, bad, marker = crafted
    module = tiny_module()
    strategy = ShardedStrategy(param_dtype=None)
    strategy.connect(module)
    with pytest.raises(CheckpointError, match=_refused(bad)):
        strategy.load_checkpoint(folder)
    assert not marker.exists()


def test_a_shard_item_changed_after_the_check_is_still_read_weights_only(tmp_path, monkeypatch):
    """The reader's own guard, beneath the check: the planner is given each item only as weights_only read it."""
    marker = tmp_path / "ran"
    bad = _in_a_shard(tmp_path / "last.ckpt", marker)
    monkeypatch.setattr(dcp, "check", dcp.read_metadata)  # as if the folder changed after its check
    module = tiny_module()
    state = {"optimizer_0": get_optimizer_state_dict(module, torch.optim.AdamW(module.parameters()))}
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(bad))}: refused: its item optimizer_0\.param_groups"):
        load_into(check(bad.parent), state)
    assert not marker.exists()
