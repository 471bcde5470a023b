"""trainer=fsdp (vit/training/sharding.py) on the CPU: torch's FSDP2 and torch.distributed.checkpoint over gloo,
train.py in two processes as a user starts it. The sharded run computes what DDP computes, each process holding
half of the weights; its checkpoints are folders of shards, resumed bit-exactly, on another number of processes
too, and made one file by `python -m vit.cli.consolidate`."""

import json
import re
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, compose, run_train_py
from tests.interop.test_sharded import tiny_module, write_sharded
from vit.checkpoint import CheckpointError, load
from vit.cli.consolidate import main as consolidate
from vit.interop.sharded import DCP_METADATA, META, is_sharded_checkpoint
from vit.model import ConfigError
from vit.training.run import train
from vit.training.run_folder import LAST
from vit.training.sharding import is_sharded

RUN = [*TINY, "model.depth=2", "data.train_size=256", "data.batch_size=16", "trainer.accelerator=cpu",
       "trainer.devices=2", "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "compile=false",
       "callbacks.pos_embed_figure=null"]  # fmt: skip
FSDP = ["trainer=fsdp", "trainer.strategy.param_dtype=null"]  # fp32, as DDP's run: the same sums
DDP = ["trainer=ddp", "trainer.precision=32-true"]
STOP = "+callbacks.fault={_target_: tests.reliability.faults.SignalAt, step: 9}"  # epoch 2's fourth step of 6


def _run(tmp_path: Path, name: str, *args: str) -> tuple[Path, str]:
    ran = run_train_py(*RUN, *args, f"output_dir={tmp_path / name}", cwd=tmp_path)
    assert ran.returncode in (0, 128 + signal.SIGTERM), ran.stderr[-3000:]
    return tmp_path / name, ran.stdout + ran.stderr


def _losses(folder: Path) -> list[float]:
    rows = (folder / "metrics.csv").read_text().splitlines()
    column = rows[0].split(",").index("train/loss_step")
    return [float(row.split(",")[column]) for row in rows[1:] if row.split(",")[column]]


