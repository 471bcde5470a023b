"""Data modules: each yields (images (B, C, H, W) float, normalised, on the device; labels (B,) int64)."""

from vit.data.cifar import CIFAR10DataModule, CIFAR100DataModule
from vit.data.fashion_mnist import FashionMNISTDataModule
from vit.data.imagefolder import ImageFolderDataModule
from vit.data.synthetic import SyntheticDataModule

__all__ = [
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
    "SyntheticDataModule",
]
