"""The size of a network, counted before it is built: exact for every kind of part, the same at any depth, and a
network larger than the machine refused by its sizes."""

from itertools import chain

import pytest
import torch

from tests.helpers import tiny_config
from vit.model import ConfigError, VisionTransformer
from vit.model import size as sizes
from vit.model.size import check_memory, weight_bytes


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(pos_embed="sincos2d"),  # a buffer, not a parameter
        dict(pos_embed="rope_mixed"),  # frequencies per layer, held outside the layers
        dict(rel_pos="mlp", rel_pos_dim=8),  # an MLP per layer, held outside the layers
        dict(rel_pos="mlp_shared", rel_pos_dim=8),
        dict(act="swiglu", pool="map", class_token=False, reg_tokens=2),
        dict(distill_token=True, depth=5, layer_scale_init=0.1, qk_norm=True),
        dict(depth=3, kv_heads=(2, 1, 2)),  # grouped-query layers of two sizes
    ],
)
def test_the_count_is_the_built_networks_bytes(overrides):
    config = tiny_config(**overrides)
    model = VisionTransformer(config)
    assert weight_bytes(config) == sum(t.nbytes for t in chain(model.parameters(), model.buffers()))


def test_a_network_larger_than_the_machine_is_refused_by_its_sizes(monkeypatch):
    config = tiny_config(depth=3)
    need = weight_bytes(config)
    monkeypatch.setattr(sizes, "machine_memory", lambda: need)
    check_memory(config)  # exactly fits
    monkeypatch.setattr(sizes, "machine_memory", lambda: need - 1)
    with pytest.raises(ConfigError) as refusal:
        check_memory(config, where="model.")
    assert str(refusal.value) == (
        f"model.embed_dim=32, model.depth=3, model.mlp_ratio=4.0 (an MLP 128 wide), a 4x4 patch grid and "
        f"model.num_classes=5: the network needs {sizes.readable(need)} for its weights alone (its largest tensor, "
        f"layers.0.mlp.fc1.weight, is (128, 32)), more than this machine's {sizes.readable(need - 1)} of memory"
    )
    monkeypatch.setattr(sizes, "machine_memory", lambda: None)  # a system that does not say: nothing to refuse by
    check_memory(config)


@pytest.mark.parametrize("overrides", [dict(embed_dim=2**62, num_heads=1), dict(in_chans=2**70)])
def test_sizes_past_64_bits_are_refused_not_a_torch_error(overrides):
    """torch's RuntimeError (a tensor's bytes overflow) or TypeError (a size past int64) on the meta device."""
    with pytest.raises(ConfigError, match=r"needs more than 9\.2 EB for its weights alone \(a tensor's size overflows"):
        check_memory(tiny_config(**overrides))
    with torch.device("meta"), pytest.raises(RuntimeError, match="overflow"):  # torch's words, which _on_meta reads
        VisionTransformer(tiny_config(embed_dim=2**62, num_heads=1))
