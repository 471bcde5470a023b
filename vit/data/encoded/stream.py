"""Shards in LitData's optimized format (written by `python -m vit.cli.shards`, see vit/data/shards/writer.py)
streamed from a local or shared folder or an s3:// URL by litdata's StreamingDataset and StreamingDataLoader, and read
as image folders are: each item's encoded image decoded in workers or on the device (vit/data/encoded/decoding.py),
the same timm transforms and ImageNet normalisation, and checkpoints that record the same facts.

- Splits: train/ trains, val/ validates, test/ tests (val/ where the shards have no test/); shards.json names the
  classes, counted as the config resolves.
- Under DDP litdata gives each rank its own part of the epoch's order, drawn from (seed, epoch), cut to the same
  whole number of batches on every rank: each image at most once an epoch, every one when the training split is
  a multiple of ranks x batch size, as data=imagefolder's loader (vit/data/loading.py) does. Evaluation reads
  the shards by index through make_loader: every image once, on ranks of unequal share.
- Exact resume: StreamingDataLoader's state_dict (epoch, items handed out) goes into the checkpoint (Lightning
  saves any loader that has one); each image's augmentation draws are seeded from (seed, epoch, item), in the
  main process too, so a resumed pass draws what the whole one did whichever process reads the item, and a run
  from a bucket draws what one from a folder does (litdata's downloads draw from Python's random state). Each later pass
  reads its trainer epoch's order (EpochLoader), and a checkpoint resumes from the shards at data.root, moved or
  copied since.
- Bad input is a DataError naming it: a missing root or shards.json, unfinished shards, a shard shorter than its
  index says (checked in setup, from a folder or an object store's listing, and again when a read fails: a shard
  cut short during the run), an image that does not decode (its shard, item and source), an object store that
  stops answering mid-run (without litdata's download thread's tracebacks: quiet_download_crashes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming import async_prefetch, downloader, reader
from litdata.utilities.env import _DistributedEnv
from torch.utils.data import DataLoader, Dataset, get_worker_info

from vit.data.encoded.base import EncodedImagesDataModule
from vit.data.encoded.shard_info import INDEX, check_index, is_url, location, object_sizes, read_info, read_json
from vit.data.encoded.targets import multi_hot
from vit.data.errors import WORKER_TRACEBACK, DataError
from vit.data.loading import epoch_seed, make_loader, own_draws, seed_draws, worker_count

log = logging.getLogger(__name__)


class ShardImages(StreamingDataset):
    """One split's shards as (image, label) pairs, the image decoded to `channels` and transformed when read; with
    `label_sets` (the class count of shards of several labels an image) each item's class indices as their multi-hot
    vector (K,)."""

    def __init__(
        self,
        root: str,
        split: str,
        channels: int,
        transform: Callable,
        train: bool,
        seed: int,
        cache_dir: str | None,
        max_cache_size: int | float | str | None,
        storage_options: dict[str, Any],
        label_sets: int | None = None,
    ):
        index = read_json(root, f"{split}/{INDEX}", storage_options)
        self.where, self.source = location(root, split), (root, split, storage_options)
        if index is None:
            raise DataError(f"{self.where} has no {INDEX}: not a finished litdata optimized folder")
        self.label_sets = label_sets
        self.chunks = chunks = check_index(index, self.where, multilabel=label_sets is not None)
        self.shards = [chunk["filename"] for chunk in chunks]
        self.ends = np.cumsum([chunk["chunk_size"] for chunk in chunks])  # item k is in the first shard ending past k
        if not len(chunks) or not self.ends[-1]:
            raise DataError(f"{self.where} holds no images")
        # a short shard makes litdata wait for the rest of it (120 s from an object store), then blame a download:
        # checked before
        _check_sizes(self.where, chunks, self._listing())
        self.channels, self.image_transform, self.train = channels, transform, train
        # training: shuffled by (seed, epoch), cut to whole batches alike on every rank; evaluation reads by index
        super().__init__(
            self.where,
            cache_dir=cache_dir,
            # the disk that chunks downloaded from a URL may fill before read ones are deleted; left unset, litdata
            # takes 75% of the free disk and logs so each time a reader starts. A folder is read in place (nothing
            # copied, nothing deleted): no budget bounds it
            max_cache_size=max_cache_size if is_url(root) else sys.maxsize,
            shuffle=train,
            drop_last=True if train else None,
            seed=seed,
            storage_options=storage_options or None,
        )
        # read by index (evaluation), litdata fetches each item as two byte-range requests, which read 0 bytes from
        # an object store: fetch whole shards into the cache instead, as iterating does (and each shard once, not
        # twice an item). The property's setter needs the cache litdata builds on the first read
        self._on_demand_bytes = False

    def __getitem__(self, index: Any) -> Any:
        draw = int(getattr(index, "index", index))
        position = draw % int(self.ends[-1])  # a balanced sampler's n-th draw of an item is item + n x length
        item, named = self._read(index if draw == position else position, position)
        if not self.train:
            return self._transformed(item, position, named)
        seed = epoch_seed(epoch_seed(self.seed, self.current_epoch), draw)
        if get_worker_info() is not None:
            seed_draws(seed)
            return self._transformed(item, position, named)
        # in the main process too: litdata's download threads draw from Python's random state (botocore's jitter,
        # s3transfer's file names) as the augmentation does, and the run's own draws go on after the item
        with own_draws(seed):
            return self._transformed(item, position, named)

    def labels(self) -> list[Any]:
        """Every item's label, in order (balanced sampling weighs them): litdata stores no label apart from its
        image, so this reads the split's every byte, once."""
        return [self._read(k, k)[0]["label"] for k in range(int(self.ends[-1]))]

    def _read(self, index: Any, position: int) -> tuple[dict[str, Any], str]:
        """Item `position` as litdata reads it (`index`: litdata's own, or the position), and its shard, named."""
        shard = int(np.searchsorted(self.ends, position, side="right"))
        named = f"shard {self.shards[shard]}"
        try:
            return super().__getitem__(index), named
        except Exception as err:  # whatever litdata raises for a shard it cannot read
            # litdata waits for the rest of a short shard (2 s from a folder, MAX_WAIT_TIME=120 s from a URL), then
            # blames a download: a shard cut short since setup checked it is named as such
            if short := _size_problem(self.where, self.chunks[shard], self._listing()):
                raise DataError(f"{short} since the run started; write the shards again") from err
            raise DataError(
                f"cannot read item {position} of {named} in {self.where} ({err.__class__.__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}); write the shards again"
            ) from err

    def _transformed(self, item: dict[str, Any], position: int, named: str) -> tuple[Any, int | torch.Tensor]:
        try:
            # bytes(): litdata hands a memoryview where an item holds a tensor too (shards of several labels an image)
            image = self.image_transform.read(bytes(item["image"]), f"item {position} of {named} in {self.where}")
        except Exception as err:
            raise DataError(
                f"item {position} of {named} in {self.where} (from {item['source']}) does not decode "
                f"({err.__class__.__name__}: {err})"
            ) from err
        label = item["label"] if self.label_sets is None else multi_hot(item["label"], self.label_sets)
        return self.image_transform(image), label

    def _listing(self) -> dict[str, int] | None:
        """The split's object sizes by name where the shards are at a URL (one listing); None for a folder."""
        root, split, storage_options = self.source
        return object_sizes(root, split, storage_options) if is_url(root) else None


