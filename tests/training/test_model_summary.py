"""The table Lightning prints as fitting starts shows the network's forward FLOPs, not a column of zeros."""

import logging
import re

import pytest
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count

from tests.helpers import tiny_run
from vit.model.flops import forward_flops
from vit.training import model_summary
from vit.training.run import build


@pytest.mark.parametrize("rich", [True, False])
def test_the_summary_shows_the_networks_forward_flops_per_image(tmp_path, capsys, caplog, monkeypatch, rich):
    if not rich:  # Lightning's plain table, as where rich is not installed
        monkeypatch.setattr(model_summary, "find_spec", lambda name: None)
    _, module, trainer = build(tiny_run(tmp_path))
    summaries = [c for c in trainer.callbacks if isinstance(c, ModelSummary)]
    assert [type(s) for s in summaries] == [model_summary.NetworkSummary]  # in place of Lightning's own
    with caplog.at_level(logging.INFO):  # rich's table is printed, Lightning's plain one logged
        summaries[0].on_fit_start(trainer, module)
    printed = capsys.readouterr().out + caplog.text
    flops = get_human_readable_count(round(forward_flops(module.config)))
    assert flops != "0"
    assert re.search(rf"\bmodel\b.*VisionTransformer.*\s{re.escape(flops)}\s", printed)
    total = rf"Total FLOPs\W+{re.escape(flops)}\s" if rich else rf"\s{re.escape(flops)}\s+Total Flops"
    assert re.search(total, printed)


def test_trainer_enable_model_summary_false_still_turns_it_off(tmp_path):
    _, _, trainer = build(tiny_run(tmp_path, "+trainer.enable_model_summary=false"))
    assert not [c for c in trainer.callbacks if isinstance(c, ModelSummary)]
