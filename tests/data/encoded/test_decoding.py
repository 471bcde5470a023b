"""data.decode=device: JPEGs decoded a batch at a time on the training device (here the CPU stands in for the GPU;
tests/test_gpu.py runs the same on CUDA) give the pixels that decoding in workers gives, to a grey level."""

from __future__ import annotations

import io
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from PIL import Image as PILImage
from torchvision import transforms as T

from tests.helpers import compose
from vit.data.encoded import base, decoding
from vit.data.encoded.decoding import OnDevice
from vit.data.encoded.imagefolder import ImageFolderDataModule
from vit.data.encoded.images import decode
from vit.data.encoded.resampling import resample
from vit.data.encoded.transforms import image_transform
from vit.data.errors import DataError
from vit.training.run import train

SIZE = 32  # the model's side; the stored images are larger and of several shapes
CLASSES = 4


def photo(rng: np.random.Generator, width: int, height: int) -> PILImage.Image:
    """Smooth colour fields plus noise: JPEG artefacts and resampling differences show, as in photographs."""
    low = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    field = np.asarray(PILImage.fromarray(low).resize((width, height), PILImage.Resampling.BICUBIC), np.float32)
    return PILImage.fromarray(np.clip(field + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8))


def rotated_jpeg(image: PILImage.Image) -> bytes:
    """The image stored on its side with EXIF orientation 6 (rotate 90° clockwise to view), as cameras write."""
    exif = PILImage.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.transpose(PILImage.Transpose.ROTATE_90).save(buffer, "JPEG", quality=90, exif=exif)
    return buffer.getvalue()


