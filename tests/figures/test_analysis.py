import math

import pytest
import torch

from tests.helpers import perturb_, tiny_config
from vit.figures import analysis
from vit.figures.drawing import attention_figure
from vit.model import VisionTransformer
from vit.model.config import ViTConfig
from vit.model.pos_embed import frequencies, rope_2d, sincos_2d


def test_sincos2d_similarity_is_the_closed_form_mean_of_cosines_of_phase_differences():
    # sin a sin b + cos a cos b = cos(a - b): the similarity of two positions is the mean over frequency
    # pairs of cos(w_i dx) (first half) and cos(w_i dy) (second half)
    dim, grid = 32, (5, 6)
    similarity = analysis.position_similarity(sincos_2d(grid, dim))
    omega = frequencies(dim // 2)  # (dim/4,)
    for (y1, x1), (y2, x2) in [((0, 0), (4, 5)), ((2, 3), (2, 4)), ((1, 5), (3, 0))]:
        expected = (torch.cos(omega * (x1 - x2)).sum() + torch.cos(omega * (y1 - y2)).sum()) / (dim // 2)
        assert similarity[y1, x1, y2, x2].item() == pytest.approx(expected.item(), abs=1e-6)


def test_sincos2d_similarity_of_the_centre_peaks_there_and_falls_off_with_distance():
    similarity = analysis.position_similarity(sincos_2d((9, 9), 64))
    centre = similarity[4, 4]  # (9, 9) map over the grid
    assert centre[4, 4] == pytest.approx(1.0) and (centre.flatten().argmax() == 4 * 9 + 4)
    for step in range(1, 5):  # along each axis, away from the centre in both directions
        for ahead, behind in [
            (centre[4, 4 + step], centre[4, 4 + step - 1]),
            (centre[4 - step, 4], centre[5 - step, 4]),
        ]:
            assert ahead < behind
    # over the whole grid: the mean similarity falls with distance (not strictly: the table is axial, so
    # (2, 1) apart is closer in x than (0, 2) apart is in y), unlike a random table's flat profile
    distances, means = analysis.similarity_by_distance(similarity)
    assert distances[0] == 1 and means[0] == means.max() and means[-1] == means.min()
    assert torch.corrcoef(torch.stack((distances, means)))[0, 1] < -0.8
    random_distances, random_means = analysis.similarity_by_distance(
        analysis.position_similarity(torch.randn(9, 9, 64, generator=torch.Generator().manual_seed(0)))
    )
    assert abs(torch.corrcoef(torch.stack((random_distances, random_means)))[0, 1]) < 0.5


@pytest.mark.parametrize(
    "rope",
    [
        dict(pos_embed="rope2d"),
        dict(pos_embed="rope2d", rope=dict(grid="centered")),  # DINOv3's positions: drawn as indices' before
        dict(pos_embed="rope2d", rope=dict(ref_grid=16)),  # EVA's scaled positions: drawn as indices' before
        dict(pos_embed="rope2d", rope=dict(grid="centered", axes="yx")),  # a DINOv3 import
    ],
)
def test_rope_table_similarity_is_the_mean_cosine_of_rotary_phase_differences(rope):
    config = tiny_config(**rope)  # 4x4 grid, head_dim 8
    model = VisionTransformer(config)
    table = analysis.position_table(model)
    r = config.rope
    cos, sin = rope_2d(config.grid_size, config.head_dim, config.pos_temperature, r.axes, r.ref_grid, r.grid)
    expected = cos @ cos.T + sin @ sin.T  # (N, N): sum over dims (each pair's phase, repeated) of cos(phi_p - phi_q)
    got = analysis.position_similarity(table).reshape(16, 16)
    torch.testing.assert_close(got, expected / config.head_dim, atol=1e-5, rtol=0)
    assert analysis.table_name(model) == "rotary phases"


def test_position_table_of_each_kind():
    for kind in ("learned", "sincos2d", "sincos1d"):
        model = VisionTransformer(tiny_config(pos_embed=kind))
        assert torch.equal(analysis.position_table(model), model.pos_embed.table)
        assert analysis.position_table(model, (6, 3)).shape == (6, 3, 32)
    assert analysis.position_table(VisionTransformer(tiny_config(pos_embed="none"))) is None


def test_similarity_by_distance_groups_pairs_by_euclidean_distance():
    similarity = torch.zeros(2, 2, 2, 2)
    similarity[0, 0, 0, 1] = similarity[0, 1, 0, 0] = 1.0  # one of the 8 ordered neighbour pairs
    distances, means = analysis.similarity_by_distance(similarity)
    torch.testing.assert_close(distances, torch.tensor([1.0, math.sqrt(2)]))
    torch.testing.assert_close(means, torch.tensor([2 / 8, 0.0]))


def test_principal_rgb_spans_zero_to_one_and_orders_components():
    y, x = torch.meshgrid(torch.arange(6.0), torch.arange(6.0), indexing="ij")
    table = torch.stack((10 * x, y, torch.zeros_like(x)), dim=-1) @ torch.linalg.qr(torch.randn(3, 3))[0]
    rgb = analysis.principal_rgb(table)
    assert rgb.shape == (6, 6, 3) and rgb[..., :2].min() == 0 and rgb[..., :2].max() == 1
    # the largest component is the column x (10x the spread of y): red is constant down each column
    assert torch.allclose(rgb[..., 0], rgb[:1, :, 0].expand(6, 6), atol=1e-5)


def _maps(pool="avg", **overrides):
    config = tiny_config(pool=pool, **overrides)
    model = perturb_(VisionTransformer(config)).eval()
    return model, model.attention_maps(torch.randn(3, 3, 16, 16))


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_attention_rows_sum_to_one_and_rollout_has_the_documented_shape(pool):
    model, maps = _maps(pool)
    t = 16 + model.config.num_prefix_tokens
    for weights in maps:
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, t))
    rolled = analysis.rollout(maps)
    assert rolled.shape == (3, t, t)
    torch.testing.assert_close(rolled.sum(-1), torch.ones(3, t))
    assert analysis.rollout_patches(maps, model).shape == (3, 4, 4)
    heads = analysis.patch_attention(maps[-1], model)
    assert heads.shape == (3, 4, 4, 4)
    if pool == "token":  # the class token's row, over the patches only
        torch.testing.assert_close(heads.flatten(-2), maps[-1][:, :, 0, 1:])


