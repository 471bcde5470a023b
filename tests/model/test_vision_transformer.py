import pytest
import torch

from tests.helpers import perturb_, tiny_config
from vit.model import VisionTransformer
from vit.model.pos_embed import resample


def shuffle_patches(images: torch.Tensor, perm: torch.Tensor, patch: int) -> torch.Tensor:
    """Move patch n of each image to position perm[n] of the raster order."""
    B, C, H, W = images.shape
    h, w = H // patch, W // patch
    patches = images.reshape(B, C, h, patch, w, patch).permute(0, 2, 4, 1, 3, 5).reshape(B, h * w, C, patch, patch)
    patches = patches[:, perm]
    return patches.reshape(B, h, w, C, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


def test_without_position_encoding_permuting_patches_permutes_tokens():
    model = perturb_(VisionTransformer(tiny_config(pos_embed="none", pool="avg"))).eval()
    images, perm = torch.randn(2, 3, 16, 16), torch.randperm(16)
    with torch.no_grad():
        tokens, shuffled = (
            model.forward_features(images),
            model.forward_features(shuffle_patches(images, perm, 4)),
        )
        torch.testing.assert_close(shuffled, tokens[:, perm], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(shuffle_patches(images, perm, 4)), model(images), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos_embed", ["learned", "factorized", "sincos2d", "sincos1d", "rope2d"])
def test_with_position_encoding_permuting_patches_changes_the_output(pos_embed):
    model = perturb_(VisionTransformer(tiny_config(pos_embed=pos_embed, pool="avg"))).eval()
    images, perm = torch.randn(2, 3, 16, 16), torch.randperm(16)
    with torch.no_grad():
        tokens, shuffled = (
            model.forward_features(images),
            model.forward_features(shuffle_patches(images, perm, 4)),
        )
    assert not torch.allclose(shuffled, tokens[:, perm], atol=1e-3)


@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d", "sincos1d", "rope2d", "none"])
@pytest.mark.parametrize("pool", ["token", "avg"])
def test_attention_maps_match_the_fast_path(pos_embed, pool):
    config = tiny_config(pos_embed=pos_embed, pool=pool)
    model = perturb_(VisionTransformer(config)).eval()
    images = torch.randn(2, 3, 16, 16)
    maps = model.attention_maps(images)
    n = 16 + config.num_prefix_tokens
    assert len(maps) == config.depth and all(m.shape == (2, 4, n, n) for m in maps)
    with torch.no_grad():
        fast = model(images)
        for layer in model.layers:
            layer.attn.fused = False
        torch.testing.assert_close(model(images), fast, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_attention_maps_are_each_layers_softmax_of_its_queries_and_keys(pool):
    # closed form from the layer's own weights and inputs: a map reversed, transposed or taken from another layer
    # or head fails
    model = perturb_(VisionTransformer(tiny_config(pool=pool, pos_embed="learned"))).eval()
    images = torch.randn(2, 3, 16, 16)
    inputs = []
    hooks = [layer.attn.register_forward_hook(lambda m, args, out: inputs.append(args[0])) for layer in model.layers]
    maps = model.attention_maps(images)
    for hook in hooks:
        hook.remove()
    for x, attn, weights in zip(inputs, (layer.attn for layer in model.layers), maps, strict=True):
        B, N = x.shape[:2]
        q, k, _ = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        expected = (q @ k.transpose(-2, -1) / attn.head_dim**0.5).softmax(-1)  # (B, H, N, N)
        torch.testing.assert_close(weights, expected)
        assert not torch.allclose(weights, weights.flip(-1), atol=1e-3)  # the check can tell a reversal


def test_forward_is_features_then_head():
    model = perturb_(VisionTransformer(tiny_config(pool="token"))).eval()
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(images)
        assert tokens.shape == (3, 17, 32)
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens[:, 0])
        torch.testing.assert_close(model(images), model.head(tokens[:, 0]))


@pytest.mark.parametrize("pos_embed", ["learned", "rope2d"])
@pytest.mark.parametrize("form", ["pre", "post"])
@pytest.mark.parametrize("fused_attn", [True, False])
def test_class_token_only_last_layer_gives_the_full_models_logits_and_gradients(pos_embed, form, fused_attn):
    """forward() lets the last layer compute the class token's row alone; the reference is
    forward_features -> pool -> head, every token's row computed. Same logits, same gradients for every
    parameter, to fp32's summation order (1e-5): the two run matrix products of other shapes, so not bitwise."""
    config = tiny_config(pool="token", pos_embed=pos_embed, layer=form, layer_scale_init=0.5)
    model = perturb_(VisionTransformer(config))
    model.set_fused_attn(fused_attn)
    images = torch.randn(3, 3, 16, 16)
    rows = []  # the token rows the last layer's MLP sees: the class token's alone on the fast path
    model.layers[-1].mlp.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[1]))
    fast, reference = model(images), model.head(model.pool(model.forward_features(images)))
    assert rows == [1, 17]
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-5)
    fast_grads = torch.autograd.grad(fast.square().sum(), list(model.parameters()), allow_unused=True)
    reference_grads = torch.autograd.grad(reference.square().sum(), list(model.parameters()), allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), fast_grads, reference_grads, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_class_token_only_last_layer_under_bf16_autocast_stays_within_bf16_rounding():
    """The same comparison under CPU bf16 autocast: the two paths round differently (other matrix shapes), so
    they agree to bf16's precision (8 bits of mantissa: 2e-2 relative), not to fp32's."""
    model = perturb_(VisionTransformer(tiny_config(pool="token"))).eval()
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast, reference = model(images), model.forward_head(model.forward_features(images))
    assert fast.dtype == reference.dtype == torch.bfloat16
    torch.testing.assert_close(fast.float(), reference.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_under_bf16_autocast_the_tokens_are_bf16_with_or_without_a_class_token(pool):
    """One dtype for the residual stream, the patch embedding's: an fp32 class token concatenated as it is would
    promote the whole stream to fp32, which trained CIFAR's and Ti/16's shapes slower with ~10% more memory."""
    model = VisionTransformer(tiny_config(pool=pool)).eval()
    dtypes = []  # of the stream into the first layer and into the final norm
    for module in (model.layers[0], model.norm):
        module.register_forward_pre_hook(lambda module, args: dtypes.append(args[0].dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.randn(2, 3, 16, 16))
    assert dtypes == [torch.bfloat16] * 2


def test_avg_pool_has_no_class_token_and_averages_patches():
    model = perturb_(VisionTransformer(tiny_config(pool="avg"))).eval()
    assert model.cls_token is None
    with torch.no_grad():
        tokens = model.forward_features(torch.randn(2, 3, 16, 16))
    assert tokens.shape == (2, 16, 32)
    torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens.mean(1))


@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d", "rope2d"])
def test_other_image_sizes_run_with_recomputed_or_resampled_positions(pos_embed):
    model = perturb_(VisionTransformer(tiny_config(pos_embed=pos_embed))).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 24, 12)).shape == (2, 5)
    if pos_embed == "learned":
        torch.testing.assert_close(model.pos_embed.table_for((6, 3)), resample(model.pos_embed.table, (6, 3)))


