"""DINOv2's families: LayerScale, an MLP of mlp_ratio (act='swiglu' for use_swiglu_ffn), registers that join after
the positions are added.

- dinov2: layer_scale_init; its table resized bicubically without antialiasing (its processor's 224 crops of a 518
  table); the classifier reads [CLS; mean of patches] (pool='token_avg', headless too: config.json's architectures
  says so), Dinov2Model's pooler_output is the class token. Its mask token (masked-image pretraining's input) is left
  out.
- dinov2_with_registers: also reg_tokens; the registers join after the positions are added, so the table's class
  row is folded into the class token and the table has no prefix rows (pos_embed_prefix=False): exact.
- tipsv2_vision_model, and tipsv2's vision tower: DINOv2 with registers whose table is resized bilinearly with
  antialiasing (pos_resample's mode 'bilinear'); its pooler_output is the class token. Its original checkpoints
  hold timm's names (blocks.N.attn.qkv, ls1.gamma) and a packed SwiGLU (mlp.w12 = [W_g; W_v]).
"""

from __future__ import annotations

from typing import Any

from vit.interop.hugging_face.family import DUAL_ENCODER, SIZES, Family, State
from vit.model.config import Resampling, ViTConfig

_DINOV2 = dict(SIZES, mlp_ratio=4, use_swiglu_ffn=False, layerscale_value=1.0, hidden_act="gelu", layer_norm_eps=1e-6)


def _dinov2(registers: bool) -> Any:
    def switches(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
        classifier = any(name.endswith("ForImageClassification") for name in v.get("architectures") or [])
        return dict(
            # the classifier reads [CLS; mean of patches], headless too (num_labels=0); the model its CLS
            pool="token_avg" if has_head or classifier else "token",
            layer_scale_init=v["layerscale_value"],
            reg_tokens=v["num_register_tokens"] if registers else 0,
            pos_embed_prefix=not registers,  # the class row is folded into the class token (_fold_class_row)
            pos_resample=Resampling(antialias=registers),  # with registers, transformers antialiases
        )

    return switches


def _fold_class_row(state: State, config: ViTConfig, v: dict[str, Any]) -> State:
    """Registers join after the positions are added: the table's class row is the class token's alone."""
    pos = state["pos_embed"]  # (1, 1 + N, D)
    state["cls_token"], state["pos_embed"] = state["cls_token"] + pos[:, :1], pos[:, 1:]
    return state


def _tipsv2(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    return _dinov2(registers=True)(v, has_head, distill_head) | dict(pos_resample=Resampling(mode="bilinear"))


_MASK_TOKEN = ("embeddings.mask_token", "mask_token")
FAMILIES = {
    "dinov2": Family(("dinov2.",), dict(_DINOV2, patch_size=14), _MASK_TOKEN, switches=_dinov2(registers=False)),
    "dinov2_with_registers": Family(
        ("dinov2_with_registers.",),
        dict(_DINOV2, patch_size=16, num_register_tokens=4),
        _MASK_TOKEN,
        switches=_dinov2(registers=True),
        placed=_fold_class_row,
    ),
    "tipsv2_vision_model": Family(
        ("vision_model.", "vision_encoder."),  # transformers' name and the original checkpoints'
        dict(_DINOV2, image_size=448, patch_size=14, num_register_tokens=1),
        (*DUAL_ENCODER, "text_encoder.", "temperature", *_MASK_TOKEN),
        renames=(
            (r"^register_tokens$", "reg_token"),
            (r"\.mlp\.(w12|c_fc)\.", ".mlp.fc1."),  # w12 packs [W_g; W_v] as our fc1 does
            (r"\.mlp\.(w3|c_proj)\.", ".mlp.fc2."),
        ),
        switches=_tipsv2,
        placed=_fold_class_row,
    ),
}
