"""Position information for a grid of patches: pure functions for the tables, thin modules that apply them.

Conventions, pinned by tests/model/test_pos_embed.py:
- A grid position is (y, x) = (row, column) of the patch; the raster index is n = y * W + x.
- The 1D sinusoid of Vaswani et al. interleaves a sin/cos pair per frequency:
  PE(p)[2i] = sin(p * w_i), PE(p)[2i + 1] = cos(p * w_i), with w_i = T^(-2i / d), i = 0 .. d/2 - 1,
  so the wavelengths 2*pi*T^(2i/d) grow steadily from 2*pi to almost 2*pi*T.
- 2D: PE(x, y) = concat(PE_1d(x), PE_1d(y)), each of d/2 dims: the first half encodes the column x,
  the second half the row y. (big_vision and vit-pytorch use [sin x | cos x | sin y | cos y] blocks
  instead; timm's default differs again. Converting weights between them is a permutation.)
- rope2d rotates the same pairs by the same phases: within a head, dims [0, d/2) rotate with x and
  [d/2, d) with y; pair (2i, 2i+1) turns by the angle whose sin/cos sincos_2d would write there.
- Prefix tokens (class, distillation, registers) have no position: fixed tables give them zeros, rope leaves
  them unrotated; a learned table gives each its own trainable vector, unless prefix_rows is off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.model import kernels
from vit.model.config import Resampling

GridSize = tuple[int, int]  # (rows, columns) of patches


def frequencies(dim: int, temperature: float = 10000.0) -> Tensor:
    """w_i = T^(-2i/dim) for i = 0 .. dim/2 - 1: one angular frequency per sin/cos pair. (dim/2,)"""
    if dim % 2:
        raise ValueError(f"a sinusoid table needs an even dim, got {dim}")
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return temperature**-exponents


def sincos_1d(positions: Tensor, dim: int, temperature: float = 10000.0) -> Tensor:
    """Vaswani's encoding of each position: (N,) -> (N, dim), sin/cos interleaved per frequency."""
    angles = positions.double()[:, None] * frequencies(dim, temperature)[None, :]  # (N, dim/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).float()  # (N, dim)


def _axial_angles(
    grid: GridSize, dim: int, temperature: float, axes: str = "xy", positions: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """Phases of the 2D encoding: x * w_i for the first dim/4 pairs, y * w_i for the rest ('xy'; 'yx' swaps
    the halves). The positions of the rows and columns are their indices unless given. (h, w, dim/2)"""
    if dim % 4:
        raise ValueError(f"a 2D sinusoid table needs dim divisible by 4, got {dim}")
    h, w = grid
    omega = frequencies(dim // 2, temperature)  # (dim/4,)
    rows, columns = positions or (torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64))
    y, x = torch.meshgrid(rows, columns, indexing="ij")
    first, second = (x, y) if axes == "xy" else (y, x)
    return torch.cat((first[..., None] * omega, second[..., None] * omega), dim=-1)  # (h, w, dim/2)


def sincos_2d(grid: GridSize, dim: int, temperature: float = 10000.0) -> Tensor:
    """PE(x, y) = concat(PE_1d(x), PE_1d(y)) for every patch of the grid. (h, w, dim)"""
    angles = _axial_angles(grid, dim, temperature)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).float()


def sincos_1d_grid(grid: GridSize, dim: int, temperature: float = 10000.0) -> Tensor:
    """The 1D encoding of each patch's raster index n = y * W + x, laid out on the grid. (h, w, dim)"""
    h, w = grid
    return sincos_1d(torch.arange(h * w), dim, temperature).reshape(h, w, dim)


def resample(
    table: Tensor,
    new_grid: GridSize,
    mode: str = "bicubic",
    *,
    antialias: bool = True,
    align_corners: bool = False,
    square: bool = False,
) -> Tensor:
    """A (h, w, D) table interpolated to (h', w', D): bicubically as timm's resample_abs_pos_embed does (or
    bilinearly, as SigLIP 2 resizes its table), antialiased, corners not aligned, unless told otherwise. `square`
    keeps the aspect ratio as RADIO does: the table goes to a max(h', w') square whose top-left h' x w' is kept, so a
    patch's position vector depends on its row and column alone, not on the image's shape.

    Returns a new tensor; the same grid gives an unchanged copy.
    """
    h, w = new_grid
    size = (max(h, w),) * 2 if square else (h, w)
    if tuple(table.shape[:2]) in ((h, w), size):
        return table[:h, :w].clone()
    grid = table.permute(2, 0, 1)[None].float()  # (1, D, h, w)
    grid = F.interpolate(grid, size=size, mode=mode, antialias=antialias, align_corners=align_corners)
    return grid[0, :, :h, :w].permute(1, 2, 0).to(table.dtype)  # (h', w', D)


