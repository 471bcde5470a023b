"""timm's NaFlexVit (naflexvit_*): the ViT of its VisionTransformer with a NaFlex embedding. Patches are projected
by a linear map of their pixels (channels last, as timm's NaFlex loader flattens them: the same map as our strided
convolution, its weight reordered), the learned (h, w, D) position table is resampled to each image's grid (our
resample: bicubic or bilinear, with or without antialiasing and aligned corners, to the grid or, aspect-preserving
as RADIO's, to a square of its longer side then cropped: the pos_resample fields), and the class and register
tokens go before the patches without positions. Read as a ViTConfig with model.naflex set, and its state dict
renamed into timm's VisionTransformer layout. NaViT's factorized tables (T_y[y] + T_x[x]) are
ViTConfig.pos_embed='factorized'; whatever its embedding does beyond that (grid-sampled positions, a norm on the
patches) is refused by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from vit.interop.timm.build import mlp_ratio_for
from vit.interop.timm.modules import layer_fields, mlp_activation
from vit.model.config import Resampling, ViTConfig


def config_of_naflex_model(model: nn.Module) -> ViTConfig:
    from timm.models.vision_transformer import Attention, Block

    embeds, block = model.embeds, model.blocks[0]
    factorized = embeds.pos_embed_type == "factorized"  # NaViT's T_y[y] + T_x[x]
    refused = {
        f"position embedding {embeds.pos_embed_type!r}": embeds.pos_embed_type not in ("learned", "factorized"),
        "grid-sampled positions": getattr(embeds, "pos_embed_use_grid_sample", False),
        f"position resampling {embeds.pos_embed_interp_mode!r}": embeds.pos_embed_interp_mode
        not in ("bicubic", "bilinear"),
        "a norm on the patches": getattr(embeds, "norm_input", None) is not None
        or not isinstance(embeds.norm, nn.Identity),
        "patches flattened channels first": embeds.is_linear and not getattr(embeds, "channels_last", True),
        f"layers of timm's {type(block).__name__}": type(block) is not Block,
        f"attention of timm's {type(block.attn).__name__}": type(block.attn) is not Attention,
        "a norm before the layers": not isinstance(getattr(model, "norm_pre", nn.Identity()), nn.Identity),
    }
    if why := [name for name, present in refused.items() if present]:
        raise ValueError(f"its NaFlex embedding or layers have {', '.join(why)}")
    attn, proj = block.attn, embeds.proj
    fields, hidden = layer_fields(model, mlp_activation(block.mlp))
    patch = tuple(embeds.patch_size)
    grid = (embeds.pos_embed_y.shape[1], embeds.pos_embed_x.shape[1]) if factorized else embeds.pos_embed.shape[1:3]
    return ViTConfig(
        img_size=(grid[0] * patch[0], grid[1] * patch[1]),
        patch_size=patch,
        in_chans=proj.in_features // (patch[0] * patch[1]) if embeds.is_linear else proj.in_channels,
        num_classes=model.num_classes,
        embed_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=attn.num_heads,
        mlp_ratio=mlp_ratio_for(hidden, model.embed_dim),
        pos_embed="factorized" if factorized else "learned",
        pos_resample=Resampling(
            mode=embeds.pos_embed_interp_mode,
            antialias=embeds.pos_embed_antialias,
            corners=embeds.pos_embed_align_corners,
            square=getattr(embeds, "pos_embed_ar_preserving", False),  # RADIO's, `par` ones
        ),
        class_token=embeds.cls_token is not None,
        reg_tokens=embeds.reg_token.shape[1] if embeds.reg_token is not None else 0,
        pos_embed_prefix=False,
        patch_bias=proj.bias is not None,
        qkv_bias=attn.qkv.bias is not None,
        proj_bias=attn.proj.bias is not None,
        layer_scale_init=1e-5 if not isinstance(getattr(block, "ls1", nn.Identity()), nn.Identity) else None,
        pool_prefix=getattr(model, "pool_include_prefix", False),
        **fields,
    )


def naflex_renaming(model: nn.Module) -> Callable[[dict[str, Tensor]], dict[str, Tensor]]:
    """NaFlexVit's state dict -> timm VisionTransformer's: the embedding's tokens and table at the top, the linear
    projection of (p_h, p_w, C)-flattened patches as the (D, C, p_h, p_w) convolution it equals."""
    linear, (ph, pw) = model.embeds.is_linear, tuple(model.embeds.patch_size)

    def rename(state: dict[str, Tensor]) -> dict[str, Any]:
        out = {}
        for key, value in state.items():
            if key == "embeds.proj.weight" and linear:
                value = value.reshape(value.shape[0], ph, pw, -1).permute(0, 3, 1, 2)  # (D, C, p_h, p_w)
            if key == "embeds.pos_embed":
                value = value.flatten(1, 2)  # (1, h * w, D): no rows for the prefix tokens
            if key in ("embeds.pos_embed_y", "embeds.pos_embed_x"):  # (1, n, D) -> our rows / cols (n, D)
                key, value = f"pos_embed.{'rows' if key.endswith('y') else 'cols'}", value[0]
            out[key.replace("embeds.proj.", "patch_embed.proj.").removeprefix("embeds.")] = value
        return out

    return rename
