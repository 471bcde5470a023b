"""A Hugging Face folder's image processor decides Loaded.preprocess: on images far from square, the same grid and
the same tensor as transformers' own processor (its PIL backend to float rounding, its torchvision backend to two
grey levels: its 8-bit bicubic rounds and clips apart from PIL's), then the same features from the processor's
output. Each processor is built from its class with the settings of a real checkpoint's, scaled to a tiny
random-weight model; nothing downloaded."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import perturb_
from vit.checkpoint import CheckpointError, load

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
CLIP_CROP = dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})  # openai/clip-vit-*'s, scaled


def _pooled(outputs):
    return outputs.pooler_output


def _logits(outputs):
    return outputs.logits


# each case: transformers' model and config classes with a tiny config, its image processor's class and the settings
# a real checkpoint's preprocessor_config.json states (scaled to the tiny model), and which output our model gives
CASES = {
    # google/vit-base-patch16-224: each side resized to 224, no crop
    "ViTImageProcessor": (
        "ViTForImageClassification",
        "ViTConfig",
        dict(image_size=32, patch_size=8, intermediate_size=64, num_labels=3),
        dict(size={"height": 32, "width": 32}),
        _logits,
    ),
    # facebook/deit-*: each side to 256, the centre 224 cropped (here 37 and 32: an odd margin, floored)
    "DeiTImageProcessor": (
        "ViTForImageClassification",
        "ViTConfig",
        dict(image_size=32, patch_size=8, intermediate_size=64, num_labels=3),
        dict(size={"height": 37, "width": 37}, crop_size={"height": 32, "width": 32}),
        _logits,
    ),
    "CLIPImageProcessor": (
        "CLIPVisionModel",
        "CLIPVisionConfig",
        dict(image_size=32, patch_size=8),
        CLIP_CROP,
        _pooled,
    ),
    # apple/aimv2-*: CLIP's processor
    "CLIPImageProcessor-aimv2": (
        "Aimv2VisionModel",
        "Aimv2VisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=48, initializer_range=0.1),
        CLIP_CROP,
        _pooled,
    ),
    # facebook/dinov2-*: the short side to 256, the centre 224 of a 518 table (here 37 and 32 of a 56 one)
    "BitImageProcessor": (
        "Dinov2Model",
        "Dinov2Config",
        dict(image_size=56, patch_size=8),
        dict(size={"shortest_edge": 37}, crop_size={"height": 32, "width": 32}),
        _pooled,
    ),
    "SiglipImageProcessor": (
        "SiglipVisionModel",
        "SiglipVisionConfig",
        dict(image_size=32, patch_size=8, intermediate_size=64),
        dict(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3),
        _pooled,
    ),
    # google/siglip2-base-patch16-naflex: max_num_patches 256 of 16 pixels (here 16 of 8)
    "Siglip2ImageProcessor": (
        "Siglip2VisionModel",
        "Siglip2VisionConfig",
        dict(num_patches=16, patch_size=8, intermediate_size=64),
        dict(patch_size=8, max_num_patches=16, image_mean=[0.5] * 3, image_std=[0.5] * 3),
        _pooled,
    ),
    # facebook/dinov3-*: each side to 224 from floats (it rescales first), no crop
    "DINOv3ViTImageProcessor": (
        "DINOv3ViTModel",
        "DINOv3ViTConfig",
        dict(image_size=32, patch_size=8, intermediate_size=64, num_register_tokens=2),
        dict(size={"height": 32, "width": 32}),
        _pooled,
    ),
    "Tipsv2ImageProcessor": (
        "Tipsv2VisionModel",
        "Tipsv2VisionConfig",
        dict(image_size=28, patch_size=7, num_register_tokens=2),
        dict(size={"height": 28, "width": 28}),
        _pooled,
    ),
}
SHAPES = [(100, 300), (300, 100), (101, 333)]  # (width, height): tall, wide, and odd margins to crop


def _image(width: int, height: int) -> Image.Image:
    pixels = np.random.default_rng(width * height).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _folder(case: str, tmp_path):
    """transformers' model of `case` saved with its image processor, and that processor on each backend."""
    model_name, config_name, values, settings, _ = CASES[case]
    torch.manual_seed(0)
    model = perturb_(getattr(transformers, model_name)(getattr(transformers, config_name)(**SMALL, **values)))
    model.eval().save_pretrained(tmp_path)
    name = case.split("-")[0]
    processors = [getattr(transformers, name)(**settings)]
    if hasattr(transformers, f"{name}Pil"):  # DINOv3's and TIPSv2's have a torchvision backend only
        processors.append(getattr(transformers, f"{name}Pil")(**settings))
    processors[0].save_pretrained(tmp_path)
    return model, processors


