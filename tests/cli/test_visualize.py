import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import compose, tiny_run, write_timm
from vit.checkpoint import load
from vit.cli.visualize import main, parser
from vit.data.memory.fashion_mnist import DEBIAN_DIR
from vit.figures import analysis
from vit.figures.drawing import DISTANCE_SIZE, DPI, PANEL, POS_EMBED_SIZE
from vit.training.run import train

ONE_BATCH = ("trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # fp32: the confusion command scores in fp32, and its figures are checked against the run's own test metrics
    # (its whole test split); two training batches and no figure of its own: the commands draw from the checkpoint
    run = tiny_run(
        tmp_path_factory.mktemp("run"),
        "trainer.max_epochs=1",
        "trainer.precision=32-true",
        "trainer.limit_train_batches=2",
        "callbacks.pos_embed_figure=null",
    )
    return train(run)["best_checkpoint"]


def _png(path, size_inches):
    """The PNG at path: its size is the figure's, and it is not blank."""
    pixels = np.asarray(Image.open(path).convert("L"), dtype=np.float64)
    assert pixels.shape == (round(size_inches[1] * DPI), round(size_inches[0] * DPI))
    assert pixels.std() > 20  # a blank or single-colour image has ~0
    return pixels


def test_pos_embed_command(checkpoint, tmp_path, capsys):
    main(["pos-embed", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "pos.png")])
    _png(tmp_path / "pos.png", POS_EMBED_SIZE)
    assert "wrote" in capsys.readouterr().out


def test_pos_embed_of_a_timm_file_with_the_preset_named(tmp_path):
    checkpoint = write_timm(tmp_path / "timm.safetensors")
    with pytest.raises(SystemExit, match=r"does not record the number of heads"):
        main(["pos-embed", "--checkpoint", checkpoint, "--out", str(tmp_path / "pos.png")])
    main(["pos-embed", "--checkpoint", checkpoint, "--preset", "vit_fashion_mnist", "--out", str(tmp_path / "pos.png")])
    _png(tmp_path / "pos.png", POS_EMBED_SIZE)


def test_attention_command_on_an_image_of_another_size_and_mode(checkpoint, tmp_path):
    image = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    image.paste((255, 200, 0, 255), (10, 5, 30, 25))
    image.save(tmp_path / "in.png")
    image_args = ["--image", str(tmp_path / "in.png")]
    main(["attention", "--checkpoint", str(checkpoint), *image_args, "--out", str(tmp_path / "a.png")])
    heads = load(checkpoint).config.num_heads
    _png(tmp_path / "a.png", (PANEL * (heads + 2), PANEL + 0.4))


def test_attention_distance_command(checkpoint, tmp_path):
    out = tmp_path / "d.png"
    data_args = ["--data", "synthetic", "--num-images", "16"]
    main(["attention-distance", "--checkpoint", str(checkpoint), *data_args, "--out", str(out)])
    _png(out, DISTANCE_SIZE)


def test_attention_distance_reads_the_data_at_the_models_input_size(exported, tmp_path):
    """A 24-px model on the 16-px synthetic data: the images are made at 24 px, the model's grid."""
    checkpoint = exported(img_size=24)  # no run folder beside it: the size can only come from the model
    out = tmp_path / "d.png"
    main(
        [
            "attention-distance",
            "--checkpoint",
            checkpoint,
            "--data",
            "synthetic",
            "--num-images",
            "8",
            "--out",
            str(out),
        ]
    )
    _png(out, DISTANCE_SIZE)


def test_resample_command(checkpoint, tmp_path):
    main(["resample", "--checkpoint", str(checkpoint), "--img-size", "32", "24", "--out", str(tmp_path / "r.png")])
    _png(tmp_path / "r.png", POS_EMBED_SIZE)


