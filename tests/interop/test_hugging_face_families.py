"""Hugging Face folders of the ViT families (DINOv2 with and without registers, CLIP, SigLIP, DeiT), loaded by
vit.checkpoint.load with the architecture config.json gives, compute what transformers computes. Random weights
from each config class, fp32, eval, at the config's image size; no hub is reached."""

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
}
DUAL = {"CLIPModel", "SiglipModel", "SiglipForImageClassification"}  # their vision tower's config is nested


def _reference(case: str):
    """transformers' model of `case`, its weights moved off their initial values, in eval mode."""
    model_name, config_name, values, _ = CASES[case]
    config_class = getattr(transformers, config_name)
    if case in DUAL:
        labels = LABELS if model_name.endswith("Classification") else {}
        config = config_class(vision_config=SMALL | values, text_config=TEXT, **labels)
    else:
        config = config_class(**SMALL, **values)
    torch.manual_seed(0)
    return perturb_(getattr(transformers, model_name)(config), std=0.05).eval()


def _tower_config(reference):
    return getattr(reference.config, "vision_config", reference.config)


def _output(case: str, reference, images):
    """What our model (its logits, or its pooled features when it has no head) must equal."""
    tower = reference.vision_model if CASES[case][0] in ("CLIPModel", "SiglipModel") else reference
    with torch.no_grad():
        return CASES[case][3](tower(pixel_values=images))


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
    with torch.no_grad():
        actual = loaded.model(images)
    _assert_equal_outputs(actual, _output(case, reference, images))
    if CASES[case][3] is _logits and not case.endswith("headless"):
        assert loaded.classes == tuple(f"kind{i}" for i in range(5))


def test_transformers_5_names_load_alike(tmp_path):
    # save_original_format=False writes the names transformers 5 uses in memory: q_proj, SwiGLU's gate_proj / up_proj
    case = "Dinov2ForImageClassification-swiglu"
    reference = _reference(case)
    reference.save_pretrained(tmp_path, save_original_format=False)
    images = _images(reference)
    with torch.no_grad():
        _assert_equal_outputs(load(tmp_path).model(images), _output(case, reference, images))


def _only_what_differs(config) -> dict:
    """config's dict without the values its class has by default."""
    defaults = type(config)().to_dict()
    return {k: v for k, v in config.to_dict().items() if k == "model_type" or defaults.get(k) != v}


@pytest.mark.parametrize("case", ["Dinov2WithRegistersModel", "CLIPVisionModel", "SiglipModel", "DeiTModel"])
def test_a_config_json_stating_only_what_differs_from_transformers_defaults_loads_alike(case, tmp_path):
    # as transformers 4 wrote a dual encoder's vision_config: google/siglip-base-patch16-224's states its patch size
    # and model_type alone. The loader knows each config class's defaults
    reference = _reference(case)
    reference.save_pretrained(tmp_path)
    if case in DUAL:
        stated = reference.config.to_dict() | {"vision_config": _only_what_differs(reference.config.vision_config)}
    else:
        stated = _only_what_differs(reference.config)
    assert {"hidden_act", "layer_norm_eps"}.isdisjoint(stated.get("vision_config", stated))  # what this is about
    (tmp_path / "config.json").write_text(json.dumps(stated))
    loaded = load(tmp_path)
    assert loaded.config.norm_eps == _tower_config(reference).layer_norm_eps  # too small a change for the outputs
    images = _images(reference)
    with torch.no_grad():
        _assert_equal_outputs(loaded.model(images), _output(case, reference, images))


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.mark.parametrize("written_by", ["BitImageProcessor", "an older transformers"])
def test_the_preprocessing_comes_from_preprocessor_config_json(written_by, tmp_path):
    _reference("Dinov2Model").save_pretrained(tmp_path)
    if written_by == "BitImageProcessor":  # DINOv2's: resize the short side to 32, crop 28 x 28, PIL's BILINEAR
        size, crop = {"shortest_edge": 32}, {"height": 28, "width": 28}
        transformers.BitImageProcessor(
            size=size, crop_size=crop, resample=2, image_mean=MEAN, image_std=STD
        ).save_pretrained(tmp_path)
    else:  # sizes as ints
        processor = dict(size=32, crop_size=28, do_center_crop=True, resample=2, image_mean=MEAN, image_std=STD)
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    loaded = load(tmp_path)
    assert (loaded.mean, loaded.std, loaded.crop_pct, loaded.interpolation) == (
        tuple(MEAN),
        tuple(STD),
        28 / 32,
        "bilinear",
    )
    assert loaded.classes is None  # a bare model: features, no classes


@pytest.mark.parametrize(
    ("config_name", "refusal"),
    [
        ("ViTMAEConfig", r"model_type vit_mae is not one this loader reads \(vit, deit, dinov2"),
    ],
)
def test_a_model_type_we_cannot_compute_is_refused_in_one_line(config_name, refusal, tmp_path):
    getattr(transformers, config_name)().save_pretrained(tmp_path)  # refused by config.json, before the weights
    with pytest.raises(CheckpointError, match=refusal) as refused:
        load(tmp_path)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300


@pytest.mark.parametrize(
    ("model_name", "values", "refusal"),
    [
        ("CLIPVisionModel", dict(hidden_act="relu"), r"model_type clip_vision_model: hidden_act='relu' is not an"),
        ("CLIPForImageClassification", {}, r"model_type clip: CLIPForImageClassification averages the patch tokens"),
    ],
)
def test_a_switch_we_cannot_compute_is_refused_naming_it(model_name, values, refusal, tmp_path):
    vision = SMALL | dict(image_size=32, patch_size=8, intermediate_size=128) | values
    if model_name == "CLIPVisionModel":
        config = transformers.CLIPVisionConfig(**vision)
    else:
        config = transformers.CLIPConfig(vision_config=vision, text_config=TEXT)
    getattr(transformers, model_name)(config).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=refusal):
        load(tmp_path)


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
    with torch.no_grad():
        _assert_equal_outputs(load(folder).model(images), _output(case, reference, images))


def test_a_bare_deit_model_loads_given_its_config_as_a_vit_model_does(tmp_path):
    # its keys are ViTModel's and a distillation token: not one of the families refused bare
    reference = _reference("DeiTModel")
    torch.save(reference.state_dict(), tmp_path / "weights.pth")
    loaded = load(tmp_path / "weights.pth", config=hugging_face_config(reference.config.to_dict(), has_head=False))
    images = _images(reference)
    with torch.no_grad():
        _assert_equal_outputs(loaded.model(images), _output("DeiTModel", reference, images))
