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


# The CPU fast path (one matrix product, benchmarks/NOTES.md) against the convolution, forward and backward.
@pytest.mark.parametrize(
    ("patch", "chans", "size"), [((7, 7), 1, (28, 28)), ((4, 2), 3, (8, 6)), ((16, 16), 3, (32, 48))]
)
def test_patch_embedding_matmul_path_agrees_with_the_convolution_and_its_gradients(patch, chans, size):
    embed = perturb_(PatchEmbed(patch, in_chans=chans, embed_dim=16))
    images = torch.randn(3, chans, *size)
    results = []
    for cpu_matmul in (True, False):
        embed.cpu_matmul = cpu_matmul
        tokens, grid = embed(images)
        (tokens * torch.linspace(-1, 1, tokens.numel()).view_as(tokens)).sum().backward()
        results.append((tokens.detach(), grid, embed.proj.weight.grad.clone(), embed.proj.bias.grad.clone()))
        embed.zero_grad()
    (fast, fast_grid, *fast_grads), (slow, slow_grid, *slow_grads) = results
    assert fast_grid == slow_grid and fast.shape == slow.shape
    assert fast.is_contiguous() and slow.is_contiguous()  # or every LayerNorm downstream copies the tokens
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    for a, b in zip(fast_grads, slow_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
