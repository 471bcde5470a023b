"""The classify task's test metrics per class (vit/training/tasks.py): each class's accuracy by the data's class names,
and balanced accuracy, their mean, against counts made by hand; and in a run's results.json."""

import json
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import tiny_config, tiny_run
from vit.training.run import train
from vit.training.tasks import TaskConfig


def _logits(predicted, classes=3):
    return torch.nn.functional.one_hot(torch.tensor(predicted), classes).float()


def test_per_class_and_balanced_accuracy_are_the_hand_counted_ones():
    """Six images of 'cat' (4 right), two of 'dog' (1 right), none of 'fox' though one image is called a fox:
    accuracy 5/8, per class 4/6 and 1/2, fox none; balanced accuracy is torchmetrics' macro mean, which counts the
    predicted fox as 0: (4/6 + 1/2 + 0) / 3."""
    task = TaskConfig().build(tiny_config(num_classes=3))
    task.setup(SimpleNamespace(classes=["cat", "dog", "fox"]))
    batches = [([0, 0, 0, 0, 1], [0, 0, 0, 0, 0]), ([2, 0, 1], [0, 1, 1])]  # (predicted, true), in two batches
    for predicted, labels in batches:
        logged = task.evaluate("test", _logits(predicted), torch.tensor(labels))
    assert logged["test/acc"].compute() == pytest.approx(5 / 8)
    assert logged["test/balanced_acc"].compute() == pytest.approx((4 / 6 + 1 / 2 + 0) / 3)
    assert task.epoch_end("test") == {}
    results = task.results({"test/acc": 5 / 8}, None)
    assert results["test_acc_per_class"] == {"cat": pytest.approx(4 / 6), "dog": 0.5, "fox": None}
    assert task.evaluate("val", _logits([0]), torch.tensor([0])).keys() == {"val/loss", "val/acc", "val/acc5"}
    task.evaluate("test", _logits([1]), torch.tensor([1]))  # a second test counts its own images only
    task.epoch_end("test")
    assert task.results({}, None)["test_acc_per_class"] == {"cat": None, "dog": 1.0, "fox": None}


def test_classes_are_named_by_index_where_the_data_names_none():
    task = TaskConfig().build(tiny_config(num_classes=2))
    task.setup(SimpleNamespace(classes=None))
    task.evaluate("test", _logits([1, 1], 2), torch.tensor([0, 1]))
    task.epoch_end("test")
    assert task.results({}, None)["test_acc_per_class"] == {"0": 0.0, "1": 1.0}


def test_a_runs_results_hold_balanced_and_per_class_test_accuracy_by_the_classes_a_subset_keeps(tmp_path):
    brief = ("trainer.max_epochs=1", "data.train_size=96", "data.val_size=32", "model.depth=1")
    results = train(tiny_run(tmp_path, *brief, "callbacks.pos_embed_figure=null", "data.class_subset=[3,1,2,0]"))
    per_class = results["test_acc_per_class"]
    assert list(per_class) == ["class_3", "class_1", "class_2", "class_0"]  # in label order
    assert results["test_balanced_acc"] == pytest.approx(sum(per_class.values()) / 4)  # every class tested
    assert json.loads((tmp_path / "results.json").read_text())["test_acc_per_class"] == per_class
