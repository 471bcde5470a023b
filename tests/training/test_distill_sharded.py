"""Distillation in two processes under trainer=fsdp computes what DDP computes: DeiT's distillation token through
forward_heads, and feature distillation, whose projector learns beside the network."""

import pytest
import torch

from tests.training.test_distill import stubborn_teacher  # noqa: F401 (a fixture)
from tests.training.test_fsdp import DDP, FSDP, _losses, _run, _weights
from vit.training.run_folder import LAST


@pytest.mark.slow  # two runs of two processes each: ~30 s
@pytest.mark.parametrize(
    "settings",
    [["distill.kind=hard", "model.distill_token=true", "model.pool=token"], ["distill.target=features"]],
    ids=["distillation token", "features"],
)
def test_distillation_under_fsdp_computes_what_ddp_computes(stubborn_teacher, tmp_path, settings):  # noqa: F811
    taught = [f"distill.teacher={stubborn_teacher}", *settings]
    fsdp, _ = _run(tmp_path, "fsdp", *taught, *FSDP)
    ddp, _ = _run(tmp_path, "ddp", *taught, *DDP)
    assert len(_losses(fsdp)) == 12
    torch.testing.assert_close(_losses(fsdp), _losses(ddp), rtol=1e-5, atol=0)
    sharded, replicated = (_weights(run / "checkpoints" / LAST, tmp_path) for run in (fsdp, ddp))
    assert sharded.keys() == replicated.keys()
    for key in replicated:  # the gradients summed in another order (reduce-scatter, all-reduce): 1e-5 apart seen
        torch.testing.assert_close(sharded[key], replicated[key], rtol=0, atol=5e-5)
