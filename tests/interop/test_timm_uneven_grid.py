"""timm's ViTs whose image size is no whole number of patches (SigLIP so400m at 384 px, patch 14: a 27 x 27 grid, the
convolution leaving the last 6 pixels out) load with timm's logits. Two layers, width 64, random weights; no hub."""

import pytest
import torch

from tests.helpers import perturb_
from vit.checkpoint import load

timm = pytest.importorskip("timm")


@pytest.mark.parametrize("name", ["vit_so400m_patch14_siglip_384", "vit_so400m_patch14_siglip_gap_384"])
@pytest.mark.parametrize(("size", "grid"), [(384, 27), (60, 4)])
def test_a_grid_of_whole_patches_that_leaves_pixels_out_loads_with_timms_logits(tmp_path, name, size, grid):
    from timm.models import save_for_hf

    torch.manual_seed(0)
    theirs = timm.create_model(name, depth=2, embed_dim=64, num_heads=4, mlp_ratio=2, num_classes=5, img_size=size)
    perturb_(theirs, std=0.1).eval()
    save_for_hf(theirs, str(tmp_path), safe_serialization=True)
    loaded = load(tmp_path)
    assert loaded.config.img_size == (size, size) and loaded.config.grid_size == (grid, grid)
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        expected = theirs(images)
        assert expected.abs().mean() > 0.05  # not two near-zero tensors
        torch.testing.assert_close(loaded.model(images), expected, atol=1e-5, rtol=0)
