"""The model's declaration: one frozen dataclass, whose defaults the YAML presets in conf/model/ change.

It declares the network alone: how it is trained (dropout aside), run (the attention kernel, recomputation in the
backward pass) or fed (images at their own size) are settings of the run. Each choice is one field whose allowed
values are written once, as a Literal or a tuple, and checked from that. Configs written before a choice became one
field (checkpoints, exports) are converted on reading by `upgrade`.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

TABLES = ("learned", "factorized", "sincos2d", "sincos1d", "none")  # a table added to the tokens
ROTARIES = ("rope2d", "rope_mixed")  # phases turning queries and keys: axial, or RoPE-Mixed's learned per layer
# pos_embed: a table, rotary phases, or a table and phases (EVA-02: learned+rope2d)
POS_EMBEDS = TABLES + ROTARIES + tuple(f"{t}+{r}" for t in TABLES[:-1] for r in ROTARIES)

Layer = Literal["pre", "post", "res_post", "parallel"]
Pool = Literal["token", "avg", "map", "token_avg"]
Attention = Literal["softmax", "differential"]
RelPos = Literal["none", "mlp", "mlp_shared"]
FinalNorm = Literal["tokens", "pooled", "none"]
NormLayer = Literal["layernorm", "rmsnorm"]
Activation = Literal["gelu", "gelu_tanh", "quick_gelu", "swiglu"]

# the range of each number, beyond its type; every other number need only be finite
POSITIVE = ("in_chans", "embed_dim", "depth", "num_heads", "rel_pos_dim", "pool_heads", "pos_temperature", "norm_eps",
            "layer_scale_init")  # fmt: skip
AT_LEAST_ZERO = ("num_classes", "reg_tokens")
RATES = ("dropout", "attn_dropout", "drop_path", "head_dropout")  # in [0, 1)


def pos_embed_of(table: str, rotary: str = "none") -> str:
    """The pos_embed value of a table (TABLES) and rotary phases (ROTARIES, or 'none')."""
    if rotary == "none":
        return table
    return rotary if table == "none" else f"{table}+{rotary}"


class ConfigError(ValueError):
    """A model configuration that cannot be built; the message names the field at fault."""


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


def _check_fields(config: Any, prefix: str) -> None:
    """Each scalar field of a config dataclass of the kind its annotation declares (a bool, an int, a finite number,
    one of a Literal's values, or None where allowed) and in the range POSITIVE, AT_LEAST_ZERO or RATES gives it;
    fields of other kinds (sizes, nested choices) are checked where they are normalised."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        value, hint = getattr(config, f.name), hints[f.name]
        kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if not all(k in (bool, int, float, type(None)) or typing.get_origin(k) is Literal for k in kinds):
            continue
        if value is None and type(None) in kinds:
            continue
        choices = [c for k in kinds if typing.get_origin(k) is Literal for c in typing.get_args(k)]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if choices:
            if value not in choices:
                raise ConfigError(f"{prefix}{f.name}={value!r} is not one of {', '.join(choices)}")
            continue
        if bool in kinds:
            if not isinstance(value, bool):
                raise ConfigError(f"{prefix}{f.name} must be true or false, got {value!r}")
            continue
        if float not in kinds:  # a count
            allowed = "a positive int" if f.name in POSITIVE else "an int >= 0" if f.name in AT_LEAST_ZERO else "an int"
            if not (number and isinstance(value, int)) or value < (f.name in POSITIVE):
                raise ConfigError(f"{prefix}{f.name} must be {allowed}, got {value!r}")
            continue
        if not number or not math.isfinite(value):
            raise ConfigError(f"{prefix}{f.name} must be a finite number, got {value!r}")
        if f.name in POSITIVE and value <= 0:
            raise ConfigError(f"{prefix}{f.name} must be positive, got {value!r}")
        if f.name in RATES and not 0 <= value < 1:
            raise ConfigError(f"{prefix}{f.name} must be in [0, 1), got {value!r}")


@dataclass(frozen=True)
class Resampling:
    """How a learned table is resampled to another grid (vit.model.pos_embed.resample)."""

    mode: Literal["bicubic", "bilinear"] = "bicubic"  # timm's; SigLIP 2 resizes bilinearly
    antialias: bool = True  # when the table shrinks (RADIO: none)
    corners: bool = False  # align_corners: the table's corner cells map to the grid's corners
    square: bool = False  # to a square of the longer side, then its top-left h x w (RADIO: the aspect kept)

    def __post_init__(self) -> None:
        _check_fields(self, "ViTConfig.pos_resample.")


@dataclass(frozen=True)
class RopeGrid:
    """Where rotary phases place each patch (vit.model.pos_embed.rope_positions)."""

    axes: Literal["xy", "yx"] = "xy"  # the axis the first half of each head's pairs turns with ('yx': EVA-02's)
    grid: Literal["index", "centered"] = "index"  # row and column indices, or DINOv3's 2π(2(j + ½)/s - 1)
    offset: float = 0.0  # added to each index before grid's map (Perception Encoder: 1)
    ref_grid: tuple[int, int] | None = None  # EVA's ref_feat_shape: positions scaled by ref_grid / grid

    def __post_init__(self) -> None:
        if self.ref_grid is not None:
            object.__setattr__(self, "ref_grid", _pair("rope.ref_grid", self.ref_grid))
        _check_fields(self, "ViTConfig.rope.")
        if self.grid == "centered" and self.ref_grid is not None:
            raise ConfigError("ViTConfig.rope.ref_grid scales index positions; centered positions span [-1, 1]")


@dataclass(frozen=True)
class ViTConfig:
    """Every architectural choice of a ViT. Built from conf/model/*.yaml via `_target_`, or in Python."""

    img_size: int | tuple[int, int] = 224  # an int for square images, or (height, width)
    patch_size: int | tuple[int, int] = 16  # kernel = stride of the patch-embedding convolution; at most img_size
    in_chans: int = 3  # 1 for grayscale (Fashion-MNIST), 3 for RGB
    num_classes: int = 1000  # 0 keeps the head as identity (features only)
    embed_dim: int = 768  # D, the token width
    depth: int = 12  # L, the number of transformer layers
    num_heads: int = 12  # H; each head has D_k = D / H dims
    kv_heads: int | tuple[int, ...] | None = None  # G < H: grouped-query keys/values, per layer if a list; None: H
    mlp_ratio: float = 4.0  # hidden width of the per-token MLP, as a multiple of D
    qkv_bias: bool = True
    pos_embed: str = "learned"  # one of POS_EMBEDS: a table (TABLES), rotary phases (ROTARIES), or table+phases
    pos_temperature: float = 10000.0  # T in the sinusoid wavelengths T^(2i/d), also for rotary phases
    pos_embed_prefix: bool = True  # a learned table has a row for each prefix token (timm's no_embed_class=False)
    pos_resample: Resampling = Resampling()  # a learned table to another grid
    rope: RopeGrid = RopeGrid()  # the positions rotary phases turn by
    rel_pos: RelPos = "none"  # a bias on attention logits, an MLP of patch offsets (vit/model/rel_pos.py), one a layer
    rel_pos_dim: int = 512  # the hidden width of rel_pos's MLP
    # class token, mean of the patch tokens, attention pooling (SigLIP's MAP head), or DINOv2's classifier input
    # [class token; mean of the patch tokens] (2D wide)
    pool: Pool = "token"
    pool_prefix: bool = False  # 'avg' and 'map' read the prefix tokens too (timm's pool_include_prefix; Eva's MAP)
    pool_heads: int | None = None  # attention pooling's heads; None: num_heads
    pool_mlp_ratio: float | None = None  # attention pooling's MLP width as a multiple of D; None: mlp_ratio
    class_token: bool | None = None  # a learned token before the patches; None: exactly when pool needs one
    reg_tokens: int = 0  # register tokens after the class token (Darcet et al. 2024)
    distill_token: bool = False  # DeiT's distillation token with its own head; logits and features average the two
    patch_bias: bool = True  # the bias b of the patch embedding (CLIP's has none)
    patch_norm: bool = False  # a norm on each patch's embedding, before positions (AIMv2; timm's patch_embed.norm)
    embed_norm: bool = False  # a norm on the tokens before the first layer (CLIP's ln_pre)
    layer: Layer = "pre"  # the layer's form: where norms sit around the residuals, or ViT-22B's parallel branches
    attention: Attention = "softmax"  # or differential attention (Ye et al. 2024): two softmax maps per head
    norm_layer: NormLayer = "layernorm"  # every norm of the model
    norm_eps: float = 1e-6  # timm's ViT value; parity with timm depends on it
    final_norm: FinalNorm = "tokens"  # after the last layer, or after pooling (timm's fc_norm), or none (RADIO)
    qk_norm: bool = False  # a norm on each head's queries and keys before their product (ViT-22B)
    attn_norm: bool = False  # a norm on the heads' concatenation before W_o (EVA-02's sub-LN)
    mlp_norm: bool = False  # a norm on the MLP's hidden layer before its second linear map (EVA-02's sub-LN)
    act: Activation = "gelu"  # the MLP's; swiglu gates SiLU(xW_g) * xW_v
    proj_bias: bool = True  # biases of W_o and of the MLP's linear maps
    dropout: float = 0.0  # after the position embedding, and on the attention and MLP outputs
    attn_dropout: float = 0.0  # on the attention weights
    drop_path: float = 0.0  # stochastic depth of the last layer; layer l gets drop_path * l / (L - 1), none if L = 1
    head_dropout: float = 0.0  # on the pooled features before the head
    layer_scale_init: float | None = None  # LayerScale (Touvron et al. 2021) start value; None disables it
    layer_scale_attn_only: bool = False  # LayerScale on the attention branch alone (Sapiens 2)

    def __post_init__(self) -> None:
        # Normalise once so every consumer sees (height, width) and the nested choices as objects; frozen, hence
        # object.__setattr__.
        object.__setattr__(self, "img_size", _pair("img_size", self.img_size))
        object.__setattr__(self, "patch_size", _pair("patch_size", self.patch_size))
        for name, kind in (("pos_resample", Resampling), ("rope", RopeGrid)):
            if isinstance(value := getattr(self, name), typing.Mapping):
                object.__setattr__(self, name, _nested(kind, value, name))
        if isinstance(self.kv_heads, list | tuple):  # one a layer, as a YAML list or a tuple
            object.__setattr__(self, "kv_heads", tuple(self.kv_heads))
        if self.class_token is None:  # older configs say only pool; the pools that read a class token get one
            object.__setattr__(self, "class_token", self.pool in ("token", "token_avg"))
        self._validate()

    def _validate(self) -> None:
        def fail(message: str) -> None:
            raise ConfigError(f"ViTConfig.{message}")

        if self.pos_embed not in POS_EMBEDS:
            fail(f"pos_embed={self.pos_embed!r} is not one of {', '.join(POS_EMBEDS)}")
        for name, kind in (("pos_resample", Resampling), ("rope", RopeGrid)):
            if not isinstance(getattr(self, name), kind):
                fail(f"{name} must be a mapping of {', '.join(f.name for f in fields(kind))}")
        _check_fields(self, "ViTConfig.")
        (ih, iw), (ph, pw) = self.img_size, self.patch_size
        if ph > ih or pw > iw:
            fail(f"patch_size={ph}x{pw} is larger than img_size={ih}x{iw}: not one whole patch fits")
        if self.pool in ("token", "token_avg") and not self.class_token:
            fail(f"pool={self.pool!r} reads the class token, but class_token is false")
        if self.distill_token and not (self.class_token and self.pool == "token"):
            fail("distill_token needs the class token and pool='token' (DeiT averages the two tokens' heads)")
        for name, heads in (("num_heads", self.num_heads), ("pool_heads", self.pool_heads or self.num_heads)):
            if self.embed_dim % heads:
                fail(f"embed_dim={self.embed_dim} is not divisible by {name}={heads}")
        for name, mlp in (("mlp_ratio", "MLP"), ("pool_mlp_ratio", "pool's MLP")):  # int(inf) is an OverflowError
            ratio = getattr(self, name)
            if ratio is not None and not self.embed_dim * ratio < math.inf:
                fail(f"{name}={ratio!r} at embed_dim={self.embed_dim} gives the {mlp} no finite width")
            if ratio is not None and self.embed_dim * ratio < 1:
                fail(f"{name}={ratio!r} gives the {mlp} no hidden unit at D={self.embed_dim}")
        table_dims = {"sincos2d": 4, "sincos1d": 2}.get(self.table, 1)
        if self.embed_dim % table_dims:
            fail(
                f"embed_dim={self.embed_dim} must be divisible by {table_dims} for a {self.table} table (sin/cos pairs)"
            )
        if self.rotary != "none" and self.head_dim % 4:
            fail(f"embed_dim / num_heads = {self.head_dim} (the head dim) must be divisible by 4 for rotary phases "
                 f"(pos_embed={self.pos_embed}: half the pairs turn with x, half with y)")  # fmt: skip
        if self.attention == "differential" and (self.rotary != "none" or self.head_dim % 2 or self.grouped):
            fail(f"attention=differential splits each head's {self.head_dim} dims in two halves, without rotary "
                 "phases or grouped keys: an even head dim, pos_embed without rope, kv_heads null")  # fmt: skip
        if self.rotary == "rope_mixed" and self.grouped:
            fail("kv_heads shares keys between heads, but rope_mixed turns each head's keys by its own phases")
        if self.layer_scale_attn_only and self.layer_scale_init is None:
            fail("layer_scale_attn_only scales the attention branch by LayerScale, but layer_scale_init is null")
        if self.layer_scale_attn_only and self.layer == "parallel":
            fail("layer_scale_attn_only scales the attention branch alone, which a parallel layer sums with its MLP's")
        per_layer = self.kv_heads if isinstance(self.kv_heads, tuple) else (self.kv_heads or self.num_heads,)
        if isinstance(self.kv_heads, tuple) and len(per_layer) != self.depth:
            fail(f"kv_heads has {len(per_layer)} entries, one a layer, but depth={self.depth}")
        if any(isinstance(g, bool) or not isinstance(g, int) or g <= 0 or self.num_heads % g for g in per_layer):
            fail(f"kv_heads={self.kv_heads!r}: each must be a positive int dividing num_heads={self.num_heads}")

    @property
    def table(self) -> str:
        """The position table added to the tokens: one of TABLES."""
        first = self.pos_embed.split("+")[0]
        return first if first in TABLES else "none"

    @property
    def rotary(self) -> str:
        """The rotary phases of queries and keys: one of ROTARIES, or 'none'."""
        last = self.pos_embed.split("+")[-1]
        return last if last in ROTARIES else "none"

    @property
    def grouped(self) -> bool:
        """Whether any layer has fewer key/value heads than query heads (kv_heads)."""
        return any(self.kv_heads_of(layer) != self.num_heads for layer in range(self.depth))

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (rows, columns) at the configured image size: whole patches only, as a strided convolution
        takes them (timm's and transformers' grids), the pixels past the last one on each side left out."""
        return (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

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
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, values: typing.Mapping[str, Any]) -> ViTConfig:
        """Build from a mapping, older layouts converted (`upgrade`), naming any key that is not a field."""
        known = {f.name for f in fields(cls)}
        values = upgrade({k: v for k, v in values.items() if k != "_target_"})
        if unknown := sorted(set(values) - known):
            raise ConfigError(f"unknown ViTConfig field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)


def _nested(kind: type, values: typing.Mapping[str, Any], name: str) -> Any:
    if unknown := sorted(set(values) - {f.name for f in fields(kind)}):
        raise ConfigError(f"ViTConfig.{name} has no field(s) {', '.join(map(str, unknown))}")
    return kind(**values)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return list(value) if isinstance(value, tuple) else value


# Fields of older layouts, each now part of one field: a saved config of any age builds the network it built then.
_RUN_SETTINGS = ("fused_attn", "grad_checkpointing", "naflex")  # how it ran or was fed: not the network


def upgrade(values: dict[str, Any]) -> dict[str, Any]:
    """A config mapping in today's layout: older checkpoints' and exports' fields folded into the ones that replaced
    them (rope and rope_mixed into pos_embed; parallel into layer, the old norm; diff_attn into attention; fc_norm
    and final_norm into final_norm; rel_pos_shared into rel_pos; rope_* and pos_resample_* into rope and
    pos_resample); run settings dropped. Today's layout passes unchanged."""
    v = {k: val for k, val in values.items() if k not in _RUN_SETTINGS}
    if isinstance(v.get("rope"), bool) or "rope_mixed" in v:
        mixed, rope, table = v.pop("rope_mixed", False), v.pop("rope", False), v.get("pos_embed", "learned")
        if rope or mixed or table == "rope2d":
            v["pos_embed"] = pos_embed_of("none" if table == "rope2d" else table, "rope_mixed" if mixed else "rope2d")
    rope = {new: v.pop(old) for old, new in (("rope_axes", "axes"), ("rope_ref_grid", "ref_grid"),
            ("rope_grid_offset", "offset")) if old in v}  # fmt: skip
    if isinstance(v.get("rope_grid"), str):
        rope["grid"] = v.pop("rope_grid")
    if rope:
        v["rope"] = {**(v.get("rope") if isinstance(v.get("rope"), dict) else {}), **rope}
    resampling = {new: v.pop(old) for old, new in (("pos_resample_antialias", "antialias"),
                  ("pos_resample_corners", "corners"), ("pos_resample_square", "square")) if old in v}  # fmt: skip
    if isinstance(v.get("pos_resample"), str):
        resampling["mode"] = v.pop("pos_resample")
    if resampling:
        v["pos_resample"] = resampling
    if "norm" in v or "parallel" in v:
        v["layer"] = "parallel" if v.pop("parallel", False) else v.pop("norm", "pre")
        v.pop("norm", None)
    if "diff_attn" in v:
        v["attention"] = "differential" if v.pop("diff_attn") else "softmax"
    if "fc_norm" in v or isinstance(v.get("final_norm"), bool):
        fc_norm, final = v.pop("fc_norm", False), v.pop("final_norm", True)
        v["final_norm"] = "pooled" if fc_norm else "tokens" if final else "none"
    if "rel_pos_shared" in v:
        shared = v.pop("rel_pos_shared")
        v["rel_pos"] = "mlp_shared" if shared and v.get("rel_pos") == "mlp" else v.get("rel_pos", "none")
    return v
