"""The vision towers of dual encoders (and their classifiers), whose text tower and contrastive projections
(visual_projection included: the features are the tower's pooled output) are left out.

- clip_vision_model, and clip's vision tower; metaclip_2's alike (MetaCLIP 2 is CLIP's network): embed_norm
  (pre_layrnorm), patch_bias=False; post_layernorm normalises the pooled class token only, which is our final norm
  read at the class token. Their classifiers average the patch tokens before any norm: refused.
- siglip_vision_model, and siglip's vision tower: no class token, pool='map' (its attention-pooling head);
  SiglipForImageClassification averages the normalised tokens (pool='avg').
- siglip2_vision_model, and siglip2's vision tower (NaFlex): SigLIP's network, which reads images at their own size;
  its patches projected by a linear map of their (p, p, C) pixels (the strided convolution it equals, weight
  reordered), its num_patches table resized to each image's grid bilinearly with antialiasing (pos_resample's mode
  'bilinear'); its attention mask for padded patches is our packing's block mask (forward_packed).
- aimv2_vision_model, and aimv2's vision tower: timm's AIMv2 (an RMSNorm on each patch's embedding, patch_norm;
  RMSNorm everywhere; SwiGLU; no class token), with its attention-pooling head: one learned query, the latent
  itself (no query projection: ours W_q = I, b_q = 0), no MLP after it (ours of one hidden unit whose output layer
  is zero), so pool='map' computes it exactly. Without the head (use_head false) the patches are averaged, which
  transformers does not do (it returns the tokens). Its native-resolution sinusoid (is_native) lays each axis's
  sines and cosines in blocks where ours interleaves them: refused.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from vit.interop.hugging_face.family import DUAL_ENCODER, SIZES, Family, State
from vit.interop.timm import mlp_ratio_for
from vit.model.config import Resampling, ViTConfig

_CONTRASTIVE = dict(SIZES, intermediate_size=3072)
_CLIP = dict(_CONTRASTIVE, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5)
_SIGLIP = dict(_CONTRASTIVE, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=True)


def _clip(classifier: str) -> Any:
    def switches(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
        if has_head:
            raise ValueError(
                f"{classifier} averages the patch tokens before any final norm "
                "(post_layernorm normalises the class token only), a pooling this ViT lacks"
            )
        return dict(embed_norm=True, patch_bias=False)  # post_layernorm on the class token = our final norm there

    return switches


def _siglip(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    # SiglipForImageClassification averages the tokens, past the head
    return dict(class_token=False, pool="map" if v["vision_use_head"] and not has_head else "avg")


def _siglip2(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    side = math.isqrt(v["num_patches"])
    if side * side != v["num_patches"]:
        raise ValueError(f"num_patches={v['num_patches']} is not a square grid's")
    bilinear = Resampling(mode="bilinear")
    return _siglip(v, has_head, distill_head) | dict(pos_resample=bilinear, img_size=side * v["patch_size"])


def _siglip_placed(state: State, config: ViTConfig, v: dict[str, Any]) -> State:
    if config.pool == "avg":  # the classifier's head is never run
        state = {k: t for k, t in state.items() if not k.startswith("attn_pool.")}
    if state["patch_embed.proj.weight"].dim() == 2:  # SigLIP 2's (D, p_h p_w C), channels last
        (ph, pw), weight = config.patch_size, state["patch_embed.proj.weight"]
        state["patch_embed.proj.weight"] = weight.reshape(len(weight), ph, pw, -1).permute(0, 3, 1, 2)
    return state


def _aimv2(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    if v["is_native"]:
        raise ValueError(
            "is_native: its 2D sinusoid lays each axis's sines and cosines in blocks [sin | cos], where this ViT's "
            "interleaves them (a permutation of every token's dims)"
        )
    if v["qkv_bias"] != v["mlp_bias"]:
        raise ValueError(
            f"qkv_bias={v['qkv_bias']} (which out_proj's bias follows) and mlp_bias={v['mlp_bias']} differ: this ViT "
            "ties the output projection's and the MLP's biases"
        )
    head = dict(pool="map", pool_mlp_ratio=mlp_ratio_for(1, v["hidden_size"])) if v["use_head"] else dict(pool="avg")
    return dict(class_token=False, patch_norm=True, norm_layer="rmsnorm", proj_bias=v["mlp_bias"], **head)


def _aimv2_placed(state: State, config: ViTConfig, v: dict[str, Any]) -> State:
    """AIMv2's attention pooling as our map pool: the latent is the query (W_q = I, b_q = 0), keys and values
    packed as [W_k; W_v] (biases zero where it has none), and the MLP's output layer zero: it adds nothing."""
    if config.pool != "map":
        return state
    k, v_ = state.pop("attn_pool.k.weight"), state.pop("attn_pool.v.weight")
    dim, zeros = k.shape[1], lambda *shape: k.new_zeros(shape)
    biases = [state.pop(f"attn_pool.{p}.bias", None) for p in "kv"]
    mlp = {"fc1.weight": zeros(2, dim), "fc1.bias": zeros(2), "fc2.weight": zeros(dim, 1), "fc2.bias": zeros(dim)}
    return state | {
        "attn_pool.q.weight": torch.eye(dim, dtype=k.dtype),
        "attn_pool.q.bias": zeros(dim),
        "attn_pool.kv.weight": torch.cat((k, v_)),
        "attn_pool.kv.bias": torch.cat([zeros(dim) if b is None else b for b in biases]),
        "attn_pool.norm.weight": k.new_ones(dim),
        **{f"attn_pool.mlp.{name}": value for name, value in mlp.items()},
    }


FAMILIES = {
    "clip_vision_model": Family(("vision_model.",), _CLIP, DUAL_ENCODER, switches=_clip("CLIPForImageClassification")),
    "metaclip_2_vision_model": Family(
        ("vision_model.",), _CLIP, DUAL_ENCODER, switches=_clip("MetaClip2ForImageClassification")
    ),
    "siglip_vision_model": Family(("vision_model.",), _SIGLIP, DUAL_ENCODER, switches=_siglip, placed=_siglip_placed),
    "siglip2_vision_model": Family(
        ("vision_model.",),
        dict(_SIGLIP, num_patches=256),  # no image_size: a table of num_patches rows
        DUAL_ENCODER,
        switches=_siglip2,
        placed=_siglip_placed,
    ),
    "aimv2_vision_model": Family(
        ("vision_model.",),
        dict(
            SIZES,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=24,
            num_attention_heads=8,
            patch_size=14,
            hidden_act="silu",
            rms_norm_eps=1e-5,
            qkv_bias=False,
            mlp_bias=False,
            use_head=True,
            is_native=False,
            use_gated_mlp=True,  # not a setting of AIMv2's: its MLP is always gated
        ),
        DUAL_ENCODER,
        renames=(
            (r"^embeddings\.patch_embed\.", "embeddings.patch_embedding."),
            (r"^embeddings\.rms_norm\.", "patch_embed.norm."),
            (r"^rms_norm\.", "norm."),
            (r"\.rms_norm([12])\.", r".norm\1."),
            (r"\.ffn\.", ".mlp."),
            (r"^head\.cls_token$", "attn_pool.latent"),
            (r"^head\.([kv])_proj\.", r"attn_pool.\1."),
            (r"^head\.output_proj\.", "attn_pool.proj."),
        ),
        switches=_aimv2,
        placed=_aimv2_placed,
    ),
}