def test_rollout_is_half_attention_half_identity_multiplied_from_the_first_layer_up():
    first, second = torch.softmax(torch.randn(2, 2, 3, 5, 5), dim=-1)  # two layers' maps, different
    mixed = [0.5 * attention.mean(1) + 0.5 * torch.eye(5) for attention in (first, second)]
    torch.testing.assert_close(analysis.rollout([first]), mixed[0])
    # the later layer on the left: the output token's row mixes rows the first layer already mixed
    torch.testing.assert_close(analysis.rollout([first, second]), mixed[1] @ mixed[0])
    assert not torch.allclose(mixed[0] @ mixed[1], mixed[1] @ mixed[0], atol=1e-3)  # so the order is tested


def test_mean_attention_distance_closed_forms():
    config = ViTConfig(img_size=12, patch_size=4, in_chans=1, num_classes=2, embed_dim=16, depth=1, num_heads=2)
    model = VisionTransformer(config)  # 3x3 grid of 4-pixel patches, class token
    n = 9
    self_only = torch.eye(n + 1).expand(1, 2, n + 1, n + 1)
    uniform = torch.full((1, 2, n + 1, n + 1), 1 / (n + 1))
    distances = analysis.mean_attention_distance([self_only, uniform], model)
    assert distances.shape == (2, 2)
    torch.testing.assert_close(distances[0], torch.zeros(2))
    # uniform over patches: the mean distance over all ordered pairs of the 3x3 grid, times 4 pixels
    points = [(y, x) for y in range(3) for x in range(3)]
    pairs = [math.dist(p, q) * 4 for p in points for q in points]
    torch.testing.assert_close(distances[1], torch.full((2,), sum(pairs) / len(pairs)))


def test_attention_maps_are_the_weights_the_fast_path_applies():
    # a model that runs SDPA in forward_features: its attention_maps are softmax(q k^T / sqrt(d)) of the very q, k
    # its fused pass computes, captured at the attention's input
    model, _ = _maps("token", pos_embed="learned")
    inputs = []
    handle = model.layers[1].attn.register_forward_hook(lambda mod, args, out: inputs.append(args[0]))
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        model.forward_features(images)
    handle.remove()
    attn = model.layers[1].attn
    q, k, _ = attn.qkv(inputs[0]).unflatten(-1, (3, attn.num_heads, attn.head_dim)).permute(2, 0, 3, 1, 4)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim), dim=-1)
    torch.testing.assert_close(model.attention_maps(images)[1], expected, atol=1e-5, rtol=1e-5)


def test_a_grey_image_is_drawn_at_its_own_grey_levels_under_the_attention_maps():
    """matplotlib stretches a 2-D image to its own range unless told the range: halves at 0.4 and 0.6 were drawn
    black and white in every panel."""
    image = torch.full((8, 8), 0.4)
    image[:, 4:] = 0.6
    heads, rolled = torch.rand(2, 2, 2), torch.rand(2, 2)
    figure = attention_figure(image, heads, rolled, "grey")
    backgrounds = [ax.images[0] for ax in figure.axes if ax.images]
    assert len(backgrounds) == 4 and all(b.norm.vmin == 0 and b.norm.vmax == 1 for b in backgrounds)
