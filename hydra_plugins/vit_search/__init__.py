"""The sweeper of conf/hparams_search/optuna.yaml: hydra-optuna-sweeper's OptunaSweeper, which vit.cli.search prepares
so that a stopped search continues where it stopped. It lives here, outside vit/, because Hydra instantiates
sweepers from its hydra_plugins package only. Hydra imports every module of that package whenever it starts, so
this one imports vit (and through it Optuna) only once a search begins."""

from __future__ import annotations

from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper


class ResumableOptunaSweeper(OptunaSweeper):
    """hydra.sweeper.n_trials is the study's total: a search resumed in its sweep folder runs the trials it lacks."""

    def sweep(self, arguments: list[str]) -> None:
        from vit.cli.search import search

        search(self.sweeper, arguments, super().sweep)