def test_commands_explain_what_they_cannot_do(checkpoint, tmp_path, monkeypatch):
    Image.new("L", (4, 4)).save(tmp_path / "x.png")
    Image.new("L", (15, 15)).save(tmp_path / "b.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # over twice this, Pillow refuses a decompression bomb
    failures = {
        "--img-size \\[30\\]: give H or H W, whole numbers of 4": ["resample", "--img-size", "30"],
        "--img-size \\[16, 0\\]: give H or H W": ["resample", "--img-size", "16", "0"],
        "--layer 7: the model has layers 0..1": ["attention", "--image", str(tmp_path / "x.png"), "--layer", "7"],
        "data config 'imagenet': no .* choose one of .*fashion_mnist": ["attention-distance", "--data", "imagenet"],
        "b\\.png: not a readable image: .* decompression bomb": ["attention", "--image", str(tmp_path / "b.png")],
        "data config 'imagefolder' has no root folder of its own: give --data-root": [
            "attention-distance",
            "--data",
            "imagefolder",
        ],  # were tracebacks: OmegaConf's MissingMandatoryValue, and the data's FileNotFoundError below
        "image folder not found: data.root=\\S+nowhere does not exist": [
            "attention-distance",
            "--data",
            "imagefolder",
            "--data-root",
            str(tmp_path / "nowhere"),
        ],
    }
    for message, command in failures.items():
        with pytest.raises(SystemExit, match=message):
            main([*command, "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out.png")])
    with pytest.raises(SystemExit, match=r"nowhere\.ckpt: no such checkpoint file"):
        main(["pos-embed", "--checkpoint", str(tmp_path / "nowhere.ckpt"), "--out", str(tmp_path / "out.png")])
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize(
    ("out", "reason"),
    [
        ("x.xyz", r"matplotlib cannot write 'xyz' files; name one of: .*\bpng\b.*"),
        (
            "file.png/x.png",
            r"could not be written \(FileExistsError: .* '.*file\.png'\); the previous file, if any, is intact",
        ),
    ],
)
def test_an_out_that_cannot_be_written_is_one_line(exported, tmp_path, out, reason):
    (tmp_path / "file.png").write_text("")
    with pytest.raises(SystemExit) as exit:
        main(["pos-embed", "--checkpoint", exported(), "--out", str(tmp_path / out)])
    assert re.fullmatch(re.escape(f"--out {tmp_path / out}: ") + reason, str(exit.value))


def test_an_out_without_a_suffix_is_a_png_under_the_name_given(checkpoint, tmp_path, capsys):
    main(["pos-embed", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "figure")])
    assert capsys.readouterr().out == f"wrote {tmp_path / 'figure'}\n"
    _png(tmp_path / "figure", POS_EMBED_SIZE)
    assert [p.name for p in tmp_path.iterdir()] == ["figure"]


def test_the_attention_figure_of_a_model_without_a_head_predicts_nothing(exported, tmp_path):
    Image.new("RGB", (16, 16)).save(tmp_path / "in.png")

    def title(model):
        args = parser().parse_args(
            ["attention", "--checkpoint", model, "--image", str(tmp_path / "in.png"), "--out", "x.png"]
        )
        return args.draw(args).get_suptitle()

    classifier, backbone = exported("classifier.safetensors"), exported("backbone.safetensors", num_classes=0)
    assert re.fullmatch(r"in\.png: layer 1 attention \(class token\); predicted class \d \(\d+%\)", title(classifier))
    assert title(backbone) == "in.png: layer 1 attention (class token)"


def test_a_model_without_position_embedding_has_nothing_to_draw(tmp_path):
    run = train(tiny_run(tmp_path, "trainer.max_epochs=1", *ONE_BATCH, "model.pos_embed=none", "callbacks=default"))
    assert not (tmp_path / "figures").exists()  # the callback skips it too
    with pytest.raises(SystemExit, match=r"pos_embed='none'\): nothing to draw"):
        main(["pos-embed", "--checkpoint", run["best_checkpoint"], "--out", str(tmp_path / "p.png")])
    assert not (tmp_path / "p.png").exists()


