"""A hyper-parameter search with Optuna that a stopped search continues: python train.py -m hparams_search=optuna
(conf/hparams_search/optuna.yaml). hydra-optuna-sweeper runs it, storing the study in the sweep folder; `search`
tells its sweeper, before it runs, what that folder already holds, and ends a search without a value in one line
(the sweeper that calls it: hydra_plugins/vit_search)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)  # not RUNNING: a trial the stop cut short
_ABSENT = object()


def check_keys(config: DictConfig, keys: list[str]) -> None:
    """Refuse in one line a search over a key the config lacks: the first trial would fail on it in Hydra's error of
    several lines, after the search had begun. `+KEY` adds a key and `~KEY` removes one, as on a command line."""
    missing = [
        key
        for key in keys
        if not key.startswith(("+", "~"))
        and key not in config.hydra.runtime.choices  # a config group: model, optim, ...
        and OmegaConf.select(config, key, default=_ABSENT, throw_on_resolution_failure=False) is _ABSENT
    ]
    if missing:
        raise SystemExit(
            f"hparams_search: no key {', '.join(missing)} in the config to search over "
            "(python train.py --cfg job lists the keys; +KEY adds one)"
        )


def stored_trials(storage: str | None, study_name: str | None) -> list[optuna.trial.FrozenTrial]:
    """The trials of the study `study_name` in `storage`; none where there is no storage or no such study yet."""
    if storage is None:
        return []
    try:
        return optuna.load_study(study_name=study_name, storage=storage).trials
    except KeyError:  # Optuna's word for a study the storage does not hold
        return []


def search(sweeper: Any, arguments: list[str], run: Callable[[list[str]], None]) -> None:
    """hydra-optuna-sweeper's `run` of its `sweeper` (OptunaSweeperImpl.sweep), prepared; a search none of whose
    trials gave a value ends in one line, the comparison table naming each job's error (CompareRuns, next), not in
    the traceback of Optuna's question for the best trial."""
    prepare(sweeper, arguments)
    try:
        run(arguments)
    except ValueError:
        trials = stored_trials(sweeper.storage, sweeper.study_name)
        if any(trial.state == TrialState.COMPLETE for trial in trials):
            raise
        print(f"{sweeper.storage}: no trial of study {sweeper.study_name} gave a value", file=sys.stderr, flush=True)


def prepare(sweeper: Any, arguments: list[str]) -> None:
    """Before hydra-optuna-sweeper's `sweeper` (its OptunaSweeperImpl, set up) searches hydra.sweeper.params and the
    command line's sweeps (`arguments`): refuse a key the config lacks; make the sweep folder, where the study's file
    goes (SQLite makes the file, not its folder); count the study's finished trials against n_trials, the search's
    total rather than this command's; number the job folders on from the stored trials, so that job N is trial N and
    no folder of the stopped search is written over."""
    config = sweeper.config
    check_keys(config, [*(sweeper.params or {}), *(argument.split("=", 1)[0] for argument in arguments)])
    Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
    trials = stored_trials(sweeper.storage, sweeper.study_name)
    if not trials:
        return
    finished = sum(trial.state in FINISHED for trial in trials)
    sweeper.job_idx = len(trials)  # Optuna numbers a study's trials 0, 1, ...: the next is len(trials)
    sweeper.n_trials = max(sweeper.n_trials - finished, 0)
    if hasattr(sweeper.sampler, "reseed_rng"):  # a seeded sampler would draw the stopped search's first trials again
        sweeper.sampler.reseed_rng()
    print(  # Hydra's own logging is off in the launching process (conf/train.yaml)
        f"{sweeper.storage}: study {sweeper.study_name} has {finished} finished trials; "
        f"{sweeper.n_trials} more make n_trials={finished + sweeper.n_trials}",
        flush=True,
    )
