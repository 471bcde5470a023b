import pytest
import torch

from tests.helpers import perturb_
from vit.model.patch_embed import PatchEmbed


def test_each_token_is_the_linear_map_of_its_patch():
    embed = perturb_(PatchEmbed((4, 2), in_chans=3, embed_dim=5))
    images = torch.randn(2, 3, 8, 6)
    tokens, grid = embed(images)
    assert grid == (2, 3) and tokens.shape == (2, 6, 5)
    E = embed.proj.weight.flatten(1)  # (D, C * P * P)
    for y in range(2):
        for x in range(3):
            patch = images[:, :, 4 * y : 4 * y + 4, 2 * x : 2 * x + 2].flatten(1)  # (B, C * P * P)
            expected = patch @ E.T + embed.proj.bias  # x_n = E p_n + b
            torch.testing.assert_close(tokens[:, y * 3 + x], expected, rtol=1e-5, atol=1e-5)


def test_indivisible_image_names_both_numbers():
    embed = PatchEmbed((4, 4), in_chans=1, embed_dim=8)
    with pytest.raises(ValueError, match="image size 30x28 is not divisible by patch size 4x4"):
        embed(torch.zeros(1, 1, 30, 28))


def test_wrong_channel_count_is_named():
    embed = PatchEmbed((4, 4), in_chans=1, embed_dim=8)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, H, W\), got \(1, 3, 28, 28\)"):
        embed(torch.zeros(1, 3, 28, 28))


def test_the_convolution_path_gives_the_cpu_matmuls_tokens_contiguous():
    """cpu_matmul off, the path on GPUs: the convolution (kernels.patch_matmul against it: tests/model/test_kernels.py).
    Both paths' tokens contiguous, or every LayerNorm downstream copies them (benchmarks/NOTES.md change 23)."""
    embed = perturb_(PatchEmbed((4, 2), in_chans=3, embed_dim=16))
    images = torch.randn(3, 3, 8, 6)
    fast, grid = embed(images)
    embed.cpu_matmul = False
    slow, slow_grid = embed(images)
    assert grid == slow_grid == (2, 3) and fast.is_contiguous() and slow.is_contiguous()
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
