"""Masked autoencoding's decoder and targets (He et al. 2022). The encoder (VisionTransformer.forward_features with
`keep`) reads the visible patches; the decoder, narrower and shallower, reads its output and reconstructs every
patch's pixels:

    Z = W_e X_enc                                  the encoder's tokens at the decoder's width d
    Y = [Z_prefix; M with Z_i in each visible slot i] + PE     a learned mask token M in every masked slot, then the
                                                   decoder's own fixed table PE (sincos2d; prefix rows zero)
    Y <- TransformerLayer(Y), depth times;  pixels = W_p LN(Y)_patches      (B, N, p_h p_w C)

The target is each patch's pixels normalised by the patch's own mean and variance (the paper's norm_pix_loss), and
the loss reads the masked patches alone.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vit.model import kernels
from vit.model.config import ViTConfig
from vit.model.init import init_weights
from vit.model.layer import TransformerLayer
from vit.model.pos_embed import AbsolutePositionEmbedding


def decoder_config(encoder: ViTConfig, dim: int, depth: int, heads: int) -> ViTConfig:
    """The decoder's layers as a ViTConfig: the encoder's grid and prefix tokens, width `dim`, pre-norm, no head."""
    return ViTConfig(
        img_size=encoder.img_size,
        patch_size=encoder.patch_size,
        in_chans=encoder.in_chans,
        num_classes=0,
        embed_dim=dim,
        depth=depth,
        num_heads=heads,
        pos_embed="sincos2d",
        pool="avg",
        class_token=encoder.class_token,
        reg_tokens=encoder.reg_tokens,
        distill_token=encoder.distill_token,
        norm_layer=encoder.norm_layer,
        norm_eps=encoder.norm_eps,
    )


class MAEDecoder(nn.Module):
    """Reconstructs every patch of the encoder's images from its visible tokens: (B, P + n, D), keep (B, n) ->
    (B, N, p_h p_w C) pixels, each patch flattened in kernels.patchify's order."""

    def __init__(self, encoder: ViTConfig, dim: int, depth: int, heads: int):
        super().__init__()
        self.config = c = decoder_config(encoder, dim, depth, heads)
        self.prefix = c.num_prefix_tokens
        self.embed = nn.Linear(encoder.embed_dim, dim)  # W_e
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))  # M
        self.pos_embed = AbsolutePositionEmbedding("sincos2d", c.grid_size, dim, c.num_prefix_tokens, c.pos_temperature)
        self.layers = nn.ModuleList(TransformerLayer(c, 0.0, index) for index in range(depth))
        self.norm = nn.LayerNorm(dim, eps=c.norm_eps)
        ph, pw = c.patch_size
        self.pred = nn.Linear(dim, ph * pw * c.in_chans)  # W_p
        init_weights(self)

    def forward(self, latent: Tensor, keep: Tensor, grid: tuple[int, int]) -> Tensor:
        z = self.embed(latent)  # (B, P + n, d)
        B, d = z.shape[0], z.shape[-1]
        full = self.mask_token.to(z.dtype).expand(B, grid[0] * grid[1], d).clone()  # (B, N, d): M everywhere
        full = full.scatter(1, keep[..., None].expand(-1, -1, d), z[:, self.prefix :])  # the visible in their slots
        y = self.pos_embed(torch.cat((z[:, : self.prefix], full), dim=1), grid)
        for layer in self.layers:
            y, _ = layer(y)
        return self.pred(self.norm(y))[:, self.prefix :]


def patch_targets(images: Tensor, patch_size: tuple[int, int], normalize: bool = True, eps: float = 1e-6) -> Tensor:
    """Each patch's pixels (B, N, p_h p_w C), in kernels.patchify's order, normalised by the patch's own mean and
    variance where `normalize` (MAE's norm_pix_loss)."""
    target = kernels.patchify(images, patch_size)
    if not normalize:
        return target
    mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
    return (target - mean) / (var + eps) ** 0.5


def masked_loss(pred: Tensor, target: Tensor, keep: Tensor) -> Tensor:
    """The mean squared error of the masked patches alone: each patch's mean over its pixels, averaged over the
    patches no `keep` row names."""
    per_patch = (pred.float() - target.float()).pow(2).mean(dim=-1)  # (B, N)
    masked = torch.ones_like(per_patch).scatter(1, keep, 0.0)
    return (per_patch * masked).sum() / masked.sum()


def unpatchify(patches: Tensor, patch_size: tuple[int, int], grid: tuple[int, int], channels: int) -> Tensor:
    """kernels.patchify's inverse: (B, N, C p_h p_w) -> (B, C, h p_h, w p_w)."""
    (ph, pw), (h, w) = patch_size, grid
    x = patches.reshape(patches.shape[0], h, w, channels, ph, pw)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(patches.shape[0], channels, h * ph, w * pw)
