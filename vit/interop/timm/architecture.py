"""A timm architecture: built by name on the meta device (no memory, no weights), and read as a ViTConfig by the
reader of its class (VisionTransformer: modules.py, Eva: eva.py, VisionTransformerRelPos: relpos.py, NaFlexVit:
naflex.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vit.interop.timm.eva import config_of_eva_model, eva_renaming
from vit.interop.timm.modules import config_of_timm_model
from vit.interop.timm.naflex import config_of_naflex_model, naflex_renaming
from vit.interop.timm.parallel import parallel_renaming
from vit.interop.timm.relpos import config_of_relpos_model, relpos_renaming
from vit.model.config import ViTConfig


def _gemma4_refusal(model: nn.Module) -> str:
    """What Gemma 4's ViT (timm's Gemma4VitEncoder, and the classifier around one) does that ViTConfig lacks."""
    clipped = any(getattr(module, "use_clipped", False) for module in model.modules())
    cells = getattr(model, "global_pool", None) == "soft"  # the encoder's own features
    return (
        "Gemma 4's ViT, whose layers normalise each branch's output as well as its input (sandwich norms), normalise "
        f"the values and attend unscaled{', clip their linear maps' if clipped else ''}, with a table per axis looked "
        f"up at each row and column, never resampled{', and patches averaged in k x k cells' if cells else ''}"
    )


def _sam_refusal(model: nn.Module) -> str:
    """What SAM's ViT (timm's VisionTransformerSAM) does that ViTConfig has no field for."""
    window = max(block.window_size for block in model.blocks)
    found = {
        f"attention within {window} x {window} windows in most layers": window > 0,
        "a decomposed relative position bias (rel_pos_h, rel_pos_w)": any(b.attn.use_rel_pos for b in model.blocks),
        "rotary phases of its own in each window": model.rope_global is not None,
        "a convolutional neck": isinstance(model.neck, nn.Sequential),
    }
    return "SAM's ViT with " + (", ".join(what for what, has in found.items() if has) or "tokens laid out as a grid")


def read_timm_module(model: nn.Module) -> tuple[ViTConfig, Any]:
    """The ViTConfig of a timm model of a class that holds ViTs (VisionTransformer, Eva, VisionTransformerRelPos),
    and the renaming of its state dict into VisionTransformer's layout (the identity for VisionTransformer); the
    classes whose layers ViTConfig cannot express (SAM's, Gemma 4's) are refused saying what they do."""
    from timm.models.eva import Eva
    from timm.models.naflexvit import NaFlexVit
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    if isinstance(model, VisionTransformerSAM):
        raise ValueError(_sam_refusal(model))
    if type(model).__name__ in ("Gemma4VitEncoder", "Gemma4VitClassifier"):
        raise ValueError(_gemma4_refusal(model))
    if isinstance(model, NaFlexVit):
        return config_of_naflex_model(model), naflex_renaming(model)
    if isinstance(model, Eva):
        return config_of_eva_model(model), eva_renaming(model)
    if isinstance(model, VisionTransformerRelPos):
        return config_of_relpos_model(model), relpos_renaming(model)
    config = config_of_timm_model(model)
    return config, parallel_renaming(model) if config.layer == "parallel" else packed_swiglu


def timm_architecture(name: str, **model_args: Any) -> nn.Module:
    """timm's model of a registered architecture name, built on the meta device (no memory, no weights)."""
    import timm

    if not timm.is_model(name):
        raise ValueError(f"{name!r} is not one of timm's architectures")
    try:
        with torch.device("meta"):
            return timm.create_model(name, pretrained=False, **model_args)
    except (TypeError, ValueError, KeyError, RuntimeError, AssertionError, ZeroDivisionError) as err:
        # a config.json's model_args are anyone's: patch_size=0, norm_layer='nope' fail inside timm
        raise ValueError(f"timm cannot build {name} with model_args {model_args}: {err}") from None


def architecture_named(path: Path) -> str | None:
    """The timm architecture a file or folder is named after (vit_small_patch16_224.augreg_in21k.pth), if any."""
    import timm

    stem = path.name.split(".")[0]
    return stem if timm.is_model(stem) else None


def packed_swiglu(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """timm's unpacked SwiGLU (AIMv2's fc1_g and fc1_x) as the packed fc1 = [W_g; W_x] of SwiGLUPacked, which the
    rest of the translation reads; every other key as it is."""
    out = {k: v for k, v in state.items() if not re.search(r"\.mlp\.fc1_[gx]\.", k)}
    for key in [k for k in state if re.search(r"\.mlp\.fc1_g\.", k)]:
        out[key.replace(".fc1_g.", ".fc1.")] = torch.cat((state[key], state[key.replace(".fc1_g.", ".fc1_x.")]))
    return out
