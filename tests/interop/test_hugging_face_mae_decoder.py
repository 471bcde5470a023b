"""A Hugging Face ViTMAEForPreTraining folder's decoder read as ours (vit/interop/hugging_face/mae_decoder.py): with
the folder's encoder, the same pixels and the same mask, our reconstruction and loss are transformers'. Random
weights that transformers builds, fp32; no hub is reached."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.helpers import hugging_face_mae
from vit.checkpoint import load
from vit.interop.hugging_face.mae_decoder import mae_decoder
from vit.model.mae import MAEDecoder, masked_loss, patch_targets
from vit.model.masking import keep_of_noise

PATCH, GRID, CHANNELS = 8, 4, 3  # hugging_face_mae's 32 x 32 images: 16 patches, 4 seen at mask_ratio 0.75


@pytest.mark.parametrize("norm_pix", [True, False])
def test_the_folders_decoder_reconstructs_as_transformers_with_the_same_mask(norm_pix, tmp_path):
    theirs = hugging_face_mae(tmp_path, norm_pix_loss=norm_pix)
    encoder = load(tmp_path)
    found = mae_decoder(tmp_path, encoder.config)
    assert (found.dim, found.depth, found.heads, found.channels, found.norm_pix) == (32, 2, 2, 3, norm_pix)
    decoder = MAEDecoder(encoder.config, found.dim, found.depth, found.heads).eval()
    decoder.load_state_dict(found.weights)  # strict: every weight placed

    generator = torch.Generator().manual_seed(1)
    images = torch.randn(2, CHANNELS, 32, 32, generator=generator)
    noise = torch.rand(2, GRID * GRID, generator=generator)  # transformers' shuffle, and ours
    keep = keep_of_noise(noise, theirs.config.mask_ratio)
    with torch.no_grad():
        expected = theirs(pixel_values=images, noise=noise)
        pixels = decoder(encoder.model.forward_features(images, keep=keep), keep, (GRID, GRID))
        loss = masked_loss(pixels, patch_targets(images, (PATCH, PATCH), norm_pix), keep)
    masked = torch.ones(2, GRID * GRID).scatter(1, keep, 0.0)
    assert torch.equal(expected.mask, masked)
    # transformers flattens a patch as (row, column, channel), ours as (channel, row, column)
    logits = expected.logits.unflatten(-1, (PATCH, PATCH, CHANNELS)).permute(0, 1, 4, 2, 3).flatten(2)
    assert logits.abs().mean() > 0.05  # not two near-zero tensors
    torch.testing.assert_close(pixels, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss, expected.loss, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("patches", [10, 14, 16, 49, 196])
@pytest.mark.parametrize("ratio", [0.5, 0.6, 0.75, 0.8, 0.9])
def test_the_patches_kept_are_transformers_for_every_grid_and_ratio(patches, ratio):
    """transformers' ViTMAE keeps int(N (1 - r)) of the noise's lowest; at 14 patches and 0.75 a rounded count keeps
    4 against its 3, at 10 and 0.8 float rounding makes its count 1."""
    config = transformers.ViTMAEConfig(hidden_size=8, mask_ratio=ratio)
    noise = torch.rand(3, patches, generator=torch.Generator().manual_seed(patches))
    _, mask, _ = transformers.models.vit_mae.modeling_vit_mae.ViTMAEEmbeddings(config).random_masking(
        torch.zeros(3, patches, 8), noise
    )
    keep = keep_of_noise(noise, ratio)
    if mask.all():  # 10 patches at 0.9: transformers keeps none, ours its one of the lowest noise
        assert torch.equal(keep, noise.argmin(dim=1, keepdim=True))
    else:
        assert torch.equal(torch.ones(3, patches).scatter(1, keep, 0.0), mask)


def test_a_folder_without_a_decoder_has_none_to_read(tmp_path):
    encoder = hugging_face_mae().config
    transformers.ViTMAEModel(encoder).save_pretrained(tmp_path)
    assert mae_decoder(tmp_path, load(tmp_path).config) is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (dict(decoder_intermediate_size=96), r"decoder_intermediate_size=96; task=mae's decoder needs 4 x"),
        (dict(hidden_act="gelu_new"), r"hidden_act='gelu_new'; task=mae's decoder needs gelu"),  # tanh's
        (dict(), r"decoder_pos_embed is not MAE's fixed sin-cos table of a 4x4 grid"),
    ],
)
def test_a_decoder_ours_cannot_be_is_refused_naming_the_key(change, says, tmp_path):
    theirs = hugging_face_mae(**change)
    if not change:  # a decoder table trained away from the fixed one (or transformers 5's zeros)
        with torch.no_grad():
            theirs.decoder.decoder_pos_embed.add_(0.1)
    theirs.save_pretrained(tmp_path)
    config = load(tmp_path).config
    with pytest.raises(ValueError, match=says):
        mae_decoder(tmp_path, config)
