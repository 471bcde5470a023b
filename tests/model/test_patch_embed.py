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


@pytest.mark.parametrize("cpu_matmul", [True, False])  # the matrix product and the convolution
def test_an_image_of_no_whole_number_of_patches_is_embedded_as_its_whole_patches(cpu_matmul):
    # the grid floors, the last rows and columns (bottom, right) left out, as timm's and transformers' convolution
    embed = perturb_(PatchEmbed((4, 3), in_chans=2, embed_dim=8))
    embed.cpu_matmul = cpu_matmul
    images = torch.randn(2, 2, 19, 14)  # 4 x 4 patches and 3 rows, 2 columns over
    tokens, grid = embed(images)
    cropped, cropped_grid = embed(images[:, :, :16, :12].contiguous())
    assert grid == cropped_grid == (4, 4)
    torch.testing.assert_close(tokens, cropped, atol=0, rtol=0)


def test_an_image_smaller_than_a_patch_names_both_numbers():
    embed = PatchEmbed((4, 4), in_chans=1, embed_dim=8)
    with pytest.raises(ValueError, match="image size 3x28 is smaller than patch size 4x4: not one patch fits"):
        embed(torch.zeros(1, 1, 3, 28))


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


@pytest.mark.parametrize("cpu_matmul", [True, False])  # one product over every batch's patches, or one call a batch
def test_batches_of_several_sizes_embed_as_each_alone_tokens_and_gradients(cpu_matmul):
    embed = perturb_(PatchEmbed((4, 2), in_chans=3, embed_dim=5, norm=torch.nn.LayerNorm(5)))
    embed.cpu_matmul = cpu_matmul
    batches = [torch.randn(2, 3, 8, 6), torch.randn(3, 3, 4, 10), torch.randn(1, 3, 13, 5)]  # the last cropped
    each = embed.each(batches)
    sum((t * torch.arange(t.numel()).view_as(t)).sum() for t, _ in each).backward()
    got = [p.grad.clone() for p in embed.parameters()]
    embed.zero_grad()
    alone = [embed(images) for images in batches]
    sum((t * torch.arange(t.numel()).view_as(t)).sum() for t, _ in alone).backward()
    assert [g for _, g in each] == [g for _, g in alone] == [(2, 3), (1, 5), (3, 2)]
    for (t, _), (expected, _) in zip(each, alone, strict=True):
        torch.testing.assert_close(t, expected, rtol=1e-5, atol=1e-5)
    for g, p in zip(got, embed.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, H, W\), got \(1, 1, 8, 8\)"):
        embed.each([torch.randn(1, 3, 8, 8), torch.randn(1, 1, 8, 8)])
