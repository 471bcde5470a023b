"""The JAX .npz files of the original ViT (google-research/vision_transformer), read by timm's own loader."""

from __future__ import annotations

import math
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import _load_weights

from vit.interop.files import Converted
from vit.interop.timm import from_timm, mlp_ratio_for, table_grid, timm_kwargs
from vit.model.config import ViTConfig
from vit.model.size import check_memory, machine_memory, readable

_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
JAX_EMBEDDING, JAX_POSITIONS = "embedding/kernel", "Transformer/posembed_input/pos_embedding"
JAX_MLP = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"
# Every array timm's loader reads into the network we build from a .npz; any other is a part we would drop.
JAX_USED = re.compile(
    r"(embedding|head)/(kernel|bias)|cls|Transformer/posembed_input/pos_embedding|Transformer/encoder_norm/(scale|bias)"
    r"|Transformer/encoderblock_\d+/(LayerNorm_[02]/(scale|bias)|MlpBlock_3/Dense_[01]/(kernel|bias)"
    r"|MultiHeadDotProductAttention_1/(query|key|value|out)/(kernel|bias))"
)


def from_jax(path: Path, config: ViTConfig | None) -> Converted:
    """The original ViT's .npz (google-research/vision_transformer layout), read by timm's loader into a timm
    model. Sizes come from the arrays, heads and the rest from `config`, as for timm state dicts."""
    if config is None:
        raise ValueError("a .npz file does not record the number of heads: choose a model preset for it")
    shapes = _shapes(path)
    if JAX_EMBEDDING not in shapes:
        hint = " (big_vision's params/ layout is not supported)" if f"params/{JAX_EMBEDDING}" in shapes else ""
        raise ValueError(f"not a ViT .npz: no '{JAX_EMBEDDING}' array{hint}")
    if unused := sorted(k for k in shapes if not JAX_USED.fullmatch(k)):
        pre_logits = any(k.startswith("pre_logits/") for k in unused)
        what = " (pre_logits/*: the Dense + tanh representation layer of ImageNet-21k models)" if pre_logits else ""
        raise ValueError(f"arrays this ViT has no place for, so its logits would differ: {', '.join(unused)}{what}")
    ph, pw, chans, dim = shapes[JAX_EMBEDDING]  # (H, W, C_in, D)
    prefix = 1 if "cls" in shapes else 0
    depth = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"Transformer/encoderblock_(\d+)/", k)))
    gh, gw = table_grid(shapes[JAX_POSITIONS][1] - prefix, config)  # (1, prefix + N, D)
    source = replace(
        config,
        img_size=(gh * ph, gw * pw),
        patch_size=(ph, pw),
        in_chans=chans,
        num_classes=shapes["head/kernel"][-1] if "head/kernel" in shapes else 0,
        embed_dim=dim,
        depth=depth,
        mlp_ratio=mlp_ratio_for(shapes[JAX_MLP][1], dim),  # (D, hidden)
        qkv_bias=True,
        pos_embed="learned",
        pool="token" if prefix else "avg",
        layer_scale_init=None,
    )
    check_memory(source)
    model = TimmViT(**timm_kwargs(source))
    try:
        _load_weights(model, str(path))
    except (zipfile.BadZipFile, EOFError, OSError) as err:  # an array cut short, a bad checksum
        raise ValueError(f"not a readable .npz file ({err})") from None
    return source, from_timm(model.state_dict(), source), {}


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each array's shape, read from its .npy header alone and held to the bytes the file has for it: np.load would
    allocate whatever a header claims (terabytes, in a file of a kilobyte) before finding the data short."""
    shapes, total = {}, 0
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                name = member.filename.removesuffix(".npy")
                with archive.open(member) as f:
                    version = np.lib.format.read_magic(f)
                    if version not in _HEADERS:
                        raise ValueError(f"{name}: .npy format {version}, not 1.0 or 2.0")
                    shape, _, dtype = _HEADERS[version](f)
                    size = math.prod(shape) * dtype.itemsize
                    if dtype.hasobject:
                        raise ValueError(f"{name}: an array of pickled objects, not numbers")
                    if size > (held := member.file_size - f.tell()):
                        raise ValueError(
                            f"{name}: its header claims shape {shape} of {dtype}, {readable(size)}, but the file "
                            f"holds {readable(held)} for it"
                        )
                shapes[name], total = shape, total + size
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise ValueError(f"not a readable .npz file ({err})") from None
    if (memory := machine_memory()) is not None and total > memory:
        raise ValueError(f"its arrays hold {readable(total)}, more than this machine's {readable(memory)} of memory")
    return shapes
