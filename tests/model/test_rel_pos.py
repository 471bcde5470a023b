"""The relative position bias (vit/model/rel_pos.py): a function of the offset between two patches alone, read
from one table of every offset the grid holds; none for prefix tokens. Parity with timm's RelPosMlp, and the
VisionTransformerRelPos models, are in tests/interop/test_timm_families.py."""

import torch

from tests.helpers import perturb_, tiny_config
from vit.model import VisionTransformer
from vit.model.rel_pos import RelativePositionBias, log_offsets, offset_index


def test_each_query_key_pair_reads_the_log_of_its_own_offset():
    grid = (3, 4)
    table, index = log_offsets(grid).flatten(0, 1), offset_index(grid)
    positions = [(y, x) for y in range(3) for x in range(4)]  # raster order
    for i, (yi, xi) in enumerate(positions):
        for j, (yj, xj) in enumerate(positions):
            d = torch.tensor([yi - yj, xi - xj], dtype=torch.float32)
            torch.testing.assert_close(table[index[i, j]], d.sign() * torch.log1p(d.abs()))


def test_the_bias_depends_on_the_offset_alone_and_leaves_prefix_tokens_out():
    bias = perturb_(RelativePositionBias(num_heads=2, hidden=8, num_prefix_tokens=1)).eval()((3, 4))  # (2, 13, 13)
    assert bias.shape == (2, 13, 13) and bias[:, 0].abs().sum() == bias[:, :, 0].abs().sum() == 0
    n = lambda y, x: 1 + y * 4 + x  # noqa: E731 - a patch's row, after the class token
    torch.testing.assert_close(bias[:, n(0, 0), n(1, 2)], bias[:, n(1, 1), n(2, 3)])  # the same offset (-1, -2)
    assert not torch.allclose(bias[:, n(0, 0), n(1, 2)], bias[:, n(1, 2), n(0, 0)])  # the opposite one


def test_a_model_with_rel_pos_gives_its_layers_their_own_or_one_shared_bias():
    for shared, modules in ((False, 2), (True, 1)):
        c = tiny_config(pos_embed="none", rel_pos="mlp_shared" if shared else "mlp", rel_pos_dim=8, num_classes=3)
        model = perturb_(VisionTransformer(c)).eval()
        assert len(model.rel_pos) == modules
        x = torch.randn(2, 3, *c.img_size)
        before = model(x)
        torch.testing.assert_close(before, model.forward_head(model.forward_features(x)))  # first-token path
        with torch.no_grad():
            model.rel_pos[0].fc1.weight.mul_(3.0)  # the first layer's bias (or every layer's) moves the logits
        assert not torch.allclose(model(x), before, atol=1e-4)
