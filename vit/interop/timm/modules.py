"""A built timm VisionTransformer (or DeiT's distilled one) read as a ViTConfig, every choice off its modules,
refusing the ones ViTConfig lacks by name; and the readers of its parts (sizes, norms, activation, patch
embedding, attention pool) that the Eva and relative-position readers (eva.py, relpos.py) share.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vit.interop.timm.build import mlp_ratio_for
from vit.model.config import ViTConfig


def _norm_kind(module: nn.Module, where: str) -> tuple[str, float]:
    """('layernorm' | 'rmsnorm', eps) of one of timm's norm modules, refusing other norms by name."""
    from timm.layers import RmsNorm

    if isinstance(module, nn.LayerNorm) and module.elementwise_affine and module.bias is not None:
        return "layernorm", module.eps
    if isinstance(module, RmsNorm | nn.RMSNorm) and getattr(module, "weight", None) is not None:
        return "rmsnorm", module.eps
    raise ValueError(f"its {where} is a {type(module).__name__}, not an affine LayerNorm or RMSNorm")


def mlp_activation(mlp: nn.Module) -> str:
    """ViTConfig.act of a timm MLP: Mlp's activation, or 'swiglu' for a gated MLP that computes SiLU(gate) * value
    with the gate first (SwiGLU, and GluMlp without gate_last); any other MLP is refused by name."""
    from timm.layers import GluMlp, Mlp, SwiGLU

    if type(mlp) is SwiGLU or type(mlp) is GluMlp:
        if not isinstance(mlp.act, nn.SiLU) or getattr(mlp, "gate_last", False):
            raise ValueError(f"its gated MLP uses {type(mlp.act).__name__} or gates with its second half")
        return "swiglu"
    if type(mlp) is Mlp:
        return activation(mlp.act)
    raise ValueError(f"its MLP is timm's {type(mlp).__name__}")


def norm_kinds_of(norms: dict[str, nn.Module]) -> set[tuple[str, float]]:
    """The (kind, eps) of these norms (by where they sit), Identity left out, refusing a kind ViTConfig lacks."""
    return {_norm_kind(m, where) for where, m in norms.items() if not isinstance(m, nn.Identity)}


def _norm_kinds(model: nn.Module, block: nn.Module) -> set[tuple[str, float]]:
    """The (kind, eps) of every norm a timm ViT or Eva model has, its attention pool's included (and not
    differential attention's sub_norm, whose RMSNorm is fixed)."""
    attn, pool = getattr(block, "attn", block), getattr(model, "attn_pool", None)  # a parallel block holds its own
    norms = dict(norm=model.norm, fc_norm=model.fc_norm, norm_pre=model.norm_pre)
    if hasattr(block, "in_norm"):  # a parallel layer: one norm for both branches
        norms |= dict(norm1=block.in_norm, q_norm=attn.q_norm)
    else:
        norms |= dict(norm1=block.norm1, norm2=block.norm2, q_norm=attn.q_norm)
        norms |= {"attn.norm": attn.norm, "mlp.norm": block.mlp.norm}
    if (patch_norm := getattr(getattr(model, "patch_embed", None), "norm", None)) is not None:
        norms["patch_embed.norm"] = patch_norm  # AIMv2's
    if pool is not None:
        norms["attn_pool.norm"] = pool.norm
    return norm_kinds_of(norms)


def activation(act: nn.Module) -> str:
    """ViTConfig.act of a timm activation module; another is refused by name."""
    from timm.layers.activations import GELU, GELUTanh, QuickGELU

    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    if isinstance(act, GELU):
        return "gelu"
    if isinstance(act, GELUTanh):
        return "gelu_tanh"
    if isinstance(act, QuickGELU):
        return "quick_gelu"
    raise ValueError(f"its MLP activation is {type(act).__name__}, not GELU, tanh-GELU, QuickGELU or SwiGLU")


def check_attention_pool(pool: nn.Module, act: str, dim: int) -> dict[str, Any]:
    """The ViTConfig fields of a timm attention pool (its heads and MLP width), refusing one that AttentionPool
    (one learned query over the patches, then a residual MLP with the layers' activation) would not compute."""
    from timm.layers import AttentionPoolLatent

    if type(pool) is not AttentionPoolLatent or pool.latent_len != 1 or pool.pos_embed is not None:
        raise ValueError("its attention pooling is not one learned query over the patch tokens")
    if not isinstance(pool.q, nn.Linear) or pool.q.bias is None or not isinstance(pool.q_norm, nn.Identity):
        raise ValueError("its attention pooling's query projection differs from ours (none, no bias, or normed)")
    if pool.mlp is None or act == "swiglu" or activation(pool.mlp.act) != act:
        raise ValueError("its attention pooling has no MLP, or one whose activation differs from its layers'")
    return {"pool_heads": pool.num_heads, "pool_mlp_ratio": mlp_ratio_for(pool.mlp.fc1.out_features, dim)}


