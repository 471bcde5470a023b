"""Linear probe and k-NN accuracy (macro mAP for several labels per image) of a checkpoint's frozen features on a
dataset, by DINOv2's protocol:
`python -m vit.cli.probe --checkpoint PATH [--blocks 1] [--avgpool] [--k 10 20 100 200] [--out probe.json]
[data=NAME data.KEY=VALUE ...]`.

Features: the class token of each of the last --blocks layers through the final norm (--avgpool: and the last
layer's mean patch token), or with --blocks 0 the pooled features the head reads. The linear probe's weight decay is
swept on a held-out tenth of the training split and the best refit on all of it; the k-NN vote (cosine similarity,
temperature 0.07) is read at every --k. A table goes to the terminal, every figure to --out as JSON. Data of several
labels per image (multi-hot) gets a logistic regression per class (one-vs-rest), and both probes are scored by the mean
over classes of the average precision (macro mAP; `_map` in the JSON where single-label data has `_acc`).

The data overrides are train.py's (conf/data/); data.img_size is the size images are read at (the model's position
table is resampled to it, as at inference), data.in_chans must be the model's channels. The config is checked as
train.py checks it, with the same one-line messages and exit statuses (config error: 2; a bad file or data: 1);
model.* overrides are refused, the network being the checkpoint's. Features are computed once per split, without
augmentation, normalised with the checkpoint's mean and std where it records them (else the data's); the probe and
the vote then take seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

from vit.atomic import write_atomically
from vit.cli.checkpoint_args import add_checkpoint_arguments, load_checkpoint
from vit.cli.output import check_out, write_out
from vit.cli.predict import positive
from vit.interop.finetune import pretrained_normalization
from vit.model.config import ConfigError
from vit.model.presets import conf_dir
from vit.training.checks import check_config
from vit.training.probe import KS, block_features, check_blocks, features, knn_at, metric, sweep_linear
from vit.training.registry import register
from vit.training.run import instantiate_setting


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.probe", description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser)
    parser.add_argument("--blocks", type=int, default=1, help="the last layers whose class tokens are the features")
    parser.add_argument("--avgpool", action="store_true", help="the last layer's mean patch token beside them")
    parser.add_argument("--k", type=positive, nargs="+", default=list(KS), help="neighbours that vote in the k-NN")
    parser.add_argument("--out", type=Path, default=Path("probe.json"), help="where every figure is written as JSON")
    parser.add_argument("overrides", nargs="*", help="train.py's data overrides, e.g. data=cifar10 data.root=DIR")
    args = parser.parse_args(argv)
    if args.blocks < 0:
        parser.error(f"--blocks {args.blocks}: the last N layers, N >= 1 (or 0: the pooled features)")
    check_out(args.out)  # the features take minutes: an --out found unwritable after them would lose them
    try:
        _refuse_model_overrides(args.overrides, args.checkpoint)
        loaded = load_checkpoint(args)
        check_blocks(args.blocks, loaded.config.depth)
        register()
        with initialize_config_dir(str(conf_dir()), version_base="1.3"):
            cfg = compose("train", overrides=args.overrides)
        cfg.model.pretrained = str(args.checkpoint)  # the file is the network, as in a fine-tuning run's checks
        cfg.output_dir = None  # Hydra's run folder, which the probe neither has nor writes
        check_config(cfg)
        data = instantiate_setting(cfg.data, "data")
        if data.in_chans != loaded.config.in_chans:  # the normalisation would quietly broadcast 1 channel to 3
            raise ConfigError(
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
            split[name] = (
                block_features(loaded.model, batches, args.blocks, args.avgpool)
                if args.blocks
                else features(loaded.model, batches)
            )
    except HydraException as err:  # an override Hydra cannot parse or apply: its first line names it
        raise SystemExit(_first_line(err)) from None
    except ConfigError as err:  # train.py's line and status for a config mistake
        print(f"config error: {_first_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, FileNotFoundError, RuntimeError) as err:  # a file or the data: DataError, CheckpointError
        raise SystemExit(f"error: {_first_line(err)}") from None
    labels = split["train"][1]
    several = labels.dim() == 2  # multi-hot (n, K)
    classes = labels.shape[1] if several else int(max(labels.max(), split["test"][1].max())) + 1
    name, shown = metric(labels), "mAP" if several else "acc"
    dim, n = split["train"][0].shape[1], len(split["train"][1])
    what = f"the last {args.blocks} layer(s)' class tokens" + (" and mean patch" if args.avgpool else "")
    print(f"{args.checkpoint}: {dim}-dim features ({what if args.blocks else 'pooled'}) of {n} training and "
          f"{len(split['test'][1])} test images")  # fmt: skip
    linear = sweep_linear(split["train"], split["test"], classes)
    neighbours = knn_at(split["train"], split["test"], classes, args.k)
    row = "{:<8} {:<20} {:>12} {:>9}".format
    held, tested = f"held_out_{name}", f"test_{name}"
    print(row("probe", "setting", f"held-out {shown}", f"test {shown}"))
    for setting in linear["settings"]:
        print(row("linear", f"weight decay {setting['weight_decay']:g}", f"{setting[held]:.2%}", ""))
    best = linear["best"]
    print(row("linear", f"best: {best['weight_decay']:g}", f"{best[held]:.2%}", f"{best[tested]:.2%}"))
    for k, value in neighbours.items():
        print(row("k-NN", f"k={k}, T=0.07", "", f"{value:.2%}"))
    results = {
        "checkpoint": str(args.checkpoint),
        "features": {"blocks": args.blocks, "avgpool": args.avgpool, "dim": dim},
        "images": {"train": n, "test": len(split["test"][1])},
        "linear": linear,
        "knn": {"temperature": 0.07, "map" if several else "accuracy": {str(k): a for k, a in neighbours.items()}},
    }
    text = json.dumps(results, indent=2) + "\n"
    write_out(args.out, lambda: write_atomically(args.out, lambda path: path.write_text(text)))


def _refuse_model_overrides(overrides: list[str], checkpoint: Path) -> None:
    """model=NAME or model.KEY=VALUE would be composed, and then ignored: the probe reads the checkpoint's network."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    if model := [k for k in keys if k == "model" or k.startswith("model.")]:
        raise ConfigError(
            f"{', '.join(model)}: the probe reads the network in {checkpoint} as it is; drop the model override(s) "
            "(data.img_size sets the size images are read at)"
        )


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


if __name__ == "__main__":
    sys.exit(main())
