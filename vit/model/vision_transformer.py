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
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vit.model import masking, packing
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
        table = (c.table, c.grid_size, D, c.num_prefix_tokens, c.pos_temperature, c.pos_embed_prefix, c.pos_resample)
        self.pos_embed = AbsolutePositionEmbedding(*table) if c.table != "none" else None
        self.rope = _rotary_embedding(c) if c.rotary != "none" else None
        biases = {"none": 0, "mlp_shared": 1}.get(c.rel_pos, c.depth)  # rel_pos: none, one shared, or one a layer
        self.rel_pos = nn.ModuleList(
            RelativePositionBias(c.num_heads, c.rel_pos_dim, c.num_prefix_tokens) for _ in range(biases)
        )
        self.pos_drop = nn.Dropout(c.dropout)
        self.embed_norm = norm(D) if c.embed_norm else nn.Identity()
        # 3. layers, stochastic depth rising linearly from 0 at the first to drop_path at the last
        rates = [c.drop_path * i / max(c.depth - 1, 1) for i in range(c.depth)]
        self.layers = nn.ModuleList(TransformerLayer(c, rate, index) for index, rate in enumerate(rates))
        # 4. pool: post-norm layers already end in a norm, so only the other forms need a final one, before pooling
        # or (final_norm: pooled) after it
        self.norm = norm(D) if c.layer != "post" and c.final_norm == "tokens" else nn.Identity()
        pool_mlp = int(D * c.pool_mlp_ratio) if c.pool_mlp_ratio else c.mlp_hidden_dim
        self.attn_pool = (
            AttentionPool(D, c.pool_heads or c.num_heads, pool_mlp, c.act, norm(D)) if c.pool == "map" else None
        )
        self.fc_norm = norm(c.pooled_dim) if c.final_norm == "pooled" else nn.Identity()
        # 5. head, and DeiT's second head on the distillation token
        self.head_drop = nn.Dropout(c.head_dropout)
        self.head = nn.Linear(c.pooled_dim, c.num_classes) if c.num_classes else nn.Identity()
        self.head_dist = nn.Linear(D, c.num_classes) if c.num_classes and c.distill_token else None
        self.grad_checkpointing = False  # set_grad_checkpointing
        init_weights(self)

    def set_fused_attn(self, enable: bool = True) -> None:
        """Attention by torch's fused kernel where it serves (kernels.fused_attention_serves), or, disabled, by the
        explicit softmax path everywhere: the same values, a run setting rather than the network's."""
        for module in self.modules():
            if hasattr(module, "fused"):
                module.fused = enable

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Training recomputes each layer in the backward pass instead of keeping its activations: less memory, more
        time, the same gradients (timm's name for it)."""
        self.grad_checkpointing = enable

    def _tokens(self, images: Tensor, patches: tuple | None = None) -> tuple[Tensor, list[packing.Positions]]:
        """Steps 1 and 2: (B, C, H, W) -> tokens (B, P + N, D) with their positions, and each layer's rope phases
        and relative position bias (from the images' `patches`, step 1, where already embedded)."""
        x, grid = patches or self.patch_embed(images)  # (B, N, D), N = h * w
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
            phases = list(zip(cos, sin, strict=True)) if self.config.rotary == "rope_mixed" else [(cos, sin)] * depth
        biases: list[Tensor | None] = [bias(grid) for bias in self.rel_pos]  # none, one shared, or one a layer
        if len(biases) <= 1:
            biases = (biases or [None]) * depth
        return list(zip(phases, biases, strict=True))

    def _encode(self, images: Tensor, need_weights: bool, keep: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        """(B, C, H, W) -> normalised tokens (B, P + N, D) and, when need_weights, every layer's attention; with
        `keep`, the prefix and those patches alone (B, P + n, D), at their places (masking.py)."""
        x, positions = self._tokens(images)
        if keep is not None:
            P = self.config.num_prefix_tokens
            x, positions = masking.visible(x, keep, P), masking.visible_positions(positions, keep, P)
        attention = []
        for layer, (rope, bias) in zip(self.layers, positions, strict=True):
            x, weights = self._run(layer, x, rope, bias, need_weights)
            if need_weights:
                attention.append(weights)  # (B, H, P + N, P + N)
        return self.norm(x), attention

    def _run(self, layer: Callable[..., Any], *args: Any) -> Any:
        """layer(*args), recomputed in the backward pass instead of kept when training with grad_checkpointing."""
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def forward_features(self, images: Tensor, keep: Tensor | None = None) -> Tensor:
        """Every token after the last layer and final norm: (B, C, H, W) -> (B, P + N, D); with `keep` (B, n), each
        image's visible patches (masked autoencoding: the layers see the prefix and those alone) -> (B, P + n, D)."""
        return self._encode(images, need_weights=False, keep=keep)[0]

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
        return self.head_of(self.pool(tokens), tokens[:, 1] if self.config.distill_token else None, pre_logits)

    def head_of(self, pooled: Tensor, distilled: Tensor | None = None, pre_logits: bool = False) -> Tensor:
        """forward_head's second half: the pooled features (B, D), and DeiT's distillation token (B, D) where the
        model has one, -> logits (B, num_classes), or the features when pre_logits (or without a head)."""
        pooled = self.head_drop(self.fc_norm(pooled))
        if distilled is not None:
            distilled = self.head_drop(self.fc_norm(distilled))
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

        Image i is embedded at its own grid h_i x w_i with its own positions (steps 1-2 at that grid). The images'
        tokens are packed, in order, into sequences of at most `max_tokens` tokens (one sequence when None),
        X_s = [X_i; X_j; ...]; attention stays within each image, softmax(Q Kᵀ / √D_k + M) V with M_st = 0 where
        tokens s and t are of one image and -inf where not (vit/model/packing.py). Each image is pooled from its own
        tokens (steps 4-5). Images of one size are embedded together and those of one token count pooled together."""
        shapes = packing.groups([tuple(image.shape) for image in images])
        batches = [torch.stack([images[i] for i in indices]) for indices in shapes]  # one grid each
        embedded = [
            self._tokens(b, patches) for b, patches in zip(batches, self.patch_embed.each(batches), strict=True)
        ]
        plan = packing.Packing(shapes, [x.shape[1] for x, _ in embedded], max_tokens, images[0].device)
        x = plan.tokens(torch.cat([x.flatten(0, 1) for x, _ in embedded]))  # (S, L, D), padding zero
        for layer, positions in zip(self.layers, plan.layer_positions([p for _, p in embedded], x.dtype), strict=True):
            x, _ = self._run(layer, x, *positions)
        groups = plan.by_length(self.norm(x))  # (m, n, D): m images of n tokens
        distilled = plan.in_order([t[:, 1] for t in groups]) if self.config.distill_token else None
        return self.head_of(plan.in_order([self.pool(t) for t in groups]), distilled)  # one head for the batch

    @torch.no_grad()
    def attention_maps(self, images: Tensor) -> list[Tensor]:
        """Every layer's attention weights for these images, by the explicit path: L x (B, H, P + N, P + N).

        Works on any model, whichever path it trains with; the weights match what the fast path computes.
        """
        return self._encode(images, need_weights=True)[1]

    def layer_of(self, name: str) -> int:
        """The depth of a parameter for layer-wise learning-rate decay: 0 for the patch embedding, class
        token and position table, l + 1 for layers.l, depth + 1 for the final norm and the head."""
        if name.startswith("layers.") or (name.startswith("rel_pos.") and self.config.rel_pos == "mlp"):
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
        if self.config.rotary == "rope_mixed":
            names.add("rope.freqs")
        return names


def _rotary_embedding(c: ViTConfig) -> nn.Module:
    """The phases that attention turns queries and keys by: fixed axial ones, or RoPE-Mixed's learned per layer."""
    positions = dict(ref_grid=c.rope.ref_grid, kind=c.rope.grid, offset=c.rope.offset)
    if c.rotary == "rope_mixed":
        return MixedRotaryEmbedding2d(
            c.grid_size, c.head_dim, c.depth, c.num_heads, c.num_prefix_tokens, c.pos_temperature, **positions
        )
    return RotaryEmbedding2d(
        c.grid_size, c.head_dim, c.num_prefix_tokens, c.pos_temperature, axes=c.rope.axes, **positions
    )
