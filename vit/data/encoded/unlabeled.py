"""A folder of images without labels (data=images): every image file under root, at any depth and in any layout (no
class folders, no label file), for learning without labels (task=mae). Hidden entries and files without an image
extension are ignored, and bad images judged, as in an image folder (vit/data/encoded/imagefolder.py); the test set
(`test_fraction`) and then the validation set (`val_fraction`) are held out by `split_seed`. Each image is labelled
0 of one class, "image", which no task reads: a task that learns labels refuses this data (`without_labels`)."""

from __future__ import annotations

import logging
from typing import Any

from torchvision.datasets.folder import IMG_EXTENSIONS

from vit.data.encoded.held_out import hold_out
from vit.data.encoded.imagefolder import ImageFolderDataModule, image_files
from vit.data.errors import DataError

log = logging.getLogger(__name__)
IMAGE = "image"  # the one class name


class UnlabeledImagesDataModule(ImageFolderDataModule):
    """The images under root, split three ways by split_seed (module docstring)."""

    name, sources = "unlabelled images", "folders of images"
    without_labels = True  # what a task of labels refuses (vit/training/classification.py)

    def __init__(self, *, root: str, test_fraction: float = 0.05, **settings: Any):
        super().__init__(root=root, **settings)
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
            raise DataError(
                f"data.test_fraction={test_fraction!r}: the share of the images held out to test, in (0, 1)"
            )
        self.test_fraction = test_fraction

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        if not self.root.is_dir():
            raise DataError(f"data.root={self.root}: not a folder")
        paths = image_files(self.root)
        if not paths:
            raise DataError(f"{self.root} holds no image files ({', '.join(IMG_EXTENSIONS)})")
        self.classes = [IMAGE]
        samples, self.bad_images = self._usable([(path, 0) for path in paths], str(self.root))
        rest, test = hold_out(len(samples), self.test_fraction, self.split_seed, key="data.test_fraction")
        kept, val = hold_out(len(rest), self.val_fraction, self.split_seed)
        train = [samples[rest[k]] for k in kept]
        log.info(f"{self.root}: {len(paths)} images, no labels; train {len(train)}, val {len(val)}, test {len(test)}")
        self.train_set = self._dataset(train, True)
        self.val_set = self._dataset([samples[rest[k]] for k in val], False)
        self.test_set = self._dataset([samples[k] for k in test], False)