def test_help_documents_every_command(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    listed = capsys.readouterr().out
    assert exit.value.code == 0
    for command in ("pos-embed", "attention", "attention-distance", "resample", "confusion", "mae"):
        assert command in listed
    with pytest.raises(SystemExit) as exit:
        main(["attention", "--help"])
    assert exit.value.code == 0 and "--image" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit:
        main(["confusion", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # as argparse wraps it to the terminal's width
    assert exit.value.code == 0 and "data overrides, e.g. data=imagefolder data.root=DIR" in shown


def test_figure_callback_writes_every_epoch_and_to_tensorboard(tmp_path):
    train(tiny_run(tmp_path, "trainer.max_epochs=2", *ONE_BATCH, "callbacks=default", "logger=tensorboard"))
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figures == ["pos_embed_epoch001.png", "pos_embed_epoch002.png"]
    _png(tmp_path / "figures" / figures[-1], POS_EMBED_SIZE)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert len(events.Images("pos_embed/similarity")) == 2


@pytest.mark.skipif(not DEBIAN_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_a_learned_table_trained_on_images_makes_nearby_positions_more_similar(tmp_path):
    # 100 steps of 64 images on Fashion-MNIST with a 7x7 grid: measured mean similarity ~0.6 at distance 1 and ~0.3
    # beyond distance 4, from ~0 at initialisation (batches of 128 learned no more, in twice the time)
    cfg = compose(
        "model.patch_size=4",
        "model.embed_dim=32",
        "model.depth=2",
        "model.num_heads=2",
        "data.batch_size=64",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=100",
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "callbacks=default",
        f"output_dir={tmp_path}",
    )
    model = load(train(cfg)["best_checkpoint"]).model
    before = analysis.similarity_by_distance(analysis.position_similarity(torch.randn(7, 7, 32) * 0.02))[1]
    distances, after = analysis.similarity_by_distance(analysis.position_similarity(analysis.position_table(model)))
    near, far = after[distances <= 1.5].mean(), after[distances >= 4].mean()
    assert near > far + 0.2, (near, far)
    assert abs(before[0] - before[-1]) < 0.2


def _confusion(checkpoint, *overrides):
    args = parser().parse_args(["confusion", "--checkpoint", str(checkpoint), "--out", "x.png", *overrides])
    return args.draw(args).axes[0]


def test_the_confusion_matrix_of_a_runs_test_split_has_its_per_class_test_accuracy_on_the_diagonal(checkpoint):
    """The data is the run folder's config.yaml's, read as its test read it: each row's share on the diagonal is the
    accuracy of that class which results.json reports."""
    ax = _confusion(checkpoint)
    tested = json.loads((Path(checkpoint).parents[1] / "results.json").read_text())["test_acc_per_class"]
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == list(tested) == ["class_0", "class_1", "class_2", "class_3"]
    shares = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    np.testing.assert_allclose(np.diag(shares), list(tested.values()), rtol=1e-5)
    np.testing.assert_allclose(shares.sum(axis=1), 1.0)
    assert "(128 images," in ax.get_title()  # data=synthetic's test_size
    assert "(40 images," in _confusion(checkpoint, "data.test_size=40").get_title()
    assert "(24 images," in _confusion(checkpoint, "data=synthetic", "data.test_size=24").get_title()


def test_a_multi_label_models_figure_is_each_classs_test_average_precision(tmp_path):
    brief = (
        "trainer.max_epochs=1",
        "trainer.precision=32-true",
        "model.depth=1",
        "data.train_size=96",
        "data.val_size=32",
    )
    run = tiny_run(tmp_path, "task=multilabel", "data.multilabel=true", *brief, "callbacks.pos_embed_figure=null")
    results = train(run)
    ax = _confusion(results["best_checkpoint"])
    heights = [bar.get_height() for bar in ax.patches]
    np.testing.assert_allclose(heights, list(results["test_ap_per_class"].values()), rtol=1e-5)
    assert ax.get_ylabel() == "average precision"


def test_the_confusion_command_says_in_one_line_what_data_it_cannot_test_on(checkpoint, exported, tmp_path):
    out = ["--out", str(tmp_path / "c.png")]
    failures = {
        "model=vit_tiny_16: give the data to test on as data=NAME and data.KEY=VALUE": [
            checkpoint,
            "model=vit_tiny_16",
        ],
        r"model\.safetensors: no config\.yaml of its run beside it .* name the data to test on": [exported()],
        r"data\.num_classes=10, but \S+best\.ckpt tells 4 classes apart": [
            checkpoint,
            "data=synthetic",
            "data.num_classes=10",
        ],
        "image folder not found: data.root=\\S+nowhere does not exist": [
            checkpoint,
            "data=imagefolder",
            f"data.root={tmp_path / 'nowhere'}",
        ],
    }
    for message, (model, *overrides) in failures.items():
        with pytest.raises(SystemExit, match=message):
            main(["confusion", "--checkpoint", str(model), *out, *overrides])
    assert not (tmp_path / "c.png").exists()


@pytest.fixture(scope="module")
def mae_checkpoint(tmp_path_factory):
    run = tiny_run(
        tmp_path_factory.mktemp("mae"),
        "task=mae",
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",  # the panels' geometry is checked, not how well it reconstructs
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        "callbacks.pos_embed_figure=null",
    )
    return train(run)["best_checkpoint"]


def test_the_mae_panels_paste_the_visible_patches_over_the_reconstruction_and_blank_the_masked_ones(mae_checkpoint):
    from vit.model import kernels
    from vit.training.module import ViTClassifier

    module = ViTClassifier.load_from_checkpoint(mae_checkpoint, weights_only=True).eval()
    images = torch.randn(2, 3, 16, 16)
    masked, reconstructed, pasted = (kernels.patchify(x, (4, 4)) for x in module.task.panels(module, images, seed=3))
    original = kernels.patchify(images, (4, 4))
    keep = module.task.outputs(module, images, evaluation_batch=3).keep  # the same masks: validation's of batch 3
    seen = torch.zeros(2, 16, dtype=torch.bool).scatter(1, keep, True)
    assert seen.sum() == 2 * 4  # a quarter of each image's 16 patches
    torch.testing.assert_close(pasted[seen], original[seen])
    torch.testing.assert_close(pasted[~seen], reconstructed[~seen])
    assert not masked[~seen].any() and torch.equal(masked[seen], original[seen])
    # the decoder predicts each patch normalised by its own statistics: brought back, a patch has the original's
    mean, std = original.mean(-1), original.var(-1).add(1e-6).sqrt()
    torch.testing.assert_close(
        reconstructed.mean(-1), mean + std * module.task.outputs(module, images, 3).pixels.mean(-1)
    )


def test_the_mae_command_draws_a_test_image_or_a_file_and_refuses_a_classifier(mae_checkpoint, checkpoint, tmp_path):
    main(["mae", "--checkpoint", mae_checkpoint, "--image-index", "70", "--out", str(tmp_path / "mae.png")])
    _png(tmp_path / "mae.png", (4 * PANEL, PANEL + 0.4))
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    main(["mae", "--checkpoint", mae_checkpoint, "--image", str(tmp_path / "x.png"), "--out", str(tmp_path / "f.png")])
    _png(tmp_path / "f.png", (4 * PANEL, PANEL + 0.4))
    with pytest.raises(SystemExit, match=r"the test split holds images 0\.\.127"):
        main(["mae", "--checkpoint", mae_checkpoint, "--image-index", "128", "--out", str(tmp_path / "g.png")])
    with pytest.raises(SystemExit, match=r"not a task=mae run's checkpoint \(task=classify\): no decoder to draw"):
        main(["mae", "--checkpoint", checkpoint, "--out", str(tmp_path / "h.png")])
