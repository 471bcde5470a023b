"""ViTMAEForPreTraining's decoder (transformers' ViTMAEDecoder) in a save_pretrained folder, as our MAEDecoder
(vit/model/mae.py) holds it, so that task=mae continues pretraining with it. The encoder loads as the classic family
does (classic.py), which leaves this decoder out.

    decoder_embed -> embed, mask_token -> mask_token, decoder_layers.i -> layers.i (the encoder's spellings, keys.py),
    decoder_norm -> norm, decoder_pred -> pred

Two layouts differ, each by a permutation:
- decoder_pos_embed is MAE's fixed table [sin x | cos x | sin y | cos y] (each block of D/4), ours sincos2d's with
  each half's sin and cos interleaved (vit/model/pos_embed.py). Rather than keep a second table, the decoder's
  channels are renumbered to ours: the rows of every weight that writes to its residual stream, the columns of every
  one that reads it, the LayerNorms on it; LayerNorm, attention and the MLP compute the same whatever the channels'
  order. The folder's table is checked to be MAE's (transformers 5 builds a fresh model's as zeros, which ours
  cannot be).
- decoder_pred flattens a patch as (row, column, channel), ours as (channel, row, column) (kernels.patchify).

What our decoder cannot be is refused naming the folder's key: an MLP other than 4 x decoder_hidden_size, another
activation, no query/key/value bias, a patch size other than the run's network's, a network without the class token
the decoder reads. A decoder of patches of another channel count than the run's images is read as it is
(FolderDecoder.channels): what to do with it is the task's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from vit.interop.files import read_json_object, read_weights
from vit.interop.hugging_face.keys import HF_CONFIG, HF_PICKLED_WEIGHTS, HF_WEIGHTS, hugging_face_to_timm
from vit.interop.timm import from_timm
from vit.model.config import ViTConfig
from vit.model.mae import decoder_config
from vit.model.pos_embed import sincos_2d

PREFIX = "decoder."  # ViTMAEForPreTraining's module of the decoder
# transformers' ViTMAEConfig defaults for the decoder, which config.json may leave out
DEFAULTS = dict(
    decoder_hidden_size=512,
    decoder_num_hidden_layers=8,
    decoder_num_attention_heads=16,
    decoder_intermediate_size=2048,
    norm_pix_loss=False,
    hidden_act="gelu",
    qkv_bias=True,
    num_channels=3,
    patch_size=16,
    image_size=224,
)
# the decoder's layers: decoder_layers.i in the hub's folders, decoder_encoder.layer.i as transformers 5 saves them
_LAYERS = re.compile(r"^decoder_(?:layers|encoder\.layer)\.")
# the decoder's modules by what they do to its residual stream: write to it (their rows and biases, and the
# LayerNorms' scales and shifts), or read it (their weights' columns)
_WRITES, _READS = ("embed", "norm1", "norm2", "norm", "out_proj", "fc2"), ("qkv", "fc1", "pred")


@dataclass(frozen=True)
class FolderDecoder:
    """A folder's MAE decoder: its width, depth and heads, the channels of the patches it predicts, whether it
    learnt per-patch normalised targets (norm_pix_loss), and its weights in MAEDecoder's names and layout."""

    dim: int
    depth: int
    heads: int
    channels: int
    norm_pix: bool
    weights: dict[str, Tensor]