def _weights(checkpoint: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's network weights: a sharded one's made one file by the command users run."""
    if is_sharded_checkpoint(checkpoint):
        one = tmp_path / f"{checkpoint.parent.parent.name}.ckpt"
        consolidate([str(checkpoint), "--out", str(one)])
        checkpoint = one
    return torch.load(checkpoint, weights_only=True)["state_dict"]


@pytest.mark.slow  # two runs of two processes: ~25 s
def test_fsdp_trains_as_ddp_with_half_the_weights_on_each_process(tmp_path):
    fsdp, log = _run(tmp_path, "fsdp", *FSDP)
    ddp, _ = _run(tmp_path, "ddp", *DDP)
    assert len(_losses(fsdp)) == 12
    torch.testing.assert_close(_losses(fsdp), _losses(ddp), rtol=1e-5, atol=0)
    held = {int(r): (int(a.replace(",", "")), int(b.replace(",", ""))) for r, a, b in
            re.findall(r"rank (\d) holds ([\d,]+) of the ([\d,]+) parameters", log)}  # fmt: skip
    (total,) = {t for _, t in held.values()}
    assert sorted(held) == [0, 1] and sum(h for h, _ in held.values()) == total
    assert all(abs(h - total / 2) < 0.01 * total for h, _ in held.values())
    # the checkpoint: each process's shard in one folder, written whole (no temporary folder left beside it)
    last = fsdp / "checkpoints" / LAST
    assert {p.name for p in last.iterdir()} == {DCP_METADATA, META, "__0_0.distcp", "__1_0.distcp"}
    assert sorted(p.name for p in last.parent.iterdir()) == ["best.ckpt", "last.ckpt"]
    with pytest.raises(CheckpointError, match=r"a sharded checkpoint \(trainer=fsdp\): make one file of it first, "
                       r"python -m vit.cli.consolidate"):  # fmt: skip
        load(last)
    # made one file, it holds DDP's network to float rounding, and loads as any checkpoint does
    sharded, replicated = _weights(last, tmp_path), _weights(ddp / "checkpoints" / LAST, tmp_path)
    assert sharded.keys() == replicated.keys()
    for key in sharded:
        torch.testing.assert_close(sharded[key], replicated[key], rtol=0, atol=1e-5)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "fsdp.ckpt").model(images), load(ddp / "checkpoints" / LAST).model(
            images), rtol=0, atol=1e-4)  # fmt: skip


@pytest.mark.slow  # three runs of two processes and one of one: ~45 s
def test_a_sharded_run_stopped_mid_epoch_resumes_to_the_same_weights_and_on_one_process(tmp_path):
    whole, _ = _run(tmp_path, "whole", *FSDP)
    _run(tmp_path, "runs/1", *FSDP, STOP)
    resumed, _ = _run(tmp_path, "runs/2", *FSDP, STOP, "resume=auto")
    assert json.loads((resumed / "results.json").read_text())["global_steps"] == 12
    expected, got = (_weights(f / "checkpoints" / LAST, tmp_path) for f in (whole, resumed))
    assert not [k for k in expected if not torch.equal(expected[k], got[k])]
    # two processes' shards, read by one: the run goes on (its random state is not the two ranks')
    one, log = _run(tmp_path, "one", *FSDP, "trainer.devices=1", "trainer.max_epochs=3",
                    f"resume={whole / 'checkpoints' / LAST}")  # fmt: skip
    assert "holds the random state of 2 rank(s), this run has 1" in log
    assert json.loads((one / "results.json").read_text())["global_steps"] == 12 + 12  # 12 steps an epoch alone


@pytest.mark.slow  # one run of two processes: ~13 s
def test_fsdp_computes_in_bf16_with_activation_checkpointing(tmp_path):
    # the class-token network: its last layer computes through forward_first_token, which FSDP must gather for too
    folder, _ = _run(tmp_path, "bf16", "trainer=fsdp", "grad_checkpointing=true", "model.pool=token")
    results = json.loads((folder / "results.json").read_text())
    losses = _losses(folder)
    assert results["skipped_steps"] == 0 and sum(losses[-3:]) < sum(losses[:3])  # it learns, in finite numbers
    assert results["test_acc"] > 0.25  # four classes
    # the weights the optimizer steps stay fp32 (FSDP2's master copy), whatever the compute dtype
    assert {v.dtype for v in _weights(folder / "checkpoints" / LAST, tmp_path).values()} == {torch.float32}


def _fake_sharded(folder: Path, tmp_path: Path) -> Path:
    """A sharded checkpoint's folder as train.py would find it: DCP's metadata and Lightning's meta.pt."""
    folder.mkdir(parents=True)
    (folder / DCP_METADATA).write_bytes(b"")
    cfg = compose(*TINY, f"output_dir={tmp_path}")
    model = {k: v for k, v in dict(cfg.model).items() if not k.startswith("_")}
    torch.save({"hyper_parameters": {"model": model}, "epoch": 0}, folder / META)
    return folder


def test_a_sharded_checkpoint_resumes_only_with_trainer_fsdp(tmp_path):
    folder = _fake_sharded(tmp_path / "last.ckpt", tmp_path)
    with pytest.raises(CheckpointError, match=r"a sharded checkpoint \(trainer=fsdp\): resume it with trainer=fsdp"):
        train(
            compose(
                *TINY, "trainer=ddp", "trainer.accelerator=cpu", f"resume={folder}", f"output_dir={tmp_path / 'out'}"
            )
        )
    with pytest.raises(SystemExit, match=r"not a sharded checkpoint"):
        consolidate([str(tmp_path), "--out", str(tmp_path / "one.ckpt")])


def test_the_strategy_is_known_by_its_config_and_refuses_an_unknown_dtype(tmp_path):
    assert is_sharded(compose("trainer=fsdp", f"output_dir={tmp_path}").trainer)
    assert not is_sharded(compose("trainer=ddp", f"output_dir={tmp_path}").trainer)
    with pytest.raises(ConfigError, match=r"param_dtype='fp8': give one of bf16, fp16, fp32"):
        train(compose(*TINY, "trainer=fsdp", "trainer.accelerator=cpu", "trainer.strategy.param_dtype=fp8",
                      f"output_dir={tmp_path}"))  # fmt: skip


def test_fsdp_under_autocast_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^trainer\.precision=bf16-mixed with trainer=fsdp: FSDP2 computes in"):
        train(compose(*TINY, "trainer=fsdp", "trainer.accelerator=cpu", "trainer.precision=bf16-mixed",
                      f"output_dir={tmp_path}"))  # fmt: skip


@pytest.mark.slow  # train.py in a process of its own: ~8 s
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the folder written in this one process
def test_a_damaged_folder_is_one_line_before_the_processes_start(tmp_path):
    """Not a traceback from each rank, as DCP's load would print: the folder is read whole before the launch."""
    folder = tmp_path / "last.ckpt"
    write_sharded(folder, tiny_module(), threads=2)
    shard = folder / "__0_1.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    ran = run_train_py(*TINY, *FSDP, "trainer.accelerator=cpu", "trainer.devices=2", f"resume={folder}",
                       f"output_dir={tmp_path / 'run'}", cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 1
    assert "Traceback" not in ran.stdout + ran.stderr
    assert ran.stderr.strip().splitlines()[-1].startswith(f"error: {shard}: truncated: ")
