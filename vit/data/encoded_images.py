"""The front that every source of encoded images shares (image folders, Hugging Face datasets, shards): images
decoded to 1 or 3 channels, ImageNet's statistics (or its luma's), and timm's transforms with timm's bilinear
resize, so that one config trains alike whatever holds the images."""

from __future__ import annotations

from typing import Any

from vit.data.errors import DataError
from vit.data.loading import SplitDataModule
from vit.data.transforms import image_transform, normalization


class EncodedImagesDataModule(SplitDataModule):
    """Subclasses set `sources` (their plural, for messages) and fill the splits in `setup`."""

    sources: str
    interpolation = "bilinear"  # of every resize, training's and evaluation's (timm's default)

    def __init__(
        self,
        root: Any,
        num_classes: int,
        in_chans: int,
        img_size: int,
        batch_size: int,
        eval_batch_size: int,
        num_workers: int | str,
        auto_augment: str | None,
        flip: bool,
        crop_pct: float,
    ):
        super().__init__()
        if in_chans not in (1, 3):
            raise DataError(f"data.in_chans={in_chans}, but {self.sources} decode to 1 (grayscale) or 3 (RGB)")
        self.root, self.num_classes, self.in_chans, self.img_size = root, num_classes, in_chans, img_size
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.auto_augment, self.flip, self.crop_pct = auto_augment, flip, crop_pct
        self.mean, self.std = normalization(in_chans)
        self.bad_images: list[str] = []  # images left out: by skip_bad_images, or by the shard writer
        self.train_set = self.val_set = self.test_set = None

    def _transform(self, train: bool) -> Any:
        return image_transform(
            self.img_size, train, self.auto_augment, self.flip, self.crop_pct, self.interpolation, self.mean, self.std
        )
