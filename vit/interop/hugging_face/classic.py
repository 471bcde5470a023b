"""The families built as the classic ViT (a learned table, pre-norm layers, GELU): what each differs in.

- vit (ViTModel, ViTForImageClassification): the classic ViT; ViTModel's pooler (dense + tanh) is left out.
- deit: the teacher classifier's two heads, averaged (distill_token); the one-head classifier never reads the
  distillation token's output, a register (reg_tokens=1); DeiTModel keeps the token (distill_token, no head), its
  features the two tokens averaged, as the teacher classifier's without heads (num_labels=0) and timm's.
- vit_mae (ViTMAEModel, ViTMAEForPreTraining's encoder): the classic ViT, its fixed sin-cos table read as the stored
  table it is. Transformers' encoder first drops a random mask_ratio of the patches and shuffles the rest
  (pretraining's input); this is the encoder on every patch in order: transformers' at mask_ratio 0 with noise that
  keeps the order. The decoder is left out.
- ijepa (IJepaModel, IJepaForImageClassification): no class token; the classifier reads the mean of the
  normalised tokens (pool='avg'); IJepaModel's optional pooler (dense + tanh) is left out.
- pixio (PixioModel): n_cls_tokens class tokens, each with a row of the table: a class token and n - 1 registers.
  Its pooler_output, the mean of those tokens, is no pooling of ours (the class token is pooled): the tokens equal
  transformers', the pooled features only when n_cls_tokens is 1.
"""

from __future__ import annotations

from typing import Any

from vit.interop.hugging_face.family import CLASSIC, SIZES, Family, State, split_prefix
from vit.model.config import ViTConfig


def _deit(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    one_head = has_head and not distill_head  # the one-head classifier never reads the distillation token's output
    return dict(distill_token=not one_head, reg_tokens=int(one_head))


def _deit_placed(state: State, config: ViTConfig, v: dict[str, Any]) -> State:
    if config.reg_tokens:
        state["reg_token"] = state.pop("dist_token")
    return state


def _ijepa(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    return dict(class_token=False, pool="avg")  # the classifier's mean of every token


def _pixio(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    return dict(reg_tokens=v["n_cls_tokens"] - 1)


FAMILIES = {
    "vit": Family(("vit.",), CLASSIC, ("pooler.",)),
    "deit": Family(("deit.",), CLASSIC, ("pooler.",), switches=_deit, placed=_deit_placed),
    "vit_mae": Family(("vit.",), CLASSIC, ("decoder.",)),
    "ijepa": Family(("ijepa.",), CLASSIC, ("pooler.",), switches=_ijepa),
    "pixio": Family(
        ("pixio.",),
        dict(
            SIZES,
            hidden_size=1280,
            num_hidden_layers=32,
            num_attention_heads=16,
            mlp_ratio=4,
            hidden_act="gelu",
            layer_norm_eps=1e-6,
            image_size=256,
            patch_size=16,
            n_cls_tokens=8,
        ),
        switches=_pixio,
        placed=lambda state, config, v: split_prefix(state, "cls_token"),
    ),
}
