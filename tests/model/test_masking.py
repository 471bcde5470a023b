"""Masked autoencoding's pieces against their definitions: how many patches stay, the encoder on the visible tokens
as the whole network's computation restricted to them, the decoder putting each visible token back in its slot, and
a loss that reads the masked patches alone."""

import pytest
import torch

from tests.helpers import perturb_, tiny_config
from vit.model import VisionTransformer, kernels
from vit.model.mae import MAEDecoder, masked_loss, patch_targets, unpatchify
from vit.model.masking import random_keep, visible, visible_count


@pytest.mark.parametrize(
    ("n", "ratio", "kept"), [(16, 0.75, 4), (196, 0.75, 49), (10, 0.66, 3), (14, 0.75, 3), (4, 0.99, 1)]
)
def test_masking_keeps_floor_one_minus_r_times_n_distinct_patches_an_image(n, ratio, kept):
    keep = random_keep(64, n, ratio, generator=torch.Generator().manual_seed(0))
    assert visible_count(n, ratio) == kept and keep.shape == (64, kept)
    assert all(len(set(row.tolist())) == kept for row in keep) and keep.min() >= 0 and keep.max() < n
    assert len({tuple(row.tolist()) for row in keep}) > 1  # each image its own draw
    assert torch.equal(keep, keep.sort(dim=1).values)


@pytest.mark.parametrize(
    "fields",
    [
        dict(pos_embed="learned"),
        dict(pos_embed="sincos2d", class_token=False, pool="avg"),
        dict(pos_embed="rope2d", reg_tokens=2),
        dict(pos_embed="learned+rope_mixed"),
        dict(pos_embed="none", rel_pos="mlp", rel_pos_dim=8),
    ],
)
def test_the_encoder_on_visible_tokens_is_the_whole_networks_computation_restricted_to_them(fields):
    """The reference: the whole token sequence, its positions, then only the kept rows and columns of attention,
    written out layer by layer (each layer's attention masked to the kept tokens by -inf on the others)."""
    model = perturb_(VisionTransformer(tiny_config(**fields)), std=0.1).eval()
    images, keep = torch.randn(3, 3, 16, 16), random_keep(3, 16, 0.75, generator=torch.Generator().manual_seed(1))
    P = model.config.num_prefix_tokens
    with torch.no_grad():
        got = model.forward_features(images, keep=keep)
        x, positions = model._tokens(images)
        allowed = torch.zeros(3, P + 16, dtype=torch.bool)
        allowed[:, :P] = True
        allowed.scatter_(1, keep + P, True)
        mask = torch.zeros(3, 1, P + 16, P + 16).masked_fill(~allowed[:, None, None, :], float("-inf"))
        for layer, (rope, bias) in zip(model.layers, positions, strict=True):
            x, _ = layer(x, rope, mask if bias is None else bias + mask)
        expected = visible(model.norm(x), keep, P)
    assert got.shape == (3, P + 4, 32)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_decoder_puts_each_visible_token_in_its_slot_and_the_mask_token_elsewhere():
    config = tiny_config(pos_embed="sincos2d")
    decoder = perturb_(MAEDecoder(config, dim=16, depth=1, heads=2)).eval()
    keep = torch.tensor([[0, 5, 9, 15]])
    latent = torch.randn(1, 1 + 4, 32)
    seen = []
    decoder.layers[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        out = decoder(latent, keep, (4, 4))
    assert out.shape == (1, 16, 4 * 4 * 3)
    tokens = seen[0] - decoder.pos_embed(torch.zeros(1, 17, 16), (4, 4))  # the table taken off again
    embedded = decoder.embed(latent)
    torch.testing.assert_close(tokens[0, 1 + keep[0]], embedded[0, 1:], atol=1e-6, rtol=0)
    masked = [i for i in range(16) if i not in keep[0]]
    torch.testing.assert_close(
        tokens[0, 1 + torch.tensor(masked)], decoder.mask_token[0].expand(12, 16), atol=1e-6, rtol=0
    )


def test_the_loss_reads_the_masked_patches_alone():
    pred, target = torch.randn(2, 16, 48), torch.randn(2, 16, 48)
    keep = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    loss = masked_loss(pred, target, keep)
    changed = pred.clone()
    changed[0, 2] += 100  # a visible patch: no change
    assert masked_loss(changed, target, keep) == loss
    changed[0, 12] += 1  # a masked one: the loss moves
    assert masked_loss(changed, target, keep) > loss
    masked = torch.ones(2, 16, dtype=torch.bool).scatter(1, keep, False)
    torch.testing.assert_close(loss, (pred - target).pow(2).mean(-1)[masked].mean())


def test_targets_are_each_patchs_pixels_normalised_by_its_own_statistics_and_unpatchify_inverts_patchify():
    images = torch.randn(2, 3, 16, 8) * 3 + 1
    raw = patch_targets(images, (4, 4), normalize=False)
    assert torch.equal(unpatchify(raw, (4, 4), (4, 2), 3), images)
    normed = patch_targets(images, (4, 4))
    torch.testing.assert_close(normed.mean(-1), torch.zeros(2, 8), atol=1e-5, rtol=0)
    torch.testing.assert_close(normed.var(-1), torch.ones(2, 8), atol=1e-3, rtol=0)
    assert torch.equal(raw, kernels.patchify(images, (4, 4)))