def _pixels(processor, image) -> torch.Tensor:
    """The processor's pixels of one image, (1, C, H, W): NaFlex's patches (p, p, C) laid back on their grid."""
    out = processor(image, return_tensors="pt")
    if "spatial_shapes" not in out:
        return out["pixel_values"]
    (h, w), p = out["spatial_shapes"][0].tolist(), processor.patch_size
    patches = out["pixel_values"][0, : h * w].reshape(h, w, p, p, -1)  # (h, w, p, p, C)
    return patches.permute(4, 0, 2, 1, 3).reshape(1, -1, h * p, w * p)


@pytest.mark.parametrize("case", CASES)
def test_preprocess_gives_the_grid_and_tensor_of_the_image_processor(case, tmp_path):
    _, processors = _folder(case, tmp_path)
    loaded = load(tmp_path)
    two_levels = 2 / (255 * min(loaded.std))
    for width, height in SHAPES:
        image = _image(width, height)
        ours = loaded.preprocess(image)
        for processor in processors:
            theirs = _pixels(processor, image)
            assert ours.shape == theirs.shape, (processor.backend, width, height)
            tolerance = 1e-5 if processor.backend == "pil" else two_levels + 1e-5
            torch.testing.assert_close(ours, theirs, atol=tolerance, rtol=0)


def test_siglip2_reads_a_photo_on_its_naflex_grid(tmp_path):
    # a 100 x 300 photo on a 4 x 12 grid in 64 patches of 16, 9 x 27 in 256, as transformers' processor reads it
    vision = dict(SMALL, num_patches=16, patch_size=16, intermediate_size=64)
    transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(**vision)).save_pretrained(tmp_path)
    image = _image(100, 300)
    for budget, grid in ((64, (12, 4)), (256, (27, 9))):
        processor = transformers.Siglip2ImageProcessor(patch_size=16, max_num_patches=budget)
        processor.save_pretrained(tmp_path)
        assert processor(image, return_tensors="pt")["spatial_shapes"][0].tolist() == list(grid)
        assert load(tmp_path).preprocess(image).shape[-2:] == (grid[0] * 16, grid[1] * 16)


@pytest.mark.parametrize("case", CASES)
def test_the_processors_output_gives_transformers_features(case, tmp_path):
    # both networks read the processor's own pixels (the PIL backend's where there is one), ours on its grid
    model, processors = _folder(case, tmp_path)
    loaded = load(tmp_path)
    image = _image(100, 300)
    out, pixels = processors[-1](image, return_tensors="pt"), _pixels(processors[-1], image)
    assert pixels.shape == loaded.preprocess(image).shape
    with torch.no_grad():
        expected = CASES[case][4](model(**out))
        actual = loaded.model(pixels)
    assert expected.abs().mean() > 0.05  # not two near-zero tensors
    torch.testing.assert_close(actual, expected, atol=1e-4 * max(1.0, expected.abs().max().item()), rtol=0)


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 32}}, "ConvNextImageProcessor"),
        ({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32}, "do_center_crop": False},
         "keeps each image's own size"),
        ({"image_processor_type": "ViTImageProcessor", "do_resize": False, "size": 32}, "no resize"),
        ({"size": 32, "crop_size": 28}, "names no image_processor_type"),
        ({"image_processor_type": "Siglip2ImageProcessor", "patch_size": 16}, "patch_size=16"),
        ({"image_processor_type": "Siglip2ImageProcessor", "patch_size": 8, "resample": 3}, "bilinearly"),
    ],
)  # fmt: skip
def test_a_processor_whose_framing_is_not_known_is_refused_naming_it(settings, refusal, tmp_path):
    _folder("Siglip2ImageProcessor" if "Siglip2" in str(settings) else "CLIPImageProcessor", tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(settings))
    with pytest.raises(CheckpointError, match=refusal):
        load(tmp_path)


