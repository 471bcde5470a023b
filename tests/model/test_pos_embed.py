import math

import pytest
import torch
from timm.layers import resample_abs_pos_embed

from vit.model import pos_embed
from vit.model.config import Resampling
from vit.model.pos_embed import (
    AbsolutePositionEmbedding,
    MixedRotaryEmbedding2d,
    RotaryEmbedding2d,
    apply_rope,
    frequencies,
    resample,
    rope_2d,
    sincos_1d,
    sincos_1d_grid,
    sincos_2d,
)

T = 10000.0


def test_sincos_1d_is_vaswanis_formula():
    dim, table = 8, sincos_1d(torch.arange(20), 8, T)
    for n in range(20):
        for i in range(dim // 2):
            wavelength_over_2pi = T ** (2 * i / dim)
            assert table[n, 2 * i].item() == pytest.approx(math.sin(n / wavelength_over_2pi), abs=1e-6)
            assert table[n, 2 * i + 1].item() == pytest.approx(math.cos(n / wavelength_over_2pi), abs=1e-6)


def test_wavelengths_grow_steadily():
    omega = frequencies(16, T)
    assert omega[0] == 1.0 and (omega[1:] < omega[:-1]).all()
    assert torch.allclose(omega[1:] / omega[:-1], torch.full((7,), T ** (-2 / 16), dtype=torch.float64))


def _offset_map(k: int, dim: int) -> torch.Tensor:
    """The closed form M_k: a 2x2 rotation by k * w_i acting on each (sin, cos) pair."""
    M = torch.zeros(dim, dim, dtype=torch.float64)
    for i, w in enumerate(frequencies(dim, T)):
        c, s = math.cos(k * w), math.sin(k * w)
        # sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return M.float()


@pytest.mark.parametrize("k", [1, 3, 10])
def test_encoding_at_n_plus_k_is_a_fixed_linear_map_of_encoding_at_n(k):
    dim, n = 16, torch.arange(0, 200)
    M = _offset_map(k, dim)
    torch.testing.assert_close(sincos_1d(n + k, dim, T), sincos_1d(n, dim, T) @ M.T, atol=1e-5, rtol=0)


def test_offset_map_fit_on_some_positions_holds_for_all_and_fails_for_sine_only():
    # T = 100 makes the slowest of the 4 frequencies turn ~6 rad over the fit range, so the fit is well posed
    dim, k, temperature = 8, 5, 100.0
    fit_n, test_n = torch.arange(0, 200), torch.arange(500, 700)

    def fit_and_check(encode) -> float:
        X, Y = encode(fit_n).double(), encode(fit_n + k).double()
        M = torch.linalg.lstsq(X, Y).solution  # Y = X M, independent of n if the property holds
        return (encode(test_n + k).double() - encode(test_n).double() @ M).abs().max().item()

    assert fit_and_check(lambda n: sincos_1d(n, dim, temperature)) < 1e-4
    sine_only = lambda n: sincos_1d(n, dim, temperature)[:, 0::2]  # noqa: E731
    assert fit_and_check(sine_only) > 0.1


def test_sincos_2d_is_concat_of_x_then_y_encodings():
    h, w, dim = 5, 7, 16
    table = sincos_2d((h, w), dim, T)
    assert table.shape == (h, w, dim)
    for y in range(h):
        for x in range(w):
            expected = torch.cat(
                (sincos_1d(torch.tensor([x]), dim // 2, T), sincos_1d(torch.tensor([y]), dim // 2, T)), 1
            )
            torch.testing.assert_close(table[y, x], expected[0])
    # the documented ordering, pinned element by element: [sin x, cos x, ... | sin y, cos y, ...]
    y, x = 3, 6
    assert table[y, x, 0].item() == pytest.approx(math.sin(x)) and table[y, x, 1].item() == pytest.approx(math.cos(x))
    assert table[y, x, 8].item() == pytest.approx(math.sin(y)) and table[y, x, 9].item() == pytest.approx(math.cos(y))
    w1 = T ** (-2 / 8)
    assert table[y, x, 2].item() == pytest.approx(math.sin(x * w1), abs=1e-6)


def test_sincos_2d_rows_have_closed_form_norm():
    dim = 32  # D/2 sin/cos pairs, each of unit norm: ||PE(x, y)|| = sqrt(D / 2)
    norms = sincos_2d((9, 11), dim, T).norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(dim / 2)))


def test_sincos_2d_center_similarity_peaks_at_center_and_falls_with_distance():
    table = sincos_2d((9, 9), 64, 100.0).flatten(0, 1)
    sim = torch.nn.functional.cosine_similarity(table[40][None], table, dim=-1).reshape(9, 9)
    assert sim.argmax().item() == 40
    ys, xs = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    dist = ((ys - 4) ** 2 + (xs - 4) ** 2).float().sqrt()
    means = [sim[(dist > r - 0.5) & (dist <= r + 0.5)].mean().item() for r in range(5)]
    assert means == sorted(means, reverse=True)


def test_sincos_1d_grid_follows_raster_order():
    table = sincos_1d_grid((3, 4), 8, T)
    torch.testing.assert_close(table[2, 1], sincos_1d(torch.tensor([2 * 4 + 1]), 8, T)[0])


def test_resample_to_same_grid_is_an_unchanged_copy():
    table = torch.randn(6, 5, 8)
    out = resample(table, (6, 5))
    assert torch.equal(out, table) and out.data_ptr() != table.data_ptr()


@pytest.mark.parametrize("new_grid", [(8, 8), (3, 5), (12, 7)])
def test_resample_matches_timm(new_grid):
    table = torch.randn(6, 6, 16)
    ours = resample(table, new_grid)
    theirs = resample_abs_pos_embed(table.flatten(0, 1)[None], new_grid, (6, 6), num_prefix_tokens=0)
    assert ours.shape == (*new_grid, 16)
    torch.testing.assert_close(ours.flatten(0, 1), theirs[0], atol=1e-5, rtol=1e-5)


def test_rope_phases_are_the_sincos_2d_phases():
    grid, head_dim = (3, 5), 16
    cos, sin = rope_2d(grid, head_dim, T)
    table = sincos_2d(grid, head_dim, T).flatten(0, 1)
    torch.testing.assert_close(sin[:, 0::2], table[:, 0::2])
    torch.testing.assert_close(cos[:, 0::2], table[:, 1::2])
    torch.testing.assert_close(sin[:, 0::2], sin[:, 1::2])  # both members of a pair turn together


def test_rope_preserves_norms_and_scores_depend_only_on_relative_offset():
    grid, head_dim = (6, 6), 16
    cos, sin = rope_2d(grid, head_dim, 100.0)
    q, k = torch.randn(head_dim), torch.randn(head_dim)

    def score(pq, pk):  # pq, pk: (y, x)
        i, j = pq[0] * 6 + pq[1], pk[0] * 6 + pk[1]
        return apply_rope(q, cos[i], sin[i]) @ apply_rope(k, cos[j], sin[j])

    rotated = apply_rope(q[None], cos, sin)
    torch.testing.assert_close(rotated.norm(dim=-1), q.norm().expand(36))
    torch.testing.assert_close(score((1, 2), (3, 1)), score((2, 4), (4, 3)))  # same offset (2, -1)
    assert not torch.allclose(score((1, 2), (3, 1)), score((1, 2), (1, 3)), atol=1e-3)


def test_fixed_tables_are_buffers_outside_the_state_dict():
    pe = AbsolutePositionEmbedding("sincos2d", (4, 4), 16, num_prefix_tokens=1, temperature=T)
    assert list(pe.parameters()) == [] and pe.state_dict() == {}
    torch.testing.assert_close(pe.table_for((2, 3)), sincos_2d((2, 3), 16, T))


@pytest.mark.parametrize("kind", ["sincos2d", "rope2d"])
def test_fixed_tables_at_other_grids_are_computed_once_each_and_kept_for_the_last_few(kind, monkeypatch):
    """A NaFlex batch's grids, asked for in turn: each the table of its own grid, computed the first time only,
    until `size` other grids have been asked for since."""
    calls = []
    if kind == "sincos2d":
        module = AbsolutePositionEmbedding(kind, (4, 4), 16, num_prefix_tokens=1, temperature=T)
        table, expected = module.table_for, lambda grid: sincos_2d(grid, 16, T)
        monkeypatch.setitem(pos_embed.FIXED_TABLES, kind, lambda *a: calls.append(a[0]) or sincos_2d(*a))
    else:
        module = RotaryEmbedding2d((4, 4), 8, num_prefix_tokens=1, temperature=T)
        table = lambda grid: module(grid)[0]  # noqa: E731
        expected = lambda grid: torch.nn.functional.pad(rope_2d(grid, 8, T)[0], (0, 0, 1, 0), value=1.0)  # noqa: E731
        monkeypatch.setattr(pos_embed, "rope_2d", lambda *a: calls.append(a[0]) or rope_2d(*a))
    for grid in [(2, 3), (3, 2), (4, 4), (5, 5), (2, 3), (3, 2)]:
        torch.testing.assert_close(table(grid), expected(grid), rtol=0, atol=0)
    assert calls == [(2, 3), (3, 2), (5, 5)]  # the model's own (4, 4) is its buffer
    module.other_grids.size = 2  # now two: (6, 6) pushes out (5, 5) and (2, 3), which come back computed again
    for grid in [(6, 6), (3, 2), (5, 5), (2, 3)]:
        torch.testing.assert_close(table(grid), expected(grid), rtol=0, atol=0)
    assert calls[3:] == [(6, 6), (5, 5), (2, 3)]


def test_fixed_tables_leave_prefix_tokens_without_position():
    pe = AbsolutePositionEmbedding("sincos2d", (2, 2), 8, num_prefix_tokens=1, temperature=T)
    x = torch.zeros(1, 5, 8)
    out = pe(x, (2, 2))
    assert torch.equal(out[:, 0], x[:, 0])
    torch.testing.assert_close(out[0, 1:], sincos_2d((2, 2), 8, T).flatten(0, 1))


def test_learned_table_is_a_2d_grid_resampled_for_other_grids():
    pe = AbsolutePositionEmbedding("learned", (4, 4), 8, num_prefix_tokens=1, temperature=T)
    assert pe.table.shape == (4, 4, 8) and pe.prefix.shape == (1, 8)
    torch.nn.init.normal_(pe.table)
    torch.testing.assert_close(pe.table_for((6, 3)), resample(pe.table, (6, 3)))


def test_a_factorized_table_is_the_sum_of_a_row_and_a_column_vector_resampled_along_each_axis():
    pe = AbsolutePositionEmbedding("factorized", (4, 6), 8, num_prefix_tokens=0, temperature=T)
    torch.nn.init.normal_(pe.rows), torch.nn.init.normal_(pe.cols)
    table = pe.table_for((4, 6))
    assert table.shape == (4, 6, 8) and [tuple(t.shape) for t in pe.tables] == [(4, 8), (6, 8)]
    torch.testing.assert_close(table[2, 5], pe.rows[2] + pe.cols[5])  # PE(x, y) = T_y[y] + T_x[x]
    line = lambda t, n: torch.nn.functional.interpolate(t.T[None], size=n, mode="linear")[0].T  # noqa: E731
    torch.testing.assert_close(pe.table_for((8, 3)), line(pe.rows, 8)[:, None] + line(pe.cols, 3)[None])
    square = AbsolutePositionEmbedding("factorized", (4, 6), 8, 0, T, resampling=Resampling(square=True))
    square.load_state_dict(pe.state_dict())  # aspect kept: both axes to the longer side, cropped
    torch.testing.assert_close(square.table_for((8, 3)), line(pe.rows, 8)[:, None] + line(pe.cols, 8)[None, :3])


def test_rope_module_leaves_prefix_unrotated():
    rope = RotaryEmbedding2d((2, 3), 8, num_prefix_tokens=1, temperature=T)
    cos, sin = rope((2, 3))
    assert cos.shape == (7, 8) and torch.equal(cos[0], torch.ones(8)) and torch.equal(sin[0], torch.zeros(8))
    cos4, _ = rope((4, 4))
    assert cos4.shape == (17, 8)


def test_rope_mixed_along_the_axes_is_the_axial_rope_and_turned_is_not():
    """RoPE-Mixed's phases f_x x + f_y y: with f = (w, 0) for the first half of the pairs and (0, w) for the rest,
    every layer and head turns exactly as the fixed axial rope ('xy'); turned to a diagonal, it no longer does."""
    grid, head_dim, depth, heads = (3, 4), 16, 2, 3
    mixed = MixedRotaryEmbedding2d(grid, head_dim, depth, heads, num_prefix_tokens=1, temperature=T)
    omega = frequencies(head_dim // 2, T).float()
    zero = torch.zeros_like(omega)
    axial = torch.stack((torch.cat((omega, zero)), torch.cat((zero, omega))))  # (2, d/2)
    with torch.no_grad():
        mixed.freqs.copy_(axial[:, None, None].expand(2, depth, heads, head_dim // 2))
    cos, sin = mixed(grid)
    assert cos.shape == (depth, heads, 13, head_dim)
    fixed_cos, fixed_sin = RotaryEmbedding2d(grid, head_dim, num_prefix_tokens=1, temperature=T)(grid)
    torch.testing.assert_close(cos, fixed_cos.expand_as(cos))
    torch.testing.assert_close(sin, fixed_sin.expand_as(sin))
    with torch.no_grad():
        mixed.freqs[:, 1, 2] = (axial[0] + axial[1]) / 2**0.5  # layer 1, head 2: both halves along the diagonal
    cos, _ = mixed(grid)
    torch.testing.assert_close(cos[0], fixed_cos.expand_as(cos[0]))
    assert not torch.allclose(cos[1, 2], fixed_cos, atol=1e-3)


def test_rope_mixed_frequencies_learn_and_start_as_turned_axial_ones():
    mixed = MixedRotaryEmbedding2d((2, 2), 8, depth=1, num_heads=2, num_prefix_tokens=0, temperature=10.0)
    f_x, f_y = mixed.freqs  # (1, 2, 4) each: per pair, a frequency w_i along a random direction per head
    omega = frequencies(4, 10.0).float()
    torch.testing.assert_close(f_x**2 + f_y**2, torch.cat((omega, omega)).expand(1, 2, 4) ** 2)
    torch.testing.assert_close(f_x[..., :2] * f_x[..., 2:] + f_y[..., :2] * f_y[..., 2:], torch.zeros(1, 2, 2))
    cos, sin = mixed((2, 2))
    (cos.sum() + sin.sum()).backward()
    assert mixed.freqs.grad is not None and mixed.freqs.grad.abs().sum() > 0
