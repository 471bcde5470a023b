"""The scheduler's view: `python train.py ...` killed with SIGTERM exits 143 after writing its checkpoint, and
the same command with resume=auto (in a new Hydra folder) finishes the run from there."""

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import NO_COMPILING, ROOT, TINY, run_train_py

# 8k synthetic images: 127 steps an epoch, so the signal sent when epoch 1 ends lands inside epoch 2
COMMAND = [
    *TINY,
    "data.batch_size=64",
    "data.train_size=8192",
    "trainer.max_epochs=2",
    "callbacks.pos_embed_figure=null",
    "hydra.run.dir=runs/${now:%Y-%m-%d_%H-%M-%S-%f}",
]


@pytest.mark.slow  # two train.py processes: ~20 s
def test_sigterm_exits_143_with_a_checkpoint_and_resume_auto_finishes_the_run(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **NO_COMPILING}
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *COMMAND],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in first.stdout:  # one line per epoch when stdout is not a terminal
        if line.startswith("epoch 1/2"):
            first.send_signal(signal.SIGTERM)
            break
    out, err = first.communicate(timeout=120)
    assert first.returncode == 143, err[-2000:]
    assert "received SIGTERM" in out + err and "exiting with 143 (rerun with resume=auto)" in out + err
    (stopped,) = (tmp_path / "runs").iterdir()
    assert (stopped / "checkpoints" / "last.ckpt").is_file() and not (stopped / "results.json").exists()

    second = run_train_py(*COMMAND, "resume=auto", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    (resumed,) = [d for d in (tmp_path / "runs").iterdir() if d != stopped]
    results = json.loads((resumed / "results.json").read_text())
    assert Path(results["resumed_from"]).resolve() == (stopped / "checkpoints" / "last.ckpt").resolve()
    assert results["epochs"] == 2 and results["global_steps"] == 2 * ((8192 - 64) // 64)  # 64 held out for validation


DDP = [
    *TINY,
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.precision=32-true",
    "trainer.max_epochs=3",
    "callbacks.pos_embed_figure=null",
]


def _val_rows(run: Path) -> list[tuple[str, str, str]]:
    if not (run / "metrics.csv").is_file():  # a run stopped before it logged anything
        return []
    with open(run / "metrics.csv") as f:
        return [(row["epoch"], row["step"], row["val/acc"]) for row in csv.DictReader(f) if row.get("val/acc")]


@pytest.mark.slow  # three runs of two DDP processes: ~40 s
def test_under_ddp_a_signal_to_one_rank_at_an_epochs_last_step_stops_both_after_the_epoch(tmp_path):
    whole = run_train_py(*DDP, f"output_dir={tmp_path / 'whole'}", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]
    expected = json.loads((tmp_path / "whole" / "results.json").read_text())
    last_step = expected["global_steps"] // 3 - 1  # of epoch 1 of 3
    stop = f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: {last_step}, rank: 1}}"
    first = run_train_py(*DDP, stop, f"output_dir={tmp_path / 'runs' / '1'}", cwd=tmp_path)
    assert first.returncode == 143, first.stderr[-2000:]
    second = run_train_py(*DDP, stop, "resume=auto", f"output_dir={tmp_path / 'runs' / '2'}", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    results = json.loads((tmp_path / "runs" / "2" / "results.json").read_text())
    assert _val_rows(tmp_path / "runs" / "1") + _val_rows(tmp_path / "runs" / "2") == _val_rows(tmp_path / "whole")
    for key in ("best_val_acc", "test_acc", "epochs", "global_steps"):
        assert results[key] == expected[key], key