def test_an_odd_margin_is_cropped_at_transformers_floored_offset(tmp_path):
    # torchvision's centre crop rounds an odd margin's half up or down (to even), transformers' floors it
    _, processors = _folder("CLIPImageProcessor", tmp_path)
    image = _image(32, 35)  # a 3-pixel margin: transformers keeps rows 1..32
    torch.testing.assert_close(load(tmp_path).preprocess(image), _pixels(processors[-1], image), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("pretrained_cfg", "img_size"),
    [
        (dict(crop_mode="center", crop_pct=0.875, interpolation="bicubic"), 32),
        (dict(crop_mode="squash", crop_pct=0.95, interpolation="bilinear"), (32, 48)),
        (dict(crop_mode="center", crop_pct=0.9, input_size=[3, 40, 56]), 32),  # a dynamic_img_size model's crop
    ],
)
def test_a_timm_folder_reads_images_as_timms_transform_of_its_model(pretrained_cfg, img_size, tmp_path):
    timm = pytest.importorskip("timm")
    from timm.data import create_transform, resolve_data_config
    from timm.models import save_for_hf

    dynamic = "input_size" in pretrained_cfg  # a model that reads any size, cropped to another than its own
    model = timm.create_model("vit_base_patch16_224", img_size=img_size, patch_size=8, embed_dim=32, depth=1,
                              num_heads=2, num_classes=3, dynamic_img_size=dynamic)  # fmt: skip
    save_for_hf(model, str(tmp_path))
    values = json.loads((tmp_path / "config.json").read_text())
    values["pretrained_cfg"].update(pretrained_cfg)
    (tmp_path / "config.json").write_text(json.dumps(values))
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True)  # timm's own reading of the folder
    transform = create_transform(**resolve_data_config(model=theirs))
    loaded = load(tmp_path)
    for width, height in SHAPES:
        image = _image(width, height)
        torch.testing.assert_close(loaded.preprocess(image), transform(image)[None], atol=1e-5, rtol=0)
    with torch.no_grad():
        pixels = transform(image)[None]
        torch.testing.assert_close(loaded.model(pixels), theirs.eval()(pixels), atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["BitImageProcessor", "Siglip2ImageProcessor"])
def test_an_export_reads_images_as_the_folder_it_came_from(case, tmp_path):
    from vit.cli.export import to_safetensors

    _folder(case, tmp_path / "hf")
    loaded = load(tmp_path / "hf")
    to_safetensors(loaded, tmp_path / "model.safetensors")
    exported, image = load(tmp_path / "model.safetensors"), _image(101, 333)
    assert exported.facts() == loaded.facts()
    torch.testing.assert_close(exported.preprocess(image), loaded.preprocess(image), atol=0, rtol=0)


@pytest.mark.slow  # an ONNX export: ~5 s
def test_an_onnx_export_reads_the_processors_crop_not_the_models_table_size(tmp_path):
    # DINOv2 crops 32 x 32 of a 56-pixel table: the graph is traced at what preprocess gives
    ort = pytest.importorskip("onnxruntime")
    from vit.cli.export import to_onnx

    _folder("BitImageProcessor", tmp_path / "hf")
    loaded = load(tmp_path / "hf")
    to_onnx(loaded, tmp_path / "model.onnx")
    pixels = loaded.preprocess(_image(101, 333))
    (logits,) = ort.InferenceSession(tmp_path / "model.onnx").run(None, {"images": pixels.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(logits), loaded.logits(pixels), atol=1e-4, rtol=0)


def test_a_data_set_is_read_at_the_processors_crop_not_the_models_table_size(tmp_path):
    # testing, calibrating and visualizing on a data set (vit.cli.run_data) feed DINOv2 its 32 x 32 crop, not 56
    from vit.cli.run_data import evaluation_data

    _folder("BitImageProcessor", tmp_path)
    loaded = load(tmp_path)
    data = evaluation_data(
        tmp_path, ["data=synthetic", "data.train_size=8", "data.test_size=4", "data.val_size=4"], loaded
    )
    images, _ = data.on_after_batch_transfer(next(iter(data.evaluation_loader("test"))), 0)
    assert images.shape[-2:] == loaded.preprocess(_image(100, 300)).shape[-2:] == (32, 32)


def test_radio_reads_the_clip_processor_its_folder_names_and_normalises_in_the_network(tmp_path):
    # transformers has no processor of RADIO's own: its folders name CLIP's, squashing to the input without
    # normalising (the network's input conditioner does it, which the loaded mean and std are)
    torch.manual_seed(0)
    config = transformers.RadioConfig(**SMALL, image_size=32, patch_size=8, max_img_size=64)
    model = perturb_(transformers.RadioModel(config)).eval()
    model.save_pretrained(tmp_path)
    processor = transformers.CLIPImageProcessorPil(size={"height": 32, "width": 32}, do_center_crop=False,
                                                   do_normalize=False)  # fmt: skip
    processor.save_pretrained(tmp_path)
    loaded, image = load(tmp_path), _image(100, 300)
    ours, theirs = loaded.preprocess(image), _pixels(processor, image)  # theirs in [0, 1]
    mean, std = (torch.tensor(values)[:, None, None] for values in (loaded.mean, loaded.std))
    torch.testing.assert_close(ours * std + mean, theirs, atol=1e-5, rtol=0)
    with torch.no_grad():
        expected = model(pixel_values=theirs).last_hidden_state
        assert expected.abs().mean() > 0.05  # not two near-zero tensors
        torch.testing.assert_close(loaded.model.forward_features(ours), expected, atol=1e-4, rtol=0)
