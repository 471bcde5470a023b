"""Train a ViT classifier: python train.py [experiment=NAME] [group=option] [key=value ...]

Examples:
  python train.py                                        # Fashion-MNIST on CPU (the default experiment)
  python train.py experiment=cifar10 trainer.devices=4 trainer=ddp
  python train.py -m model.pos_embed=learned,sincos2d,rope2d,none   # a sweep, compared in one table
  python train.py -m hparams_search=optuna                          # an Optuna search of lr, decay, drop path
"""

import json
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from vit.atomic import WriteError
from vit.checkpoint import CheckpointError
from vit.data.errors import DataError
from vit.model import ConfigError
from vit.training.nonfinite import NonFiniteError
from vit.training.objective import objective
from vit.training.registry import register
from vit.training.run import sweep_job, train
from vit.training.run_folder import RESULTS_FILE


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        results = train(cfg)
    except ConfigError as err:  # a mistake in the config: its message, not a traceback
        return failed(f"config error: {err}", 2)
    except (CheckpointError, DataError, NonFiniteError, FileNotFoundError, WriteError) as err:  # files, data, numbers
        return failed(f"error: {err}", 1)
    return objective(cfg.task.kind, results)  # what a Hydra sweeper optimises: the best validation score


def failed(line: str, status: int) -> None:
    """One line, then exit with `status`; a sweep's job writes the line into its results.json instead and
    returns, so that the sweep runs its other jobs (SystemExit would end it) and its table shows the failure."""
    print(line, file=sys.stderr)
    if not sweep_job():
        sys.exit(status)
    results = Path(HydraConfig.get().runtime.output_dir) / RESULTS_FILE
    results.write_text(json.dumps({"error": line, "exit_status": status}, indent=2) + "\n")


if __name__ == "__main__":
    register()  # before Hydra composes conf/train.yaml, which names what it registers
    main()
