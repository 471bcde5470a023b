"""The scheduler's view: `python train.py ...` killed with SIGTERM exits 143 after writing its checkpoint, and
the same command with resume=auto (in a new Hydra folder) finishes the run from there."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_training import ROOT, TINY, run_train_py

# 8k synthetic images: 127 steps an epoch, so the signal sent when epoch 1 ends lands inside epoch 2
COMMAND = [
    *TINY,
    "data.train_size=8192",
    "trainer.max_epochs=2",
    "callbacks.pos_embed_figure=null",
    "hydra.run.dir=runs/${now:%Y-%m-%d_%H-%M-%S-%f}",
]


@pytest.mark.slow  # two train.py processes: ~20 s
def test_sigterm_exits_143_with_a_checkpoint_and_resume_auto_finishes_the_run(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
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
