"""NaViT's patch-and-pack (Dehghani et al. 2023) as bookkeeping: where the tokens of images of their own sizes sit
in a few sequences, and the attention bias that keeps each image to itself. VisionTransformer.forward_packed embeds,
runs the layers and pools; this file only places tokens and positions.

Images of one shape are embedded together (a group), their tokens end to end in the rows, group after group. The
images are packed, in order, into S sequences of at most `max_tokens` tokens (first fit), each padded to the longest
L; slot s of sequence k holds row `source[k, s]` of the tokens, or padding. Attention within sequence k adds
M_st = 0 where slots s and t hold one image's tokens and -inf where not: a block-diagonal mask, on which each image's
own relative position bias sits, while rotary phases go with their tokens (the identity rotation on padding). Without
relative biases the mask is kernels.document_mask's: on a GPU a FlexAttention BlockMask, never written out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask

from vit.model import kernels

Positions = tuple[tuple[Tensor, Tensor] | None, Tensor | None]  # a layer's (rope cos and sin, relative bias)


def pack(sizes: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Images of `sizes` tokens into sequences of at most `max_tokens` (first fit, in order): each sequence's image
    indices; one sequence when None. One image longer than `max_tokens` is a ValueError."""
    if max_tokens is None:
        return [list(range(len(sizes)))]
    if too_long := [n for n in sizes if n > max_tokens]:
        raise ValueError(f"an image of {too_long[0]} tokens does not fit a sequence of max_tokens={max_tokens}")
    sequences: list[list[int]] = []
    room: list[int] = []
    smallest, open_ = min(sizes, default=0), []  # open_: the sequences with room left for the smallest image
    for i, n in enumerate(sizes):
        k = next((k for k in open_ if room[k] >= n), len(sequences))
        if k == len(sequences):
            sequences.append([])
            room.append(max_tokens)
            open_.append(k)
        sequences[k].append(i)
        room[k] -= n
        if room[k] < smallest:
            open_.remove(k)
    return sequences


def groups(keys: Sequence[Any]) -> list[list[int]]:
    """The indices of equal keys (images' shapes, token counts), in order of first appearance."""
    out: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        out.setdefault(key, []).append(i)
    return list(out.values())


