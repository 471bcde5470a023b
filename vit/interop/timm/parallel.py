"""timm's parallel ViT layers (ParallelScalingBlock, DiffParallelScalingBlock: ViT-22B's X + MHA(LN(X)) + MLP(LN(X)),
the second with differential attention) read as ViTConfig.layer='parallel' (and attention='differential'), and
their state dict renamed into timm's VisionTransformer layout: the fused input projection [W_fc1; W_q; W_k; W_v]
split into the MLP's fc1 and attention's qkv, the output projections (two, or one fused on [heads; MLP hidden]) into
W⁽ᵒ⁾ and fc2, whose sum is the same."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_ATTENTION = ("q_norm.", "k_norm.", "sub_norm.", "lambda_")  # the parts of attention held by the block itself


def parallel_block_fields(block: nn.Module) -> dict[str, Any]:
    """The ViTConfig fields of a parallel layer, refusing what ours computes otherwise by name."""
    from timm.models.vision_transformer import DiffParallelScalingBlock

    diff = type(block) is DiffParallelScalingBlock
    separate = getattr(block, "attn_out_proj", None) is not None
    out_bias = (block.attn_out_proj if separate else block.out_proj).bias is not None
    if not out_bias:
        raise ValueError("its parallel layers have no output biases but an MLP input bias, which ours ties to them")
    if diff and block.dual_lambda:
        raise ValueError("its differential attention learns λ as two scalars (dual_lambda)")
    attention = "differential" if diff else "softmax"
    return dict(layer="parallel", attention=attention, qkv_bias=block.mlp_bias is None, proj_bias=True)


def parallel_renaming(model: nn.Module) -> Callable[[dict[str, Tensor]], dict[str, Tensor]]:
    """A parallel-layer model's state dict -> timm VisionTransformer's layout with ours as the layer's parts."""
    hidden, dim = model.blocks[0].in_split[0], model.embed_dim

    def rename(state: dict[str, Tensor]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for key, value in state.items():
            m = _BLOCK.match(key)
            if m is None:
                out[key] = value
                continue
            at, rest = f"blocks.{m[1]}", m[2]
            if rest.startswith("in_norm."):
                out[f"{at}.norm1.{rest.removeprefix('in_norm.')}"] = value
            elif rest.startswith("in_proj."):  # [W_fc1; W_q; W_k; W_v] rows, and their biases
                part = rest.removeprefix("in_proj.")
                out[f"{at}.mlp.fc1.{part}"], out[f"{at}.attn.qkv.{part}"] = value[:hidden], value[hidden:]
            elif rest == "mlp_bias":  # fc1's bias when the projection has none (no qkv bias)
                out[f"{at}.mlp.fc1.bias"] = value
            elif rest.startswith(("attn_out_proj.", "mlp_out_proj.")):
                branch = "attn.proj" if rest.startswith("attn") else "mlp.fc2"
                out[f"{at}.{branch}.{rest.split('.', 1)[1]}"] = value
            elif rest == "out_proj.weight":  # one map of [heads; MLP hidden]: its columns split, the sum unchanged
                out[f"{at}.attn.proj.weight"], out[f"{at}.mlp.fc2.weight"] = value[:, :dim], value[:, dim:]
            elif rest == "out_proj.bias":
                out[f"{at}.attn.proj.bias"], out[f"{at}.mlp.fc2.bias"] = value, torch.zeros_like(value)
            elif rest == "ls.gamma":
                out[f"{at}.ls1.gamma"] = value
            elif rest.startswith(_ATTENTION):
                out[f"{at}.attn.{rest}"] = value
            else:
                out[key] = value
        return out

    return rename
