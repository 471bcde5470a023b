"""task=mae in two processes as every run: DDP and FSDP (trainer=fsdp) compute the same masked-patch losses, the
sharded checkpoint holds the task's decoder beside the network, and a consolidated file continues pretraining with
that decoder."""

import pytest
import torch

from tests.training.test_fsdp import DDP, FSDP, _losses, _run, _weights
from vit.training.mae import DECODER
from vit.training.run_folder import LAST

MAE = ["task=mae", "task.decoder_dim=32"]


@pytest.mark.slow  # two runs of two processes: ~25 s
def test_mae_under_fsdp_computes_what_ddp_computes_and_keeps_its_decoder(tmp_path):
    fsdp, _ = _run(tmp_path, "fsdp", *MAE, *FSDP)
    ddp, _ = _run(tmp_path, "ddp", *MAE, *DDP)
    assert len(_losses(fsdp)) == 12  # two epochs of 6 steps a process
    torch.testing.assert_close(_losses(fsdp), _losses(ddp), rtol=1e-5, atol=0)
    sharded, replicated = (_weights(run / "checkpoints" / LAST, tmp_path) for run in (fsdp, ddp))
    decoder = sorted(k for k in replicated if k.startswith(DECODER))
    assert decoder and sorted(k for k in sharded if k.startswith(DECODER)) == decoder
    for key in replicated:
        torch.testing.assert_close(sharded[key], replicated[key], rtol=0, atol=1e-5)
    # the consolidated file continues pretraining from its decoder, in one process
    one = tmp_path / "fsdp.ckpt"  # written by _weights, as `python -m vit.cli.consolidate` writes it
    again, log = _run(tmp_path, "again", *MAE, "trainer.devices=1", f"model.pretrained={one}")
    assert f"task=mae: the decoder continues from {one}" in log
    assert len(_losses(again)) == 2 * 12  # one process takes the whole epoch: 12 steps
