"""--checkpoint and --preset, shared by the command lines that read a model through vit.checkpoint.load."""

from __future__ import annotations

import argparse
from pathlib import Path

from vit.interop.load import Loaded, load
from vit.model.presets import preset_config


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """--checkpoint and --preset, for the command-line tools that read a model through vit.checkpoint.load."""
    parser.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="any checkpoint vit.checkpoint.load reads (timm, JAX: with --preset)",
    )
    parser.add_argument(
        "--preset",
        metavar="NAME",
        help="the model preset (conf/model/NAME.yaml) for what timm and JAX files do not record: heads, norm eps, ...",
    )


def load_checkpoint(args: argparse.Namespace) -> Loaded:
    """The model of add_checkpoint_arguments' options; ValueError (naming the file or preset) if it cannot be."""
    return load(args.checkpoint, config=preset_config(args.preset) if args.preset else None)
