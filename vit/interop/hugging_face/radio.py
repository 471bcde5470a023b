"""RADIO (RadioModel; C-RADIOv3 and v4): timm's RADIO as its NaFlexVit reads it. Patches projected by a bias-free
linear map of their (C, p, p) pixels (the strided convolution it equals), a learned table of max_img_size / patch
rows a side resized as RADIO does (to a square of the grid's longer side, bilinearly, without antialiasing, then its
top-left corner: pos_resample {mode: bilinear, antialias: false, square: true}), num_cls_tokens class tokens and
num_registers registers before the patches without positions (a class token and registers, pos_embed_prefix=False),
LayerScale, no final norm. Its input conditioner normalises the pixels inside the network: here it is the data
facts' mean and std, as preprocessing. Its summary, the class tokens summary_idxs side by side, is no pooling of
ours (the first class token is pooled): the tokens (last_hidden_state) equal transformers', and the pooled features
its summary's first summary_idxs[0] == 0 block. The video patch projection (frames stacked on the channels) never
runs on images: left out.
"""

from __future__ import annotations

from typing import Any

from vit.interop.hugging_face.family import SIZES, Family, State, split_prefix
from vit.model.config import Resampling, ViTConfig

_CLIP_MEAN, _CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _radio(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    patch, rows = v["patch_size"], v["max_img_size"] // v["patch_size"]
    return dict(
        img_size=rows * patch,  # the table's own grid
        patch_bias=False,
        reg_tokens=v["num_cls_tokens"] + v["num_registers"] - 1,
        pos_embed_prefix=False,
        pos_resample=Resampling(mode="bilinear", antialias=False, square=True),
        layer_scale_init=v["layerscale_value"],
        final_norm="none",
    )


def _radio_placed(state: State, config: ViTConfig, v: dict[str, Any]) -> State:
    (ph, pw), weight = config.patch_size, state["patch_embed.proj.weight"]
    state["patch_embed.proj.weight"] = weight.reshape(len(weight), -1, ph, pw)  # (C, p_h, p_w) flattened
    for layer in range(config.depth):  # transformers gives a checkpoint without LayerScale layerscale_value's
        for name in ("ls1.gamma", "ls2.gamma"):
            state.setdefault(f"blocks.{layer}.{name}", weight.new_full((config.embed_dim,), v["layerscale_value"]))
    return split_prefix(state, "cls_token")


def _conditioner(state: State, v: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """The input conditioner's (x - m) / s after the image processor's own normalisation (x - m0) / s0, if any:
    one normalisation, of mean m0 + m s0 and std s0 s. Its buffers are what transformers computes with."""
    m, s = (
        next((t.flatten().tolist() for k, t in state.items() if k.endswith(f"input_conditioner.{name}")), v[name])
        for name in ("norm_mean", "norm_std")
    )
    if facts["mean"] is None or facts["std"] is None:
        return facts | {"mean": m, "std": s}
    m0, s0 = (facts[key] * len(m) if len(facts[key]) == 1 else facts[key] for key in ("mean", "std"))
    mean = [a + b * c for a, b, c in zip(m0, m, s0, strict=True)]
    return facts | {"mean": mean, "std": [a * b for a, b in zip(s0, s, strict=True)]}


FAMILIES = {
    "radio": Family(
        ("radio_model.model.",),  # the original checkpoints' module name; transformers' has none
        dict(
            SIZES,
            hidden_size=1280,
            num_hidden_layers=32,
            num_attention_heads=16,
            mlp_ratio=4.0,
            hidden_act="gelu",
            layer_norm_eps=1e-6,
            use_swiglu_ffn=False,
            layerscale_value=1.0,
            patch_size=16,
            max_img_size=2048,
            num_cls_tokens=3,
            num_registers=7,
            norm_mean=_CLIP_MEAN,
            norm_std=_CLIP_STD,
        ),
        (
            "radio_model.input_conditioner.",
            "radio_model.summary_idxs",
            "input_conditioner.",
            "summary_idxs",
            "embeddings.video_patch_projection.",
            "patch_generator.video_embedder.",
        ),
        renames=(
            (r"^patch_generator\.embedder\.|^embeddings\.patch_projection\.", "patch_embed.proj."),
            (r"^patch_generator\.pos_embed$|^embeddings\.position_embedding$", "pos_embed"),
            (r"^patch_generator\.cls_token\.token$|^embeddings\.cls_register_token$", "cls_token"),
        ),
        switches=_radio,
        placed=_radio_placed,
        facts=_conditioner,
    ),
}
