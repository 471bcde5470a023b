"""Masked autoencoding's masking (He et al. 2022) as pure functions: which patches of each image stay visible, and
an encoder's tokens and positions restricted to them. The encoder then runs on the visible tokens only (what makes
MAE cheap), each carrying the position it had in the whole image: its table row is added before the masking, and its
rotary phases and relative position biases are gathered with it.

`keep` is (B, n): each image's visible patch indices (0 .. N-1), sorted; prefix tokens (class, registers) always stay.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

Positions = tuple[tuple[Tensor, Tensor] | None, Tensor | None]  # a layer's (rope cos and sin, relative bias)


def visible_count(num_patches: int, mask_ratio: float) -> int:
    """⌊(1 - r) N⌋ patches stay visible, at least one: MAE's count, int(N (1 - r)) as its code and transformers'
    compute it (float rounding included)."""
    return max(1, int(num_patches * (1 - mask_ratio)))


def keep_of_noise(noise: Tensor, mask_ratio: float) -> Tensor:
    """MAE's argsort of noise: (B, N) noise -> each image's ⌊(1 - r) N⌋ patches of the lowest noise, sorted:
    the patches transformers' ViTMAE keeps for that `noise`."""
    keep = noise.argsort(dim=1)[:, : visible_count(noise.shape[1], mask_ratio)]
    return keep.sort(dim=1).values


def random_keep(batch: int, num_patches: int, mask_ratio: float, device=None, generator=None) -> Tensor:
    """Each image's visible patches, drawn uniformly without replacement (an independent shuffle an image, from
    uniform noise): (B, ⌊(1 - r) N⌋) indices, sorted."""
    return keep_of_noise(torch.rand(batch, num_patches, device=device, generator=generator), mask_ratio)


def _rows(keep: Tensor, prefix: int) -> Tensor:
    """The token rows that stay: every prefix row, then prefix + each visible patch. (B, P + n)"""
    first = torch.arange(prefix, device=keep.device).expand(keep.shape[0], prefix)
    return torch.cat((first, keep + prefix), dim=1)


def visible(tokens: Tensor, keep: Tensor, prefix: int) -> Tensor:
    """(B, P + N, D) tokens -> (B, P + n, D): the prefix and the visible patches, in keep's order."""
    rows = _rows(keep, prefix)
    return tokens.gather(1, rows[..., None].expand(-1, -1, tokens.shape[-1]))


def visible_positions(per_layer: Sequence[Positions], keep: Tensor, prefix: int) -> list[Positions]:
    """Each layer's rotary phases, (P + N, d) or RoPE-Mixed's (H, P + N, d) -> (B, 1 or H, P + n, d), and relative
    position bias, (H, P + N, P + N) -> (B, H, P + n, P + n), restricted to the tokens that stay; computed once for
    the layers that share the very same tensors."""
    rows = _rows(keep, prefix)  # (B, T)
    done: dict[int, Tensor] = {}

    def gathered(t: Tensor | None, pairwise: bool) -> Tensor | None:
        if t is None:
            return None
        if id(t) not in done:
            if pairwise:  # (H, T0, T0) -> (B, H, T, T)
                done[id(t)] = t[:, rows[:, :, None], rows[:, None, :]].movedim(1, 0)
            else:  # (T0, d) -> (B, 1, T, d); (H, T0, d) -> (B, H, T, d)
                done[id(t)] = t[rows].unsqueeze(1) if t.dim() == 2 else t[:, rows].movedim(1, 0)
        return done[id(t)]

    out: list[Positions] = []
    for rope, bias in per_layer:
        phases = None if rope is None else (gathered(rope[0], False), gathered(rope[1], False))
        out.append((phases, gathered(bias, True)))
    return out
