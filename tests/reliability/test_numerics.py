"""A NaN or infinity never reaches the weights: the run halts naming the step and batch, or skips a bounded
number of steps and counts them; checkpoints stay finite."""

import csv
import math
from typing import ClassVar

import lightning as L
import pytest
import torch

from tests.helpers import tiny_run
from vit.training.module import TRAIN_LOSS, TRAIN_LOSS_STEP
from vit.training.nonfinite import NonFiniteError, any_nonfinite
from vit.training.run import train
from vit.training.run_folder import LAST

SHORT = ["trainer.max_epochs=2", "callbacks.pos_embed_figure=null"]  # 7 steps an epoch


def _nan_at(*steps: int) -> str:
    return f"+callbacks.fault={{_target_: tests.reliability.faults.NaNBatchAt, steps: {list(steps)}}}"


def _finite(path) -> bool:
    return all(v.isfinite().all() for v in torch.load(path, weights_only=True)["state_dict"].values())


def test_a_nan_batch_halts_the_run_before_the_step_naming_step_and_batch(tmp_path):
    with pytest.raises(NonFiniteError, match=r"non-finite gradient at step 9 \(epoch 1, batch 2; loss nan\).*halted"):
        train(tiny_run(tmp_path, *SHORT, _nan_at(9)))
    last = tmp_path / "checkpoints" / LAST
    assert torch.load(last, weights_only=True)["global_step"] == 7 and _finite(last)  # epoch 1's checkpoint


def test_skipping_drops_those_steps_counts_them_and_leaves_the_weights_finite(tmp_path):
    results = train(tiny_run(tmp_path, *SHORT, "optim.nonfinite=skip", "optim.max_skipped_steps=2", _nan_at(3, 9)))
    assert results["skipped_steps"] == 2 and results["global_steps"] == 14
    assert _finite(tmp_path / "checkpoints" / LAST)
    # each epoch's mean loss is the mean over the steps taken (batches of equal size): the NaN steps left out
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for epoch in ("0", "1"):
        steps = [float(r[TRAIN_LOSS_STEP]) for r in rows if r["epoch"] == epoch and r[TRAIN_LOSS_STEP]]
        (mean,) = [float(r[TRAIN_LOSS]) for r in rows if r["epoch"] == epoch and r[TRAIN_LOSS]]
        taken = [v for v in steps if math.isfinite(v)]
        assert len(steps) == 7 and len(taken) == 6 and mean == pytest.approx(sum(taken) / 6, rel=1e-5)


def test_more_non_finite_steps_than_allowed_halt(tmp_path):
    with pytest.raises(NonFiniteError, match=r"step 5 .*2 steps skipped already, optim\.max_skipped_steps=2"):
        train(tiny_run(tmp_path, *SHORT, "optim.nonfinite=skip", "optim.max_skipped_steps=2", _nan_at(1, 3, 5)))


class Snapshot(L.Callback):
    """Copies the weights and the optimizer's state (AdamW's moments, Muon's momentum) as step `step` starts and
    ends, into Snapshot.taken."""

    taken: ClassVar[dict[str, list]] = {}

    def __init__(self, step: int):
        self.step = step

    def _take(self, when, trainer, pl_module):
        if trainer.global_step == self.step + (when == "end"):  # global_step counts the step once it is taken
            state = [v.clone() for s in trainer.optimizers[0].state.values() for v in s.values()]
            Snapshot.taken[when] = [p.detach().clone() for p in pl_module.parameters()] + state

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._take("start", trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._take("end", trainer, pl_module)


def test_a_skipped_step_leaves_every_parameter_and_optimizer_moment_as_it_was(tmp_path):
    Snapshot.taken.clear()
    snapshot = "+callbacks.snapshot={_target_: tests.reliability.test_numerics.Snapshot, step: 3}"
    train(tiny_run(tmp_path, *SHORT, "optim.nonfinite=skip", _nan_at(3), snapshot))
    start, end = Snapshot.taken["start"], Snapshot.taken["end"]
    assert len(start) == len(end) > 0 and all(torch.equal(a, b) for a, b in zip(start, end, strict=True))


CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
)


@pytest.mark.parametrize("device", ["cpu", CUDA])  # CUDA: GradScaler's kernel there has no bf16 branch of its own
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_any_nonfinite_finds_one_bad_value_in_any_tensor_and_dtype_and_changes_nothing(bad, device):
    dtypes = [torch.float32, torch.bfloat16, torch.float64, torch.float16]
    tensors = [torch.randn(7, 3, device=device, dtype=dtype) for dtype in dtypes]
    before = [t.clone() for t in tensors]
    assert not any_nonfinite(tensors) and not any_nonfinite([])
    for t, b in zip(tensors, before, strict=True):
        assert torch.equal(t, b)  # the check multiplies by one: not a value moves
    for i in range(len(tensors)):
        spoiled = [t.clone() for t in tensors]
        spoiled[i].view(-1)[-1] = bad
        assert any_nonfinite(spoiled)
