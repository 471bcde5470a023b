"""Write shards in LitData's optimized format, for data=stream:
`python -m vit.cli.shards SRC OUT [--resize-short-side N] [--workers K] ...`.

SRC is an image folder (SRC/train/<class>/*, SRC/val/<class>/*), a Hugging Face dataset (a save_to_disk folder,
parquet or arrow files) or CIFAR's files (a folder that holds cifar-10-batches-py/ or cifar-100-python/). OUT gets
one optimized folder per split (train/, val/ held out from train, test/) and shards.json; copy it to an object
store with any S3 tool (aws s3 sync OUT s3://bucket/prefix). Interrupted, the same command finishes the write.
See vit/data/shards.py for the splits, the image bytes and bad images.
"""

from __future__ import annotations

import argparse
import logging
import sys

from vit.data.errors import DataError
from vit.data.shards import write_shards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.shards", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="an image folder, a Hugging Face dataset, or a folder of CIFAR's files")
    parser.add_argument("out", help="the folder to write (shards.json, train/, val/, test/)")
    parser.add_argument("--source", default="auto", choices=["auto", "imagefolder", "hf", "cifar10", "cifar100"])
    parser.add_argument(
        "--resize-short-side", type=int, help="resize once so that the short side is N px (JPEG stays JPEG, q95)"
    )
    parser.add_argument("--workers", type=int, help="writing processes (default: the CPUs this process may use)")
    parser.add_argument("--chunk-bytes", default="64MB", help="the size of one shard (default: 64MB)")
    parser.add_argument("--val-fraction", type=float, default=0.05, help="held out from train as val/")
    parser.add_argument("--split-seed", type=int, default=0, help="the seed of the held-out draw")
    parser.add_argument("--skip-bad-images", action="store_true", help="leave bad images out, each named")
    parser.add_argument("--max-bad-fraction", type=float, default=0.01, help="with --skip-bad-images, per split")
    parser.add_argument("--image-column", help="a Hugging Face dataset's image column (default: image, img)")
    parser.add_argument("--label-column", help="a Hugging Face dataset's label column (default: label, labels)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # litdata's INFO lines size a reader's cache, which writing never uses; its warnings still show
    logging.getLogger("litdata").setLevel(logging.WARNING)
    chunk_bytes = int(args.chunk_bytes) if args.chunk_bytes.isdigit() else args.chunk_bytes
    try:
        info = write_shards(
            args.src,
            args.out,
            kind=args.source,
            resize_short_side=args.resize_short_side,
            val_fraction=args.val_fraction,
            split_seed=args.split_seed,
            workers=args.workers,
            chunk_bytes=chunk_bytes,
            skip_bad_images=args.skip_bad_images,
            max_bad_fraction=args.max_bad_fraction,
            image_column=args.image_column,
            label_column=args.label_column,
        )
    except (DataError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    splits = ", ".join(f"{name} {count}" for name, count in info["splits"].items())
    print(f"wrote {args.out}: {info['num_classes']} classes; images: {splits}")


if __name__ == "__main__":
    sys.exit(main())
