"""The front that every source of encoded images shares (image folders, Hugging Face datasets, shards): images
decoded to 1 or 3 channels, ImageNet's statistics (or its luma's), and timm's transforms with timm's bilinear
resize, so that one config trains alike whatever holds the images; decoded in the loader's workers or on the
training device (vit/data/encoded/decoding.py)."""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader

from vit.data.encoded.decoding import CPU, EncodedBatch, cannot_decode_on, collate_for, normalized, pipeline
from vit.data.encoded.transforms import image_transform, normalization
from vit.data.errors import DataError
from vit.data.loading import SplitDataModule, checked_sampler, make_loader
from vit.data.native_size import collate_native, native_transform, per_shape

log = logging.getLogger(__name__)

DECODE = ("auto", "workers", "device")


@functools.cache
def _say_once(message: str) -> None:
    log.warning(message)


class EncodedImagesDataModule(SplitDataModule):
    """Subclasses set `sources` (their plural, for messages) and fill the splits in `setup`. Each takes its own
    settings and passes the rest (`**shared`) to this constructor, which holds their defaults once."""

    sources: str
    interpolation = "bilinear"  # of every resize, training's and evaluation's (timm's default)
    # several labels an image: targets are multi-hot float vectors (K,), batched (B, K), not int labels; known once
    # `setup` has read the labels (a label file's `labels` column, a Hugging Face Sequence(ClassLabel), such shards)
    multilabel = False

    def __init__(
        self,
        *,
        root: Any,
        num_classes: int,
        in_chans: int = 3,
        img_size: int = 224,
        batch_size: int = 128,
        eval_batch_size: int = 256,
        num_workers: int | str = "auto",
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        flip: bool = True,
        crop_pct: float = 0.875,
        decode: str = "auto",
        max_tokens: int | None = None,
        sampler: str = "uniform",
    ):
        super().__init__()
        self.sampler = checked_sampler(sampler)
        if in_chans not in (1, 3):
            raise DataError(f"data.in_chans={in_chans}, but {self.sources} decode to 1 (grayscale) or 3 (RGB)")
        self.root, self.num_classes, self.in_chans, self.img_size = root, num_classes, in_chans, img_size
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.auto_augment, self.flip, self.crop_pct = auto_augment, flip, crop_pct
        self.mean, self.std = normalization(in_chans)
        if decode not in DECODE:
            raise DataError(f"data.decode={decode!r}: give one of {', '.join(DECODE)}")
        self.decode = decode
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise DataError(f"data.max_tokens={max_tokens!r}: give a whole number of patches >= 1, or null")
        self.max_tokens = max_tokens  # images at their own size, within this many patches (native_size.py)
        self.bad_images: list[str] = []  # images left out: by skip_bad_images, or by the shard writer
        self.train_set = self.val_set = self.test_set = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A source's signature with its `**shared` spelled out as its parent's settings, its own in their place:
        what the config is checked against and help() shows, as if each source had written them all out."""
        super().__init_subclass__(**kwargs)
        own = list(inspect.signature(cls.__init__).parameters.values())[1:]  # less self
        if not own or own[-1].kind is not inspect.Parameter.VAR_KEYWORD:
            return
        mine = {p.name: p for p in own[:-1]}
        inherited = inspect.signature(cls.__mro__[1]).parameters
        cls.__signature__ = inspect.Signature(
            [mine.get(name, p) for name, p in inherited.items()] + [p for p in own[:-1] if p.name not in inherited]
        )

    def _transform(self, train: bool) -> Any:
        """What a split's dataset does to each stored image (`read`, then a call on what it read)."""
        if self.max_tokens is not None:
            if self.patch_size is None:
                raise DataError("data.max_tokens: images are fitted to the network's patches, whose size the run "
                                "gives the data module (patch_size) before it reads them")  # fmt: skip
            settings = (self.max_tokens, self.patch_size, self.auto_augment, self.flip, self.mean, self.std)
            return pipeline(self.in_chans, native_transform(train, *settings), on_device=False)
        transform = image_transform(
            self.img_size, train, self.auto_augment, self.flip, self.crop_pct, self.interpolation, self.mean, self.std
        )
        return pipeline(self.in_chans, transform, self.on_device)

    @property
    def on_device(self) -> bool:
        """Whether images are decoded on the training device: data.decode=device, or auto on a GPU where no
        augmentation needs PIL (timm's RandAugment does) and torchvision can decode there."""
        device = getattr(getattr(self.trainer, "strategy", None), "root_device", None) or CPU
        if self.max_tokens is not None:  # images of their own sizes: decoded and fitted in the workers
            return False
        if self.decode == "workers" or (
            self.decode == "auto" and (device.type != "cuda" or self.auto_augment is not None)
        ):
            return False
        if why := cannot_decode_on(device):
            if self.decode == "device":
                raise DataError(
                    f"data.decode=device, but torchvision cannot decode JPEGs on {device} ({why}): set "
                    f"data.decode=workers"
                )
            _say_once(f"data.decode=auto decodes in workers: torchvision cannot decode JPEGs on {device} ({why})")
            return False
        return True

    @property
    def collate_fn(self) -> Any:
        return collate_native if self.max_tokens is not None else collate_for(self.on_device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> tuple[Tensor | list[Tensor], Tensor]:
        images, labels = batch
        if isinstance(images, list):  # of their own sizes, (C, H_i, W_i) uint8 each
            return per_shape(images, lambda batch: self.as_precision(normalized(batch, self.mean, self.std))), labels
        if isinstance(images, EncodedBatch):
            images = self.as_precision(images.pixels())  # (B, C, H, W), on the device the batch went to
        elif images.dtype == torch.uint8:  # decoded and augmented in workers
            images = self.as_precision(normalized(images, self.mean, self.std))
        return images, labels

    def _loader(self, dataset: Any, batch_size: int, train: bool) -> DataLoader:
        """Batches of a split's files, decoded in self.num_workers workers (data=stream samples its own way)."""
        return make_loader(
            dataset,
            batch_size,
            train,
            self.num_workers,
            self.collate_fn,
            pin_memory=torch.cuda.is_available(),
            sampler=self.sampler,
        )
