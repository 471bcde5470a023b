"""The model's declaration: one frozen dataclass, whose defaults the YAML presets in conf/model/ change."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

POS_EMBEDS = ("learned", "factorized", "sincos2d", "sincos1d", "rope2d", "none")
POOLS = ("token", "avg", "map", "token_avg")
NORMS = ("pre", "post", "res_post")
NORM_LAYERS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "swiglu")

PosEmbed = Literal["learned", "factorized", "sincos2d", "sincos1d", "rope2d", "none"]


# the fields that hold real numbers, as files and command lines give them, and those of them that None turns off
_NUMBERS = (
    "mlp_ratio", "pos_temperature", "rope_grid_offset", "pool_mlp_ratio", "norm_eps", "dropout", "attn_dropout",
    "drop_path", "head_dropout", "layer_scale_init",
)  # fmt: skip
_NONE_IS_OFF = ("pool_mlp_ratio", "layer_scale_init")


class ConfigError(ValueError):
    """A model configuration that cannot be built; the message names the field at fault."""


def _product(width: int, ratio: float) -> float:
    """width * ratio, infinite where it is beyond a float."""
    try:
        return width * ratio
    except OverflowError:  # a width past 1e308
        return math.inf


def _pair(name: str, value: int | Sequence[int]) -> tuple[int, int]:
    """An int or a 2-sequence as (height, width), refusing anything else with the field's name."""
    if isinstance(value, bool):
        raise ConfigError(f"ViTConfig.{name} must be an int or (height, width), got {value!r}")
    if isinstance(value, int):
        pair = (value, value)
    else:
        try:  # Hydra hands over a ListConfig; '28' would iterate as (2, 8) and 16.5 truncate to 16
            whole = not isinstance(value, str) and all(float(v).is_integer() for v in value)
            pair = tuple(int(v) for v in value)
        except (TypeError, ValueError):
            whole = False
        if not whole or len(pair) != 2:
            raise ConfigError(f"ViTConfig.{name} must be an int or (height, width), got {value!r}")
    if min(pair) <= 0:
        raise ConfigError(f"ViTConfig.{name} must be positive, got {value!r}")
    return pair  # type: ignore[return-value]


