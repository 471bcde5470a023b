"""timm's ViTs whose layers ViTConfig cannot express are refused in one line saying what they do, not loaded as a
near miss: SAM's (samvit_*: windowed attention, a decomposed relative position bias, a convolutional neck) and
Gemma 4's (gemma4_vit_*: sandwich norms, normalised values attended unscaled). Two layers, random weights."""

import pytest

from vit.checkpoint import CheckpointError, load

timm = pytest.importorskip("timm")

SMALL = dict(depth=2, embed_dim=64, num_heads=4)


@pytest.mark.parametrize(
    ("name", "settings", "said"),
    [
        (
            "samvit_base_patch16",
            dict(SMALL, img_size=64, window_size=2, neck_chans=32),
            r"SAM's ViT with attention within 2 x 2 windows in most layers, a decomposed relative position bias "
            r"\(rel_pos_h, rel_pos_w\), a convolutional neck$",
        ),
        (
            "samvit_base_patch16_224",  # no neck
            dict(SMALL, img_size=64, window_size=2),
            r"SAM's ViT with attention within 2 x 2 windows in most layers, a decomposed relative position bias "
            r"\(rel_pos_h, rel_pos_w\)$",
        ),
        (
            "gemma4_vit_167m",  # the classifier, of E4B's clipped linear maps
            dict(SMALL, head_dim=16, intermediate_size=96, img_size=48),
            r"Gemma 4's ViT, whose layers normalise each branch's output as well as its input \(sandwich norms\), "
            r"normalise the values and attend unscaled, clip their linear maps, with a table per axis .* resampled$",
        ),
        (
            "gemma4_vit_570m_enc",  # the encoder, its soft tokens
            dict(SMALL, head_dim=16, intermediate_size=96, img_size=48),
            r"Gemma 4's ViT, .* attend unscaled, with a table per axis looked up at each row and column, never "
            r"resampled, and patches "
            r"averaged in k x k cells$",
        ),
    ],
)
def test_a_timm_vit_whose_layers_have_no_field_is_refused_saying_what_they_do(tmp_path, name, settings, said):
    from timm.models import save_for_hf

    save_for_hf(timm.create_model(name, **settings), str(tmp_path), safe_serialization=True)
    with pytest.raises(CheckpointError, match=rf"timm's {name} is not a ViT this model can hold: {said}") as refused:
        load(tmp_path)
    assert "\n" not in str(refused.value)


def test_the_refusals_are_of_the_pretrained_architectures_the_sweep_builds():
    # the sweep builds each at two layers; a renamed or retired architecture would leave these tests testing nothing
    from benchmarks.timm_sweep import architectures

    names = set(architectures())
    assert {"samvit_base_patch16", "gemma4_vit_167m", "gemma4_vit_570m_enc"} <= names
