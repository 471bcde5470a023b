"""Every debug preset runs train() to the end on the tiny synthetic config."""

import csv

import pytest

from tests.helpers import CONF_DIR, tiny_run
from vit.training.module import TRAIN_LOSS
from vit.training.run import train
from vit.training.tasks import TRAIN_ACC

PRESETS = sorted(p.stem for p in (CONF_DIR / "debug").glob("*.yaml"))


# Optimizer steps of a 2-epoch tiny run (14 training batches an epoch) under each preset: what the preset is for.
STEPS = {"fast_dev_run": 1, "limit": 2 * 5, "overfit": 2 * 1}


def test_every_preset_has_its_expected_steps():
    assert sorted(STEPS) == PRESETS


@pytest.mark.parametrize("preset", PRESETS)
def test_debug_preset_runs_the_batches_it_promises(tmp_path, preset):
    results = train(tiny_run(tmp_path, f"debug={preset}", "trainer.max_epochs=2", "callbacks.pos_embed_figure=null"))
    assert results["global_steps"] == STEPS[preset]
    assert 0 <= results["test_acc"] <= 1


def test_overfit_learns_its_one_batch(tmp_path):
    """overfit_batches makes Lightning rebuild the training loader with a SequentialSampler: it used to fail."""
    # AdamW, as the test was written for: what it checks is the loader (Muon halves this loss in ~15 steps, not 10)
    overrides = ["debug=overfit", "trainer.max_epochs=10", "optim.lr=1e-2", "optim.optimizer=adamw"]
    overrides.append("callbacks.pos_embed_figure=null")  # ten epochs, ten figures: not what is tested
    results = train(tiny_run(tmp_path, *overrides))
    assert results["global_steps"] == results["epochs"] == 10  # one batch per epoch
    with open(tmp_path / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r[TRAIN_LOSS]]
    losses = [float(r[TRAIN_LOSS]) for r in rows]
    assert losses[-1] < 0.5 * losses[0] and float(rows[-1][TRAIN_ACC]) == 1.0