def test_non_square_images():
    model = VisionTransformer(tiny_config(img_size=(16, 28)))
    assert model(torch.randn(2, 3, 16, 28)).shape == (2, 5)
    assert model.pos_embed.table.shape == (4, 7, 32)


def test_an_image_of_no_whole_number_of_patches_reads_its_whole_patches():
    model = VisionTransformer(tiny_config()).eval()
    images = torch.randn(1, 3, 18, 19)
    with torch.no_grad():
        torch.testing.assert_close(model(images), model(images[:, :, :16, :16]), atol=0, rtol=0)


def test_fixed_position_tables_are_not_parameters():
    model = VisionTransformer(tiny_config(pos_embed="sincos2d"))
    assert not [n for n, _ in model.named_parameters() if "pos" in n]
    assert not [k for k in model.state_dict() if k.startswith("pos_embed")]


def test_no_weight_decay_names_tokens_and_learned_tables():
    assert VisionTransformer(tiny_config(pool="token")).no_weight_decay() == {
        "cls_token",
        "pos_embed.table",
        "pos_embed.prefix",
    }
    assert VisionTransformer(tiny_config(pool="avg", pos_embed="sincos2d")).no_weight_decay() == set()


def test_drop_path_rises_linearly_with_depth():
    model = VisionTransformer(tiny_config(depth=5, drop_path=0.2))
    rates = [getattr(layer.drop_path, "p", 0.0) for layer in model.layers]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])


def test_post_norm_model_has_no_extra_final_norm():
    model = VisionTransformer(tiny_config(layer="post"))
    assert isinstance(model.norm, torch.nn.Identity)
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 5)
