"""data.max_tokens=N: images at their own size and aspect ratio, each within N patches, packed
(vit/data/native_size.py, VisionTransformer.forward_packed). The budget's grid, the run on an image folder of
non-square images, and the settings that go with it."""

import random
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from PIL import Image

from tests.helpers import compose
from tests.reliability.faults import stopped_and_resumed_end_alike
from vit.checkpoint import load
from vit.cli import visualize
from vit.cli.predict import predict
from vit.data.native_size import FitToGrid, budget_grid, fit
from vit.model import ConfigError
from vit.training.run import train

SHAPES = [(40, 24), (24, 56), (64, 32), (32, 32), (20, 60)]  # width x height: five aspect ratios


def write_folder(root: Path) -> Path:
    """An image folder of three classes, each image one of five aspect ratios, a colour per class."""
    rng = random.Random(0)
    for split, count in (("train", 24), ("val", 6)):
        for k, name in enumerate("abc"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", rng.choice(SHAPES), (80 * k, 100, 200 - 5 * i)).save(folder / f"{i}.png")
    return root


class RecordShapes(L.Callback):
    """Not a fault: a witness. The (H, W) of every training image the network received, in the class-level list."""

    shapes: list[tuple[int, int]] = []  # noqa: RUF012 - Hydra builds the instance; the test reads the class

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        RecordShapes.shapes += [tuple(image.shape[-2:]) for image in batch[0]]


def run(root: Path, out: Path, *more: str):
    return compose("data=imagefolder", f"data.root={root}", "data.img_size=32", "data.num_workers=0",
                   "data.batch_size=8", "data.eval_batch_size=8", "model=vit_small_16", "model.embed_dim=32",
                   "model.depth=2", "model.num_heads=4", "model.patch_size=8",
                   "data.max_tokens=16", "trainer=cpu", "trainer.precision=32-true", "trainer.max_epochs=2",
                   "callbacks.pos_embed_figure=null", f"output_dir={out}", *more)  # fmt: skip


@pytest.mark.parametrize(
    ("pixels", "patch", "budget", "grid"),
    [
        ((480, 640), (16, 16), 256, (14, 18)),  # 3:4 kept, 252 of 256
        ((224, 224), (16, 16), 196, (14, 14)),  # the square image at its own grid exactly
        ((100, 1000), (16, 16), 64, (3, 21)),  # a strip: 1:10 as well as 63 whole patches allow
        ((10, 10), (16, 16), 256, (16, 16)),  # enlarged to the budget
        ((30, 4000), (14, 14), 16, (1, 16)),  # at least one patch a side
    ],
)
def test_the_budget_grid_keeps_the_aspect_ratio_within_the_budget(pixels, patch, budget, grid):
    assert budget_grid(*pixels, patch, budget) == grid
    h, w = grid
    assert h * w <= budget
    image = fit(torch.rand(3, *pixels), patch, budget)
    assert image.shape == (3, h * patch[0], w * patch[1])


def test_a_run_trains_on_images_at_their_own_aspect_ratios(tmp_path):
    root = write_folder(tmp_path / "folder")
    witness = "+callbacks.witness={_target_: tests.training.test_naflex.RecordShapes}"
    RecordShapes.shapes = []
    results = train(run(root, tmp_path / "out", witness))
    # the training images, as the data module hands them over: each on its own grid of whole patches of 8 within the
    # budget of 16, aspect ratios kept as well as whole patches allow
    shapes = RecordShapes.shapes
    assert all(h % 8 == w % 8 == 0 and (h // 8) * (w // 8) <= 16 for h, w in shapes)
    assert {(h, w) for h, w in shapes} == {(24, 40), (40, 24), (32, 32), (48, 16)}  # SHAPES' grids (two share one)
    assert results["global_steps"] > 0 and results["test_acc"] is not None
    loaded = load(results["best_checkpoint"])
    assert loaded.max_tokens is not None
    images = [fit(torch.rand(3, 56, 24), (8, 8), 16), fit(torch.rand(3, 16, 40), (8, 8), 16)]  # 6x2, 2x6 patches
    with torch.no_grad():  # the trained network reads each at its own grid, as forward() does alone
        torch.testing.assert_close(
            loaded.model.forward_packed(images, 17), torch.cat([loaded.model(i[None]) for i in images])
        )
    # predict reads a new image as evaluation did: its own aspect ratio, within the budget
    assert loaded.max_tokens == 16
    tall = Image.new("RGB", (24, 56), (80, 100, 200))
    assert loaded.preprocess(tall).shape == (1, 3, 40, 24)  # 5 x 3 patches of 8: 15 of 16, near 56:24
    (name, probability), *_ = predict(loaded, tall, top_k=3)
    assert name in "abc" and 0 < probability <= 1
    # and the attention figure is drawn at the image's own grid (5 x 3 patches), not the model's square one
    tall.save(tmp_path / "tall.png")
    drawn = []
    original = visualize.attention_figure
    with pytest.MonkeyPatch.context() as m:
        m.setattr(visualize, "attention_figure", lambda *a: drawn.append(a) or original(*a))
        visualize.main(["attention", "--checkpoint", results["best_checkpoint"], "--image", str(tmp_path / "tall.png"),
                        "--out", str(tmp_path / "attention.png")])  # fmt: skip
    ((images, heads, rolled, _),) = drawn
    assert images.shape[:2] == (40, 24) and heads.shape[-2:] == rolled.shape[-2:] == (5, 3)  # (H, W, C) pixels
    assert (tmp_path / "attention.png").stat().st_size > 0


@pytest.mark.slow  # three runs: ~3 s, the default suite's budget is near
def test_a_naflex_run_stopped_mid_epoch_resumes_bit_identical(tmp_path):
    root = write_folder(tmp_path / "folder")
    stopped_and_resumed_end_alike(lambda name, *more: run(root, tmp_path / name, *more), tmp_path, step=11, steps=16)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (["data.max_tokens=0"], r"data\.max_tokens=0: give a whole number of patches >= 1, or null"),
        (["mixup={mixup_alpha: 0.8}"], r"data\.max_tokens with mixup: not built for batches of images of their own"),
        (["test_time_shift=2"], r"data\.max_tokens with test_time_shift"),
        (  # exabytes of attention masks, once asked for at the first batch
            ["data.max_tokens=1000000000"],
            r"^data\.max_tokens=1000000000: data\.batch_size=8 images of 8x8 patches, model\.embed_dim=32 wide, each "
            r"with its 1000000001x1000000001 attention mask, needs 16\.0 EB, more than this machine's [\d.]+ [KMGT]B "
            r"of memory$",
        ),
    ],
)
def test_naflex_settings_that_cannot_work_are_one_line(tmp_path, settings, said):
    from vit.data.errors import DataError

    with pytest.raises((ConfigError, DataError), match=said):
        train(run(write_folder(tmp_path / "folder"), tmp_path / "out", *settings))


def test_a_budget_past_memory_is_named_before_a_pretrained_file_is_read(tmp_path):
    """The file's patch and width are not known before it is read: the attention masks alone are too many bytes."""
    (tmp_path / "weights.safetensors").write_bytes(b"not read")
    settings = [f"model.pretrained={tmp_path / 'weights.safetensors'}", "data.max_tokens=1000000000"]
    with pytest.raises(ConfigError, match=r"^data\.max_tokens=1000000000: data\.batch_size=8 images each with its "):
        train(run(write_folder(tmp_path / "folder"), tmp_path / "out", *settings))


@pytest.mark.slow  # ~2.5 s
def test_siglip2_naflex_fine_tunes_with_lora_on_images_at_their_own_aspect_ratios(tmp_path):
    transformers = pytest.importorskip("transformers")
    vision = transformers.Siglip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=2, num_patches=16, patch_size=8)  # fmt: skip
    transformers.Siglip2VisionModel(vision).save_pretrained(tmp_path / "siglip2")
    root = write_folder(tmp_path / "folder")
    results = train(run(root, tmp_path / "out", f"model.pretrained={tmp_path / 'siglip2'}", "finetune=lora"))
    loaded = load(results["best_checkpoint"])  # the adapters merged into the SigLIP 2 network, read back
    assert loaded.max_tokens == 16 and loaded.config.pos_resample.mode == "bilinear"
    assert loaded.config.num_classes == 3
    assert results["trainable_params"] < results["params"] / 5


