"""What a hyper-parameter search optimises (conf/hparams_search/optuna.yaml): a run's best validation value of its
task's monitored metric, the score that chose its best.ckpt, maximised or minimised as the task's `mode` says. The
test metrics stay out of the search, so that they still measure the chosen settings on images nothing chose by."""

from __future__ import annotations

from typing import Any

from vit.training.task import best_key
from vit.training.tasks import TASKS


def direction(kind: str) -> str:
    """Optuna's direction for task.kind=`kind`: maximize where higher is better (accuracy, mAP), else minimize (MAE's
    loss). conf/hparams_search/optuna.yaml reads it through a resolver (vit/training/resolvers.py)."""
    return "maximize" if TASKS[kind].mode == "max" else "minimize"


def objective(kind: str, results: dict[str, Any]) -> float | None:
    """The objective of a run of task.kind=`kind`, from the results train() returned: None where it validated never."""
    return results.get(best_key(TASKS[kind].monitor))
