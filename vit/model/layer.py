"""One transformer layer: attention and a per-token MLP (vit/model/mlp.py), each inside a residual with a norm."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from vit.model.attention import DifferentialAttention, MultiHeadAttention
from vit.model.config import ViTConfig
from vit.model.mlp import Mlp
from vit.model.norm import make_norm


class LayerScale(nn.Module):
    """A learned per-channel gain on a residual branch (Touvron et al. 2021, CaiT)."""

    def __init__(self, dim: int, init_value: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init_value))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class DropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016): in training, each sample's branch is zeroed with probability p and the
    kept ones scaled by 1 / (1 - p). torchvision.ops' StochasticDepth does the same, but importing it brings
    torch._dynamo into every `import vit`."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        noise = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # (B, 1, ..., 1)
        return x * noise.div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class TransformerLayer(nn.Module):
    """pre-norm:      Z = X + MHA(LN(X));   X̃ = Z + MLP(LN(Z))
    post-norm:     Z = LN(X + MHA(X));   X̃ = LN(Z + MLP(Z))
    res-post-norm: Z = X + LN(MHA(X));   X̃ = Z + LN(MLP(Z))   (Swin-v2: the norm on each branch's output)
    parallel:      X̃ = X + MHA(LN(X)) + MLP(LN(X))             (ViT-22B: both branches read one norm of X)

    Each branch may be scaled by LayerScale (or the attention branch alone) and dropped per sample by stochastic
    depth (drop path). `index` is the layer's place, 0 first, for what differs by layer (kv_heads).
    """

    def __init__(self, config: ViTConfig, drop_path: float, index: int = 0):
        super().__init__()
        c, dim = config, config.embed_dim
        norm = partial(make_norm, c.norm_layer, eps=c.norm_eps)
        self.form = c.layer
        self.norm1 = norm(dim)
        heads = (c.num_heads, c.qkv_bias, c.attn_dropout, c.dropout)
        options = dict(qk_norm=c.qk_norm, attn_norm=c.attn_norm, proj_bias=c.proj_bias, norm=norm)
        if c.attention == "differential":
            self.attn = DifferentialAttention(dim, *heads, layer=index, **options)
        else:
            self.attn = MultiHeadAttention(dim, *heads, kv_heads=c.kv_heads_of(index), **options)
        parallel = c.layer == "parallel"
        self.norm2 = norm(dim) if not parallel else nn.Identity()  # a parallel layer's MLP reads norm1's output
        self.mlp = Mlp(
            dim,
            c.mlp_hidden_dim,
            c.act,
            c.dropout,
            bias=c.proj_bias,
            norm=norm(c.mlp_hidden_dim) if c.mlp_norm else None,
        )
        init = config.layer_scale_init
        self.ls1 = LayerScale(dim, init) if init else nn.Identity()
        self.ls2 = LayerScale(dim, init) if init and not (c.layer_scale_attn_only or parallel) else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:  # x: (B, N, D) -> (B, N, D)
        """The layer, its attention turned by rope's phases and biased by a relative position bias when given."""
        a, weights = self.attn(self._attention_input(x), rope, bias, need_weights)
        return self._residuals(x, a), weights

    def forward_first_token(
        self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, bias: Tensor | None = None
    ) -> Tensor:
        """forward(x)[0][:, :1] for less work: only the first token queries, every token gives keys and values,
        and the rest of the layer is per token. (B, N, D) -> (B, 1, D)."""
        q, k, v = self.attn.project(self._attention_input(x), rope)
        a, _ = self.attn.attend(q[:, :, :1], k, v, bias=None if bias is None else bias[:, :1])
        return self._residuals(x[:, :1], a)

    def _attention_input(self, x: Tensor) -> Tensor:
        """LN(X) for the pre-norm and parallel forms, X for the post-norm ones."""
        return self.norm1(x) if self.form in ("pre", "parallel") else x

    def _residuals(self, x: Tensor, a: Tensor) -> Tensor:
        """The layer after attention, given X and the attention output A = MHA(LN(X)) or MHA(X), row for row."""
        if self.form == "parallel":  # one LayerScale on the sum
            return x + self.drop_path(self.ls1(a + self.mlp(self.norm1(x))))
        if self.form == "pre":
            z = x + self.drop_path(self.ls1(a))
            return z + self.drop_path(self.ls2(self.mlp(self.norm2(z))))
        if self.form == "res_post":
            z = x + self.drop_path(self.ls1(self.norm1(a)))
            return z + self.drop_path(self.ls2(self.norm2(self.mlp(z))))
        z = self.norm1(x + self.drop_path(self.ls1(a)))
        return self.norm2(z + self.drop_path(self.ls2(self.mlp(z))))
