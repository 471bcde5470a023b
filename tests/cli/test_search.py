"""python train.py -m hparams_search=optuna (conf/hparams_search/optuna.yaml, vit/cli/search.py): each trial's value
is its job's best validation score, the study lives in the sweep folder and a stopped search continues there; the
trials are rows of the sweep's comparison table. Runs in this process (tests/test_documented_commands.py's Shell):
three trials of a one-layer model take seconds, a process would add its start to each command."""

import json
from pathlib import Path

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_dir
from optuna.trial import TrialState

from tests.helpers import CONF_DIR, EAGER, TINY
from tests.test_documented_commands import Shell
from vit.training.objective import objective
from vit.training.run_folder import RESULTS_FILE, RUN_CONFIG
from vit.training.tasks import TASKS

SEARCH = ["python", "train.py", "-m", "hparams_search=optuna"]
# sizes and steps: a one-layer model, two training batches and one of each evaluation split a trial, trained eager,
# without the position-embedding figure
SMALL = [*TINY, EAGER, "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1", "callbacks.pos_embed_figure=null"]  # fmt: skip
SEARCHED = ("optim.lr", "optim.weight_decay", "model.drop_path")  # conf/hparams_search/optuna.yaml's params


@pytest.fixture
def shell(tmp_path, monkeypatch, capfd) -> Shell:
    return Shell(tmp_path, monkeypatch, capfd)


def _study(sweep):
    return optuna.load_study(study_name="hparams_search", storage=f"sqlite:///{sweep / 'optuna.db'}")


def _jobs(sweep) -> dict[int, dict]:
    """Each job folder's results.json, by the job number its folder name starts with."""
    return {int(p.parent.name.split("_")[0]): json.loads(p.read_text()) for p in sweep.glob(f"*/{RESULTS_FILE}")}


def _table_rows(sweep) -> list[str]:
    return [line for line in (sweep / "comparison.md").read_text().splitlines()[2:] if line.startswith("| ")]


def test_a_search_stores_each_trials_best_validation_score_and_resumes_in_its_folder(shell):
    sweep = shell.home / "multirun" / "search"
    first = shell.run([*SEARCH, *SMALL, "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep}"])
    assert first.status == 0, first.out[-3000:]
    study = _study(sweep)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE  # accuracy
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    jobs = _jobs(sweep)
    assert sorted(jobs) == [0, 1]
    for trial in study.trials:
        results = jobs[trial.number]
        assert trial.value == results["best_val_acc"] != results["test_acc"]  # validation's, never the test's
        ran = yaml.safe_load((Path(results["output_dir"]) / RUN_CONFIG).read_text())  # the trial's settings
        assert trial.params == {key: ran[key.split(".")[0]][key.split(".")[1]] for key in SEARCHED}
    rows = _table_rows(sweep)
    assert len(rows) == 2
    assert all(f"optim.lr={t.params['optim.lr']}" in row for t, row in zip(study.trials, rows, strict=True))

    stored = [(t.params, t.value) for t in study.trials]  # read now: study.trials reads the file each time
    resumed = shell.run([*SEARCH, *SMALL, "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep}"])  # 3 in all
    assert resumed.status == 0, resumed.out[-3000:]
    again = _study(sweep)
    assert [t.state for t in again.trials] == [TrialState.COMPLETE] * 3
    assert [(t.params, t.value) for t in again.trials[:2]] == stored
    jobs = _jobs(sweep)
    assert sorted(jobs) == [0, 1, 2]  # job 2 is trial 2: the stopped search's folders stand as they were
    assert again.trials[2].value == jobs[2]["best_val_acc"]
    assert len(_table_rows(sweep)) == 3


def test_a_search_over_a_key_the_config_lacks_is_refused_in_one_line_before_any_trial(shell):
    sweep = shell.home / "multirun" / "search"
    ran = shell.run([*SEARCH, *SMALL, "optim.lrr=tag(log,interval(1e-4,1e-2))", f"hydra.sweep.dir={sweep}"])
    assert ran.status == 1
    assert ran.out.strip().splitlines()[-1].startswith("hparams_search: no key optim.lrr in the config to search over")
    assert "Traceback" not in ran.out and not sweep.exists()


def test_a_search_whose_every_trial_fails_ends_in_its_table_not_in_a_traceback(shell):
    sweep = shell.home / "multirun" / "search"
    out_of_range = "model.drop_path=interval(1.5,2)"  # the command line's sweep of a key replaces the file's
    ran = shell.run([*SEARCH, *SMALL, "hydra.sweeper.n_trials=2", out_of_range, f"hydra.sweep.dir={sweep}"])
    assert ran.status == 1 and "Traceback" not in ran.out
    assert "no trial of study hparams_search gave a value" in ran.out
    assert [t.state for t in _study(sweep).trials] == [TrialState.FAIL] * 2
    rows = _table_rows(sweep)
    assert len(rows) == 2 and all("config error: model.drop_path must be in [0, 1)" in row for row in rows)


# what each task's search optimises, and which way: results.json's key of its best validation score
OBJECTIVES = {"classify": ("best_val_acc", "maximize"), "multilabel": ("best_val_map", "maximize"),
              "mae": ("best_val_loss", "minimize")}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_the_objective_is_the_tasks_best_validation_score_in_its_direction(kind):
    key, direction = OBJECTIVES[kind]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hparams_search=optuna", f"task={kind}"], return_hydra_config=True)
    assert cfg.hydra.sweeper.direction == direction
    assert objective(kind, {key: 0.25, "test_acc": 0.5, "test_loss": 0.5, "test_map": 0.5}) == 0.25
