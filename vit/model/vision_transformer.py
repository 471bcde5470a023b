"""The Vision Transformer (Dosovitskiy et al. 2021), top-down in the order of its equations:

1. patches:   x_n = E p_n + b                      (vit/model/patch_embed.py)
2. tokens:    X = [x_cls; x_1; ...; x_N] + PE       (prefix tokens as configured; vit/model/pos_embed.py)
3. layers:    X <- TransformerLayer(X), L times     (vit/model/layer.py, attention in vit/model/attention.py;
              rotary phases and a relative position bias, where configured, enter each layer's attention)
4. pool:      y = LN(X)_cls  or  mean_n LN(X)_n     (or attention pooling, vit/model/pool.py)
5. head:      logits = W_head y + b_head

The prefix before the patches is [class token, DeiT's distillation token, register tokens], each optional;
averages and attention pooling read the patches alone unless pool_prefix says otherwise. CLIP-like models
normalise X before step 3 (embed_norm); timm's average-pooling models move step 4's norm after the mean (fc_norm).

When the class token alone is pooled, the logits read only its row of the last layer's output, so forward()
asks the last layer for that row alone (TransformerLayer.forward_first_token: queries from the class token,
keys and values from every token): the same logits for 1/L-th less of the work. forward_features keeps every
token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vit.model.config import ViTConfig
from vit.model.init import init_weights
from vit.model.layer import TransformerLayer
from vit.model.norm import make_norm
from vit.model.patch_embed import PatchEmbed
from vit.model.pool import AttentionPool
from vit.model.pos_embed import AbsolutePositionEmbedding, MixedRotaryEmbedding2d, RotaryEmbedding2d
from vit.model.rel_pos import RelativePositionBias


class VisionTransformer(nn.Module):
    """A ViT classifier declared by a ViTConfig. forward(images (B, C, H, W)) -> logits (B, num_classes).

    Any image size that is a whole number of patches is accepted: fixed position tables are
    recomputed for its grid, a learned table is resampled to it.
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = c = config
        D, norm = c.embed_dim, partial(make_norm, c.norm_layer, eps=c.norm_eps)  # every norm of the model, by width
        # 1. patches
        self.patch_embed = PatchEmbed(
            c.patch_size, c.in_chans, D, bias=c.patch_bias, norm=norm(D) if c.patch_norm else None
        )
        # 2. tokens and their positions
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if c.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if c.distill_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, c.reg_tokens, D)) if c.reg_tokens else None
        self.pos_embed = (
            AbsolutePositionEmbedding(
                c.pos_embed,
                c.grid_size,
                D,
                c.num_prefix_tokens,
                c.pos_temperature,
                prefix_rows=c.pos_embed_prefix,
                resampling=c.pos_resample,
                antialias=c.pos_resample_antialias,
                align_corners=c.pos_resample_corners,
                square=c.pos_resample_square,
            )
            if c.pos_embed in ("learned", "factorized", "sincos2d", "sincos1d")
            else None
        )
        self.rope = _rotary_embedding(c) if c.uses_rope else None
        biases = 0 if c.rel_pos == "none" else 1 if c.rel_pos_shared else c.depth  # rel_pos: shared, or one a layer
        self.rel_pos = nn.ModuleList(
            RelativePositionBias(c.num_heads, c.rel_pos_dim, c.num_prefix_tokens) for _ in range(biases)
        )
        self.pos_drop = nn.Dropout(c.dropout)
        self.embed_norm = norm(D) if c.embed_norm else nn.Identity()
        # 3. layers, stochastic depth rising linearly from 0 at the first to drop_path at the last
        rates = [c.drop_path * i / max(c.depth - 1, 1) for i in range(c.depth)]
        self.layers = nn.ModuleList(TransformerLayer(c, rate, index) for index, rate in enumerate(rates))
        # 4. pool: post-norm layers already end in a norm, so only (res-post) pre-norm needs a final one, before
        # pooling or, with fc_norm, after it
        final_norm = c.norm != "post" and c.final_norm and not c.fc_norm
        self.norm = norm(D) if final_norm else nn.Identity()
        self.attn_pool = (
            AttentionPool(
                D,
                c.pool_heads or c.num_heads,
                int(D * c.pool_mlp_ratio) if c.pool_mlp_ratio else c.mlp_hidden_dim,
                c.act,
                norm(D),
                c.fused_attn,
            )
            if c.pool == "map"
            else None
        )
        self.fc_norm = norm(c.pooled_dim) if c.fc_norm else nn.Identity()
        # 5. head, and DeiT's second head on the distillation token
        self.head_drop = nn.Dropout(c.head_dropout)
        self.head = nn.Linear(c.pooled_dim, c.num_classes) if c.num_classes else nn.Identity()
        self.head_dist = nn.Linear(D, c.num_classes) if c.num_classes and c.distill_token else None
        init_weights(self)

    def _tokens(self, images: Tensor) -> tuple[Tensor, list[tuple[tuple[Tensor, Tensor] | None, Tensor | None]]]:
        """Steps 1 and 2: (B, C, H, W) -> tokens (B, P + N, D) with their positions, and each layer's rope phases
        and relative position bias."""
        x, grid = self.patch_embed(images)  # (B, N, D), N = h * w
        prefix = [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if prefix:  # in the patches' dtype, as the position table is: bf16 under autocast, not promoted to fp32
            x = torch.cat([t.expand(x.shape[0], -1, -1).to(x.dtype) for t in prefix] + [x], dim=1)  # (B, P + N, D)
        if self.pos_embed is not None:
            x = self.pos_embed(x, grid)
        return self.embed_norm(self.pos_drop(x)), self._positions(grid)

    def _positions(self, grid: tuple[int, int]) -> list[tuple[tuple[Tensor, Tensor] | None, Tensor | None]]:
        """What each layer's attention takes of the tokens' positions: rope's (cos, sin), one pair (P + N, d) for all
        or with rope_mixed each layer's own per head (H, P + N, d); and a relative position bias (H, P + N, P + N),
        shared or each layer's. None where the model has neither."""
        depth = self.config.depth
        phases: list[tuple[Tensor, Tensor] | None] = [None] * depth
        if self.rope is not None:
            cos, sin = self.rope(grid)
            phases = list(zip(cos, sin, strict=True)) if self.config.rope_mixed else [(cos, sin)] * depth
        biases: list[Tensor | None] = [bias(grid) for bias in self.rel_pos]  # none, one shared, or one a layer
        if len(biases) <= 1:
            biases = (biases or [None]) * depth
        return list(zip(phases, biases, strict=True))

    def _encode(self, images: Tensor, need_weights: bool) -> tuple[Tensor, list[Tensor]]:
        """(B, C, H, W) -> normalised tokens (B, P + N, D) and, when need_weights, every layer's attention."""
        x, positions = self._tokens(images)
        attention = []
        for layer, (rope, bias) in zip(self.layers, positions, strict=True):
            x, weights = self._run(layer, x, rope, bias, need_weights)
            if need_weights:
                attention.append(weights)  # (B, H, P + N, P + N)
        return self.norm(x), attention

    def _run(self, layer: Callable[..., Any], *args: Any) -> Any:
        """layer(*args), recomputed in the backward pass instead of kept when training with grad_checkpointing."""
        if self.config.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def forward_features(self, images: Tensor) -> Tensor:
        """Every token after the last layer and final norm: (B, C, H, W) -> (B, P + N, D)."""
        return self._encode(images, need_weights=False)[0]

    def forward_intermediates(
        self,
        images: Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ) -> list[Any] | tuple[Tensor, list[Any]]:
        """The tokens after chosen layers, as timm's forward_intermediates gives them (feature extraction, the
        linear probes of DINOv2/v3). `indices`: the last n layers, or layer indices (negative from the end); all
        when None. `norm`: through the final norm. Patch tokens as (B, D, h, w) for output_fmt 'NCHW', (B, N, D)
        for 'NLC'; with return_prefix_tokens each is a pair (patches, prefix tokens (B, P, D)). Returns the list, or
        (forward_features(images), the list) unless intermediates_only."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r}: 'NCHW' or 'NLC'")
        depth, P = self.config.depth, self.config.num_prefix_tokens
        wanted = (
            range(depth) if indices is None else range(depth - indices, depth) if isinstance(indices, int) else indices
        )
        chosen = sorted({k % depth for k in wanted if -depth <= k < depth})
        if len(chosen) != len(set(wanted)):
            raise ValueError(f"indices={indices}: layers run from 0 to {depth - 1} (or -{depth} to -1)")
        x, positions = self._tokens(images)
        h, w = (size // patch for size, patch in zip(images.shape[-2:], self.config.patch_size, strict=True))
        out = []
        for k, (layer, (rope, bias)) in enumerate(zip(self.layers, positions, strict=True)):
            if k > chosen[-1] and intermediates_only:
                break
            x, _ = self._run(layer, x, rope, bias)
            if k in chosen:
                tokens = self.norm(x) if norm else x
                patches = tokens[:, P:]  # (B, N, D)
                if output_fmt == "NCHW":
                    patches = patches.transpose(1, 2).reshape(x.shape[0], -1, h, w)  # (B, D, h, w)
                out.append((patches, tokens[:, :P]) if return_prefix_tokens else patches)
        return out if intermediates_only else (self.norm(x), out)

    def pool(self, tokens: Tensor) -> Tensor:
        """(B, P + N, D) -> (B, D): the class token, the mean over patch tokens, their attention pooling, or
        (B, 2D) for 'token_avg': the class token beside the patches' mean. With pool_prefix the mean and the
        attention pooling read the prefix tokens too."""
        c = self.config
        pool, patches = c.pool, tokens if c.pool_prefix else tokens[:, c.num_prefix_tokens :]
        if pool == "token":
            return tokens[:, 0]
        if pool == "map":
            return self.attn_pool(patches)
        if pool == "token_avg":
            return torch.cat((tokens[:, 0], patches.mean(dim=1)), dim=-1)
        return patches.mean(dim=1)

    def forward_head(self, tokens: Tensor, pre_logits: bool = False) -> Tensor:
        """(B, P + N, D) -> logits (B, num_classes), or the pooled features when pre_logits (or without a head).
        DeiT's distilled model averages its class and distillation tokens: through their two heads, or as
        features (timm's pre_logits and headless output)."""
        pooled = self.head_drop(self.fc_norm(self.pool(tokens)))
        if self.config.distill_token:
            distilled = self.head_drop(self.fc_norm(tokens[:, 1]))
            if pre_logits or self.head_dist is None:
                return (pooled + distilled) / 2
            return (self.head(pooled) + self.head_dist(distilled)) / 2
        return pooled if pre_logits else self.head(pooled)

    def forward_heads(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """DeiT's two outputs, which forward averages: the class token's logits and the distillation token's, each
        (B, num_classes); without a distillation token, the logits twice (distillation then reads the class token)."""
        tokens = self.forward_features(images)
        if not self.config.distill_token or self.head_dist is None:
            logits = self.forward_head(tokens)
            return logits, logits
        pooled, distilled = self.fc_norm(self.pool(tokens)), self.fc_norm(tokens[:, 1])
        return self.head(self.head_drop(pooled)), self.head_dist(self.head_drop(distilled))

    def forward(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> logits (B, num_classes); forward_head(forward_features(images)) is the reference."""
        if self.config.pool != "token" or self.config.distill_token:
            return self.forward_head(self.forward_features(images))
        x, positions = self._tokens(images)
        for layer, (rope, bias) in zip(self.layers[:-1], positions[:-1], strict=True):
            x, _ = self._run(layer, x, rope, bias)
        last = self._run(self.layers[-1].forward_first_token, x, *positions[-1])  # row 0: (B, 1, D)
        return self.forward_head(self.norm(last))

    def forward_packed(self, images: Sequence[Tensor], max_tokens: int | None = None) -> Tensor:
        """NaViT's patch-and-pack (Dehghani et al. 2023): images (C, H_i, W_i), each at its own size and aspect
        ratio (a whole number of patches) -> logits (I, num_classes), forward()'s for each image alone.

        Image i is embedded at its own grid h_i x w_i with its own positions (steps 1-2 at that grid: the table
        resampled or recomputed for it, rotary phases and relative bias at it). The images' tokens are packed, in
        order, into sequences of at most `max_tokens` tokens (one sequence when None), X_s = [X_i; X_j; ...];
        attention stays within each image, softmax(Q Kᵀ / √D_k + M) V with M_st = 0 where tokens s and t are of
        one image and -inf where not (a block-diagonal mask, added to each image's own bias). Each image is pooled
        from its own tokens (steps 4-5).

        The images of one size are embedded together and those of one token count pooled together: a batch's few
        shapes cost a few calls, not one an image."""
        groups = list(_groups([tuple(image.shape) for image in images]).values())  # the images of one size
        blocks, group_positions = [], []
        sizes, offsets = [0] * len(images), [0] * len(images)  # each image's tokens, and its first row below
        row = 0
        for indices in groups:
            x, shared = self._tokens(torch.stack([images[i] for i in indices]))  # one grid, one set of positions
            n = x.shape[1]
            for j, i in enumerate(indices):
                sizes[i], offsets[i] = n, row + j * n
            row += len(indices) * n
            blocks.append(x.flatten(0, 1))  # the group's tokens, image after image
            group_positions.append(shared)
        sequences = pack(sizes, max_tokens)  # which images each sequence holds
        slots = _slots(sequences, sizes, offsets, images[0].device)  # where each token goes: S sequences of L
        x = _gathered(torch.cat(blocks), slots, 0.0)  # (S, L, D), padding zero
        mask = _block_mask(slots, x.dtype)  # (S, 1, L, L)
        previous, packed = None, None
        for layer, per_group in zip(self.layers, zip(*group_positions, strict=True), strict=True):
            # the layers share one rope pair and bias unless rope_mixed or per-layer rel_pos: packed once then
            if previous is None or not _same(per_group, previous):
                packed = _packed_positions(per_group, groups, slots, mask)
            previous = per_group
            x, _ = self._run(layer, x, *packed)
        x = self.norm(x).flatten(0, 1)  # (S L, D)
        logits: list[Tensor] = [torch.empty(0)] * len(images)
        for n, indices in _groups(sizes).items():  # the images of n tokens, gathered (m, n, D) and pooled at once
            first = torch.tensor([slots.starts[i] for i in indices], device=x.device)
            rows = first[:, None] + torch.arange(n, device=x.device)  # (m, n): their slots
            for i, out in zip(indices, self.forward_head(x[rows]), strict=True):
                logits[i] = out
        return torch.stack(logits)

    @torch.no_grad()
    def attention_maps(self, images: Tensor) -> list[Tensor]:
        """Every layer's attention weights for these images, by the explicit path: L x (B, H, P + N, P + N).

        Works on any model, whichever path it trains with; the weights match what the fast path computes.
        """
        return self._encode(images, need_weights=True)[1]

    def layer_of(self, name: str) -> int:
        """The depth of a parameter for layer-wise learning-rate decay: 0 for the patch embedding, class
        token and position table, l + 1 for layers.l, depth + 1 for the final norm and the head."""
        if name.startswith("layers.") or (name.startswith("rel_pos.") and not self.config.rel_pos_shared):
            return int(name.split(".")[1]) + 1  # layer l's own relative position bias learns with layer l
        if name.startswith(
            ("patch_embed.", "cls_token", "dist_token", "reg_token", "pos_embed.", "rope.", "rel_pos.", "embed_norm.")
        ):
            return 0
        return self.config.depth + 1

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay must leave alone besides biases and norms: tokens, tables, frequencies."""
        names = {name for name in ("cls_token", "dist_token", "reg_token") if getattr(self, name) is not None}
        if self.pos_embed is not None and self.pos_embed.learned:
            names |= {name for name, _ in self.named_parameters() if name.startswith("pos_embed.")}
        if self.config.rope_mixed:
            names.add("rope.freqs")
        return names


def _rotary_embedding(c: ViTConfig) -> nn.Module:
    """The phases that attention turns queries and keys by: fixed axial ones, or RoPE-Mixed's learned per layer."""
    positions = dict(ref_grid=c.rope_ref_grid, kind=c.rope_grid, offset=c.rope_grid_offset)
    if c.rope_mixed:
        return MixedRotaryEmbedding2d(
            c.grid_size, c.head_dim, c.depth, c.num_heads, c.num_prefix_tokens, c.pos_temperature, **positions
        )
    return RotaryEmbedding2d(
        c.grid_size, c.head_dim, c.num_prefix_tokens, c.pos_temperature, axes=c.rope_axes, **positions
    )


def pack(sizes: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Images of `sizes` tokens into sequences of at most `max_tokens` (first fit, in order): each sequence's image
    indices. One image longer than `max_tokens` is a ValueError."""
    if max_tokens is None:
        return [list(range(len(sizes)))]
    if too_long := [n for n in sizes if n > max_tokens]:
        raise ValueError(f"an image of {too_long[0]} tokens does not fit a sequence of max_tokens={max_tokens}")
    sequences: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(sizes):
        k = next((k for k, free in enumerate(room) if free >= n), len(sequences))
        if k == len(sequences):
            sequences.append([])
            room.append(max_tokens)
        sequences[k].append(i)
        room[k] -= n
    return sequences


def _groups(keys: Sequence[Any]) -> dict[Any, list[int]]:
    """The indices of equal keys, in order of first appearance."""
    out: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        out.setdefault(key, []).append(i)
    return out


class _Slots(NamedTuple):
    """Where packed images' tokens sit: S sequences of L slots, taken from T rows of tokens (the images' own)."""

    source: Tensor  # (S, L): each slot's row of the T, T (a padding row) where none
    owner: Tensor  # (S, L): each slot's image; -1 - slot for padding, so that a padding slot is alone
    starts: list[int]  # each image's first slot in the flattened S L slots


def _slots(sequences: list[list[int]], sizes: Sequence[int], offsets: Sequence[int], device: Any) -> _Slots:
    """The slots of images of `sizes` tokens, image i's at rows offsets[i].., packed as `sequences`, each padded
    to the longest."""
    length, end = max(sum(sizes[i] for i in s) for s in sequences), sum(sizes)
    source: list[int] = []
    owner: list[int] = []
    starts = [0] * len(sizes)
    for k, sequence in enumerate(sequences):
        for i in sequence:
            starts[i] = len(source)
            source.extend(range(offsets[i], offsets[i] + sizes[i]))
            owner.extend([i] * sizes[i])
        padding = range(len(source), (k + 1) * length)
        source.extend([end] * len(padding))
        owner.extend(-1 - slot for slot in padding)
    as_slots = lambda values: torch.tensor(values, device=device).view(len(sequences), length)  # noqa: E731
    return _Slots(as_slots(source), as_slots(owner), starts)


def _gathered(rows: Tensor, slots: _Slots, fill: float) -> Tensor:
    """Per-token rows of the images end to end, (T, d) or (H, T, d), in their slots: (S, L, d) or (S, H, L, d),
    `fill` in the padding slots."""
    padded = torch.cat((rows, rows.new_full((*rows.shape[:-2], 1, rows.shape[-1]), fill)), dim=-2)
    if rows.dim() == 2:
        return padded[slots.source]
    return padded[:, slots.source].movedim(1, 0)


def _same(positions: Sequence[tuple[Any, Any]], others: Sequence[tuple[Any, Any]]) -> bool:
    """Whether two layers' per-image (rope, bias) are the very same tensors (one shared by every layer)."""
    return all(a is b for now, then in zip(positions, others, strict=True) for a, b in zip(now, then, strict=True))


def _block_mask(slots: _Slots, dtype: torch.dtype) -> Tensor:
    """(S, 1, L, L): 0 between the tokens of one image, -inf elsewhere; a padding token sees itself alone."""
    own = slots.owner[:, :, None] == slots.owner[:, None, :]
    return torch.zeros(own.shape, dtype=dtype, device=own.device).masked_fill(~own, float("-inf")).unsqueeze(1)


def _packed_positions(
    per_group: Sequence[tuple[tuple[Tensor, Tensor] | None, Tensor | None]],
    groups: Sequence[Sequence[int]],
    slots: _Slots,
    mask: Tensor,
) -> tuple[tuple[Tensor, Tensor] | None, Tensor]:
    """One layer's positions of packed images, given each group's (the images of one size, whose tokens lie end
    to end in the rows): the rotary phases, each image's (..., P + N_i, d) in its slots and the identity rotation in
    padding -> (S, 1 or H, L, d); and the attention bias (S, 1 or H, L, L): the images' relative position biases
    on the diagonal blocks plus `mask`."""
    rope = None
    if per_group[0][0] is not None:
        each = [rope for (rope, _), indices in zip(per_group, groups, strict=True) for _ in indices]  # image by image
        cos, sin = (
            _gathered(torch.cat([rope[part] for rope in each], dim=-2), slots, fill)
            for part, fill in ((0, 1.0), (1, 0.0))  # padding turns by zero
        )
        rope = (cos, sin) if cos.dim() == 4 else (cos.unsqueeze(1), sin.unsqueeze(1))
    if per_group[0][1] is None:
        return rope, mask
    length = mask.shape[-1]
    bias = torch.zeros(mask.shape[0], per_group[0][1].shape[0], length, length, dtype=mask.dtype, device=mask.device)
    for (_, group_bias), indices in zip(per_group, groups, strict=True):
        n = group_bias.shape[-1]
        for i in indices:
            k, at = divmod(slots.starts[i], length)
            bias[k, :, at : at + n, at : at + n] = group_bias
    return rope, bias + mask
