"""Figures of what a ViT learned, as matplotlib `Figure`s built without pyplot (no display needed): the numbers
come from analysis.py beside this file; vit/cli/visualize.py draws them from a checkpoint."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from vit.figures import analysis

DPI = 100
PANEL = 2.4  # inches per small panel
POS_EMBED_SIZE = (12.0, 6.0)  # inches: similarity mosaic on the left, components and profile on the right
DISTANCE_SIZE = (7.0, 5.0)


def similarity_mosaic(similarity: Tensor, gap: int = 1) -> np.ndarray:
    """The (h, w, h, w) similarities as one image: tile (y, x) is position (y, x)'s map over the grid,
    tiles laid out like the patches, NaN gaps between them. -> (h*(h+gap)-gap, w*(w+gap)-gap)."""
    h, w = similarity.shape[:2]
    tiles = np.full((h, w, h + gap, w + gap), np.nan)
    tiles[:, :, :h, :w] = similarity.numpy()
    return tiles.transpose(0, 2, 1, 3).reshape(h * (h + gap), w * (w + gap))[: -gap or None, : -gap or None]


def _draw_similarity(ax, similarity: Tensor, title: str) -> None:
    image = ax.imshow(similarity_mosaic(similarity), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="cosine similarity")


def _draw_components(ax, table: Tensor, title: str) -> None:
    ax.imshow(analysis.principal_rgb(table).numpy(), interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def pos_embed_figure(table: Tensor, title: str = "") -> Figure:
    """Dosovitskiy et al. (2021) Fig. 7 centre for a (h, w, D) table, with its first three principal
    components as RGB and its mean similarity against distance between patches."""
    h, w, _ = table.shape
    similarity = analysis.position_similarity(table)
    fig = Figure(figsize=POS_EMBED_SIZE, dpi=DPI)
    grid = fig.add_gridspec(2, 2, width_ratios=(2, 1))
    _draw_similarity(fig.add_subplot(grid[:, 0]), similarity, f"similarity of each position with all others ({h}x{w})")
    _draw_components(fig.add_subplot(grid[0, 1]), table, "first 3 principal components as RGB")
    profile = fig.add_subplot(grid[1, 1])
    distances, means = analysis.similarity_by_distance(similarity)
    profile.plot(distances.numpy(), means.numpy(), marker="o", markersize=3)
    profile.axhline(0, color="grey", linewidth=0.5)
    profile.set_xlabel("distance between patches (patches)")
    profile.set_ylabel("mean cosine similarity")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def resample_figure(before: Tensor, after: Tensor, title: str = "") -> Figure:
    """A table before and after resampling to a new grid: similarity mosaics and principal components."""
    fig = Figure(figsize=POS_EMBED_SIZE, dpi=DPI)
    grid = fig.add_gridspec(2, 2, width_ratios=(1.4, 1))
    for row, table in enumerate((before, after)):
        h, w, _ = table.shape
        _draw_similarity(fig.add_subplot(grid[row, 0]), analysis.position_similarity(table), f"{h}x{w} grid")
        _draw_components(fig.add_subplot(grid[row, 1]), table, f"{h}x{w}: principal components")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def attention_figure(image: np.ndarray, heads: Tensor, rolled: Tensor, title: str = "") -> Figure:
    """The image, each head's attention over the patches (one layer), and the rollout over all layers,
    each map upsampled onto the image. image: (H, W) or (H, W, 3) in [0, 1]; heads: (heads, h, w);
    rolled: (h, w)."""
    count = heads.shape[0]
    fig = Figure(figsize=(PANEL * (count + 2), PANEL + 0.4), dpi=DPI)
    axes = fig.subplots(1, count + 2)
    extent = (-0.5, image.shape[1] - 0.5, image.shape[0] - 0.5, -0.5)  # the image's own pixel edges
    gray = image.ndim == 2
    shades = {"cmap": "gray", "vmin": 0, "vmax": 1} if gray else {}  # grey levels as they are, not stretched
    axes[0].imshow(image, **shades)
    axes[0].set_title("image", fontsize=9)
    maps = [(f"head {i}", heads[i]) for i in range(count)] + [("rollout, all layers", rolled)]
    for ax, (name, values) in zip(axes[1:], maps, strict=True):
        ax.imshow(image, **shades)
        ax.imshow(values.numpy(), cmap="inferno", alpha=0.6, extent=extent, interpolation="nearest")
        ax.set_title(name, fontsize=9)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def attention_distance_figure(distances: Tensor, title: str = "") -> Figure:
    """Mean attention distance (pixels) of every head against depth: (layers, heads) -> scatter."""
    layers, heads = distances.shape
    fig = Figure(figsize=DISTANCE_SIZE, dpi=DPI)
    ax = fig.add_subplot()
    for head in range(heads):
        ax.scatter(np.arange(1, layers + 1), distances[:, head].numpy(), s=14, label=f"head {head}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(np.arange(1, layers + 1))
    if heads <= 16:
        ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def figure_pixels(figure: Figure) -> np.ndarray:
    """The rendered figure as an RGB uint8 array (H, W, 3), e.g. for TensorBoard's add_image."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def reconstruction_figure(panels: Sequence[tuple[str, np.ndarray]], title: str = "") -> Figure:
    """Images side by side, each named: a masked autoencoder's original, masked, reconstruction and reconstruction
    with the visible patches pasted (He et al. 2022, Fig. 2). Each (H, W) or (H, W, 3) in [0, 1]."""
    fig = Figure(figsize=(PANEL * len(panels), PANEL + 0.4), dpi=DPI)
    for ax, (name, image) in zip(fig.subplots(1, len(panels)), panels, strict=True):
        shades = {"cmap": "gray", "vmin": 0, "vmax": 1} if image.ndim == 2 else {}
        ax.imshow(image, interpolation="nearest", **shades)
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def denormalized(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """The first of a batch of model inputs back in [0, 1] for display: (H, W) or (H, W, 3)."""
    mean = torch.tensor(mean).view(-1, 1, 1)
    std = torch.tensor(std).view(-1, 1, 1)
    pixels = (images[0] * std + mean).clamp(0, 1)  # (C, H, W)
    return pixels[0].numpy() if pixels.shape[0] == 1 else pixels.permute(1, 2, 0).numpy()