def png(image: PILImage.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def special(rng: np.random.Generator) -> dict[str, tuple[bytes, int]]:
    """name -> (file bytes, dimensions of what travels: 1 for JPEG bytes, 3 for pixels decoded in the worker)."""
    kinds = {}
    for name, mode, options, dims in (
        ("plain.jpg", "RGB", dict(quality=90), 1),
        ("progressive.jpg", "RGB", dict(quality=90, progressive=True), 1),
        ("gray.jpg", "L", dict(quality=90), 1),
        ("cmyk.jpg", "CMYK", dict(quality=90), 3),
        ("photo.png", "RGB", {}, 3),
        ("alpha.png", "RGBA", {}, 3),
    ):
        buffer = io.BytesIO()
        photo(rng, 57, 45).convert(mode).save(buffer, "JPEG" if name.endswith("jpg") else "PNG", **options)
        kinds[name] = buffer.getvalue(), dims
    kinds["rotated.jpg"] = rotated_jpeg(photo(rng, 57, 45)), 3
    return kinds


def write_folder(root: Path) -> Path:
    """train/ 40 JPEGs of assorted sizes plus one of each special kind; val/ 8 JPEGs and the special kinds."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 40), ("val", 8)):
        for k in range(count):
            (root / split / f"c{k % CLASSES}").mkdir(parents=True, exist_ok=True)
            photo(rng, 60 + k, 50 + 2 * k).save(root / split / f"c{k % CLASSES}" / f"{k}.jpg", quality=90)
        for k, (name, (data, _)) in enumerate(special(rng).items()):
            (root / split / f"c{k % CLASSES}" / name).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("decoding"))


def images_and_labels(dm, split: str, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The split's first batch as the model gets it on `device` (moved as Lightning moves it), back in grey levels
    (0..255) on the CPU; draws seeded alike."""
    torch.manual_seed(0)  # before setup: shards take their shuffling seed there
    random.seed(0)
    dm.setup()
    loader = dm.train_dataloader() if split == "train" else dm.test_dataloader()
    images, labels = dm.on_after_batch_transfer(move_data_to_device(next(iter(loader)), device), 0)
    assert images.device.type == labels.device.type == device
    mean, std = torch.tensor(dm.mean).view(-1, 1, 1), torch.tensor(dm.std).view(-1, 1, 1)
    return (images.cpu() * std + mean) * 255, labels.cpu()


def assert_within_a_grey_level(make, split: str, channels: int = 3) -> None:
    (expected, expected_labels), (got, labels) = (
        images_and_labels(make(decode), split) for decode in ("workers", "device")
    )
    assert torch.equal(labels, expected_labels)
    assert got.shape == expected.shape == (len(labels), channels, SIZE, SIZE)
    difference = (got - expected).abs()
    # the same crops and flips, resized in float32 instead of PIL's fixed point: a sum within float32's error of a
    # half rounds either way, by a level, and a rare one in the first pass adds to one in the second; in grey the
    # device reads the JPEG's own luma, which PIL recomputes from the decoded colours (5 levels at most)
    assert difference.max() < (2.01 if channels == 3 else 6) and difference.mean() < 0.04
    assert channels == 1 or (difference > 1.01).float().mean() < 1e-4


def folder_module(root: Path, **settings) -> ImageFolderDataModule:
    values = dict(num_classes=CLASSES, img_size=SIZE, batch_size=16, eval_batch_size=16, num_workers=0)
    return ImageFolderDataModule(root=str(root), **{**values, "auto_augment": None, **settings})


def test_workers_hand_over_whole_pixels_which_the_device_normalises_as_timms_transform_does(folder):
    """Decoded in workers, a batch travels as uint8 (a quarter of float32's bytes); what the model reads after
    on_after_batch_transfer is timm's whole transform (ToTensor, Normalize) of each image, to float32's rounding."""
    dm = folder_module(folder, decode="workers")
    dm.setup()
    pixels, labels = next(iter(dm.test_dataloader()))
    assert pixels.dtype == torch.uint8
    images, _ = dm.on_after_batch_transfer((pixels, labels), 0)
    timm = image_transform(SIZE, False, None, True, dm.crop_pct, "bilinear", dm.mean, dm.std)
    expected = torch.stack([timm(decode(path, 3)) for path, _ in dm.test_set.samples[: len(labels)]])
    torch.testing.assert_close(images, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("workers, channels", [(0, 3), (2, 3), (0, 1)])
def test_on_the_device_the_same_seed_gives_the_workers_pixels_within_a_grey_level(folder, split, workers, channels):
    def make(decode):
        return folder_module(folder, decode=decode, num_workers=workers, in_chans=channels)

    assert_within_a_grey_level(make, split, channels)


def test_hugging_face_rows_and_shards_decode_on_the_device_as_in_workers(folder, tmp_path):
    # here, not above: tests/test_gpu.py imports this module on GPU machines that lack datasets and litdata
    from datasets import Dataset, Features, Image, Value

    from vit.data.encoded.hf import HFDataModule
    from vit.data.encoded.stream import StreamDataModule
    from vit.data.shards.writer import write_shards

    files = sorted((folder / "train").rglob("*.*"))
    rows = Dataset.from_dict(
        {
            "image": [{"bytes": f.read_bytes(), "path": None} for f in files],
            "label": [int(f.parent.name[1]) for f in files],
        },
        features=Features({"image": Image(), "label": Value("int64")}),
    )
    rows.save_to_disk(tmp_path / "hf")
    settings = dict(num_classes=CLASSES, img_size=SIZE, batch_size=16, eval_batch_size=16, num_workers=0)
    settings["auto_augment"] = None
    assert_within_a_grey_level(
        lambda decode: HFDataModule(root=str(tmp_path / "hf"), decode=decode, **settings), "train"
    )
    write_shards(str(folder), str(tmp_path / "shards"), val_fraction=0.1, workers=1)
    assert_within_a_grey_level(
        lambda decode: StreamDataModule(root=str(tmp_path / "shards"), decode=decode, **settings), "train"
    )


def test_only_what_the_device_decodes_as_pil_does_travels_as_jpeg_bytes(folder):
    """CMYK, PNG, transparency and EXIF rotations are decoded in the worker (upright, on black), as before."""
    reader = OnDevice(3, image_transform(SIZE, True, None, True, 0.875, "bilinear", (0.5,) * 3, (0.5,) * 3))
    for name, (data, dims) in special(np.random.default_rng(1)).items():
        item = reader.read(data, name)
        assert item.data.dim() == dims, name
        assert (item.height, item.width) == (45, 57), name  # the rotated one upright
        if dims == 3:
            assert item.data.shape == (3, 45, 57), name


@pytest.mark.parametrize("resize, crop", [(36, 32), (20, 32), ((30, 40), (32, 24))])
def test_evaluation_resizes_and_centre_crops_as_torchvision_on_pil_does(resize, crop):
    """torchvision's Resize (the shorter side, or both) then CenterCrop (black around an image smaller than it)."""
    transform = T.Compose([T.Resize(resize), T.CenterCrop(crop), T.ToTensor(), T.Normalize((0,) * 3, (1,) * 3)])
    rng = np.random.default_rng(2)
    images = [photo(rng, w, h) for w, h in ((50, 37), (37, 50), (64, 64), (33, 90))]
    reader = OnDevice(3, transform)
    items = [reader(reader.read(png(image), f"{k}.png")) for k, image in enumerate(images)]
    got = decoding.EncodedBatch(items).pixels() * 255
    expected = torch.stack([transform(image) for image in images]) * 255
    assert got.shape == expected.shape and (got - expected).abs().max() < 1.01


def test_large_images_are_framed_a_few_at_a_time_with_the_same_pixels(folder, monkeypatch):
    def pixels(split):
        return images_and_labels(folder_module(folder, decode="device"), split)[0]

    whole = {split: pixels(split) for split in ("train", "test")}
    runs = []  # (images, the largest one's pixels) each time the device frames some
    monkeypatch.setattr(
        decoding,
        "resample",
        lambda images, *a: runs.append((len(images), max(i.numel() for i in images))) or resample(images, *a),
    )
    monkeypatch.setattr(decoding, "CHUNK", 3 * 100 * 100)  # one to three of the stored images
    for split in ("train", "test"):
        assert (pixels(split) - whole[split]).abs().max() < 1.01  # a sum's order may move a half
    assert len(runs) > 4 and all(count * largest <= decoding.CHUNK or count == 1 for count, largest in runs)


def test_decoding_on_the_device_refuses_what_it_cannot_run(folder):
    with pytest.raises(DataError, match=r"data\.auto_augment=null, or data\.decode=workers"):
        folder_module(folder, decode="device", auto_augment="rand-m9-mstd0.5-inc1").setup()
    with pytest.raises(DataError, match=r"data\.decode='gpu'"):
        folder_module(folder, decode="gpu")


@pytest.mark.parametrize(
    "device, auto_augment, expected",
    [("cuda", None, True), ("cuda", "rand-m9-mstd0.5-inc1", False), ("cpu", None, False)],
)
def test_auto_decodes_on_the_device_where_a_gpu_trains_without_randaugment(
    folder, monkeypatch, device, auto_augment, expected
):
    monkeypatch.setattr(base, "cannot_decode_on", lambda device: None)  # a GPU that decodes
    dm = folder_module(folder, decode="auto", auto_augment=auto_augment)
    assert not dm.on_device  # no trainer yet
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
    assert dm.on_device is expected


def test_where_torchvision_cannot_decode_on_the_device_auto_says_so_once_and_device_is_refused(
    folder, monkeypatch, caplog
):
    assert decoding.cannot_decode_on(torch.device("cpu")) is None  # tried for real
    decoding.cannot_decode_on.cache_clear()
    base._say_once.cache_clear()

    def no_nvjpeg(data, **options):
        raise RuntimeError("decode_jpeg_cuda: torchvision not compiled with nvJPEG support")

    monkeypatch.setattr(decoding, "decode_jpeg", no_nvjpeg)
    try:
        assert decoding.cannot_decode_on(torch.device("cpu")) == (
            "decode_jpeg_cuda: torchvision not compiled with nvJPEG support"
        )
        gpu = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda")))
        auto = folder_module(folder, decode="auto")
        auto.trainer = gpu
        assert not auto.on_device and not auto.on_device
        said = [r.getMessage() for r in caplog.records if "decodes in workers" in r.getMessage()]
        assert len(said) == 1 and "not compiled with nvJPEG" in said[0]
        with pytest.raises(
            DataError, match=r"cannot decode JPEGs on cpu \(.*nvJPEG support\): set data\.decode=workers"
        ):
            folder_module(folder, decode="device").setup()
    finally:
        decoding.cannot_decode_on.cache_clear()  # the real answer for the tests after this one


def test_a_jpeg_whose_data_does_not_decode_is_named(folder, tmp_path):
    root = tmp_path / "bad"
    for split in ("train", "val"):
        for k in range(CLASSES):
            (root / split / f"c{k}").mkdir(parents=True)
            (root / split / f"c{k}" / "a.jpg").write_bytes((folder / "train" / f"c{k}" / f"{k}.jpg").read_bytes())
    good = (root / "val" / "c0" / "a.jpg").read_bytes()
    (root / "val" / "c0" / "a.jpg").write_bytes(good[:300] + bytes(len(good) - 300))  # the header intact
    dm = folder_module(root, decode="device", verify_images=False, batch_size=2)
    with pytest.raises(DataError, match=r"val/c0/a.jpg does not decode \(on cpu: .*; with PIL: OSError"):
        images_and_labels(dm, "test")


def test_an_image_the_devices_decoder_fails_on_is_decoded_by_pil_with_a_warning(folder, monkeypatch, caplog):
    """nvjpeg reads less of the JPEG standard than libjpeg-turbo (arithmetic coding, for one): here the device's
    decoder is made to fail on the progressive JPEGs, which PIL then decodes: the same pixels, each one named."""
    real = decoding.decode_jpeg

    def fails_on_progressive(data, **options):
        if any(b"\xff\xc2" in bytes(d[:2000].tolist()) for d in (data if isinstance(data, list) else [data])):
            raise RuntimeError("decode_jpeg: unsupported")  # SOF2, the start of a progressive frame
        return real(data, **options)

    monkeypatch.setattr(decoding, "decode_jpeg", fails_on_progressive)
    assert_within_a_grey_level(lambda decode: folder_module(folder, decode=decode), "test")
    assert [r.getMessage().split(":")[0] for r in caplog.records if "decoded with PIL" in r.getMessage()] == [
        str(folder / "val" / "c1" / "progressive.jpg")
    ]


def train_an_epoch(folder: Path, tmp_path: Path, *more: str) -> dict:
    """train.py on the folder without RandAugment: a 1-layer model, one epoch of 5 steps."""
    settings = ["data=imagefolder", f"data.root={folder}", f"data.img_size={SIZE}", "data.batch_size=8"]
    settings += ["data.num_workers=0", "data.auto_augment=null"]
    model = ["model.patch_size=8", "model.embed_dim=32", "model.depth=1", "model.num_heads=2"]
    results = train(compose(*settings, *model, "trainer.max_epochs=1", f"output_dir={tmp_path}", *more))
    assert results["global_steps"] == 5 and 0.0 <= results["test_acc"] <= 1.0
    return results


@pytest.mark.parametrize("precision", [[], ["trainer.precision=64-true"]], ids=["auto", "fp64: inputs converted"])
def test_train_py_trains_an_epoch_decoding_on_the_device(folder, tmp_path, precision):
    train_an_epoch(folder, tmp_path, "data.decode=device", *precision)