def _plain_pool(pooling: dict[str, Any], heads: int, hidden: int, dim: int) -> dict[str, Any]:
    """The pool fields, left at None (the layers' own) where they equal the layers'."""
    out = dict(pooling)
    if out.get("pool_heads") == heads:
        out.pop("pool_heads")
    if "pool_mlp_ratio" in out and int(dim * out["pool_mlp_ratio"]) == hidden:
        out.pop("pool_mlp_ratio")
    return out


# timm's distilled ViT builds fc_norm in place of the final norm (fc_norm=True) but its head never applies it
DISTILLED_FC_NORM = "it is DeiT's distilled ViT with fc_norm, which timm builds but never applies: no final norm runs"


def config_of_timm_model(model: nn.Module) -> ViTConfig:
    """Every architectural choice of a timm VisionTransformer (or DeiT's distilled one) as a ViTConfig. A choice
    ViTConfig lacks is a ValueError naming it: the model would not compute what timm's computes."""
    from timm.layers import DiffAttention
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import Attention, Block, ParallelScalingBlock, ResPostBlock
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    kind = type(model).__name__
    if not isinstance(model, TimmViT):
        raise ValueError(f"timm's {kind} is not a plain VisionTransformer")
    block = model.blocks[0]
    if isinstance(block, ParallelScalingBlock) or type(block).__name__ == "DiffParallelScalingBlock":
        return _config_of_parallel_model(model)
    if type(block) not in (Block, ResPostBlock):
        raise ValueError(
            f"its layers are timm's {type(block).__name__}, not the pre-norm Block, ResPostBlock or a parallel one"
        )
    attn, mlp = block.attn, block.mlp
    if type(attn) not in (Attention, DiffAttention) or getattr(attn, "gate", None) is not None:
        raise ValueError(
            f"its attention is timm's {type(attn).__name__}{' (gated)' if type(attn) is Attention else ''}"
        )
    if type(attn) is DiffAttention and attn.dual_lambda:
        raise ValueError("its differential attention learns λ as two scalars (dual_lambda)")
    act = mlp_activation(mlp)
    if isinstance(model, VisionTransformerDistilled) and not isinstance(model.fc_norm, nn.Identity):
        raise ValueError(DISTILLED_FC_NORM)
    proj_bias = attn.proj.bias is not None
    fc1 = mlp.fc1_g if hasattr(mlp, "fc1_g") else mlp.fc1  # timm's SwiGLU keeps the gate's and value's apart
    if (fc1.bias is not None) != proj_bias or (mlp.fc2.bias is not None) != proj_bias:
        raise ValueError("its output projection and MLP differ in having biases")
    return ViTConfig(
        **shared_fields(model, act),
        qkv_bias=attn.qkv.bias is not None,
        attention="differential" if type(attn) is DiffAttention else "softmax",
        **_vision_transformer_fields(model, block),
        proj_bias=proj_bias,
        layer="res_post" if type(block) is ResPostBlock else "pre",  # ResPostBlock: the norm on each branch's output
    )


def _vision_transformer_fields(model: nn.Module, block: nn.Module) -> dict[str, Any]:
    """The fields every layer kind of timm's VisionTransformer gives alike: tokens, LayerScale, pooling's prefix."""
    from timm.models.deit import VisionTransformerDistilled

    scale = getattr(block, "ls1", getattr(block, "ls", nn.Identity()))  # a parallel block's one LayerScale
    return dict(
        reg_tokens=model.num_reg_tokens,
        distill_token=isinstance(model, VisionTransformerDistilled),
        layer_scale_init=1e-5 if not isinstance(scale, nn.Identity) else None,  # the start value is not needed
        pool_prefix=model.pool_include_prefix,
    )


def _config_of_parallel_model(model: nn.Module) -> ViTConfig:
    """A VisionTransformer of ViT-22B's parallel layers (parallel.py reads what they differ in)."""
    from vit.interop.timm.parallel import parallel_block_fields

    block = model.blocks[0]
    return ViTConfig(
        **shared_fields(model, activation(block.mlp_act)),
        **parallel_block_fields(block),
        **_vision_transformer_fields(model, block),
    )


