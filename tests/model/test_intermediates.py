"""forward_intermediates: timm's name and semantics (the tokens after chosen layers, normed or not, patch and prefix
tokens apart, NCHW or NLC), checked against timm's own model with the same weights."""

import pytest
import timm
import torch
from timm.models import save_for_hf

from tests.helpers import perturb_
from vit.checkpoint import load

# registers and a class token (5 prefix tokens), a 4 x 2 grid of patches: each axis and prefix is told apart
SHAPE = dict(img_size=(32, 16), patch_size=8, embed_dim=32, depth=3, num_heads=4, reg_tokens=4, num_classes=3)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.manual_seed(0)
    theirs = perturb_(timm.create_model("vit_base_patch16_224", pretrained=False, **SHAPE), std=0.05).eval()
    folder = tmp_path_factory.mktemp("intermediates")
    save_for_hf(theirs, str(folder), safe_serialization=True)
    return theirs, load(folder).model


@pytest.mark.parametrize(
    "settings",
    [
        dict(indices=2),
        dict(indices=[0, -1], norm=True),
        dict(indices=None, output_fmt="NLC"),
        dict(indices=[1], return_prefix_tokens=True, norm=True),
        dict(indices=1, intermediates_only=False, norm=True),
    ],
    ids=["last two", "first and last, normed", "all, NLC", "with prefix tokens", "with the final features"],
)
def test_the_intermediates_are_timms(pair, settings):
    theirs, ours = pair
    settings = {"intermediates_only": True, **settings}
    images = torch.randn(2, 3, 32, 16)
    with torch.no_grad():
        expected, got = theirs.forward_intermediates(images, **settings), ours.forward_intermediates(images, **settings)
    if not settings["intermediates_only"]:
        torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=0)
        expected, got = expected[1], got[1]
    flat = lambda out: [t for item in out for t in (item if isinstance(item, tuple) else (item,))]  # noqa: E731
    assert len(got) == len(expected) > 0
    for a, b in zip(flat(got), flat(expected), strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_indices_out_of_range_are_named(pair):
    _, ours = pair
    with pytest.raises(ValueError, match=r"indices=\[3\]: layers run from 0 to 2"):
        ours.forward_intermediates(torch.randn(1, 3, 32, 16), indices=[3])
