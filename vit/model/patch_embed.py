"""Patch embedding: split the image into non-overlapping P x P patches and map each linearly to D dims (and, where
configured, normalise each: AIMv2's x_n = LN(E p_n + b))."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.model import kernels
from vit.model.pos_embed import GridSize


class PatchEmbed(nn.Module):
    """A strided convolution (kernel = stride = patch size) is the per-patch linear map x_n = E p_n + b.

    Two computations of the same map with the same weights: the convolution (the reference, and the path on
    GPUs), and, where `kernels.patch_matmul_serves` (a CPU) while `cpu_matmul` is on, `kernels.patch_matmul`, one
    matrix product over the patches, which trains the default Fashion-MNIST model faster (benchmarks/NOTES.md
    change 1).
    """

    def __init__(
        self,
        patch_size: tuple[int, int],
        in_chans: int,
        embed_dim: int,
        bias: bool = True,
        norm: nn.Module | None = None,
    ):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.in_chans = in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = norm or nn.Identity()  # on each patch's embedding (ViTConfig.patch_norm)
        self.cpu_matmul = True

    def grid_for(self, height: int, width: int) -> GridSize:
        """The patch grid of an image: its whole patches, as the strided convolution takes them (the rows and
        columns past the last one, at the bottom and right, left out: timm's and transformers' grid), refusing an
        image smaller than one patch."""
        ph, pw = self.patch_size
        if height < ph or width < pw:
            raise ValueError(f"image size {height}x{width} is smaller than patch size {ph}x{pw}: not one patch fits")
        return height // ph, width // pw

    def _grid(self, images: Tensor) -> GridSize:
        if images.ndim != 4 or images.shape[1] != self.in_chans:
            raise ValueError(f"expected images of shape (B, {self.in_chans}, H, W), got {tuple(images.shape)}")
        return self.grid_for(*images.shape[-2:])

    def each(self, batches: Sequence[Tensor]) -> list[tuple[Tensor, GridSize]]:
        """forward() of each batch, of its own image size; where the matrix product serves, one product over every
        batch's patches, which packed images of several sizes embed faster than one product a size."""
        if not (self.cpu_matmul and batches and kernels.patch_matmul_serves(batches[0])) or len(batches) == 1:
            return [self(images) for images in batches]
        grids = [self._grid(images) for images in batches]
        rows = torch.cat([kernels.patchify(images, self.patch_size).flatten(0, 1) for images in batches])
        tokens = self.norm(F.linear(rows, self.proj.weight.flatten(1), self.proj.bias)).split(
            [len(images) * h * w for images, (h, w) in zip(batches, grids, strict=True)]
        )
        return [(t.view(len(b), -1, t.shape[-1]), grid) for t, b, grid in zip(tokens, batches, grids, strict=True)]

    def forward(self, images: Tensor) -> tuple[Tensor, GridSize]:  # images: (B, C, H, W)
        grid = self._grid(images)
        if self.cpu_matmul and kernels.patch_matmul_serves(images):
            tokens = kernels.patch_matmul(images, self.proj.weight, self.proj.bias, self.patch_size)  # (B, h*w, D)
            return self.norm(tokens), grid
        tokens = self.proj(images)  # (B, D, h, w)
        # contiguous: where no prefix token is concatenated, a transposed residual stream stays transposed, every
        # residual sum runs as a strided kernel and every LayerNorm copies it (benchmarks/NOTES.md change 23)
        return self.norm(tokens.flatten(2).transpose(1, 2).contiguous()), grid  # (B, h*w, D), (h, w)