@dataclass(frozen=True)
class ViTConfig:
    """Every architectural choice of a ViT. Built from conf/model/*.yaml via `_target_`, or in Python."""

    img_size: int | tuple[int, int] = 224  # an int for square images, or (height, width)
    patch_size: int | tuple[int, int] = 16  # kernel = stride of the patch-embedding convolution
    in_chans: int = 3  # 1 for grayscale (Fashion-MNIST), 3 for RGB
    num_classes: int = 1000  # 0 keeps the head as identity (features only)
    embed_dim: int = 768  # D, the token width
    depth: int = 12  # L, the number of transformer layers
    num_heads: int = 12  # H; each head has D_k = D / H dims
    kv_heads: int | tuple[int, ...] | None = None  # G < H: grouped-query keys/values, per layer if a list; None: H
    mlp_ratio: float = 4.0  # hidden width of the per-token MLP, as a multiple of D
    qkv_bias: bool = True
    pos_embed: PosEmbed = "learned"  # one of POS_EMBEDS
    pos_temperature: float = 10000.0  # T in the sinusoid wavelengths T^(2i/d), also for rope2d
    rope: bool = False  # rotary phases on queries and keys beside pos_embed's table (EVA-02 has both); rope2d: no table
    rope_axes: Literal["xy", "yx"] = "xy"  # the axis the first half of each head's pairs turns with ('yx': EVA-02's)
    rope_ref_grid: int | tuple[int, int] | None = None  # EVA's ref_feat_shape: rope positions scaled by ref / grid
    rope_grid: Literal["index", "centered"] = "index"  # rope positions: indices, or DINOv3's 2π(2(j + ½)/s - 1)
    rope_grid_offset: float = 0.0  # added to each row and column index before rope_grid's map (Perception Encoder: 1)
    rope_mixed: bool = False  # RoPE-Mixed (Heo et al. 2024): each layer and head learns its (f_x, f_y) per pair
    rel_pos: Literal["none", "mlp"] = (
        "none"  # a bias on attention logits, an MLP of patch offsets (vit/model/rel_pos.py)
    )
    rel_pos_dim: int = 512  # the hidden width of rel_pos's MLP
    rel_pos_shared: bool = False  # one rel_pos MLP for every layer (timm's vit_srelpos) instead of one each
    # class token, mean of the patch tokens, attention pooling (SigLIP's MAP head), or DINOv2's classifier input
    # [class token; mean of the patch tokens] (2D wide)
    pool: Literal["token", "avg", "map", "token_avg"] = "token"
    pool_prefix: bool = False  # 'avg' and 'map' read the prefix tokens too (timm's pool_include_prefix; Eva's MAP)
    pool_heads: int | None = None  # attention pooling's heads; None: num_heads
    pool_mlp_ratio: float | None = None  # attention pooling's MLP width as a multiple of D; None: mlp_ratio
    class_token: bool | None = None  # a learned token before the patches; None: exactly when pool needs one
    reg_tokens: int = 0  # register tokens after the class token (Darcet et al. 2024)
    distill_token: bool = False  # DeiT's distillation token with its own head; logits and features average the two
    pos_embed_prefix: bool = True  # a learned table has a row for each prefix token (timm's no_embed_class=False)
    pos_resample: Literal["bicubic", "bilinear"] = "bicubic"  # a learned table to another grid (SigLIP 2: bilinear)
    pos_resample_square: bool = False  # to a square of the longer side, then its top-left h x w (RADIO: aspect kept)
    pos_resample_antialias: bool = True  # antialiasing when the table shrinks (RADIO: none)
    pos_resample_corners: bool = False  # align_corners: the table's corner cells map to the grid's corners
    patch_bias: bool = True  # the bias b of the patch embedding (CLIP's has none)
    patch_norm: bool = False  # a norm on each patch's embedding, before positions (AIMv2; timm's patch_embed.norm)
    embed_norm: bool = False  # a norm on the tokens before the first layer (CLIP's ln_pre)
    norm: Literal["pre", "post", "res_post"] = (
        "pre"  # where the norm sits relative to the residual (res_post: Swin-v2's)
    )
    norm_layer: Literal["layernorm", "rmsnorm"] = "layernorm"  # every norm of the model
    norm_eps: float = 1e-6  # timm's ViT value; parity with timm depends on it
    fc_norm: bool = False  # the final norm after pooling instead of before it (timm's average-pooling models)
    final_norm: bool = True  # a norm after the last layer (before or, with fc_norm, after pooling); RADIO has none
    qk_norm: bool = False  # a norm on each head's queries and keys before their product (ViT-22B)
    attn_norm: bool = False  # a norm on the heads' concatenation before W_o (EVA-02's sub-LN)
    mlp_norm: bool = False  # a norm on the MLP's hidden layer before its second linear map (EVA-02's sub-LN)
    act: Literal["gelu", "gelu_tanh", "quick_gelu", "swiglu"] = "gelu"  # the MLP's; swiglu gates SiLU(xW_g) * xW_v
    proj_bias: bool = True  # biases of W_o and of the MLP's linear maps
    dropout: float = 0.0  # after the position embedding, and on the attention and MLP outputs
    attn_dropout: float = 0.0  # on the attention weights
    drop_path: float = 0.0  # stochastic depth of the last layer; layer l gets drop_path * l / (L - 1), none if L = 1
    head_dropout: float = 0.0  # on the pooled features before the head
    layer_scale_init: float | None = None  # LayerScale (Touvron et al. 2021) start value; None disables it
    layer_scale_attn_only: bool = False  # LayerScale on the attention branch alone (Sapiens 2)
    parallel: bool = False  # ViT-22B's layer: X + MHA(LN(X)) + MLP(LN(X)), both branches on one norm
    diff_attn: bool = False  # differential attention (Ye et al. 2024): two softmax maps per head, the second's λ-scaled
    fused_attn: bool = True  # scaled_dot_product_attention; False takes the explicit softmax path
    grad_checkpointing: bool = False  # training recomputes each layer in the backward pass: less memory, more time
    naflex: bool = False  # runs read each image at its own size and aspect ratio, packed (forward_packed)

    def __post_init__(self) -> None:
        # Normalise the sizes once so every consumer sees (height, width); frozen, hence object.__setattr__.
        object.__setattr__(self, "img_size", _pair("img_size", self.img_size))
        object.__setattr__(self, "patch_size", _pair("patch_size", self.patch_size))
        if self.rope_ref_grid is not None:
            object.__setattr__(self, "rope_ref_grid", _pair("rope_ref_grid", self.rope_ref_grid))
        if isinstance(self.kv_heads, list | tuple):  # one a layer, as a YAML list or a tuple
            object.__setattr__(self, "kv_heads", tuple(self.kv_heads))
        if self.class_token is None:  # older configs say only pool; the pools that read a class token get one
            object.__setattr__(self, "class_token", self.pool in ("token", "token_avg"))
        self._validate()

    def _validate(self) -> None:
        def fail(message: str) -> None:
            raise ConfigError(f"ViTConfig.{message}")

        (ih, iw), (ph, pw) = self.img_size, self.patch_size
        if ih % ph or iw % pw:
            fail(
                f"img_size={ih}x{iw} is not divisible by patch_size={ph}x{pw} "
                f"(each side of the image must be a whole number of patches)"
            )
        for name in ("in_chans", "embed_dim", "depth", "num_heads", "rel_pos_dim", "pool_heads"):
            value = getattr(self, name)
            if name == "pool_heads" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail(f"{name} must be a positive int, got {value!r}")
        for name in _NUMBERS:  # a string, a list or inf would fail the checks below as a TypeError or OverflowError
            value = getattr(self, name)
            if value is None and name in _NONE_IS_OFF:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                fail(f"{name} must be a finite number, got {value!r}")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) or self.num_classes < 0:
            fail(f"num_classes must be an int >= 0, got {self.num_classes!r}")
        if self.pos_embed not in POS_EMBEDS:
            fail(f"pos_embed={self.pos_embed!r} is not one of {', '.join(POS_EMBEDS)}")
        if self.pool not in POOLS:
            fail(f"pool={self.pool!r} is not one of {', '.join(POOLS)}")
        if self.pos_resample not in ("bicubic", "bilinear"):
            fail(f"pos_resample={self.pos_resample!r} is not one of bicubic, bilinear")
        if self.norm not in NORMS:
            fail(f"norm={self.norm!r} is not one of {', '.join(NORMS)}")
        if self.norm_layer not in NORM_LAYERS:
            fail(f"norm_layer={self.norm_layer!r} is not one of {', '.join(NORM_LAYERS)}")
        if self.act not in ACTIVATIONS:
            fail(f"act={self.act!r} is not one of {', '.join(ACTIVATIONS)}")
        if isinstance(self.reg_tokens, bool) or not isinstance(self.reg_tokens, int) or self.reg_tokens < 0:
            fail(f"reg_tokens must be an int >= 0, got {self.reg_tokens!r}")
        if self.pool in ("token", "token_avg") and not self.class_token:
            fail(f"pool={self.pool!r} reads the class token, but class_token is false")
        if self.pool_heads is not None and (self.pool_heads <= 0 or self.embed_dim % self.pool_heads):
            fail(f"pool_heads={self.pool_heads} must be positive and divide embed_dim={self.embed_dim}")
        for name in ("mlp_ratio", "pool_mlp_ratio"):  # int() of an infinite width is an OverflowError
            ratio = getattr(self, name)
            if ratio is not None and not math.isfinite(_product(self.embed_dim, ratio)):
                fail(f"{name}={ratio!r} at embed_dim={self.embed_dim} gives the MLP no finite width")
        if self.pool_mlp_ratio is not None and int(self.embed_dim * self.pool_mlp_ratio) < 1:
            fail(f"pool_mlp_ratio={self.pool_mlp_ratio!r} gives the pool's MLP no hidden unit at D={self.embed_dim}")
        if self.fc_norm and not self.final_norm:
            fail("fc_norm places the final norm after pooling, but final_norm is false")
        if self.distill_token and not (self.class_token and self.pool == "token"):
            fail("distill_token needs the class token and pool='token' (DeiT averages the two tokens' heads)")
        if self.embed_dim % self.num_heads:
            fail(f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}")
        if self.pos_embed == "sincos2d" and self.embed_dim % 4:
            fail(
                f"embed_dim={self.embed_dim} must be divisible by 4 for pos_embed=sincos2d "
                "(a sin/cos pair per frequency, for x and for y)"
            )
        if self.pos_embed == "sincos1d" and self.embed_dim % 2:
            fail(f"embed_dim={self.embed_dim} must be even for pos_embed=sincos1d (sin/cos pairs)")
        if self.uses_rope and self.head_dim % 4:
            fail(
                f"embed_dim / num_heads = {self.head_dim} (the head dim) must be divisible by 4 for "
                "rotary phases (pos_embed=rope2d or rope; half the pairs rotate with x, half with y)"
            )
        if self.rope_axes not in ("xy", "yx"):
            fail(f"rope_axes={self.rope_axes!r} is not one of xy, yx")
        if self.rope_grid not in ("index", "centered"):
            fail(f"rope_grid={self.rope_grid!r} is not one of index, centered")
        if self.rope_grid == "centered" and self.rope_ref_grid is not None:
            fail("rope_ref_grid scales index positions; centered positions span [-1, 1] on any grid")
        if self.rope_mixed and not self.uses_rope:
            fail("rope_mixed learns the frequencies of rotary phases: it needs pos_embed=rope2d or rope=true")
        if self.rel_pos not in ("none", "mlp"):
            fail(f"rel_pos={self.rel_pos!r} is not one of none, mlp")
        if self.rel_pos_shared and self.rel_pos == "none":
            fail("rel_pos_shared shares rel_pos's MLP between layers, but rel_pos is none")
        if self.pos_temperature <= 0:
            fail(f"pos_temperature must be positive, got {self.pos_temperature!r}")
        if self.mlp_hidden_dim < 1:
            fail(f"mlp_ratio={self.mlp_ratio!r} gives the MLP no hidden unit at D={self.embed_dim}")
        if self.norm_eps <= 0:
            fail(f"norm_eps must be positive, got {self.norm_eps!r}")
        for name in ("dropout", "attn_dropout", "drop_path", "head_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                fail(f"{name} must be in [0, 1), got {value!r}")
        if self.layer_scale_init is not None and self.layer_scale_init <= 0:
            fail(f"layer_scale_init must be positive or null, got {self.layer_scale_init!r}")
        if self.parallel and (self.norm != "pre" or self.layer_scale_attn_only):
            fail("parallel layers read one pre-norm and scale their sum: norm must be 'pre', layer_scale_attn_only off")
        if self.diff_attn and (self.uses_rope or self.head_dim % 2):
            fail(f"diff_attn splits each head's {self.head_dim} dims in two halves without rotary phases: the head dim "
                 "must be even and pos_embed not rope2d, rope off")  # fmt: skip
        if self.layer_scale_attn_only and self.layer_scale_init is None:
            fail("layer_scale_attn_only scales the attention branch by LayerScale, but layer_scale_init is null")
        if self.kv_heads is not None:
            per_layer = self.kv_heads if isinstance(self.kv_heads, tuple) else (self.kv_heads,)
            if isinstance(self.kv_heads, tuple) and len(per_layer) != self.depth:
                fail(f"kv_heads has {len(per_layer)} entries, one a layer, but depth={self.depth}")
            for g in per_layer:
                if isinstance(g, bool) or not isinstance(g, int) or g <= 0 or self.num_heads % g:
                    fail(f"kv_heads={self.kv_heads!r}: each must be a positive int dividing num_heads={self.num_heads}")
            if self.diff_attn and any(g != self.num_heads for g in per_layer):
                fail("kv_heads groups keys and values, which diff_attn does not")
            if self.rope_mixed and any(g != self.num_heads for g in per_layer):
                fail("kv_heads shares keys between heads, but rope_mixed turns each head's keys by its own phases")

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns) at the configured image size."""
        return (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def uses_rope(self) -> bool:
        """Whether attention rotates queries and keys: pos_embed='rope2d' (no table), or rope beside a table."""
        return self.pos_embed == "rope2d" or self.rope

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: [class, distillation, registers], each when configured."""
        return int(self.class_token) + int(self.distill_token) + self.reg_tokens

    @property
    def pooled_dim(self) -> int:
        """The width of the head's input: 2D for pool='token_avg', else D."""
        return 2 * self.embed_dim if self.pool == "token_avg" else self.embed_dim

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def kv_heads_of(self, layer: int) -> int:
        """G, the heads of keys and values of layer `layer` (0-based): H unless kv_heads groups them."""
        if self.kv_heads is None:
            return self.num_heads
        return self.kv_heads[layer] if isinstance(self.kv_heads, tuple) else self.kv_heads

    @property
    def mlp_hidden_dim(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python containers (lists for sizes), safe for YAML, JSON and weights_only checkpoints."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}  # sizes, grids, kv_heads

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ViTConfig:
        """Build from a mapping, naming any key that is not a field (e.g. a YAML typo)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if k != "_target_"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown ViTConfig field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)
