"""Patch embedding: split the image into non-overlapping P x P patches and map each linearly to D dims."""

from __future__ import annotations

from torch import Tensor, nn

from vit.pos_embed import GridSize


class PatchEmbed(nn.Module):
    """A strided convolution (kernel = stride = patch size) is the per-patch linear map x_n = E p_n + b."""

    def __init__(self, patch_size: tuple[int, int], in_chans: int, embed_dim: int):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.in_chans = in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    def grid_for(self, height: int, width: int) -> GridSize:
        """The patch grid of an image, refusing sizes that are not a whole number of patches."""
        ph, pw = self.patch_size
        if height % ph or width % pw:
            raise ValueError(
                f"image size {height}x{width} is not divisible by patch size {ph}x{pw}; "
                f"resize or crop to a multiple of the patch size"
            )
        return height // ph, width // pw

    def forward(self, images: Tensor) -> tuple[Tensor, GridSize]:  # images: (B, C, H, W)
        if images.ndim != 4 or images.shape[1] != self.in_chans:
            raise ValueError(f"expected images of shape (B, {self.in_chans}, H, W), got {tuple(images.shape)}")
        grid = self.grid_for(*images.shape[-2:])
        tokens = self.proj(images)  # (B, D, h, w)
        return tokens.flatten(2).transpose(1, 2), grid  # (B, h*w, D), (h, w)
