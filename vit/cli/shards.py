"""Write shards in LitData's optimized format, for data=stream:
`python -m vit.cli.shards SRC OUT [--resize-short-side N] [--workers K] ...`.

SRC is an image folder (SRC/train/<class>/*, SRC/val/<class>/*, or any folder of images with --labels FILE, as
data.labels reads it), a Hugging Face dataset (a save_to_disk folder, parquet or arrow files) or CIFAR's files (a
folder that holds cifar-10-batches-py/ or cifar-100-python/). OUT gets one optimized folder per split (train/, val/
held out from train, test/) and shards.json; copy it to an object store with any S3 tool (aws s3 sync OUT
s3://bucket/prefix). Interrupted, the same command finishes the write.
See vit/data/shards/writer.py for the splits, the image bytes and bad images.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from vit.atomic import WriteError
from vit.cli.predict import positive
from vit.data.errors import DataError
from vit.data.shards.writer import size_in_bytes, write_shards


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its errors in one line: the 12-line usage it prints first buries the line at fault."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 1:  # nan too
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction from 0 to 1")
    return value


def _size(text: str) -> int:
    """Bytes written as litdata reads them: 600, 64MB, 1.5GB, 500k."""
    count = size_in_bytes(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes, e.g. 600, 500KB, 64MB or 1GB")
    return count


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="python -m vit.cli.shards", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="an image folder, a Hugging Face dataset, or a folder of CIFAR's files")
    parser.add_argument("out", help="the folder to write (shards.json, train/, val/, test/)")
    parser.add_argument("--source", default="auto", choices=["auto", "imagefolder", "hf", "cifar10", "cifar100"])
    parser.add_argument(
        "--resize-short-side",
        type=positive,
        help="resize once so that the short side is N px (JPEG stays JPEG, q95); left out, the bytes are kept",
    )
    parser.add_argument("--workers", type=positive, help="writing processes (default: the CPUs this process may use)")
    parser.add_argument("--chunk-bytes", type=_size, default="64MB", help="the size of one shard (default: 64MB)")
    parser.add_argument("--val-fraction", type=_fraction, default=0.05, help="held out from train as val/")
    parser.add_argument("--split-seed", type=int, default=0, help="the seed of the held-out draw")
    parser.add_argument("--skip-bad-images", action="store_true", help="leave bad images out, each named")
    parser.add_argument("--max-bad-fraction", type=_fraction, default=0.01, help="with --skip-bad-images, per split")
    parser.add_argument("--image-column", help="a Hugging Face dataset's image column (default: image, img)")
    parser.add_argument("--label-column", help="a Hugging Face dataset's label column (default: label, labels)")
    parser.add_argument("--labels", help="a label file for the image folder SRC (CSV, TSV, JSON Lines, Parquet)")
    parser.add_argument(
        "--unlabeled", default="error", choices=["error", "skip"], help="with --labels: an image no row names"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # litdata's INFO lines size a reader's cache, which writing never uses; its warnings still show
    logging.getLogger("litdata").setLevel(logging.WARNING)
    try:
        info = write_shards(
            args.src,
            args.out,
            kind=args.source,
            resize_short_side=args.resize_short_side,
            val_fraction=args.val_fraction,
            split_seed=args.split_seed,
            workers=args.workers,
            chunk_bytes=args.chunk_bytes,
            skip_bad_images=args.skip_bad_images,
            max_bad_fraction=args.max_bad_fraction,
            image_column=args.image_column,
            label_column=args.label_column,
            labels=args.labels,
            unlabeled=args.unlabeled,
        )
    except (DataError, FileNotFoundError, WriteError) as err:
        raise SystemExit(f"error: {err}") from None
    splits = ", ".join(f"{name} {count}" for name, count in info["splits"].items())
    print(f"wrote {args.out}: {info['num_classes']} classes; images: {splits}")


if __name__ == "__main__":
    sys.exit(main())
