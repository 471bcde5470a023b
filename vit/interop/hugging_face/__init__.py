"""Hugging Face transformers' ViT families: save_pretrained folders (config.json + weights), and ViT state dicts
saved as a file (the other families' are refused by name: only config.json says their architecture). Keys are
renamed to timm's, and timm's to ours by vit/interop/timm/layout.py, so there is one translation into our names; the
architecture is config.json's, with transformers' defaults for what it leaves out. One file per job:

family.py       what the loader knows of a family (Family): its tower's names, defaults, left-out weights, switches
classic.py      vit, deit, vit_mae, ijepa, pixio: the classic ViT's layout
dinov2.py       dinov2, dinov2_with_registers, tipsv2: LayerScale, registers after the positions
rope.py         dinov3_vit, sapiens2: DINOv3's rotary embedding
contrastive.py  the vision towers of clip, metaclip_2, siglip, siglip2, aimv2
radio.py        radio
dispatch.py     model_type -> its family, or the reason it is refused (mlcd)
keys.py         a family's weights, in any of its spellings, in timm's layout; bare state dicts told apart
config.py       config.json -> ViTConfig
folder.py       a save_pretrained folder: architecture, weights and preprocessing
mae_decoder.py  ViTMAEForPreTraining's decoder, for task=mae to continue (the loader leaves it out)

Left out, not being part of the network from an image to its pooled features or logits: poolers of dense + tanh
(ViTModel's, DeiTModel's, IJepaModel's), mask tokens (masked-image pretraining's input), MAE's decoder, a dual
encoder's text tower and contrastive projections. Outputs equal transformers' at config.json's image size; at another
one transformers resamples its position table its own way (DINOv2's without antialiasing), ours as timm does.
"""

from vit.interop.hugging_face.config import hugging_face_config
from vit.interop.hugging_face.folder import HF_PREPROCESSOR, from_hugging_face
from vit.interop.hugging_face.keys import (
    HF_CONFIG,
    HF_PICKLED_WEIGHTS,
    HF_WEIGHTS,
    hugging_face_to_timm,
    is_hugging_face,
    refuse_bare_family,
)

__all__ = [
    "HF_CONFIG",
    "HF_PICKLED_WEIGHTS",
    "HF_PREPROCESSOR",
    "HF_WEIGHTS",
    "from_hugging_face",
    "hugging_face_config",
    "hugging_face_to_timm",
    "is_hugging_face",
    "refuse_bare_family",
]
