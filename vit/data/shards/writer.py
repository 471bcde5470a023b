"""Writing a source's splits (vit/data/shards/sources.py: an image folder, a Hugging Face dataset or CIFAR) as shards
in LitData's optimized format, so that many ranks can stream them from a shared or object store
(vit/data/encoded/stream.py reads them).

Each split becomes its own optimized folder, OUT/train/, OUT/val/ and OUT/test/ (vit/data/encoded/shard_info.py), whose
items are {'image': the encoded image, 'label': int, 'source': the file or row it came from}; where images have
several labels (a label file's `labels`, a Hugging Face Sequence(ClassLabel)) 'label' is the list of their class
indices, a 1-D int64 tensor, and shards.json says `multilabel`:

- Images keep their original bytes (JPEG, PNG, ...: no re-encoding loss), or are resized once so that their short
  side is `resize_short_side` (never enlarged) and re-encoded: JPEG originals as JPEG of quality 95, anything
  else as PNG (lossless). CIFAR's arrays are encoded as PNG.
- Splits: the source's training split is train/; val/ is held out from it (val_fraction, split_seed: for an image
  folder the same files data=imagefolder holds out), except for a source with a validation split of its own (a
  Hugging Face dataset with both a validation and a test split), whose validation split is val/. test/ is the
  source's test set; absent when there is none (readers then test on val/).
- Bad images (empty, not decodable) are found by decoding every image once before writing, with the image
  folders' policy (bad_images.judge): an error naming each, or with `skip_bad_images` left out and listed.
- Interrupted writes resume: litdata checkpoints each split as chunks are written (use_checkpoint), and rerunning
  the same command skips finished splits and continues the unfinished one with the interrupted run's worker
  count. shards.json is written first with complete=false and completed last; a rerun with other settings is
  refused once anything is stored under it, and replaces it while nothing is (a first write that failed at once).
- A failed write ends every process it started, the workers' own included, and names its cause in one line.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image, ImageOps

from vit.atomic import write_atomically
from vit.data.encoded.bad_images import judge
from vit.data.encoded.held_out import hold_out
from vit.data.encoded.images import problem
from vit.data.encoded.shard_info import FORMAT, INDEX, INFO, SPLITS, read_json
from vit.data.errors import DataError
from vit.data.shards.disk_space import INDEX_BYTES, block_size, check_space, full_disk, stop_when_full, written_bytes
from vit.data.shards.processes import no_processes_left_on_failure
from vit.data.shards.sources import Source, Split, open_source

log = logging.getLogger(__name__)

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3}
JPEG_QUALITY = 95  # of resized JPEGs: visually lossless, about a third of quality 100's bytes
CHECKPOINT = ".checkpoints/config.json"  # litdata's, in a split's folder: written before the first item


def plan(source: Source, val_fraction: float, split_seed: int) -> dict[str, Split]:
    """The splits to write: train, val (the source's, or held out from train) and test where the source has one.
    `source.train` holds its usable images only: the draw is data=imagefolder's and data=hf's, over the same images."""
    train, val = source.train, source.val
    if val is None:
        kept, held = hold_out(len(train), val_fraction, split_seed, key="val_fraction")
        train, val = train.take(kept), train.take(held)
    splits = {"train": train, "val": val, "test": source.test}
    return {name: split for name, split in splits.items() if split is not None}


def usable(split: Split, where: str, skip: bool, max_fraction: float, threads: int) -> tuple[Split, list[str]]:
    """The split less its bad images (empty, or not decodable), judged by the image folders' policy."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max(1, threads)) as pool:  # PIL decodes without holding the GIL
        found = list(pool.map(lambda key: _problem(split, key), split.keys, chunksize=64))
    problems = {split.names[k]: why for k, (why, _) in enumerate(found) if why is not None}
    log.info(f"decoded the {len(split)} images of {where} in {time.perf_counter() - start:.1f} s")
    judge(problems, len(split), where, skip, max_fraction, noun="image")
    sized = replace(split, sizes=[size for _, size in found])
    return sized.take([k for k, (why, _) in enumerate(found) if why is None]), sorted(problems)


def _problem(split: Split, key: Any) -> tuple[str | None, int]:
    """Why the split's image `key` cannot be written (or None), and its bytes; one that cannot be read (a dataset's
    row naming a missing file) is bad as data=hf finds it, not a failure of the whole write."""
    try:
        data = split.read(key)
    except OSError as err:
        return f"{err.__class__.__name__}: {err}", 0
    return problem(data, 3, True), len(data)


def resized(data: bytes, short_side: int) -> bytes:
    """The image with its short side `short_side` (never enlarged), upright, re-encoded: JPEG as JPEG, else PNG."""
    with Image.open(io.BytesIO(data)) as image:
        if min(image.size) <= short_side:
            return data
        jpeg = image.format == "JPEG"
        image = ImageOps.exif_transpose(image)  # the orientation tag is not kept, so apply it
        scale = short_side / min(image.size)
        size = (max(short_side, round(image.width * scale)), max(short_side, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
        buffer = io.BytesIO()
        if jpeg:
            image.save(buffer, "JPEG", quality=JPEG_QUALITY)
        else:
            image.save(buffer, "PNG")
        return buffer.getvalue()


@dataclass(frozen=True)
class Encode:
    """litdata's per-item function: position k of a split to the item stored in the shards."""

    split: Split
    resize_short_side: int | None

    def __call__(self, k: int) -> dict[str, Any]:
        data = self.split.read(self.split.keys[k])
        if self.resize_short_side:
            data = resized(data, self.resize_short_side)
        label = self.split.labels[k]
        # several labels: one tensor, one leaf of litdata's item, whatever their number (a list would be one leaf each)
        label = torch.tensor(label, dtype=torch.int64) if isinstance(label, tuple) else int(label)
        return {"image": data, "label": label, "source": self.split.names[k]}


def write_split(split: Split, out: Path, encode: Encode, workers: int, chunk_bytes: int | str) -> None:
    """One split as a litdata optimized folder, resuming an interrupted write of it (with that write's workers)."""
    from litdata import optimize  # 3 s to import: the writer's cost, not every reader's

    interrupted = read_json(str(out), CHECKPOINT) if out.is_dir() else None
    if interrupted is not None:
        workers = interrupted["num_workers"]
        log.info(f"{out}: continuing an interrupted write with its {workers} worker(s)")
    what, chunk = f"writing split {out.name}", size_in_bytes(chunk_bytes)
    # the bytes kept as they are: the need is known before writing (resized, the watch alone stops a full disk)
    known = split.sizes is not None and not encode.resize_short_side
    need = space_needed(split, chunk, block_size(out)) if known else None
    if need is not None:
        check_space(out, need - written_bytes(out), what)
    try:  # litdata prints an advert for its cloud and each worker's comings and goings; its progress bar stays
        with (
            stop_when_full(out, chunk + INDEX_BYTES, need, what),
            no_processes_left_on_failure(),
            open(os.devnull, "w") as quiet,
            contextlib.redirect_stdout(quiet),
        ):
            optimize(
                # in a terminal only: the bar redraws itself with cursor moves, which a log keeps as '[A' debris
                verbose=sys.stderr.isatty(),
                fn=encode,
                inputs=list(range(len(split))),
                output_dir=str(out),
                chunk_bytes=chunk_bytes,
                num_workers=workers,
                use_checkpoint=True,  # resumable; litdata keeps the items in order, which its checkpoints need
                start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None,
            )
    except DataError:
        raise
    except Exception as err:
        if f"[Errno {errno.ENOSPC}]" in str(err):  # a worker's, passed on as its traceback's text
            raise DataError(full_disk(out, need, what)) from None
        if "not compatible with the current configuration" in str(err):
            raise DataError(
                f"{out} holds an interrupted write of other images: delete {out} to write it again"
            ) from None
        raise DataError(f"writing {out} failed ({_cause(err)}); rerun to continue") from err


def space_needed(split: Split, chunk_bytes: int, block: int) -> int:
    """The disk space of a split's shards, about: its images' own bytes, each item's name, label and offsets, the
    index, and each shard's last block (a disk stores files in whole blocks)."""
    assert split.sizes is not None
    items = sum(split.sizes) + sum(len(name.encode()) + 64 for name in split.names)
    shards = min(len(split), -(-items // max(1, chunk_bytes))) + 1
    return items + shards * block + INDEX_BYTES


def size_in_bytes(size: int | str) -> int:
    """A size as litdata reads chunk_bytes (600, '500k', '64MB', '1.5GB': powers of 1000) in bytes; 0 for none."""
    if isinstance(size, int):
        return size
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", size.strip().lower())
    return int(float(found[1]) * UNITS[found[2]]) if found and found[2] in UNITS else 0


def _cause(err: Exception) -> str:
    """The error at the root of a failure, in one line: litdata passes a worker's failure on as its whole traceback,
    the root error's line first and its own 'RuntimeError: Failed processing item=...' last."""
    text = str(err).strip()
    _, marker, traceback = text.partition("Traceback (most recent call last):")
    if not marker:
        return f"{err.__class__.__name__}: {text.splitlines()[0]}" if text else err.__class__.__name__
    chained = ("Traceback (", "The above exception", "During handling of the above")
    raised = [line for line in traceback.splitlines() if line[:1].strip() and not line.startswith(chained)]
    return raised[0] if raised else text.splitlines()[-1]


def write_shards(
    src: str,
    out: str,
    kind: str = "auto",
    resize_short_side: int | None = None,
    val_fraction: float = 0.05,
    split_seed: int = 0,
    workers: int | None = None,
    chunk_bytes: int | str = "64MB",
    skip_bad_images: bool = False,
    max_bad_fraction: float = 0.01,
    image_column: str | None = None,
    label_column: str | None = None,
    labels: str | None = None,
    unlabeled: str = "error",
) -> dict[str, Any]:
    """Write SRC's splits as shards under OUT, and OUT/shards.json; returns what shards.json holds. Rerunning
    the same call after an interruption finishes the write; with other settings it is refused once anything is
    stored. `labels`: a label file for the image folder SRC (data.labels), `unlabeled` as data.unlabeled."""
    if resize_short_side is not None and resize_short_side < 1:  # 0 would otherwise read as "keep the bytes"
        raise DataError(f"resize_short_side={resize_short_side}: give 1 px or more, or None to keep the bytes")
    root = Path(out).expanduser()
    if root.exists() and not root.is_dir():
        raise DataError(f"OUT={out} is a file, not a folder: choose a folder to write the shards into")
    settings = dict(
        source=str(Path(src).expanduser().resolve()) if Path(src).expanduser().exists() else src,
        kind=kind,
        resize_short_side=resize_short_side,
        val_fraction=val_fraction,
        split_seed=split_seed,
        skip_bad_images=skip_bad_images,
        image_column=image_column,
        label_column=label_column,
    )
    if labels is not None:  # only then: the settings of shards written from class folders stay as they were
        settings.update(labels=str(Path(labels).expanduser().resolve()), unlabeled=unlabeled)
    before = read_json(str(root), INFO) if root.is_dir() else None
    if before is not None and before.get("settings") != settings:
        if before.get("complete") or _stored(root):
            raise DataError(
                f"{root / INFO} was written with other settings ({before.get('settings')}): choose another OUT"
            )
        log.info(f"{root}: nothing was stored with the settings of {INFO} ({before.get('settings')}): replacing them")
        for name in SPLITS:  # litdata's record of the items each split began with, which may change with the settings
            (root / name / CHECKPOINT).unlink(missing_ok=True)
        before = None
    if before is not None and before.get("complete"):
        log.info(f"{root}: already written")
        return before
    source = open_source(src, kind, image_column, label_column, labels, (val_fraction, split_seed), unlabeled)
    workers = workers or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    # bad images leave the training split before validation is held out of it, as data=imagefolder and data=hf do
    judging = dict(skip=skip_bad_images, max_fraction=max_bad_fraction, threads=workers)
    if not len(source.train):
        raise DataError(f"split train of {src} holds no images")
    train, bad = usable(source.train, f"split train of {src}", **judging)
    splits = plan(replace(source, train=train), val_fraction, split_seed)
    info = {
        "format": FORMAT,
        "complete": False,
        "source_kind": source.kind,
        "classes": source.classes,
        "num_classes": source.num_classes,
        "multilabel": source.multilabel,
        "settings": settings,
        "images": f"short side {resize_short_side}" if resize_short_side else "original bytes",
        "splits": {},
    }
    _write_info(root, info)
    for name, split in splits.items():
        if not len(split):
            raise DataError(f"split {name} of {src} holds no images")
        if name == "test" or (name == "val" and source.val is not None):  # the source's own: not judged yet
            splits[name], left_out = usable(split, f"split {name} of {src}", **judging)
            bad += left_out
    todo = {name: split for name, split in splits.items() if not (root / name / INDEX).is_file()}  # finished: kept
    if not resize_short_side:  # the bytes kept as they are: a disk without room for them all is named before writing
        need = sum(space_needed(split, size_in_bytes(chunk_bytes), block_size(root)) for split in todo.values())
        check_space(root, need - sum(written_bytes(root / name) for name in todo), f"writing {', '.join(todo)}")
    for name, split in todo.items():
        write_split(split, root / name, Encode(split, resize_short_side), workers, chunk_bytes)
    counts = {name: len(split) for name, split in splits.items()}
    info.update(complete=True, splits=counts, bad_images=bad)
    _write_info(root, info)
    return info


def _stored(root: Path) -> bool:
    """Whether a split's folder under OUT holds anything besides litdata's CHECKPOINT: a chunk, a checkpoint of
    one, an index."""
    return any(
        path.is_file() and path != root / name / CHECKPOINT
        for name in SPLITS
        if (root / name).is_dir()
        for path in (root / name).rglob("*")
    )


def _write_info(root: Path, info: dict[str, Any]) -> None:
    write_atomically(root / INFO, lambda path: path.write_text(json.dumps(info, indent=1) + "\n"))
