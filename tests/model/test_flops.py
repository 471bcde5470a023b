"""The analytic FLOP count that run summaries and the benchmarks' MFU rest on agrees with torch's own counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.helpers import tiny_config
from vit.model import VisionTransformer
from vit.model.flops import forward_flops
from vit.model.presets import create_model


def counted(model: VisionTransformer) -> int:
    """torch's count of one image through the whole model, as MFU counts it (forward() does less)."""
    with FlopCounterMode(display=False) as counter:
        model.forward_head(model.forward_features(torch.randn(1, model.config.in_chans, *model.config.img_size)))
    return counter.get_total_flops()


@pytest.mark.parametrize("preset", ["vit_cifar", "vit_tiny_16", "eva02_small_14", "siglip_base_16", "dinov2_small_14"])
def test_analytic_flops_equal_torchs_count_of_the_forward_pass(preset):
    model = create_model(preset, depth=2)
    model.set_fused_attn(False)  # torch counts no FLOPs in CPU SDPA kernels
    assert forward_flops(model.config) == pytest.approx(counted(model), rel=1e-3)


@pytest.mark.parametrize("heads", [{"pool": "token_avg"}, {"distill_token": True}, {"num_classes": 0}])
def test_the_head_is_counted_as_wide_and_as_many_as_it_is(heads):
    """Exactly: the 2D-wide features of token_avg, DeiT's second head, no head at all."""
    model = VisionTransformer(tiny_config(**heads))
    model.set_fused_attn(False)
    assert forward_flops(model.config) == counted(model)
