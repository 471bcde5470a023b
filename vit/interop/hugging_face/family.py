"""What the loader knows of one Hugging Face model_type's vision tower: the record each family file fills in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from vit.model.config import ViTConfig

State = dict[str, Tensor]


def _no_switches(v: dict[str, Any], has_head: bool, distill_head: bool) -> dict[str, Any]:
    return {}


def _in_place(state: State, config: ViTConfig, v: dict[str, Any]) -> State:
    return state


def _no_facts(state: State, v: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    return facts


@dataclass(frozen=True)
class Family:
    """One model_type's vision tower as stored, and what it is in ViTConfig.

    towers: the module names the tower has inside classifiers and dual encoders, removed from its keys;
    defaults: transformers' config defaults, which config.json may leave out;
    left_out: key prefixes of the weights outside the network from an image to its features or logits;
    renames: the family's own key spellings, (pattern, replacement) applied in turn before the shared ones;
    switches(v, has_head, distill_head): the ViTConfig fields that set it apart from the classic ViT, from its
        config values v, raising ValueError for what ViTConfig lacks;
    placed(state, config, v): the timm-layout weights whose place depends on the architecture read;
    facts(raw state, v, facts): the data facts with what the network's own input step records;
    unbiased: the attention projections whose missing bias is zero (a key bias only adds q·b_k to a softmax row:
        nothing; elsewhere a missing bias is a broken file).
    """

    towers: tuple[str, ...]
    defaults: dict[str, Any]
    left_out: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    switches: Callable[[dict[str, Any], bool, bool], dict[str, Any]] = _no_switches
    placed: Callable[[State, ViTConfig, dict[str, Any]], State] = _in_place
    facts: Callable[[State, dict[str, Any], dict[str, Any]], dict[str, Any]] = _no_facts
    unbiased: tuple[str, ...] = ("attn.k",)


# transformers' config defaults shared by most families
SIZES = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_channels=3, image_size=224, qkv_bias=True
)
CLASSIC = dict(SIZES, patch_size=16, intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-12)
DUAL_ENCODER = ("text_model.", "text_projection.", "visual_projection.", "logit_scale", "logit_bias")


def split_prefix(state: State, key: str) -> State:
    """A (1, n, D) row of prefix tokens stored as one tensor (n class tokens, or class and register tokens) as our
    class token (the first) and n - 1 register tokens."""
    tokens = state.pop(key)
    state["cls_token"] = tokens[:, :1]
    if tokens.shape[1] > 1:
        state["reg_token"] = tokens[:, 1:]
    return state