class EpochLoader(StreamingDataLoader):
    """litdata's loader, each pass of which reads the order of `epoch()` (the trainer's epoch; None: litdata's own
    count of passes in this process), and only the first pass after load_state_dict resumes the checkpoint's.
    Lightning restores no loader state from a checkpoint taken at an epoch's end, the epoch being over, so litdata's
    count would start again there; and it stops at the loader's length without reading a pass to its end, where
    litdata stops resuming, so every later pass would resume the checkpoint's epoch again."""

    def __init__(self, *args: Any, epoch: Callable[[], int | None], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.epoch = epoch
        self._resuming = False  # the next pass is the one load_state_dict restored

    def __iter__(self) -> Any:
        if not self._resuming:
            self.restore = False
        self._resuming = False
        epoch = self.epoch()  # on the first batch: Lightning has counted the finished epochs by then
        if epoch is not None and not self.restore:  # a restored pass is the checkpoint's own epoch, resumed
            self.current_epoch = epoch  # litdata counts passes from 1: its __iter__ adds the 1
        try:
            yield from super().__iter__()
        except DataError:
            raise
        except Exception as err:  # litdata reads ahead outside ShardImages.__getitem__: a corrupt shard's header
            raise DataError(
                f"cannot read the shards in {self.dataset.where} ({_raised(err)}); write the shards again"
            ) from err

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """A checkpoint's state, read from the shards at data.root as they are now: litdata's state names the folder
        (or URL and cache) it was saved from and refuses any other, shards moved or copied elsewhere included."""
        state, dataset = obj["dataset"], self.dataset
        if state["subsampled_files"] != dataset.subsampled_files:
            raise DataError(
                f"cannot resume: the checkpoint's training shards ({len(state['subsampled_files'])} files, read from "
                f"{state['input_dir_url'] or state['input_dir_path']}) are not those at data.root={dataset.source[0]}"
            )
        where = {"input_dir_path": dataset.input_dir.path, "input_dir_url": dataset.input_dir.url}
        super().load_state_dict({**obj, "dataset": {**state, **where}})
        self._resuming = True


class Indexed(Dataset):
    """A split's shards read by index, for evaluation: make_loader's samplers then give each rank its share, every
    image once (litdata's own split hands out whole shards, which can leave a rank of a small split none)."""

    def __init__(self, images: ShardImages):
        self.images = images

    def __len__(self) -> int:
        return int(self.images.ends[-1])

    def __getitem__(self, index: int) -> Any:
        return self.images[index]


class Drawn(Indexed):
    """The training shards read by index in make_loader's class-balanced order (data.sampler=balanced): each draw's
    augmentation seeded by ShardImages from (seed, epoch, draw), after the read, as a streamed pass seeds its items.
    `targets`: the items' labels (ShardImages.labels)."""

    seeds_draws = True  # make_loader hands over numbered draws, and the epoch through set_epoch

    def __init__(self, images: ShardImages):
        super().__init__(images)
        self.targets = images.labels()

    def set_epoch(self, epoch: int) -> None:
        self.images.current_epoch = epoch


def _raised(err: Exception) -> str:
    """An error's class and first line; for one raised again from a DataLoader worker, the worker's own."""
    text = str(err)
    if WORKER_TRACEBACK in text:
        lines = text.split(WORKER_TRACEBACK, 1)[1].splitlines()
        last_frame = max((k for k, line in enumerate(lines) if line.startswith(" ")), default=-1)
        return next((line for line in lines[last_frame + 1 :] if line.strip()), text.splitlines()[0])
    return f"{err.__class__.__name__}: {text.splitlines()[0] if text else ''}"


def _check_sizes(where: str, chunks: list[dict[str, Any]], listed: dict[str, int] | None) -> None:
    """Each shard as long as its index says: in the folder `where`, or as `listed` (an object store's sizes)."""
    for chunk in chunks:
        if short := _size_problem(where, chunk, listed):
            raise DataError(f"{short}; write the shards again")


def _size_problem(where: str, chunk: dict[str, Any], listed: dict[str, int] | None) -> str | None:
    """What is wrong with one shard's size (see _check_sizes), or None where it is as long as its index says."""
    name = chunk["filename"]
    if listed is None:
        path = os.path.join(where, name)
        size = os.path.getsize(path) if os.path.isfile(path) else None
    else:
        path, size = f"{where}/{name}", listed.get(name)
    if size == chunk["chunk_bytes"]:
        return None
    found = "missing" if size is None else f"{size} bytes"
    return f"shard {path} is {found}, but {INDEX} says {chunk['chunk_bytes']} bytes: truncated or replaced"


def allow_plain_http(storage_options: dict[str, Any]) -> None:
    """litdata fetches shards from S3 with obstore, whose client options it fixes without allow_http, so an
    S3-compatible server on plain http (MinIO in a cluster, a local test server) fails with 'BadScheme'. Where the
    endpoint is http://, those options allow it (in this process and in the DataLoader workers it forks)."""
    endpoint = (
        storage_options.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL", "")
    )
    if str(endpoint).startswith("http://"):
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True


def quiet_download_crashes() -> None:
    """When a download fails (an object store gone mid-run), litdata's chunk-download thread prints the error and its
    traceback to stderr, then closes its event loop under the downloads still in flight, whose ends each print
    another traceback ('Event loop is closed', through sys.excepthook); the reader raises the error afterwards, where
    ShardImages and EpochLoader name it in one line. The thread's report goes to this module's debug log instead, once
    the downloads in flight have ended (failed too, as a rule, at the same moment): in this process and in the
    DataLoader workers it forks. litdata offers no setting for either."""

    def report(thread: reader.PrepareChunksThread, err: BaseException) -> None:
        log.debug("litdata's chunk downloads stopped", exc_info=err)
        loop = getattr(async_prefetch._THREAD_LOOPS, "loop", None)  # this thread's, which litdata closes next
        if loop is not None and not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(asyncio.gather(*asyncio.all_tasks(loop), return_exceptions=True))

    reader.PrepareChunksThread._report_crash = report


class StreamDataModule(EncodedImagesDataModule):
    """Shards at `root` (see the module's docstring). `bad_images` lists the images the writer left out."""

    name, sources = "shards", "shards' images"

    def __init__(
        self,
        *,
        root: str,
        cache_dir: str | None = None,
        max_cache_size: int | float | str | None = "100GB",
        storage_options: dict[str, Any] | None = None,
        **shared: Any,  # EncodedImagesDataModule's settings
    ):
        super().__init__(root=str(root), **shared)
        self.cache_dir, self.max_cache_size = cache_dir, max_cache_size
        self.storage_options = dict(storage_options or {})
        self.classes: list[str] | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        info = read_info(self.root, self.storage_options)
        if info["num_classes"] != self.num_classes:
            raise DataError(
                f"the shards at data.root={self.root} hold {info['num_classes']} classes but "
                f"data.num_classes={self.num_classes}: leave data.num_classes out, the config reads it from them"
            )
        allow_plain_http(self.storage_options)
        quiet_download_crashes()
        self.classes, self.bad_images = info["classes"], list(info.get("bad_images", []))
        self.multilabel = info.get("multilabel", False)  # shards written before it was recorded: one label each
        self.train_set = self._split("train", train=True)
        self.val_set = self._split("val", train=False)
        self.test_set = self._split("test", train=False) if "test" in info["splits"] else self.val_set
        if "test" not in info["splits"]:
            log.info(f"data.root={self.root} has no test split: testing on val/")

    def _split(self, split: str, train: bool) -> ShardImages:
        transform = self._transform(train)
        # the run's seed, as make_loader's samplers take it (seed_everything sets it on every rank, below 2**32);
        # unseeded, torch's is any 64-bit number, which litdata's shuffle (numpy's RandomState) refuses
        seed = torch.initial_seed() % 2**32
        args = (self.in_chans, transform, train, seed, self.cache_dir, self.max_cache_size, self.storage_options)
        return ShardImages(self.root, split, *args, label_sets=self.num_classes if self.multilabel else None)

    def _unaugmented(self, dataset: Any) -> Any:
        """The training shards through the evaluation transform, in order, as the validation shards read."""
        return self._split("train", train=False) if dataset is self.train_set else dataset

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> DataLoader:
        workers = worker_count(self.num_workers)
        if not train or self.sampler == "balanced":
            return make_loader(
                Drawn(dataset) if train else Indexed(dataset),
                batch_size,
                train,
                workers,
                self.collate_fn,
                pin_memory=torch.cuda.is_available(),
                sampler=self.sampler,
            )
        # an own generator: starting a pass draws no number from the global random state (exact resume relies on it)
        loader = EpochLoader(
            dataset,
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=self.collate_fn,
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator(),
            epoch=lambda: None if self.trainer is None else self.trainer.current_epoch,
        )
        if train and len(loader) == 0:
            world = _DistributedEnv.detect().world_size
            raise DataError(
                f"data.batch_size={batch_size}, but the training shards hold too few images for one batch on each "
                f"of {world} process(es), so not one training step would run: lower data.batch_size"
            )
        return loader