def _table_order(dim: int) -> Tensor:
    """MAE's table as a permutation of ours: its channel c is our sincos2d's channel order[c]. (dim,)"""
    k, order = dim // 4, []
    for half in (0, dim // 2):  # x, then y: each [sin 0 .. k-1 | cos 0 .. k-1], ours sin/cos pairs
        order += [half + 2 * i for i in range(k)] + [half + 2 * i + 1 for i in range(k)]
    return torch.tensor(order)


def _renumbered(weights: dict[str, Tensor], order: Tensor) -> dict[str, Tensor]:
    """transformers' decoder weights over the residual channels of our table: our channel order[c] is its c."""
    ours = order.argsort()
    out = {}
    for key, value in weights.items():
        module, param = key.rsplit(".", 1) if "." in key else ("", key)
        name = module.rsplit(".", 1)[-1]
        if key == "mask_token":
            out[key] = value.index_select(-1, ours)
        elif name in _READS and param == "weight":
            out[key] = value.index_select(1, ours)
        elif name in _WRITES:
            out[key] = value.index_select(0, ours)
        else:  # qkv's and fc1's biases, pred's: not the residual stream
            out[key] = value
    return out


def _check(v: dict, encoder: ViTConfig, folder: Path) -> None:
    """What our decoder cannot be, refused naming config.json's key."""
    dim = v["decoder_hidden_size"]
    refusals = [
        (v["decoder_intermediate_size"] != 4 * dim, "decoder_intermediate_size", "4 x decoder_hidden_size"),
        (v["hidden_act"] not in ("gelu", "gelu_python"), "hidden_act", "gelu"),
        (v["qkv_bias"] is not True, "qkv_bias", "true"),
        ((v["patch_size"],) * 2 != tuple(encoder.patch_size), "patch_size", "the run's model.patch_size"),
        (dim % 4 or dim % v["decoder_num_attention_heads"], "decoder_hidden_size", "divisible by 4 and the heads"),
    ]
    for refused, key, wanted in refusals:
        if refused:
            raise ValueError(f"{folder}: its MAE decoder has {key}={v[key]!r}; task=mae's decoder needs {wanted}")
    if encoder.num_prefix_tokens != 1 or not encoder.class_token:
        raise ValueError(
            f"{folder}: its MAE decoder reads the class token alone before the patches; the run's network has "
            f"{encoder.num_prefix_tokens} prefix tokens (model.pool={encoder.pool}): keep the folder's class token"
        )


def mae_decoder(folder: Path, encoder: ViTConfig) -> FolderDecoder | None:
    """The decoder a Hugging Face ViTMAEForPreTraining folder holds, for a run whose network is `encoder`; None where
    the folder is no such model (another model_type, ViTMAEModel's encoder alone). ValueError for a decoder that
    ours cannot be."""
    if not (folder / HF_CONFIG).is_file() or read_json_object(folder / HF_CONFIG).get("model_type") != "vit_mae":
        return None
    v = {**DEFAULTS, **read_json_object(folder / HF_CONFIG)}
    file = next((folder / name for name in (HF_WEIGHTS, HF_PICKLED_WEIGHTS) if (folder / name).is_file()), None)
    state = {} if file is None else {k: t for k, t in read_weights(file).items() if k.startswith(PREFIX)}
    if not state:
        return None
    _check(v, encoder, folder)
    try:
        return _read(state, v, encoder, folder)
    except KeyError as err:
        raise ValueError(f"{folder}: its MAE decoder lacks {PREFIX}{err.args[0]}") from None


def _read(state: dict[str, Tensor], v: dict, encoder: ViTConfig, folder: Path) -> FolderDecoder:
    """The folder's decoder weights `state` (decoder.*) in MAEDecoder's names and layout, config.json's `v`."""
    dim, depth, heads = v["decoder_hidden_size"], v["decoder_num_hidden_layers"], v["decoder_num_attention_heads"]
    own = {k.removeprefix(PREFIX): t for k, t in state.items()}
    table = own.pop("decoder_pos_embed")  # (1, 1 + N, D): a zero row for the class token
    grid = (v["image_size"] // v["patch_size"],) * 2
    order = _table_order(dim)
    expected = sincos_2d(grid, dim).flatten(0, 1)[:, order]
    if table.shape != (1, 1 + expected.shape[0], dim) or not torch.allclose(table[0, 1:].float(), expected, atol=1e-5):
        raise ValueError(
            f"{folder}: its decoder_pos_embed is not MAE's fixed sin-cos table of a {grid[0]}x{grid[1]} grid, which "
            "task=mae's decoder computes (a model saved untrained by transformers 5 holds zeros)"
        )
    # the layers and the final norm as transformers' encoder spells them, then through timm's layout into ours
    spelled = {_LAYERS.sub("encoder.layer.", k): t for k, t in own.items() if _LAYERS.match(k)}
    spelled |= {k.replace("decoder_norm.", "layernorm.", 1): t for k, t in own.items() if k.startswith("decoder_norm.")}
    layers = from_timm(hugging_face_to_timm(spelled, "vit"), decoder_config(encoder, dim, depth, heads))
    p, channels = v["patch_size"], v["num_channels"]
    weights = {
        **layers,
        "mask_token": own["mask_token"],
        "embed.weight": own["decoder_embed.weight"],
        "embed.bias": own["decoder_embed.bias"],
        # (p, p, C) -> (C, p, p) rows
        "pred.weight": own["decoder_pred.weight"].unflatten(0, (p, p, channels)).permute(2, 0, 1, 3).flatten(0, 2),
        "pred.bias": own["decoder_pred.bias"].unflatten(0, (p, p, channels)).permute(2, 0, 1).flatten(),
    }
    return FolderDecoder(dim, depth, heads, channels, bool(v["norm_pix_loss"]), _renumbered(weights, order))