def resample_axis(table: Tensor, length: int, align_corners: bool = False) -> Tensor:
    """One axis's (n, D) table interpolated linearly to (length, D), as NaViT's factorized tables are resampled
    (timm's NaFlexVit); the same length gives the table itself."""
    if table.shape[0] == length:
        return table
    line = table.T[None].float()  # (1, D, n)
    return F.interpolate(line, size=length, mode="linear", align_corners=align_corners)[0].T.to(table.dtype)


def rope_positions(
    grid: GridSize, kind: str = "index", ref_grid: GridSize | None = None, offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    """The rotary positions of a grid's rows and columns, j = 0 .. s-1 moved by `offset`: 'index' j, scaled by
    ref_grid / grid with a ref_grid (EVA's ref_feat_shape: any grid spans the reference grid's phases); 'centered'
    2π(2(j + ½)/s - 1), DINOv3's cell centres in [-1, 1] with its 2π folded in. 2 x (s,) float64"""
    out = []
    for axis, s in enumerate(grid):
        j = torch.arange(s, dtype=torch.float64) + offset
        if kind == "centered":
            out.append(2 * math.pi * (2 * (j + 0.5) / s - 1))
        else:
            out.append(j if ref_grid is None else j * (ref_grid[axis] / s))
    return out[0], out[1]


def rope_2d(
    grid: GridSize,
    head_dim: int,
    temperature: float = 10000.0,
    axes: str = "xy",
    ref_grid: GridSize | None = None,
    kind: str = "index",
    offset: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """cos and sin of the axial rotary phases, repeated for both members of a pair. 2 x (h*w, head_dim)

    `axes` names the axis of the first half of the pairs ('yx' is EVA-02's and DINOv3's layout); `kind` and
    `ref_grid` place the positions (rope_positions)."""
    positions = rope_positions(grid, kind, ref_grid, offset)
    angles = _axial_angles(grid, head_dim, temperature, axes, positions).flatten(0, 1)  # (N, head_dim/2)
    angles = angles.repeat_interleave(2, dim=-1)  # (N, head_dim)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_2i, x_2i+1) of x (..., N, d) by the phase whose cos/sin (N, d) are given, repeated for
    both members of a pair: (x_2i cos - x_2i+1 sin, x_2i+1 cos + x_2i sin), in x's dtype (kernels.rope: eager a
    complex product, compiled a multiply-add)."""
    return kernels.rope(x, cos, sin)


def mixed_rope_frequencies(head_dim: int, depth: int, num_heads: int, temperature: float) -> Tensor:
    """RoPE-Mixed's starting frequencies (Heo et al. 2024): per layer and head, the axial frequencies w_i along a
    random direction phi for the first half of the pairs and along phi + pi/2 for the rest, as (f_x, f_y); training
    then moves them freely. (2, depth, num_heads, head_dim/2)"""
    omega = frequencies(head_dim // 2, temperature).float()  # (head_dim/4,)
    phi = torch.rand(depth, num_heads, 1) * 2 * math.pi
    f_x = torch.cat((omega * phi.cos(), omega * (phi + math.pi / 2).cos()), dim=-1)
    f_y = torch.cat((omega * phi.sin(), omega * (phi + math.pi / 2).sin()), dim=-1)
    return torch.stack((f_x, f_y))


FIXED_TABLES = {"sincos2d": sincos_2d, "sincos1d": sincos_1d_grid}


class AbsolutePositionEmbedding(nn.Module):
    """Adds a position vector to every token: a trainable (h, w, D) grid, or a fixed sinusoid table.

    A fixed table is a non-persistent buffer: never trained, never saved, recomputed for any grid.
    A learned table at another grid than its own is resampled on the fly, as `resampling` says (bicubically by
    default).
    """

    def __init__(
        self,
        kind: str,
        grid: GridSize,
        dim: int,
        num_prefix_tokens: int,
        temperature: float,
        prefix_rows: bool = True,
        resampling: Resampling | None = None,
    ):
        super().__init__()
        self.kind, self.grid, self.temperature = kind, tuple(grid), temperature
        self.resampling = resampling or Resampling()
        self.num_prefix_tokens = num_prefix_tokens
        if kind in ("learned", "factorized"):
            if kind == "learned":
                self.table = nn.Parameter(torch.zeros(*grid, dim))  # (h, w, D)
            else:  # NaViT's factorized table: PE(x, y) = T_y[y] + T_x[x]
                self.rows, self.cols = nn.Parameter(torch.zeros(grid[0], dim)), nn.Parameter(torch.zeros(grid[1], dim))
            rows = num_prefix_tokens if prefix_rows else 0  # timm's no_embed_class: no rows
            self.prefix = nn.Parameter(torch.zeros(rows, dim)) if rows else None
        elif kind in FIXED_TABLES:
            self.register_buffer("table", FIXED_TABLES[kind](grid, dim, temperature), persistent=False)
            self.prefix = None
            self.other_grids = kernels.GridCache()
        else:
            raise ValueError(f"not an absolute position embedding: {kind!r}")

    @property
    def learned(self) -> bool:
        """Whether the table is trained: 'learned' or 'factorized'."""
        return self.kind in ("learned", "factorized")

    @property
    def tables(self) -> list[nn.Parameter]:
        """The learned grid, or the factorized one's row and column tables."""
        return [self.table] if self.kind == "learned" else [self.rows, self.cols] if self.learned else []

    def table_for(self, grid: GridSize) -> Tensor:
        """The (h, w, D) table for a patch grid."""
        if self.kind == "factorized":  # each axis resampled on its own, to the longer side's length if square
            if tuple(grid) == self.grid:
                return self.rows[:, None] + self.cols[None, :]
            (h, w), r = grid, self.resampling
            n_y, n_x = (max(h, w),) * 2 if r.square else (h, w)
            rows, cols = resample_axis(self.rows, n_y, r.corners)[:h], resample_axis(self.cols, n_x, r.corners)[:w]
            return rows[:, None] + cols[None, :]
        if tuple(grid) == self.grid:
            return self.table
        if self.learned:
            r = self.resampling
            return resample(self.table, grid, r.mode, antialias=r.antialias, align_corners=r.corners, square=r.square)
        compute, dim, device = FIXED_TABLES[self.kind], self.table.shape[-1], self.table.device
        return self.other_grids.get(grid, device, lambda: compute(grid, dim, self.temperature).to(device))

    def forward(self, x: Tensor, grid: GridSize) -> Tensor:  # x: (B, P + h*w, D)
        pos = self.table_for(grid).flatten(0, 1)  # (h*w, D)
        p = self.num_prefix_tokens
        if self.prefix is not None:
            return x + torch.cat((self.prefix, pos), dim=0).to(x.dtype)
        if p:
            return torch.cat((x[:, :p], x[:, p:] + pos.to(x.dtype)), dim=1)
        return x + pos.to(x.dtype)


class RotaryEmbedding2d(nn.Module):
    """Supplies the (cos, sin) phases that attention applies to queries and keys; prefix tokens stay put."""

    def __init__(
        self,
        grid: GridSize,
        head_dim: int,
        num_prefix_tokens: int,
        temperature: float,
        axes: str = "xy",
        ref_grid: GridSize | None = None,
        kind: str = "index",
        offset: float = 0.0,
    ):
        super().__init__()
        self.grid, self.head_dim, self.temperature = tuple(grid), head_dim, temperature
        self.num_prefix_tokens, self.axes, self.ref_grid, self.kind = num_prefix_tokens, axes, ref_grid, kind
        self.offset = offset
        cos, sin = self._phases(self.grid)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.other_grids = kernels.GridCache()

    def _phases(self, grid: GridSize) -> tuple[Tensor, Tensor]:
        cos, sin = rope_2d(grid, self.head_dim, self.temperature, self.axes, self.ref_grid, self.kind, self.offset)
        p = self.num_prefix_tokens
        return F.pad(cos, (0, 0, p, 0), value=1.0), F.pad(sin, (0, 0, p, 0))  # (P + N, d): identity on prefix

    def forward(self, grid: GridSize) -> tuple[Tensor, Tensor]:
        if tuple(grid) == self.grid:
            return self.cos, self.sin
        device = self.cos.device
        return self.other_grids.get(grid, device, lambda: tuple(t.to(device) for t in self._phases(grid)))


class MixedRotaryEmbedding2d(nn.Module):
    """RoPE-Mixed: layer l's head h turns pair i by theta = f_x x + f_y y with its own learned (f_x, f_y), so the
    rotation can follow any direction of the grid, diagonals included. Phases per layer; prefix tokens stay put."""

    def __init__(
        self,
        grid: GridSize,
        head_dim: int,
        depth: int,
        num_heads: int,
        num_prefix_tokens: int,
        temperature: float,
        ref_grid: GridSize | None = None,
        kind: str = "index",
        offset: float = 0.0,
    ):
        super().__init__()
        self.num_prefix_tokens, self.ref_grid, self.kind, self.offset = num_prefix_tokens, ref_grid, kind, offset
        self.freqs = nn.Parameter(mixed_rope_frequencies(head_dim, depth, num_heads, temperature))

    def forward(self, grid: GridSize) -> tuple[Tensor, Tensor]:
        """cos and sin of every layer's phases, repeated for both members of a pair. 2 x (L, H, P + N, d)"""
        rows, columns = rope_positions(grid, self.kind, self.ref_grid, self.offset)
        y, x = (t.flatten().to(self.freqs) for t in torch.meshgrid(rows, columns, indexing="ij"))  # (N,) each
        f_x, f_y = self.freqs[:, :, :, None]  # (L, H, 1, d/2) each
        angles = (x[:, None] * f_x + y[:, None] * f_y).repeat_interleave(2, dim=-1)  # (L, H, N, d)
        p = self.num_prefix_tokens
        return F.pad(angles.cos(), (0, 0, p, 0), value=1.0), F.pad(angles.sin(), (0, 0, p, 0))
