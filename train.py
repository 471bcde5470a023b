"""Train a ViT classifier: python train.py [experiment=NAME] [group=option] [key=value ...]

Examples:
  python train.py                                        # Fashion-MNIST on CPU (the default experiment)
  python train.py experiment=cifar10 trainer.devices=4 trainer=ddp
  python train.py -m model.pos_embed=learned,sincos2d,rope2d,none   # a sweep, compared in one table
"""

import sys

import hydra
from omegaconf import DictConfig

from vit.atomic import WriteError
from vit.checkpoint import CheckpointError
from vit.data.errors import DataError
from vit.model import ConfigError
from vit.training.model_defaults import register_model_defaults
from vit.training.module import NonFiniteError
from vit.training.resolvers import register_resolvers
from vit.training.run import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        results = train(cfg)
    except ConfigError as err:  # a mistake in the config: its message, not a traceback
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    except (CheckpointError, DataError, NonFiniteError, FileNotFoundError, WriteError) as err:  # files, data, numbers
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    return results["test_acc"]  # the value a Hydra sweeper optimises


if __name__ == "__main__":
    register_resolvers()  # before Hydra composes conf/train.yaml, which names them
    register_model_defaults()
    main()