class Packing:
    """The slots of images packed into sequences. `shapes`: the images' groups (indices of one shape, as `groups`
    gives them) and each group's tokens an image; their rows run group after group, image after image."""

    def __init__(self, shape_groups: Sequence[Sequence[int]], lengths: Sequence[int], max_tokens: int | None, device):
        self.shape_groups = shape_groups
        count = sum(len(g) for g in shape_groups)
        sizes, offsets, row = np.zeros(count, np.int64), np.zeros(count, np.int64), 0  # tokens, and first row
        for indices, n in zip(shape_groups, lengths, strict=True):
            sizes[indices], offsets[indices] = n, row + n * np.arange(len(indices))
            row += len(indices) * n
        self.sizes = sizes.tolist()
        self.length_groups = groups(self.sizes)  # the images of one token count, as by_length gives them out
        sequences = pack(self.sizes, max_tokens)
        self.length = max(sum(self.sizes[i] for i in s) for s in sequences)  # L
        self.starts = [0] * count  # each image's first slot in the flattened S L slots
        for k, sequence in enumerate(sequences):
            at = k * self.length
            for i in sequence:
                self.starts[i], at = at, at + self.sizes[i]
        within = np.arange(row) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # each token's place in its image
        slot = np.repeat(self.starts, sizes) + within  # image by image, token by token
        source = np.full(len(sequences) * self.length, row)  # row: one past the last, where tokens() puts padding
        owner = -1 - np.arange(len(source))  # each padding slot its own owner: it sees itself alone
        source[slot], owner[slot] = np.repeat(offsets, sizes) + within, np.repeat(np.arange(count), sizes)
        slots = lambda values: torch.from_numpy(values).view(len(sequences), self.length).to(device)  # noqa: E731
        self.source, self.owner = slots(source), slots(owner)  # (S, L)

    def tokens(self, rows: Tensor, fill: float = 0.0) -> Tensor:
        """Per-token rows of the images end to end, (T, d) or (H, T, d), in their slots: (S, L, d) or (S, H, L, d),
        `fill` in the padding slots."""
        padded = torch.cat((rows, rows.new_full((*rows.shape[:-2], 1, rows.shape[-1]), fill)), dim=-2)
        picked = padded.index_select(-2, self.source.flatten()).unflatten(-2, self.source.shape)  # backward: index_add_
        return picked if rows.dim() == 2 else picked.movedim(1, 0)

    def mask(self, dtype: torch.dtype) -> Tensor | BlockMask:
        """0 between the tokens of one image, -inf elsewhere: (S, 1, L, L), or its BlockMask where FlexAttention
        serves (kernels.document_mask)."""
        return kernels.document_mask(self.owner, dtype)

    def layer_positions(self, per_group: Sequence[Sequence[Positions]], dtype: torch.dtype) -> Iterator[Positions]:
        """Each layer's positions of the packed images, given each group's per-layer (rope, bias): packed once for
        the layers that share the very same tensors (all but rope_mixed's and per-layer relative biases)."""
        mask, previous, packed = self.mask(dtype), None, None
        for layer in zip(*per_group, strict=True):  # this layer's positions, group by group
            if previous is None or not _same(layer, previous):
                packed = self._positions(layer, mask)
            previous = layer
            yield packed

    def _positions(
        self, per_group: Sequence[Positions], mask: Tensor | BlockMask
    ) -> tuple[tuple[Tensor, Tensor] | None, Tensor | BlockMask]:
        """One layer's rotary phases, each image's (..., P + N_i, d) in its slots and the identity in padding ->
        (S, 1 or H, L, d); and the bias (S, 1 or H, L, L): the images' relative biases on the diagonal blocks + mask."""
        rope = None
        if per_group[0][0] is not None:
            each = [rope for (rope, _), indices in zip(per_group, self.shape_groups, strict=True) for _ in indices]
            cos, sin = (
                self.tokens(torch.cat([r[part] for r in each], dim=-2), fill) for part, fill in ((0, 1.0), (1, 0.0))
            )
            rope = (cos, sin) if cos.dim() == 4 else (cos.unsqueeze(1), sin.unsqueeze(1))
        if per_group[0][1] is None:
            return rope, mask
        if isinstance(mask, BlockMask):  # the biases sit on the dense mask
            mask = kernels.dense_document_mask(self.owner, per_group[0][1].dtype)
        bias = mask.new_zeros(mask.shape[0], per_group[0][1].shape[0], self.length, self.length)
        for (_, group_bias), indices in zip(per_group, self.shape_groups, strict=True):
            n = group_bias.shape[-1]
            for i in indices:
                k, at = divmod(self.starts[i], self.length)
                bias[k, :, at : at + n, at : at + n] = group_bias
        return rope, bias + mask

    def by_length(self, x: Tensor) -> list[Tensor]:
        """The packed tokens (S, L, D) back out, the images of one token count together, (m, n, D) for each of
        length_groups."""
        flat, out = x.flatten(0, 1), []  # (S L, D)
        for indices in self.length_groups:
            first = torch.tensor([self.starts[i] for i in indices], device=x.device)
            rows = (first[:, None] + torch.arange(self.sizes[indices[0]], device=x.device)).flatten()
            out.append(flat.index_select(0, rows).view(len(indices), self.sizes[indices[0]], -1))
        return out

    def in_order(self, per_length: Sequence[Tensor]) -> Tensor:
        """The rows of by_length's groups, (m, ...) each, back in the images' order: (I, ...)."""
        order = torch.tensor([i for indices in self.length_groups for i in indices], device=per_length[0].device)
        return torch.cat(per_length).index_select(0, order.argsort())


def _same(positions: Sequence[Positions], others: Sequence[Positions]) -> bool:
    """Whether two layers' per-group (rope, bias) are the very same tensors (one shared by every layer)."""
    return all(a is b for now, then in zip(positions, others, strict=True) for a, b in zip(now, then, strict=True))
