"""timm's VisionTransformerRelPos (the vit_relpos_* and vit_srelpos_* models): read off the module into a ViTConfig,
its weights renamed into timm's VisionTransformer layout, which layout.py then reads as ours.

These ViTs have no position table: every layer's attention logits get a relative position bias from an MLP of the
log-spaced offset between patches (timm's RelPosMlp in its 'cr' mode, ViTConfig.rel_pos='mlp'), one per layer or
one shared by all (vit_srelpos). The 'rpn' models put the norm on each branch's output (ResPostRelPosBlock,
ViTConfig.layer='res_post'). Refused by name: RelPosMlp's Swin-v2 mode (a sigmoid on the bias), the indexed bias
table (RelPosBias), a patch embedding other than a plain strided convolution.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torch import Tensor, nn

from vit.interop.timm.modules import check_patch_embed, mlp_activation, norm_kinds_of, sizes
from vit.model.config import ViTConfig

_BIAS = re.compile(r"^(?:blocks\.(\d+)\.attn\.rel_pos|shared_rel_pos)\.mlp\.(fc[12]\.(?:weight|bias))$")


def config_of_relpos_model(model: nn.Module) -> ViTConfig:
    """Every architectural choice of a timm VisionTransformerRelPos as a ViTConfig; a ValueError names one it lacks."""
    from timm.layers import Mlp, RelPosMlp
    from timm.models.vision_transformer_relpos import RelPosBlock, ResPostRelPosBlock

    block = model.blocks[0]
    if type(block) not in (RelPosBlock, ResPostRelPosBlock):
        raise ValueError(f"its layers are timm's {type(block).__name__}")
    attn, mlp, embed = block.attn, block.mlp, model.patch_embed
    bias = model.shared_rel_pos if model.shared_rel_pos is not None else attn.rel_pos
    if type(bias) is not RelPosMlp or bias.mode != "cr":
        mode = f" in its {bias.mode!r} mode" if type(bias) is RelPosMlp else ""
        raise ValueError(f"its relative position bias is timm's {type(bias).__name__}{mode}, not RelPosMlp's 'cr'")
    if type(bias.mlp) is not Mlp or not isinstance(bias.mlp.act, nn.ReLU):
        raise ValueError("its relative position MLP is not two linear maps around a ReLU")
    check_patch_embed(embed)
    if model.global_pool not in ("token", "avg"):
        raise ValueError(f"its pooling global_pool={model.global_pool!r}")
    norms = dict(norm1=block.norm1, norm2=block.norm2, norm=model.norm, fc_norm=model.fc_norm, q_norm=attn.q_norm)
    kinds = norm_kinds_of(norms)
    if len(kinds) != 1:
        raise ValueError(f"its norms differ in kind or eps: {sorted(kinds)}")
    (norm_layer, eps), hidden = kinds.pop(), mlp.fc2.in_features
    proj_bias = attn.proj.bias is not None
    if (mlp.fc1.bias is not None) != proj_bias or (mlp.fc2.bias is not None) != proj_bias:
        raise ValueError("its output projection and MLP differ in having biases")
    ls1 = getattr(block, "ls1", nn.Identity())
    return ViTConfig(
        **sizes(model, hidden),
        qkv_bias=attn.qkv.bias is not None,
        pos_embed="none",
        rel_pos="mlp_shared" if model.shared_rel_pos is not None else "mlp",
        rel_pos_dim=bias.mlp.fc1.out_features,
        pool=model.global_pool,
        class_token=model.cls_token is not None,
        patch_bias=embed.proj.bias is not None,
        layer="res_post" if type(block) is ResPostRelPosBlock else "pre",
        norm_layer=norm_layer,
        norm_eps=eps,
        final_norm="pooled" if not isinstance(model.fc_norm, nn.Identity) else "tokens",
        qk_norm=not isinstance(attn.q_norm, nn.Identity),
        act=mlp_activation(mlp),
        proj_bias=proj_bias,
        layer_scale_init=None if isinstance(ls1, nn.Identity) else 1e-5,  # the start value is not needed
    )


def relpos_renaming(model: nn.Module) -> Callable[[dict[str, Tensor]], dict[str, Tensor]]:
    """VisionTransformerRelPos's keys -> timm VisionTransformer's, the bias MLPs as ours (rel_pos.L.fc1/fc2, L = 0
    when shared); its rel_pos buffers (offset index and log coordinates) are dropped: the model computes them."""

    def rename(state: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {}
        for key, value in state.items():
            if (m := _BIAS.match(key)) is not None:
                out[f"rel_pos.{m[1] or 0}.{m[2]}"] = value
            elif ".rel_pos." not in f".{key}" and not key.startswith("shared_rel_pos."):
                out[key] = value
        return out

    return rename
