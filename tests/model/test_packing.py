"""forward_packed (NaViT's patch-and-pack): images of their own sizes and aspect ratios in one sequence, attention
kept within each image by a block-diagonal mask, give exactly the logits forward() gives each image alone."""

import random

import pytest
import torch

from tests.helpers import perturb_, tiny_config
from vit.model import VisionTransformer, kernels, packing
from vit.model.packing import pack

# whole patches of 4: grids 4x4, 4x6, 2x8, 7x3 and 4x4 again; the two 4x4 are embedded together, and the three
# of 16 patches (4x4, 2x8) pooled together
SIZES = [(16, 16), (16, 24), (8, 32), (28, 12), (16, 16)]


def _images() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(3, h, w, generator=generator) for h, w in SIZES]


def _alone_and_packed(model: VisionTransformer, max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    images = _images()
    with torch.no_grad():
        alone = torch.cat([model(image.unsqueeze(0)) for image in images])
        return alone, model.forward_packed(images, max_tokens)


@pytest.mark.parametrize(
    "settings",
    [
        dict(),  # a learned table (resampled to each grid), the class token
        dict(pos_embed="sincos2d", pool="avg"),
        dict(pos_embed="factorized", pos_resample=dict(square=True)),  # NaViT's tables, RADIO's aspect-kept resampling
        dict(pos_embed="rope2d", pool="avg", class_token=False),
        dict(pos_embed="rope_mixed"),
        dict(pos_embed="sincos1d"),
        dict(pool="map", class_token=False, reg_tokens=2),
        dict(distill_token=True, pos_embed="learned+rope2d"),
        dict(rel_pos="mlp", pos_embed="none"),
        dict(pool="token_avg", layer="post"),
    ],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "classic",
)
@pytest.mark.parametrize("max_tokens", [None, 40])  # one sequence; three, padded to the longest
def test_packed_images_give_each_image_alones_logits(settings, max_tokens):
    model = perturb_(VisionTransformer(tiny_config(**settings)), std=0.1).eval()
    alone, packed = _alone_and_packed(model, max_tokens)
    assert packed.shape == (len(SIZES), 5)
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=1e-4)


def test_images_are_packed_first_fit_in_order_and_one_too_long_is_refused():
    assert pack([17, 25, 17, 22], 40) == [[0, 2], [1], [3]]
    assert pack([17, 25, 17, 22], None) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="an image of 41 tokens does not fit a sequence of max_tokens=40"):
        pack([17, 41], 40)


def test_first_fit_skipping_full_sequences_places_every_image_where_a_scan_of_all_sequences_would():
    def scan(sizes: list[int], max_tokens: int) -> list[list[int]]:
        sequences: list[list[int]] = []
        for i, n in enumerate(sizes):
            k = next((k for k, s in enumerate(sequences) if sum(sizes[j] for j in s) + n <= max_tokens), None)
            sequences.append([i]) if k is None else sequences[k].append(i)
        return sequences

    rng = random.Random(0)
    for _ in range(300):
        sizes = [rng.randint(1, 40) for _ in range(rng.randint(1, 30))]
        assert pack(sizes, 40) == scan(sizes, 40)


def test_without_the_mask_the_images_would_see_each_other():
    """The check above can fail: the same packed sequence attending across images gives other logits."""
    model = perturb_(VisionTransformer(tiny_config(pos_embed="sincos2d", pool="avg")), std=0.1).eval()
    alone, packed = _alone_and_packed(model)
    with pytest.MonkeyPatch.context() as m:  # the mask zero everywhere: every token attends to every image's
        m.setattr(packing.Packing, "_positions", lambda self, per_group, mask: (None, torch.zeros_like(mask)))
        with torch.no_grad():
            mixed = model.forward_packed(_images())
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=1e-4)
    assert (mixed - alone).abs().max() > 1e-2


def test_packed_training_reaches_every_weight_each_image_uses():
    model = perturb_(VisionTransformer(tiny_config()), std=0.1).train()
    model.set_grad_checkpointing()
    logits = model.forward_packed([torch.randn(3, h, w) for h, w in SIZES])
    logits.logsumexp(dim=1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("max_tokens", [None, 40])
@pytest.mark.parametrize("bf16", [False, True])
def test_packed_training_on_flex_attention_is_training_on_the_dense_mask(monkeypatch, max_tokens, bf16):
    """On a GPU packed attention reads a BlockMask (kernels.document_mask); the dense mask it replaces gives the same
    logits and gradients, under bf16 autocast too (with qk_norm: fp32 queries beside bf16 values)."""
    config = tiny_config(pos_embed="rope2d", pool="avg", qk_norm=bf16)
    model = perturb_(VisionTransformer(config), std=0.1).cuda().eval()
    images = [image.cuda() for image in _images()]

    def logits_and_grads() -> list[torch.Tensor]:
        model.zero_grad()
        with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
            logits = model.forward_packed(images, max_tokens)
        logits.float().logsumexp(dim=1).sum().backward()
        return [logits.float()] + [p.grad.clone() for p in model.parameters()]

    flex = logits_and_grads()
    monkeypatch.setattr(kernels, "flex_attention_serves", lambda t: False)
    tolerance = dict(atol=5e-2, rtol=5e-2) if bf16 else dict(atol=1e-4, rtol=1e-3)
    for a, b in zip(flex, logits_and_grads(), strict=True):
        torch.testing.assert_close(a, b, **tolerance)
