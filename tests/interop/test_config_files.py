"""Hugging Face and OpenCLIP folders: preprocessing read as the source library applies it, weights that do not fit
together and config files that are not what they claim refused in one line naming what is at fault. Random weights
from the source library, fp32, eval; no hub is reached."""

import json

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from tests.helpers import perturb_
from vit.checkpoint import CheckpointError, load

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def _vit_folder(tmp_path, **values):
    """A ViTForImageClassification save_pretrained folder, and the model."""
    config = transformers.ViTConfig(**SMALL, image_size=32, patch_size=8, num_labels=5, **values)
    torch.manual_seed(0)
    reference = perturb_(transformers.ViTForImageClassification(config), std=0.05).eval()
    reference.save_pretrained(tmp_path)
    return reference


def _refused_in_one_line(path, refusal):
    with pytest.raises(CheckpointError, match=refusal) as refused:
        load(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "processor",
    [
        dict(do_normalize=False),  # pixels x / 255, whatever image_mean and image_std say
        dict(rescale_factor=1 / 127.5, image_mean=[1.0] * 3, image_std=[1.0] * 3),  # [-1, 1], written as a rescale
        dict(do_rescale=False, image_mean=[100.0, 120.0, 130.0], image_std=[50.0, 60.0, 70.0]),  # 0..255 statistics
    ],
)
def test_the_pixels_are_those_the_image_processor_gives_whatever_its_rescale_and_normalize(processor, tmp_path):
    _vit_folder(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}, **processor).save_pretrained(tmp_path)
    image = Image.fromarray(np.random.RandomState(0).randint(0, 256, (32, 32, 3), dtype=np.uint8))
    expected = transformers.ViTImageProcessor.from_pretrained(tmp_path)(image, return_tensors="pt").pixel_values
    torch.testing.assert_close(load(tmp_path).preprocess(image), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("file", "text", "refusal"),
    [
        ("config.json", "[1, 2]", r"config\.json holds an array, not a JSON object$"),
        ("config.json", "{oops", r"config\.json is not JSON: "),
        ("config.json", "null", r"config\.json holds null, not a JSON object$"),  # timm's check raised
        ("config.json", {"hidden_size": "64"}, r"hidden_size='64' is not a whole number$"),
        ("config.json", {"num_attention_heads": 0}, r"num_attention_heads=0 is not >= 1$"),
        ("config.json", {"num_attention_heads": None}, r"num_attention_heads=None is not a whole number$"),
        ("config.json", {"hidden_act": ["gelu"]}, r"hidden_act=\['gelu'\] is not a name$"),
        ("config.json", {"layer_norm_eps": "1e-12"}, r"layer_norm_eps='1e-12' is not a number$"),
        ("config.json", {"model_type": ["vit"]}, r"model_type=\['vit'\] is not a name$"),
        ("preprocessor_config.json", "[]", r"preprocessor_config\.json holds an array, not a JSON object$"),
        ("preprocessor_config.json", {"size": "224"}, r"preprocessor_config\.json: size='224' is neither height and "),
        ("preprocessor_config.json", {"size": {"height": 0, "width": 2}}, r"size=\{'height': 0, .* not a size in"),
        ("preprocessor_config.json", {"rescale_factor": "1/255"}, r"rescale_factor='1/255' is not a number > 0$"),
    ],
)
def test_a_hugging_face_config_file_of_the_wrong_kind_is_refused_naming_what_is_wrong(file, text, refusal, tmp_path):
    _vit_folder(tmp_path)
    if isinstance(text, dict):  # one field changed in what save_pretrained wrote
        written = json.loads((tmp_path / file).read_text()) if (tmp_path / file).is_file() else {}
        text = json.dumps(written | text)
    (tmp_path / file).write_text(text)
    _refused_in_one_line(tmp_path, refusal)


