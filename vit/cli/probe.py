"""Linear probe and k-NN accuracy of a checkpoint's frozen features on a dataset:
`python -m vit.cli.probe --checkpoint PATH [--preset NAME] [--k 20] [data=NAME data.KEY=VALUE ...]`.

The data overrides are train.py's (conf/data/); data.img_size is the size images are read at (the model's position
table is resampled to it, as at inference), data.in_chans must be the model's channels. Features are computed once
per split, without augmentation, normalised with the checkpoint's mean and std where it records them (else the
data's); the probe and the vote then take seconds.
"""

from __future__ import annotations

import argparse
import sys

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate
from omegaconf.errors import OmegaConfBaseException

from vit.cli.checkpoint_args import add_checkpoint_arguments, load_checkpoint
from vit.cli.predict import positive
from vit.data.errors import DataError
from vit.interop.finetune import pretrained_normalization
from vit.model.presets import conf_dir
from vit.training.checks import data_fault
from vit.training.model_defaults import register_model_defaults
from vit.training.probe import features, knn, linear_probe
from vit.training.resolvers import register_resolvers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.probe", description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser)
    parser.add_argument("--k", type=positive, default=20, help="neighbours that vote in the k-NN")
    parser.add_argument("overrides", nargs="*", help="train.py's data overrides, e.g. data=cifar10 data.root=~/data")
    args = parser.parse_args(argv)
    try:
        loaded = load_checkpoint(args)
        register_resolvers()
        register_model_defaults()
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            data = instantiate(compose("train", overrides=args.overrides).data)
        if data.in_chans != loaded.config.in_chans:  # the normalisation would quietly broadcast 1 channel to 3
            raise ValueError(
                f"data.in_chans={data.in_chans}, but {args.checkpoint} reads {loaded.config.in_chans}-channel "
                f"images: add data.in_chans={loaded.config.in_chans}"
            )
        stats = pretrained_normalization(loaded, loaded.config.in_chans)
        if isinstance(stats, tuple):  # features as the network was trained to see images
            data.normalize_with(*stats)
        data.setup("fit")
        split = {}
        for name in ("train", "test"):
            batches = (data.on_after_batch_transfer(batch, 0) for batch in data.evaluation_loader(name))
            split[name] = features(loaded.model, batches)
    except HydraException as err:  # an override Hydra cannot parse or apply: its first line names it
        raise SystemExit(str(err).strip().splitlines()[0]) from None
    except (ValueError, DataError, FileNotFoundError, RuntimeError, OmegaConfBaseException) as err:
        # a data resolver's own error (a missing folder) is behind OmegaConf's; its first line names the key
        fault = data_fault(err) if isinstance(err, OmegaConfBaseException) else None
        raise SystemExit(str(fault or err).strip().splitlines()[0]) from None
    classes = int(max(split["train"][1].max(), split["test"][1].max())) + 1
    dim, n = split["train"][0].shape[1], len(split["train"][1])
    print(f"{args.checkpoint}: {dim}-dim features of {n} training and {len(split['test'][1])} test images")
    print(f"linear probe: {linear_probe(split['train'], split['test'], classes):.2%} test accuracy")
    print(f"{args.k}-NN: {knn(split['train'], split['test'], classes, k=args.k):.2%} test accuracy")


if __name__ == "__main__":
    sys.exit(main())
