"""The families with DINOv3's rotary embedding: no position table, RoPE at the patches' centres (rows first, the
phases' half-split rotation made our interleaved one by reordering each head's query and key dims at loading,
vit.interop.timm.eva.pair_heads, as timm's DINOv3 and Sapiens 2 are read), registers, LayerScale.

- dinov3_vit (DINOv3ViTModel, plain or gated MLP): pos_embed='rope2d' with rope {grid: centered, axes: yx} and
  rope_theta as its temperature; query, key and value biases each optional (a missing one is zero).
- sapiens2 (Sapiens2Model): DINOv3's attention with RMSNorm everywhere, qk-norm, grouped-query attention in its
  middle layers (kv_heads, one a layer) and LayerScale on the attention branch alone (layer_scale_attn_only); its
  pooler_output is the class token. The random shift, jitter and rescale of its positions are training's
  augmentation (transformers applies them in training mode only): left out. Its original checkpoints' names
  (wq, ffn.w12 = [W_g; W_v], storage_tokens) are read too.
"""

from __future__ import annotations

import re
from typing import Any

from vit.interop.hugging_face.family import SIZES, Family, State
from vit.interop.timm.eva import pair_heads
from vit.model.config import RopeGrid, ViTConfig

_DINOV3 = dict(
    SIZES,
    hidden_size=384,
    num_attention_heads=6,
    patch_size=16,
    intermediate_size=1536,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    rope_theta=100.0,
    query_bias=True,
    value_bias=True,
    proj_bias=True,
    mlp_bias=True,
    layerscale_value=1.0,
    use_gated_mlp=False,
    num_register_tokens=0,
)
_SAPIENS2 = dict(
    _DINOV3,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    hidden_act="silu",
    key_bias=True,
    use_gated_mlp=True,
    num_register_tokens=8,
    rms_norm_eps=1e-6,
    use_qk_norm=True,
    num_key_value_heads_per_layer=None,
    num_key_value_attention_heads=8,
    num_first_full_attention_layers=8,
    num_last_full_attention_layers=8,
)
del _SAPIENS2["layer_norm_eps"]  # its norms are RMSNorms of rms_norm_eps


def _dinov3(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    if v["proj_bias"] != v["mlp_bias"]:
        raise ValueError(f"proj_bias={v['proj_bias']} and mlp_bias={v['mlp_bias']} differ: this ViT ties them")
    return dict(
        pos_embed="rope2d",  # RoPE alone: DINOv3's phases at its patches' centres, rows first (_paired_heads)
        rope=RopeGrid(axes="yx", grid="centered"),
        pos_temperature=v["rope_theta"],
        qkv_bias=v["query_bias"] or v.get("key_bias", False) or v["value_bias"],
        proj_bias=v["proj_bias"],
        reg_tokens=v["num_register_tokens"],
        layer_scale_init=v["layerscale_value"],
    )


def _kv_heads(v: dict[str, Any]) -> int | tuple[int, ...] | None:
    """Sapiens 2's key/value heads a layer: config.json's list, or transformers' rule (all heads in the first and
    last layers, num_key_value_attention_heads between); None where every layer has all."""
    depth, heads = v["num_hidden_layers"], v["num_attention_heads"]
    per_layer = v["num_key_value_heads_per_layer"]
    if per_layer is None:
        first, last = v["num_first_full_attention_layers"], v["num_last_full_attention_layers"]
        grouped = v["num_key_value_attention_heads"]
        per_layer = [heads if i < first or i >= depth - last else grouped for i in range(depth)]
    if not isinstance(per_layer, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in per_layer):
        raise ValueError(f"num_key_value_heads_per_layer={per_layer!r} is not a list of head counts")
    return None if set(per_layer) == {heads} else tuple(per_layer)


def _sapiens2(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    return _dinov3(v, has_head, distill_head) | dict(
        norm_layer="rmsnorm", qk_norm=v["use_qk_norm"], kv_heads=_kv_heads(v), layer_scale_attn_only=True
    )


def _paired_heads(state: State, config: ViTConfig, v: dict[str, Any]) -> State:
    if config.act != "swiglu":  # the plain MLP's up_proj is its fc1, not a gated MLP's value half
        state = {re.sub(r"\.mlp\.value\.", ".mlp.fc1.", k): t for k, t in state.items()}
    return pair_heads(state, config.num_heads, config.head_dim)  # half-split rotation -> our interleaved pairs


_QKV = ("attn.q", "attn.k", "attn.v")  # DINOv3's config leaves out any of the three biases
FAMILIES = {
    "dinov3_vit": Family(
        ("",), _DINOV3, ("embeddings.mask_token",), switches=_dinov3, placed=_paired_heads, unbiased=_QKV
    ),
    "sapiens2": Family(
        ("model.",),  # the encoder's name in Sapiens2Model, and the whole model's in its task models
        _SAPIENS2,
        ("embeddings.mask_token", "mask_token"),
        renames=(  # its original checkpoints' names -> transformers'
            (r"^storage_tokens$", "embeddings.register_tokens"),
            (r"^patch_embed\.projection\.", "embeddings.patch_embeddings."),
            (r"\.attn\.gamma\.weight$", ".layer_scale1.lambda1"),
            (r"\.attn\.w([qkv])\.", r".attention.\1_proj."),
            (r"\.attn\.proj\.", ".attention.o_proj."),
            (r"\.ffn\.w12\.", ".mlp.fc1."),  # [W_g; W_v], our packed fc1
            (r"\.ffn\.w3\.", ".mlp.fc2."),
            (r"\.ln([12])\.", r".norm\1."),
            (r"^ln1\.", "norm."),
        ),
        switches=_sapiens2,
        placed=_paired_heads,
        unbiased=_QKV,
    ),
}
