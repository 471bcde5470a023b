"""The size of the network a ViTConfig declares, known before it is built. Configs come from files and command
lines, and a one-kilobyte config.json can state a million layers: building first would spend minutes and all of
the machine's memory before any check could say so."""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from dataclasses import replace
from itertools import chain

import torch
from torch import Tensor, nn

from vit.model.config import ConfigError, ViTConfig
from vit.model.vision_transformer import VisionTransformer

_LAYER = re.compile(r"layers\.(\d+)\.")


def _on_meta(config: ViTConfig) -> VisionTransformer:
    """The network on the meta device: shapes without memory (the time is still a module per part, so ~depth).
    OverflowError where a tensor's bytes would not fit in 64 bits."""
    try:
        with torch.device("meta"):
            return VisionTransformer(config)
    except (RuntimeError, TypeError) as err:
        # torch's "Storage size calculation overflowed with sizes=[...]", or a size past int64's "Overflow when
        # unpacking long long"
        if "overflow" in str(err).lower():
            raise OverflowError(str(err)) from None
        raise


def _shallow(config: ViTConfig, depth: int, kv_heads: int | None = None) -> ViTConfig:
    """The config cut to `depth` layers, each with kv_heads key/value heads (the first layer's when None)."""
    g = kv_heads or config.kv_heads_of(0)
    return replace(config, depth=depth, kv_heads=None if g == config.num_heads else g)


@functools.lru_cache(maxsize=256)  # a run checks one config at several places: the config, the build, a load
def weight_bytes(config: ViTConfig) -> int:
    """Bytes of VisionTransformer(config)'s parameters and buffers (position tables, rotary phases), in fp32. A one-
    and a two-layer model built on the meta device give everything but the layers and one layer's share (rope_mixed's
    frequencies and per-layer relative position MLPs included), so that a depth of a million costs what one does;
    layers of another number of key/value heads (kv_heads) are sized apart."""
    kv = config.kv_heads
    layers = Counter(kv) if isinstance(kv, tuple) else {config.kv_heads_of(0): config.depth}  # G: its layers
    sizes = {
        g: [
            sum(t.nbytes for t in chain(model.parameters(), model.buffers()))
            for model in (_on_meta(_shallow(config, depth, g)) for depth in (1, 2))
        ]
        for g in layers
    }
    one, two = sizes[config.kv_heads_of(0)]
    return 2 * one - two + sum(n * (sizes[g][1] - sizes[g][0]) for g, n in layers.items())


def machine_memory() -> int | None:
    """This machine's physical memory in bytes; None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows), or no such name
        return None


def readable(count: int) -> str:
    """'25.3 GB', '28.4 TB': decimal units, as memory is sold."""
    units = ("bytes", "KB", "MB", "GB", "TB", "PB", "EB")
    power = min(len(str(count)) - 1, 3 * (len(units) - 1)) // 3
    return f"{count / 1000**power:.1f} {units[power]}"


def first_layer(config: ViTConfig) -> nn.Module:
    """The network's first transformer layer on the meta device: the shapes of its maps, without their memory or the
    time of the other layers."""
    return _on_meta(_shallow(config, 1)).layers[0]


def check_fits(need: int, what: str) -> None:
    """Refuse, before it is made, `what` (a phrase naming the settings that size it) needing `need` bytes, more than
    this machine's memory."""
    have = machine_memory()
    if have is not None and need > have:
        raise ConfigError(f"{what} needs {readable(need)}, more than this machine's {readable(have)} of memory")


def check_memory(config: ViTConfig, where: str = "") -> None:
    """Refuse, before building it, a network whose weights alone would not fit in this machine's memory, saying
    the sizes that make it so (as fields prefixed with `where`, e.g. 'model.'), its largest tensor, which points at
    any other field at fault (in_chans, reg_tokens, ...), and what it would need."""
    try:
        need = weight_bytes(config)
    except OverflowError:
        need, largest = None, "a tensor's size overflows 64 bits"
    have = machine_memory()
    if need is None or (have is not None and need > have):
        if need is not None:
            model = _on_meta(_shallow(config, 1))
            name, tensor = max(chain(model.named_parameters(), model.named_buffers()), key=lambda kv: kv[1].numel())
            largest = f"its largest tensor, {name}, is {tuple(tensor.shape)}"
        c, (h, w) = config, config.grid_size
        needs = f"more than {readable(2**63)}" if need is None else readable(need)
        raise ConfigError(
            f"{where}embed_dim={c.embed_dim}, {where}depth={c.depth}, {where}mlp_ratio={c.mlp_ratio} (an MLP "
            f"{c.mlp_hidden_dim} wide), a {h}x{w} patch grid and {where}num_classes={c.num_classes}: the network "
            f"needs {needs} for its weights alone ({largest}), more than this machine's "
            f"{'' if have is None else readable(have) + ' of '}memory"
        )


def check_depth(config: ViTConfig, weights: dict[str, Tensor]) -> None:
    """Refuse a config whose depth is not the number of layers these weights (our names) hold: the one size whose
    mistake costs time before anything can be compared, even on the meta device (a module per part per layer)."""
    layers = {int(m[1]) for k in weights if (m := _LAYER.match(k))}
    held = max(layers) + 1 if layers else 0
    if held != config.depth:
        raise ValueError(f"its configuration states depth={config.depth}, but its weights hold {held} layers")


def check_weights(config: ViTConfig, weights: dict[str, Tensor]) -> None:
    """Refuse, before building it, a config whose network would not fit in memory or would not hold these weights
    (our names) exactly: the depth first (check_depth), then the memory (check_memory: position tables and rotary
    phases are in no file), then every tensor's shape against the network's, built on the meta device."""
    if strays := sorted(k for k, v in weights.items() if not isinstance(v, Tensor)):
        raise ValueError(f"{strays[0]} is not a tensor (a Python {type(weights[strays[0]]).__name__})")
    check_depth(config, weights)
    check_memory(config)  # the network fits: none of its tensors overflows on the meta device either
    expected = _on_meta(config).state_dict()
    missing, unexpected = sorted(expected.keys() - weights.keys()), sorted(weights.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(f"weights do not match the model it describes: missing {missing}, unexpected {unexpected}")
    for key, tensor in expected.items():
        if weights[key].shape != tensor.shape:
            raise ValueError(
                f"weights do not match the model it describes: size mismatch for {key}: the file's is "
                f"{tuple(weights[key].shape)}, the configuration's {tuple(tensor.shape)}"
            )