@pytest.mark.parametrize(("size", "grid", "fitted"), [((24, 56), (4, 4), (16, 32)), ((56, 24), (2, 8), (32, 16))])
def test_patches_taller_than_wide_give_the_grid_of_rows_and_columns_they_fill(size, grid, fitted):
    """Patches of 8 rows by 4 columns: a tall image (24 x 56, PIL's width x height) takes 4 rows of 4 patches,
    16 x 32 pixels; a wide one 2 rows of 8. Swapping a patch's sides anywhere gives other grids."""
    w, h = size
    assert budget_grid(h, w, (8, 4), 16) == grid
    assert FitToGrid((8, 4), 16)(Image.new("RGB", size)).size == fitted
    assert tuple(fit(torch.rand(3, h, w), (8, 4), 16).shape[1:]) == fitted[::-1]


@pytest.mark.parametrize(("size", "fitted"), [((24, 56), (24, 40)), ((40, 16), (40, 16)), ((16, 16), (32, 32))])
def test_the_workers_fit_each_image_to_its_budget_grid_of_the_networks_patches(size, fitted):
    """PIL's (width, height): a tall image on 5x3 patches of 8 (15 of 16), a wide one on 2x5, a small square one
    enlarged to 4x4; the tensor form (fit) gives the same grid."""
    image = Image.new("RGB", size)
    assert FitToGrid((8, 8), 16)(image).size == fitted
    assert tuple(fit(torch.rand(3, size[1], size[0]), (8, 8), 16).shape[1:]) == fitted[::-1]
