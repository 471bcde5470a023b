"""One file from a sharded checkpoint (trainer=fsdp):
`python -m vit.cli.consolidate CKPT_FOLDER --out FILE.ckpt`.

The folder's shards are gathered in this one process (no GPU, no process group) into a training checkpoint of one
file, without the optimizer state: what vit.checkpoint.load, predict, export, probe and model.pretrained read.
To continue training, resume the folder itself, on any number of processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from vit.atomic import write_atomically
from vit.cli.output import write_out
from vit.interop.files import CheckpointError
from vit.interop.sharded import consolidated, is_sharded_checkpoint


def consolidate(folder: Path, out: Path) -> None:
    if not is_sharded_checkpoint(folder):
        raise CheckpointError(f"{folder}: not a sharded checkpoint (a folder with .metadata and meta.pt)")
    checkpoint = consolidated(folder)
    write_atomically(out, lambda partial: torch.save(checkpoint, partial))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.consolidate", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="the sharded checkpoint: a folder (e.g. checkpoints/last.ckpt)")
    parser.add_argument("--out", required=True, type=Path, help="the file to write (e.g. model.ckpt)")
    args = parser.parse_args(argv)
    inside = args.out.resolve().is_relative_to(args.checkpoint.resolve())
    if inside and is_sharded_checkpoint(args.checkpoint):  # before write_out makes --out's folder
        raise SystemExit(f"--out {args.out}: inside the checkpoint it reads, {args.checkpoint}: write it elsewhere")
    write_out(args.out, lambda: consolidate(args.checkpoint, args.out), bad_input=CheckpointError)


if __name__ == "__main__":
    sys.exit(main())
