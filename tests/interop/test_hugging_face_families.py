"""Hugging Face folders of the ViT families (DINOv2 with and without registers, DINOv3, CLIP, SigLIP, DeiT, AIMv2,
MetaCLIP 2, TIPSv2, Sapiens 2, ViT-MAE, I-JEPA, RADIO, Pixio), loaded by vit.checkpoint.load with the architecture
config.json gives, compute what transformers computes: the pooled features where the model has a pooler, its logits,
else its tokens. Random weights from each config class, fp32, eval, at the config's image size; no hub is reached."""

import json
import re

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers import perturb_
from vit.checkpoint import CheckpointError, load
from vit.interop.hugging_face import hugging_face_config

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
LABELS = dict(id2label={i: f"kind{i}" for i in range(5)}, label2id=None)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)  # a dual encoder's


def _pooled(outputs):
    return outputs.pooler_output


def _logits(outputs):
    return outputs.logits


def _tokens(outputs):  # a model without a pooler: every token, which forward_features gives
    return outputs.last_hidden_state


def _distilled(outputs):  # DeiTModel's pooler_output is its pooler's dense + tanh, which we leave out; its
    return outputs.last_hidden_state[:, :2].mean(dim=1)  # features, as timm's: class and distillation tokens averaged


# each case: transformers' class, its config class with a small config, and which output our model must give
CASES = {
    "Dinov2Model": ("Dinov2Model", "Dinov2Config", dict(image_size=28, patch_size=7), _pooled),
    "Dinov2ForImageClassification-swiglu": (
        "Dinov2ForImageClassification",
        "Dinov2Config",
        dict(image_size=28, patch_size=7, use_swiglu_ffn=True, **LABELS),
        _logits,
    ),
    "Dinov2WithRegistersModel": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        dict(image_size=28, patch_size=7, num_register_tokens=3),
        _pooled,
    ),
    "Dinov2WithRegistersForImageClassification": (
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersConfig",
        dict(image_size=42, patch_size=14, mlp_ratio=3, **LABELS),
        _logits,
    ),
    "CLIPVisionModel": (
        "CLIPVisionModel",
        "CLIPVisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=128),
        _pooled,
    ),
    "CLIPVisionModel-gelu": (
        "CLIPVisionModel",
        "CLIPVisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=96, hidden_act="gelu", layer_norm_eps=1e-6),
        _pooled,
    ),
    "CLIPModel": ("CLIPModel", "CLIPConfig", dict(image_size=48, patch_size=16, intermediate_size=128), _pooled),
    "SiglipVisionModel": (
        "SiglipVisionModel",
        "SiglipVisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=128),
        _pooled,
    ),
    "SiglipModel": ("SiglipModel", "SiglipConfig", dict(image_size=56, patch_size=14, intermediate_size=128), _pooled),
    "SiglipForImageClassification": (
        "SiglipForImageClassification",
        "SiglipConfig",
        dict(image_size=32, patch_size=8, intermediate_size=128),
        _logits,
    ),
    "DeiTForImageClassificationWithTeacher": (
        "DeiTForImageClassificationWithTeacher",
        "DeiTConfig",
        dict(image_size=32, patch_size=8, intermediate_size=128, **LABELS),
        _logits,
    ),
    "DeiTForImageClassification": (
        "DeiTForImageClassification",
        "DeiTConfig",
        dict(image_size=32, patch_size=8, intermediate_size=128, **LABELS),
        _logits,
    ),
    "DeiTModel": ("DeiTModel", "DeiTConfig", dict(image_size=32, patch_size=8, intermediate_size=128), _distilled),
    # classifiers without heads (num_labels=0: feature extractors): what their identity classifiers pass on
    "DeiTForImageClassificationWithTeacher-headless": (
        "DeiTForImageClassificationWithTeacher",
        "DeiTConfig",
        dict(image_size=32, patch_size=8, intermediate_size=128, num_labels=0),
        _logits,
    ),
    "Dinov2ForImageClassification-headless": (
        "Dinov2ForImageClassification",
        "Dinov2Config",
        dict(image_size=28, patch_size=7, num_labels=0),
        _logits,
    ),
    # DINOv3: RoPE at the patches' centres with half-split rotation, registers, no position table, LayerScale
    "DINOv3ViTModel": (
        "DINOv3ViTModel",
        "DINOv3ViTConfig",
        dict(image_size=32, patch_size=8, intermediate_size=128, num_register_tokens=4, layerscale_value=0.5),
        _pooled,
    ),
    "DINOv3ViTModel-gated": (
        "DINOv3ViTModel",
        "DINOv3ViTConfig",
        dict(image_size=48, patch_size=16, intermediate_size=96, use_gated_mlp=True, hidden_act="silu", key_bias=True),
        _pooled,
    ),
    # AIMv2: patch_norm, RMSNorm, SwiGLU, its attention-pooling head as pool='map'
    "Aimv2VisionModel": (  # initializer_range: its pooled features otherwise average near zero
        "Aimv2VisionModel",
        "Aimv2VisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=96, initializer_range=0.1),
        _pooled,
    ),
    "Aimv2VisionModel-headless": (
        "Aimv2VisionModel",
        "Aimv2VisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=96, use_head=False),
        _tokens,
    ),
    "Aimv2Model": (
        "Aimv2Model",
        "Aimv2Config",
        dict(image_size=32, patch_size=8, intermediate_size=96, qkv_bias=True, mlp_bias=True, initializer_range=0.1),
        _pooled,
    ),
    "MetaClip2VisionModel": (
        "MetaClip2VisionModel",
        "MetaClip2VisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=96),
        _pooled,
    ),
    "MetaClip2Model": (
        "MetaClip2Model",
        "MetaClip2Config",
        dict(image_size=32, patch_size=8, intermediate_size=96),
        _pooled,
    ),
    # TIPSv2: DINOv2 with registers, its table resized bilinearly; original checkpoints' timm names
    "Tipsv2VisionModel": (
        "Tipsv2VisionModel",
        "Tipsv2VisionConfig",
        dict(image_size=28, patch_size=7, num_register_tokens=2, layerscale_value=0.5),
        _pooled,
    ),
    "Tipsv2Model-swiglu": (
        "Tipsv2Model",
        "Tipsv2Config",
        dict(image_size=28, patch_size=7, use_swiglu_ffn=True),
        _pooled,
    ),
    # Sapiens 2: DINOv3's RoPE, RMSNorm, qk-norm, key/value heads a layer, LayerScale on attention alone
    "Sapiens2Model": (
        "Sapiens2Model",
        "Sapiens2Config",
        dict(
            image_size=32,
            patch_size=8,
            intermediate_size=96,
            num_key_value_heads_per_layer=[4, 2],
            num_register_tokens=2,
        ),
        _pooled,
    ),
    "Sapiens2Model-plain-mlp": (
        "Sapiens2Model",
        "Sapiens2Config",
        dict(image_size=32, patch_size=8, intermediate_size=96, use_gated_mlp=False, hidden_act="gelu", key_bias=False),
        _pooled,
    ),
    # ViT-MAE's encoder on every patch in order: transformers' at mask_ratio 0 with noise that keeps the order
    "ViTMAEModel": (
        "ViTMAEModel",
        "ViTMAEConfig",
        dict(image_size=32, patch_size=8, intermediate_size=96, mask_ratio=0.0),
        _tokens,
    ),
    "ViTMAEForPreTraining": (
        "ViTMAEForPreTraining",
        "ViTMAEConfig",
        dict(
            image_size=32,
            patch_size=8,
            intermediate_size=96,
            mask_ratio=0.0,
            decoder_hidden_size=32,
            decoder_num_hidden_layers=1,
            decoder_num_attention_heads=2,
            decoder_intermediate_size=64,
        ),
        _tokens,
    ),
    "IJepaModel": ("IJepaModel", "IJepaConfig", dict(image_size=32, patch_size=8, intermediate_size=96), _tokens),
    "IJepaForImageClassification": (
        "IJepaForImageClassification",
        "IJepaConfig",
        dict(image_size=32, patch_size=8, intermediate_size=96, **LABELS),
        _logits,
    ),
    # RADIO: 3 class tokens and 7 registers without positions, an 8 x 8 table resized to 4 x 4 as RADIO does, no
    # final norm; its summary is no pooling of ours, so its tokens
    "RadioModel": ("RadioModel", "RadioConfig", dict(image_size=32, patch_size=8, max_img_size=64), _tokens),
    "RadioModel-swiglu": (
        "RadioModel",
        "RadioConfig",
        dict(image_size=32, patch_size=8, max_img_size=64, use_swiglu_ffn=True, layerscale_value=0.5),
        _tokens,
    ),
    # Pixio: its pooler averages its 8 class tokens, no pooling of ours: its tokens; with one, its pooled features
    "PixioModel": ("PixioModel", "PixioConfig", dict(image_size=32, patch_size=8), _tokens),
    "PixioModel-one-class-token": (
        "PixioModel",
        "PixioConfig",
        dict(image_size=32, patch_size=8, n_cls_tokens=1),
        _pooled,
    ),
}
# their vision tower's config is nested
DUAL = {
    "CLIPModel",
    "SiglipModel",
    "SiglipForImageClassification",
    "Aimv2Model",
    "MetaClip2Model",
    "Tipsv2Model-swiglu",
}
# the models whose network ours is a part of: a dual encoder's vision tower, MAE's encoder
TOWERS = dict.fromkeys(["CLIPModel", "SiglipModel", "Aimv2Model", "MetaClip2Model", "Tipsv2Model"], "vision_model")
TOWERS["ViTMAEForPreTraining"] = "vit"
RAW_PIXELS = {"RadioModel", "RadioModel-swiglu"}  # RADIO normalises the pixels itself: for us, the data facts do


