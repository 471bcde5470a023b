"""What a trained ViT learned, as numbers: position-table similarity, its principal components and
distance profile, per-head attention maps, attention rollout and mean attention distance.

Pure functions of tensors; vit/cli/visualize.py draws them. Attention weights come from
VisionTransformer.attention_maps, which recomputes them by the explicit path for any model, including
one trained with the SDPA fast path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vit.model import VisionTransformer
from vit.model.pos_embed import GridSize


def position_table(model: VisionTransformer, grid: GridSize | None = None) -> Tensor | None:
    """The model's position vectors on a patch grid (its own by default): (h, w, D), or None for 'none'.

    For rotary phases without a table (pos_embed 'rope2d' or 'rope_mixed') there is no added vector; the table is
    the phases the model applies (its positions: indices, DINOv3's centred ones, or scaled to a reference grid)
    written as cos/sin pairs, whose cosine similarity between positions p and q is (2/d) * sum_i
    cos(phi_i(p) - phi_i(q)): the relative-position factor that rope multiplies into every query-key product,
    averaged over frequency pairs. With rope_mixed the phases are learned, per layer and head:
    the first layer's, all heads' pairs side by side, so the similarity averages cos(phi(p) - phi(q)) over them.
    """
    c = model.config
    grid = tuple(grid or c.grid_size)
    if model.pos_embed is not None:
        return model.pos_embed.table_for(grid).detach().float()
    if model.rope is not None and c.rotary == "rope_mixed":  # learned: the first layer's, every head's side by side
        cos, sin = (t[0, :, c.num_prefix_tokens :].detach().float() for t in model.rope(grid))  # (H, N, d) each
        return torch.cat((cos, sin), dim=-1).transpose(0, 1).reshape(*grid, -1)  # (h, w, H * 2d)
    if model.rope is not None:  # the phases attention applies, not sincos of the indices: positions may be centred
        cos, sin = (t[c.num_prefix_tokens :].detach().float() for t in model.rope(grid))  # (N, d) each
        return torch.cat((cos, sin), dim=-1).reshape(*grid, -1)  # (h, w, 2d)
    return None


def table_name(model: VisionTransformer) -> str:
    """What position_table gives, in words: the added table by its kind, or, where there is none, rotary phases
    (pos_embed 'rope2d' or 'rope_mixed', as DINOv3 imports are)."""
    return "rotary phases" if model.pos_embed is None and model.rope is not None else f"{model.config.table} table"


def position_similarity(table: Tensor) -> Tensor:
    """Cosine similarity of every position's vector with every other's: (h, w, D) -> (h, w, h, w)."""
    h, w, _ = table.shape
    unit = torch.nn.functional.normalize(table.flatten(0, 1).double(), dim=-1)  # (N, D)
    return (unit @ unit.T).reshape(h, w, h, w).float()


def grid_distances(grid: GridSize, step: tuple[int, int] = (1, 1)) -> Tensor:
    """Euclidean distance between patch positions: (N, N) for N = h * w, raster order; in patches, or in
    pixels with step = the patch's (height, width)."""
    h, w = grid
    y, x = torch.meshgrid(torch.arange(h) * step[0], torch.arange(w) * step[1], indexing="ij")
    points = torch.stack((y.flatten(), x.flatten()), dim=-1).double()  # (N, 2)
    return torch.cdist(points, points)


def similarity_by_distance(similarity: Tensor) -> tuple[Tensor, Tensor]:
    """Mean similarity of position pairs at each distance (pairs of a position with itself left out).

    (h, w, h, w) -> (distances (K,), mean similarity (K,)), distances ascending. A table that has become
    2D falls off with distance; a random one is flat near zero.
    """
    h, w = similarity.shape[:2]
    distance = grid_distances((h, w)).round(decimals=6).flatten()
    values = similarity.reshape(h * w * h * w).double()
    keep = distance > 0
    distances, index = torch.unique(distance[keep], return_inverse=True)
    sums = torch.zeros(len(distances), dtype=torch.float64).index_add_(0, index, values[keep])
    counts = torch.zeros(len(distances), dtype=torch.float64).index_add_(0, index, torch.ones_like(values[keep]))
    return distances.float(), (sums / counts).float()


def principal_rgb(table: Tensor) -> Tensor:
    """The first three principal components of the position vectors, each scaled to [0, 1]: (h, w, D) ->
    (h, w, 3), an RGB image of the table. Signs are fixed so each component's largest loading is positive."""
    h, w, _ = table.shape
    centered = table.flatten(0, 1).double()
    centered = centered - centered.mean(dim=0)
    _, _, v = torch.linalg.svd(centered, full_matrices=False)  # rows of v: principal directions
    k = min(3, v.shape[0])
    directions = v[:k]
    signs = torch.sign(directions.gather(1, directions.abs().argmax(dim=1, keepdim=True)))
    scores = centered @ (directions * signs).T  # (N, k)
    low, high = scores.min(dim=0).values, scores.max(dim=0).values
    scaled = (scores - low) / (high - low).clamp_min(1e-12)
    rgb = torch.zeros(h * w, 3, dtype=torch.float64)
    rgb[:, :k] = scaled
    return rgb.reshape(h, w, 3).float()


def patch_attention(attention: Tensor, model: VisionTransformer, grid: GridSize | None = None) -> Tensor:
    """Where one layer looks, per head: the class token's attention over the patches (pool='token'), or
    the mean over patch queries (pool='avg'). (B, H, P + N, P + N) -> (B, H, h, w), on the images' `grid` (the
    model's own when None)."""
    c = model.config
    p = c.num_prefix_tokens
    to_patches = attention[..., p:]  # (B, H, P + N, N)
    rows = to_patches[:, :, 0] if c.pool == "token" else to_patches[:, :, p:].mean(dim=2)  # (B, H, N)
    return rows.unflatten(-1, tuple(grid or c.grid_size))


def rollout(attentions: list[Tensor]) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): per layer, the head-averaged weights plus the identity for
    the residual path, rows renormalized, multiplied from the first layer up. L x (B, H, T, T) -> (B, T, T);
    row t says how much each input token contributed to output token t."""
    result = None
    for attention in attentions:
        mixed = 0.5 * attention.double().mean(dim=1) + 0.5 * torch.eye(attention.shape[-1], dtype=torch.float64)
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)  # (B, T, T)
        result = mixed if result is None else mixed @ result
    if result is None:
        raise ValueError("rollout needs the attention of at least one layer")
    return result.float()


def rollout_patches(attentions: list[Tensor], model: VisionTransformer, grid: GridSize | None = None) -> Tensor:
    """Rollout relevance of each input patch for the prediction: the class token's row (pool='token') or
    the mean of the patch rows (pool='avg'), over patch inputs. -> (B, h, w), on the images' `grid`."""
    c = model.config
    p = c.num_prefix_tokens
    rolled = rollout(attentions)[..., p:]  # (B, T, N)
    rows = rolled[:, 0] if c.pool == "token" else rolled[:, p:].mean(dim=1)
    return rows.unflatten(-1, tuple(grid or c.grid_size))


def mean_attention_distance(attentions: list[Tensor], model: VisionTransformer) -> Tensor:
    """Per layer and head, the mean image-space distance (pixels, between patch centres) from a patch query
    to the patches it attends to, weighted by attention (Dosovitskiy et al. 2021, Fig. 7 right).

    Queries and keys are the patch tokens: attention to the class token (which has no place in the image)
    is left out and the rest renormalized. Averaged over queries and images. L x (B, H, T, T) -> (L, H).
    """
    c = model.config
    p = c.num_prefix_tokens
    distance = grid_distances(c.grid_size, c.patch_size)  # (N, N) pixels
    rows = []
    for attention in attentions:
        weights = attention[..., p:, p:].double()  # (B, H, N, N)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        rows.append((weights * distance).sum(dim=-1).mean(dim=(0, 2)))  # (H,)
    return torch.stack(rows).float()
