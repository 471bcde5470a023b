"""NaFlex checkpoints: timm's NaFlexVit and Hugging Face's SigLIP 2 (siglip2_vision_model, and siglip2's vision tower)
load as our network, computing the source's outputs on its own NaFlex batch (each image its own
padded sequence of patches, a validity mask) against our packed sequences, and timm's on a plain image batch too.
Random weights built by the source library; nothing downloaded."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import perturb_
from vit.checkpoint import load

timm = pytest.importorskip("timm")


def _naflex_batch(images: list[torch.Tensor], patch: tuple[int, int], budget: int) -> dict[str, torch.Tensor]:
    """timm's NaFlex input: each image's patches (channels last), their (y, x) and validity, padded to `budget`."""
    from timm.data.naflex_transforms import patchify_image

    patches, coords, valid = zip(*(patchify_image(image, patch) for image in images), strict=True)
    pad = lambda t, n: F.pad(t, (0, 0, 0, n - len(t))) if t.dim() == 2 else F.pad(t, (0, n - len(t)))  # noqa: E731
    return {
        "patches": torch.stack([pad(p, budget) for p in patches]),
        "patch_coord": torch.stack([pad(c, budget) for c in coords]),
        "patch_valid": torch.stack([pad(v, budget) for v in valid]),
    }


@pytest.mark.parametrize(
    ("name", "settings"),
    [
        ("naflexvit_base_patch16_gap", {}),  # registers, LayerScale, average pooling, fc_norm
        ("naflexvit_base_patch16_map", {}),  # attention pooling
        ("naflexvit_base_patch16_siglip", {}),  # its table resampled bilinearly: pos_resample
        ("naflexvit_base_patch16_gap", {"class_token": True, "global_pool": "token", "fc_norm": False}),
        ("naflexvit_base_patch16_par_gap", {}),  # aspect-preserving: pos_resample_square
        ("naflexvit_base_patch16_radio_v3", {}),  # RADIO's: square, bilinear, no antialiasing, aligned corners
        ("naflexvit_huge_patch16_radio_v4", {}),  # the same, corners not aligned
        ("naflexvit_base_patch16_parfac_gap", {}),  # NaViT's factorized tables, aspect-preserving
        ("naflexvit_base_patch16_gap", {"pos_embed": "factorized"}),  # factorized, each axis to its own length
    ],
)
def test_timms_naflexvit_loads_with_its_logits_on_square_and_naflex_batches(tmp_path, name, settings):
    from timm.models import save_for_hf

    torch.manual_seed(0)
    theirs = timm.create_model(name, num_classes=5, embed_dim=64, depth=2, num_heads=2, **settings)
    perturb_(theirs, std=0.05).eval()
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    loaded = load(tmp_path / "hub")
    ours = loaded.model
    assert loaded.config.patch_size == (16, 16)
    images = [torch.randn(3, 48, 80), torch.randn(3, 96, 32), torch.randn(3, 64, 64)]  # 3x5, 6x2, 4x4 patches
    with torch.no_grad():
        square = torch.randn(2, 3, 64, 96)
        torch.testing.assert_close(ours(square), theirs(square), atol=1e-4, rtol=0)
        expected = theirs(_naflex_batch(images, (16, 16), budget=24))
        torch.testing.assert_close(ours.forward_packed(images, 24 + ours.config.num_prefix_tokens), expected,
                                   atol=1e-4, rtol=0)  # fmt: skip


def test_a_naflex_embedding_we_cannot_compute_is_refused_by_name(tmp_path):
    from timm.models import save_for_hf

    from vit.checkpoint import CheckpointError

    theirs = timm.create_model("naflexvit_base_patch16_gap", num_classes=5, embed_dim=64, depth=2, num_heads=2,
                               pos_embed_use_grid_sample=True)  # fmt: skip
    save_for_hf(theirs, str(tmp_path / "hub"), safe_serialization=True)
    with pytest.raises(CheckpointError, match="grid-sampled positions"):
        load(tmp_path / "hub")


def _siglip2_batch(images: list[torch.Tensor], patch: int, budget: int) -> dict[str, torch.Tensor]:
    """transformers' SigLIP 2 input as its image processor makes it: each image's patches flattened (p, p, C),
    padded to `budget`, with the mask of real patches and each image's grid (spatial_shapes)."""
    rows, shapes = [], []
    for image in images:
        c, h, w = image.shape
        grid = (h // patch, w // patch)
        rows.append(image.reshape(c, grid[0], patch, grid[1], patch).permute(1, 3, 2, 4, 0).reshape(-1, patch**2 * c))
        shapes.append(grid)
    return {
        "pixel_values": torch.stack([F.pad(r, (0, 0, 0, budget - len(r))) for r in rows]),
        "pixel_attention_mask": torch.stack([(torch.arange(budget) < len(r)).long() for r in rows]),
        "spatial_shapes": torch.tensor(shapes),
    }


@pytest.mark.parametrize("tower", [False, True])  # Siglip2VisionModel; Siglip2Model's vision tower
def test_siglip2_naflex_loads_with_its_pooled_features(tmp_path, tower):
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_patches=16,
                  patch_size=8)  # fmt: skip
    if tower:
        config = transformers.Siglip2Config(
            vision_config=vision,
            text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
        )
        whole = transformers.Siglip2Model(config).eval()
        theirs = whole.vision_model
    else:
        whole = theirs = transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(**vision)).eval()
    with torch.no_grad():
        for p in whole.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    whole.save_pretrained(tmp_path / "hf")
    loaded = load(tmp_path / "hf")
    assert loaded.config.pos_resample.mode == "bilinear" and loaded.config.pool == "map"
    images = [torch.randn(3, 24, 40), torch.randn(3, 48, 16), torch.randn(3, 32, 32)]  # 3x5, 6x2, 4x4 of a 4x4 table
    with torch.no_grad():
        expected = theirs(**_siglip2_batch(images, 8, budget=16)).pooler_output
        torch.testing.assert_close(loaded.model.forward_packed(images, 16), expected, atol=1e-4, rtol=0)