def check_patch_embed(embed: nn.Module, norm: bool = False) -> None:
    """Refuse a timm patch embedding that is not one strided convolution (a ResNet stem, overlaps), or, unless the
    caller reads it as patch_norm (`norm`), one followed by a norm."""
    from timm.layers import PatchEmbed

    if type(embed) is not PatchEmbed:
        raise ValueError(f"its patch embedding is timm's {type(embed).__name__}, not a strided convolution")
    if (
        not isinstance(embed.proj, nn.Conv2d)
        or embed.dynamic_img_pad
        or (not norm and not isinstance(embed.norm, nn.Identity))
    ):
        raise ValueError("its patch embedding is not a plain strided convolution")
    if embed.proj.stride != embed.proj.kernel_size:
        raise ValueError(f"its patches overlap (stride {embed.proj.stride}, kernel {embed.proj.kernel_size})")


def sizes(model: nn.Module, hidden: int) -> dict[str, Any]:
    """The ViTConfig sizes of a timm ViT of any class: input, patches, classes, width, depth, heads, MLP ratio."""
    embed = model.patch_embed
    return dict(
        img_size=tuple(embed.img_size),
        patch_size=tuple(embed.patch_size),
        in_chans=embed.proj.in_channels,
        num_classes=model.num_classes,
        embed_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=getattr(model.blocks[0], "attn", model.blocks[0]).num_heads,  # a parallel block holds its own
        mlp_ratio=mlp_ratio_for(hidden, model.embed_dim),
    )


def layer_fields(model: nn.Module, act: str) -> tuple[dict[str, Any], int]:
    """The ViTConfig fields of a timm ViT's layers, final norms and pooling, whatever embeds its patches
    (VisionTransformer, Eva, NaFlexVit), and its MLP's hidden width; refusing a pooling or mix of norms ViTConfig
    lacks."""
    block = model.blocks[0]
    attn, mlp, pool = getattr(block, "attn", block), getattr(block, "mlp", None), model.global_pool
    halves = 2 if hasattr(attn, "sub_norm") else 1  # differential attention's head_dim is each half's
    if attn.num_heads * attn.head_dim * halves != model.embed_dim:
        raise ValueError(f"its attention width {attn.num_heads} x {attn.head_dim} is not its width {model.embed_dim}")
    if pool not in ("token", "avg", "map"):
        raise ValueError(f"its pooling global_pool={pool!r}")
    pooling = check_attention_pool(model.attn_pool, act, model.embed_dim) if pool == "map" else {}
    kinds = _norm_kinds(model, block)
    if len(kinds) != 1:
        raise ValueError(f"its norms differ in kind or eps: {sorted(kinds)}")
    (norm_layer, eps), hidden = kinds.pop(), mlp.fc2.in_features if mlp is not None else block.in_split[0]
    identity = lambda module: isinstance(module, nn.Identity)  # noqa: E731
    fields = dict(
        pool=pool,
        norm_layer=norm_layer,
        norm_eps=eps,
        final_norm="pooled" if not identity(model.fc_norm) else "none" if identity(model.norm) else "tokens",
        qk_norm=not identity(attn.q_norm),
        attn_norm=not identity(getattr(attn, "norm", nn.Identity())),
        mlp_norm=mlp is not None and not identity(mlp.norm),
        act=act,
        **_plain_pool(pooling, attn.num_heads, hidden, model.embed_dim),
    )
    return fields, hidden


def shared_fields(model: nn.Module, act: str) -> dict[str, Any]:
    """The ViTConfig fields timm's VisionTransformer and Eva both hold, read off either (sizes, tokens, norms,
    pooling), refusing a patch embedding, pooling or mix of norms ViTConfig lacks."""
    embed = model.patch_embed
    check_patch_embed(embed, norm=True)
    fields, hidden = layer_fields(model, act)
    identity = lambda module: isinstance(module, nn.Identity)  # noqa: E731
    return dict(
        **sizes(model, hidden),
        pos_embed="learned" if model.pos_embed is not None else "none",
        class_token=model.cls_token is not None,
        pos_embed_prefix=not model.no_embed_class,
        patch_bias=embed.proj.bias is not None,
        patch_norm=not identity(embed.norm),
        embed_norm=not identity(model.norm_pre),
        **fields,
    )