QUERY = "vit.encoder.layer.0.attention.attention.query"


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (
            {f"{QUERY}.bias": None},
            r"lack the query projection beside blocks\.0\.attn\.k\.bias, blocks\.0\.attn\.v\.bias",
        ),
        ({QUERY.replace("query", "value") + ".bias": None}, r"lack blocks\.0\.attn\.v\.bias \(timm's names\)"),
        ({QUERY.replace("query", "value") + ".weight": None}, r"lack blocks\.0\.attn\.v\.weight \(timm's names\)"),
        ({f"{QUERY}.weight": torch.zeros(64, 63)}, r"do not fit together into attn\.qkv: blocks\.0\.attn\.q\.weight"),
    ],
    ids=["no query bias", "no value bias", "no value weight", "query of another width"],
)
def test_attention_projections_that_do_not_fit_together_are_refused_not_zero_filled(change, refusal, tmp_path):
    # a missing query or value bias was filled with zeros (logits off by the bias), a narrower query a traceback
    _vit_folder(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    for key, value in change.items():
        state.pop(key) if value is None else state.__setitem__(key, value)
    save_file(state, tmp_path / "model.safetensors")
    _refused_in_one_line(tmp_path, refusal)


def test_a_file_without_the_key_bias_computes_what_transformers_computes(tmp_path):
    # a key bias adds q·b_k to a whole softmax row, which the softmax ignores: zero is exact
    reference = _vit_folder(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state.pop(QUERY.replace("query", "key") + ".bias")
    save_file(state, tmp_path / "model.safetensors")
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        torch.testing.assert_close(load(tmp_path).model(images), expected, atol=1e-5, rtol=0)


# OpenCLIP hub folders -------------------------------------------------------------------------------------------

MODEL_CFG = dict(
    embed_dim=16,
    vision_cfg=dict(image_size=32, patch_size=8, width=64, layers=2, head_width=16),
    text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1),
)


def _open_clip_folder(folder, preprocess_cfg=None):
    clip = perturb_(open_clip.CLIP(**MODEL_CFG), std=0.05).eval()
    written = {"model_cfg": MODEL_CFG} | ({} if preprocess_cfg is None else {"preprocess_cfg": preprocess_cfg})
    (folder / "open_clip_config.json").write_text(json.dumps(written))
    save_file(clip.state_dict(), folder / "open_clip_model.safetensors")


@pytest.mark.parametrize("preprocess_cfg", [None, {"mean": None, "std": None}], ids=["absent", "null"])
def test_an_open_clip_folder_without_mean_and_std_gets_open_clips_defaults(preprocess_cfg, tmp_path):
    # open_clip's PreprocessCfg then has OpenAI's statistics; they were read as unrecorded (0.5, mapping to [-1, 1])
    _open_clip_folder(tmp_path, preprocess_cfg)
    _, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{tmp_path}")  # open_clip's own reader
    normalize = preprocess.transforms[-1]
    loaded = load(tmp_path)
    assert (loaded.mean, loaded.std) == (tuple(normalize.mean), tuple(normalize.std))
    assert loaded.stats_recorded


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (dict(model_cfg=[1]), r"open_clip_config\.json: model_cfg is \[1\], not a JSON object$"),
        (dict(preprocess_cfg=[1]), r"open_clip_config\.json: preprocess_cfg is \[1\], not a JSON object$"),
        (dict(model_cfg=MODEL_CFG | dict(vision_cfg=[1])), r"has vision_cfg=\[1\], not a JSON object$"),
        (
            dict(model_cfg=MODEL_CFG | dict(vision_cfg=MODEL_CFG["vision_cfg"] | dict(norm_kwargs=[1]))),
            r"has vision_cfg\.norm_kwargs=\[1\], not a JSON object$",
        ),
        (
            dict(model_cfg=MODEL_CFG | dict(vision_cfg=MODEL_CFG["vision_cfg"] | dict(head_width=0))),
            r"has vision_cfg\.head_width=0, not a width up to 64$",
        ),
    ],
    ids=["model_cfg", "preprocess_cfg", "vision_cfg", "norm_kwargs", "head_width"],
)
def test_an_open_clip_config_of_the_wrong_kind_is_refused_naming_the_entry(change, refusal, tmp_path):
    _open_clip_folder(tmp_path)
    written = json.loads((tmp_path / "open_clip_config.json").read_text())
    (tmp_path / "open_clip_config.json").write_text(json.dumps(written | change))
    _refused_in_one_line(tmp_path, refusal)


def test_an_open_clip_tower_whose_projection_is_not_a_matrix_is_refused(tmp_path):
    _open_clip_folder(tmp_path)
    state = load_file(tmp_path / "open_clip_model.safetensors")
    state["visual.proj"] = state["visual.proj"][0].contiguous()  # (16,): was an IndexError from its transpose
    save_file(state, tmp_path / "open_clip_model.safetensors")
    _refused_in_one_line(tmp_path, r"its projection proj has shape \(16,\), not \(width, embedding width\)$")


@pytest.mark.parametrize("act", ["gelu_python", "gelu_fast", "gelu_accurate"])
def test_transformers_other_spellings_of_gelu_load_with_its_logits(act, tmp_path):
    """Each was refused as an activation this ViT lacks: erf's GELU and the tanh approximation, written out."""
    reference = _vit_folder(tmp_path, hidden_act=act)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path).model(images), reference(images).logits, atol=1e-5, rtol=0)