def _reference(case: str):
    """transformers' model of `case`, its weights moved off their initial values, in eval mode."""
    model_name, config_name, values, _ = CASES[case]
    config_class = getattr(transformers, config_name)
    if case in DUAL:
        labels = LABELS if model_name.endswith("Classification") else {}
        text = TEXT | {"hidden_size": 64} if model_name == "Tipsv2Model" else TEXT  # TIPSv2 ties the two widths
        config = config_class(vision_config=SMALL | values, text_config=text, **labels)
    else:
        config = config_class(**SMALL, **values)
    torch.manual_seed(0)
    return perturb_(getattr(transformers, model_name)(config), std=0.05).eval()


def _tower_config(reference):
    return getattr(reference.config, "vision_config", reference.config)


def _output(case: str, reference, images):
    """What our model must give: transformers' logits, pooled features or tokens (CASES)."""
    tower = getattr(reference, TOWERS.get(CASES[case][0], ""), reference)
    config = _tower_config(reference)
    keep_order = {"noise": torch.arange((config.image_size // config.patch_size) ** 2).float().expand(len(images), -1)}
    with torch.no_grad():
        return CASES[case][3](tower(pixel_values=images, **(keep_order if case.startswith("ViTMAE") else {})))


def _ours(case: str, loaded, images):
    """Our model's output of the kind CASES names for `case`: its tokens, or forward's logits or pooled features."""
    if case in RAW_PIXELS:
        images = (images - torch.tensor(loaded.mean)[:, None, None]) / torch.tensor(loaded.std)[:, None, None]
    with torch.no_grad():
        return loaded.model.forward_features(images) if CASES[case][3] is _tokens else loaded.model(images)


def _assert_equal_outputs(actual, expected):
    """Equal to 1e-5 of the outputs' scale (unit-scale outputs: 1e-5 absolute)."""
    assert expected.abs().mean() > 0.05  # not two near-zero tensors
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual, expected, atol=1e-5 * scale, rtol=0)


def _images(reference):
    size = _tower_config(reference).image_size
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", CASES)
def test_a_hugging_face_folder_computes_what_transformers_computes(case, tmp_path):
    reference = _reference(case)
    reference.save_pretrained(tmp_path)
    loaded = load(tmp_path)  # nothing restated: config.json says the architecture
    images = _images(reference)
    _assert_equal_outputs(_ours(case, loaded, images), _output(case, reference, images))
    if CASES[case][3] is _logits and not case.endswith("headless"):
        assert loaded.classes == tuple(f"kind{i}" for i in range(5))


@pytest.mark.parametrize(
    "case",
    [
        "Dinov2ForImageClassification-swiglu",
        "Tipsv2Model-swiglu",
        "Sapiens2Model",
        "RadioModel-swiglu",
        "ViTMAEForPreTraining",
        "IJepaForImageClassification",
        "PixioModel",
        "Aimv2Model",
    ],
)
def test_transformers_5_names_load_alike(case, tmp_path):
    # save_original_format=False writes the names transformers 5 uses in memory: q_proj, SwiGLU's gate_proj /
    # up_proj; save_pretrained's default, the original checkpoints' (TIPSv2's and RADIO's timm names, Sapiens 2's wq)
    reference = _reference(case)
    reference.save_pretrained(tmp_path, save_original_format=False)
    images = _images(reference)
    _assert_equal_outputs(_ours(case, load(tmp_path), images), _output(case, reference, images))


def _only_what_differs(config) -> dict:
    """config's dict without the values its class has by default."""
    defaults = type(config)().to_dict()
    return {k: v for k, v in config.to_dict().items() if k == "model_type" or defaults.get(k) != v}


@pytest.mark.parametrize(
    "case",
    [
        "Dinov2WithRegistersModel",
        "CLIPVisionModel",
        "SiglipModel",
        "DeiTModel",
        "Aimv2VisionModel",
        "MetaClip2Model",
        "Tipsv2VisionModel",
        "Sapiens2Model",
        "IJepaModel",
        "RadioModel",
        "PixioModel",
    ],
)
def test_a_config_json_stating_only_what_differs_from_transformers_defaults_loads_alike(case, tmp_path):
    # as transformers 4 wrote a dual encoder's vision_config: google/siglip-base-patch16-224's states its patch size
    # and model_type alone. The loader knows each config class's defaults
    reference = _reference(case)
    reference.save_pretrained(tmp_path)
    if case in DUAL:
        stated = reference.config.to_dict() | {"vision_config": _only_what_differs(reference.config.vision_config)}
    else:
        stated = _only_what_differs(reference.config)
    eps = "layer_norm_eps" if hasattr(_tower_config(reference), "layer_norm_eps") else "rms_norm_eps"
    assert {"hidden_act", eps}.isdisjoint(stated.get("vision_config", stated))  # what this is about
    (tmp_path / "config.json").write_text(json.dumps(stated))
    loaded = load(tmp_path)
    assert loaded.config.norm_eps == getattr(_tower_config(reference), eps)  # too small a change for the outputs
    images = _images(reference)
    _assert_equal_outputs(_ours(case, loaded, images), _output(case, reference, images))


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.mark.parametrize("written_by", ["BitImageProcessor", "an older transformers"])
def test_the_preprocessing_comes_from_preprocessor_config_json(written_by, tmp_path):
    _reference("Dinov2Model").save_pretrained(tmp_path)
    if written_by == "BitImageProcessor":  # DINOv2's: resize the short side to 32, crop 28 x 28, PIL's BILINEAR
        size, crop = {"shortest_edge": 32}, {"height": 28, "width": 28}
        transformers.BitImageProcessor(
            size=size, crop_size=crop, resample=2, image_mean=MEAN, image_std=STD
        ).save_pretrained(tmp_path)
    else:  # sizes as ints, which the processor's class reads (BiT's: a short side, a square crop)
        processor = dict(size=32, crop_size=28, do_center_crop=True, resample=2, image_mean=MEAN, image_std=STD)
        processor["feature_extractor_type"] = "BitFeatureExtractor"
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    loaded = load(tmp_path)
    assert (loaded.mean, loaded.std, loaded.crop_pct, loaded.interpolation) == (
        tuple(MEAN),
        tuple(STD),
        28 / 32,
        "bilinear",
    )
    assert (loaded.crop_mode, loaded.input_size) == ("shortest_edge", (28, 28))
    assert loaded.classes is None  # a bare model: features, no classes


def test_radios_input_conditioner_follows_its_image_processors_normalisation(tmp_path):
    # the network normalises (x - m) / s itself; an image processor that normalises first, (x - m0) / s0, makes the
    # two one normalisation of mean m0 + m s0 and std s0 s
    reference = _reference("RadioModel")
    reference.save_pretrained(tmp_path)
    processor = dict(do_normalize=True, image_mean=[0.5, 0.25, 0.0], image_std=[2.0, 4.0, 1.0])
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    m, s = reference.config.norm_mean, reference.config.norm_std
    loaded = load(tmp_path)
    torch.testing.assert_close(torch.tensor(loaded.mean), torch.tensor([0.5 + 2 * m[0], 0.25 + 4 * m[1], m[2]]))
    torch.testing.assert_close(torch.tensor(loaded.std), torch.tensor([2 * s[0], 4 * s[1], s[2]]))


@pytest.mark.parametrize(
    ("case", "size"),
    [
        ("Tipsv2VisionModel", (42, 42)),  # its table resized bilinearly, antialiased: up
        ("Tipsv2VisionModel", (14, 14)),  # and down
        ("RadioModel", (32, 48)),  # a square of the longer side, its top-left 4 x 6
        ("RadioModel", (72, 24)),  # larger than its table on one side, smaller on the other
        ("Sapiens2Model", (32, 48)),  # rotary phases at the cells' centres of any grid
    ],
)
def test_the_families_that_resize_their_positions_alike_equal_transformers_at_other_sizes(case, size, tmp_path):
    reference = _reference(case)
    reference.save_pretrained(tmp_path)
    images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    _assert_equal_outputs(_ours(case, load(tmp_path), images), _output(case, reference, images))


def test_radio_without_layerscale_weights_scales_by_layerscale_value_as_transformers(tmp_path):
    # C-RADIO's checkpoints have none; transformers then gives each LayerScale the config's layerscale_value
    case = "RadioModel-swiglu"  # layerscale_value 0.5
    reference = _reference(case)
    with torch.no_grad():
        for name, weight in reference.named_parameters():
            if "layer_scale" in name:
                weight.fill_(reference.config.layerscale_value)
    state = {k: v.contiguous() for k, v in reference.state_dict().items() if "layer_scale" not in k}
    reference.config.save_pretrained(tmp_path)
    save_file(state, tmp_path / "model.safetensors")
    images = _images(reference)
    _assert_equal_outputs(_ours(case, load(tmp_path), images), _output(case, reference, images))


def test_two_spellings_of_one_weight_are_refused_naming_both(tmp_path):
    # a classic and a transformers 5 name of the final norm: which one transformers would read is not ours to guess
    reference = _reference("IJepaModel")
    reference.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    save_file(state | {"norm.weight": state["layernorm.weight"] + 1}, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"Hugging Face weights layernorm\.weight and norm\.weight are both norm"):
        load(tmp_path)


def test_a_vit_mae_saved_with_its_masking_loads_its_encoder_on_every_patch(tmp_path):
    # mask_ratio is pretraining's input, not the network: the encoder is loaded as transformers runs it at 0
    case = "ViTMAEModel"
    reference = _reference(case)
    reference.config.mask_ratio = 0.75
    reference.save_pretrained(tmp_path)
    loaded = load(tmp_path)
    reference.config.mask_ratio = 0.0
    images = _images(reference)
    _assert_equal_outputs(_ours(case, loaded, images), _output(case, reference, images))


@pytest.mark.parametrize(
    ("config_name", "refusal"),
    [
        ("BeitConfig", r"model_type beit is not one this loader reads \(vit, deit, vit_mae"),
        ("MLCDVisionConfig", r"model_type mlcd_vision_model: MLCD's class token turns by learned rotary phases"),
    ],
)
def test_a_model_type_we_cannot_compute_is_refused_in_one_line(config_name, refusal, tmp_path):
    getattr(transformers, config_name)().save_pretrained(tmp_path)  # refused by config.json, before the weights
    with pytest.raises(CheckpointError, match=refusal) as refused:
        load(tmp_path)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300


@pytest.mark.parametrize(
    ("model_name", "config_name", "values", "refusal"),
    [
        (
            "CLIPVisionModel",
            "CLIPVisionConfig",
            dict(hidden_act="relu"),
            r"clip_vision_model: hidden_act='relu' is not",
        ),
        ("CLIPForImageClassification", "CLIPConfig", {}, r"clip: CLIPForImageClassification averages the patch tokens"),
        (
            "MetaClip2ForImageClassification",
            "MetaClip2Config",
            {},
            r"metaclip_2: MetaClip2ForImageClassification avera",
        ),
        (
            "Aimv2VisionModel",
            "Aimv2VisionConfig",
            dict(is_native=True),
            r"aimv2_vision_model: is_native: its 2D sinusoid",
        ),
        (
            "Aimv2VisionModel",
            "Aimv2VisionConfig",
            dict(qkv_bias=True),
            r"aimv2_vision_model: qkv_bias=True \(which out_proj's .* differ",
        ),
        (
            "Sapiens2Model",
            "Sapiens2Config",
            dict(use_gated_mlp=False),
            r"sapiens2: hidden_act='silu' is not an activation",
        ),
    ],
)
def test_a_switch_we_cannot_compute_is_refused_naming_it(model_name, config_name, values, refusal, tmp_path):
    vision = SMALL | dict(image_size=32, patch_size=8, intermediate_size=128) | values
    config_class = getattr(transformers, config_name)
    if config_name in ("CLIPConfig", "MetaClip2Config"):
        config = config_class(vision_config=vision, text_config=TEXT)
    else:
        config = config_class(**vision)
    getattr(transformers, model_name)(config).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=f"model_type {refusal}") as refused:
        load(tmp_path)
    assert "\n" not in str(refused.value)


# Bare state dicts (no config.json) of the families whose architecture only config.json says: the family the refusal
# names. The CLIPModel case is a torch.save file, which a folder takes as pytorch_model.bin
BARE = {
    "Dinov2Model": "DINOv2",
    "Dinov2ForImageClassification-swiglu": "DINOv2",
    "Dinov2WithRegistersModel": "DINOv2 with registers",
    "DINOv3ViTModel": "DINOv3",
    "CLIPVisionModel": "CLIP",
    "CLIPModel": "CLIP",
    "SiglipVisionModel": "SigLIP",
    "SiglipModel": "SigLIP",
    "DeiTForImageClassification": "DeiT classifier",
    "DeiTForImageClassificationWithTeacher": "DeiT classifier",
    "Sapiens2Model": "Sapiens 2",
    "Aimv2VisionModel": "AIMv2",
    "RadioModel": "RADIO",
}


@pytest.mark.parametrize(("case", "family"), BARE.items(), ids=list(BARE))
def test_a_bare_state_dict_of_a_family_is_refused_naming_it_and_the_folder_that_loads(case, family, tmp_path):
    reference = _reference(case)
    suffix, weights = (".bin", "pytorch_model.bin") if case == "CLIPModel" else (".safetensors", "model.safetensors")
    bare = tmp_path / f"weights{suffix}"
    (torch.save if suffix == ".bin" else save_file)(
        {k: v.contiguous() for k, v in reference.state_dict().items()}, bare
    )
    said = rf"a bare Hugging Face {family} state dict: .* config\.json .* as {re.escape(weights)}$"
    refusal = rf"weights{re.escape(suffix)}: {said}"
    with pytest.raises(CheckpointError, match=refusal) as refused:
        load(bare)
    assert "\n" not in str(refused.value)
    folder = tmp_path / "folder"  # what the refusal says to do
    folder.mkdir()
    bare.rename(folder / weights)
    reference.config.save_pretrained(folder)
    images = _images(reference)
    _assert_equal_outputs(_ours(case, load(folder), images), _output(case, reference, images))


def test_a_bare_deit_model_loads_given_its_config_as_a_vit_model_does(tmp_path):
    # its keys are ViTModel's and a distillation token: not one of the families refused bare
    reference = _reference("DeiTModel")
    torch.save(reference.state_dict(), tmp_path / "weights.pth")
    loaded = load(tmp_path / "weights.pth", config=hugging_face_config(reference.config.to_dict(), has_head=False))
    images = _images(reference)
    with torch.no_grad():
        _assert_equal_outputs(loaded.model(images), _output("DeiTModel", reference, images))
