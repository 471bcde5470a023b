"""task=mae through train(): a masked-autoencoder run learns to reconstruct the masked patches, keeps its decoder
in its checkpoints, resumes exactly, and leaves a plain ViT that fine-tuning reads without the decoder (or continued
pretraining reads with it). The decoder, the masking and the loss themselves: tests/model/test_masking.py."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import hugging_face_mae, tiny_run
from tests.reliability.faults import stopped_and_resumed_end_alike
from vit.checkpoint import load
from vit.interop.hugging_face.mae_decoder import mae_decoder
from vit.model.config import ConfigError
from vit.model.masking import visible_count
from vit.training.mae import DECODER
from vit.training.module import ViTClassifier
from vit.training.run import build, train


def mae(tmp_path, *more: str):
    """tiny_run (16x16 synthetic images, a 4x4 grid, two epochs of 7 batches) pretraining with task=mae."""
    return tiny_run(tmp_path, "task=mae", "callbacks.pos_embed_figure=null", *more)


# patterns under less noise, 56 steps of 16 images, a decoder of 64 dims: ~1 s that learn what the patches reveal
LEARNS = ("data.noise=0.1", "data.batch_size=16", "task.decoder_dim=64")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """An MAE run's results and its folder."""
    folder = tmp_path_factory.mktemp("mae")
    return train(mae(folder, *LEARNS)), folder


def _validation_loss(module: ViTClassifier, cfg) -> float:
    """val/loss of `module` on the run's validation split, as the run scored it (the same masks each time)."""
    import lightning as L
    from hydra.utils import instantiate

    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    (scores,) = trainer.validate(module, datamodule=instantiate(cfg.data), verbose=False)
    return scores["val/loss"]


def test_an_mae_run_learns_to_reconstruct_what_the_encoder_did_not_see(pretrained, tmp_path):
    results, folder = pretrained
    assert results["test_loss"] is not None and results.get("test_acc") is None
    cfg = mae(folder, *LEARNS)
    best = ViTClassifier.load_from_checkpoint(results["best_checkpoint"], weights_only=True)
    fresh = build(mae(tmp_path, *LEARNS))[1]
    # norm_pix targets have unit variance a patch: an untrained decoder's loss is near 1; two epochs learn the
    # class patterns the visible patches reveal (0.79 on the Zen 4 where this was written)
    untrained, trained = _validation_loss(fresh, cfg), _validation_loss(best, cfg)
    assert untrained > 0.9 and trained < 0.85 * untrained
    # the same masks as the run's validation (which scored in bf16 autocast, here in float32)
    assert trained == pytest.approx(results["best_val_loss"], rel=1e-3)
    assert _validation_loss(best, cfg) == trained


def test_the_encoder_reads_the_visible_patches_alone_and_the_head_is_not_built(tmp_path):
    module = build(mae(tmp_path, "task.mask_ratio=0.5"))[1]
    assert module.model.config.num_classes == 0
    seen = []
    original = module.model.forward_features
    module.model.forward_features = lambda images, keep=None: seen.append(keep) or original(images, keep=keep)
    images = torch.rand(3, 3, 16, 16)
    reconstruction = module.task.outputs(module, images)
    (keep,) = seen
    assert keep.shape == (3, visible_count(16, 0.5)) == (3, 8)
    assert all(len(set(row.tolist())) == 8 for row in keep)  # distinct patches, drawn per image
    assert reconstruction.pixels.shape == reconstruction.target.shape == (3, 16, 4 * 4 * 3)
    assert not torch.equal(keep[0], keep[1]) or not torch.equal(keep[1], keep[2])


def test_the_best_checkpoint_keeps_the_decoder_beside_a_plain_vit(pretrained):
    results, _ = pretrained
    state = torch.load(results["best_checkpoint"], weights_only=True)["state_dict"]
    assert any(k.startswith(DECODER) for k in state) and not any(k.startswith("model.head") for k in state)
    loaded = load(results["best_checkpoint"])  # the network alone
    assert loaded.config.num_classes == 0
    assert loaded.model(torch.rand(2, 3, 16, 16)).shape == (2, 32)  # pooled features


def test_fine_tuning_from_an_mae_run_reads_the_encoder_and_drops_the_decoder(pretrained, tmp_path):
    results, _ = pretrained
    encoder = {k: v for k, v in torch.load(results["best_checkpoint"], weights_only=True)["state_dict"].items()
               if k.startswith("model.")}  # fmt: skip
    module = build(tiny_run(tmp_path, f"model.pretrained={results['best_checkpoint']}"))[1]
    assert module.model.config.num_classes == 4 and not any(k.startswith("task.") for k in module.state_dict())
    mine = module.state_dict()
    assert not [k for k in encoder if not torch.equal(encoder[k], mine[k])]  # every encoder weight, as pretrained
    assert {k for k in mine if k.startswith("model.") and k not in encoder} == {"model.head.weight", "model.head.bias"}


def test_continued_pretraining_starts_the_decoder_from_the_checkpoint_too(pretrained, tmp_path):
    results, _ = pretrained
    saved = torch.load(results["best_checkpoint"], weights_only=True)["state_dict"]
    module = build(mae(tmp_path, *LEARNS, f"model.pretrained={results['best_checkpoint']}"))[1]
    mine = module.state_dict()
    assert not [k for k in saved if k.startswith(DECODER) and not torch.equal(saved[k], mine[k])]
    fresh = build(mae(tmp_path / "fresh", *LEARNS))[1].state_dict()
    assert not torch.equal(fresh["task.decoder.embed.weight"], mine["task.decoder.embed.weight"])


@pytest.mark.slow  # three runs: ~6 s
def test_an_mae_run_stopped_mid_epoch_resumes_bit_identical(tmp_path):
    stopped_and_resumed_end_alike(lambda name, *more: mae(tmp_path / name, *more), tmp_path, step=10, steps=14)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (["task.mask_ratio=1.0"], r"^task\.mask_ratio=1\.0: the share of each image's patches masked, in \(0, 1\)$"),
        (["task.mask_ratio=0"], r"^task\.mask_ratio=0: "),
        (["task.decoder_depth=0"], r"^task\.decoder_depth=0: a whole number >= 1, or null"),
        (["task.decoder_dim=30"], r"^task\.decoder_dim=30 must be divisible by 4 \(its sincos2d table\)"),
        (
            ["task.decoder_dim=400000", "task.decoder_depth=64"],
            r"^task\.decoder_dim=400000, task\.decoder_depth=64: the decoder .*more than this machine's",
        ),
        (["mixup={mixup_alpha: 0.8}"], r"^task=mae with mixup: "),
        (["model.pool=map"], r"^task=mae with model\.pool=map "),
        (["task.loss=bce"], r"^task\.loss='bce': task=mae takes mse; task\.loss=bce is task=classify's"),
    ],
)
def test_mae_settings_that_cannot_work_are_one_line(tmp_path, settings, said):
    with pytest.raises(ConfigError, match=said) as refused:
        train(mae(tmp_path, *settings))
    assert "\n" not in str(refused.value)


def test_a_teacher_with_mae_is_refused_naming_the_way_to_distil_without_labels(tmp_path):
    (tmp_path / "teacher.safetensors").write_bytes(b"not read")
    with pytest.raises(ConfigError, match=r"task=mae: MAE learns from the images alone; .*distill\.target=features"):
        train(mae(tmp_path, f"distill.teacher={tmp_path / 'teacher.safetensors'}"))


def test_the_network_exports_as_timm_reads_it_without_the_decoder(pretrained, tmp_path):
    import timm

    from vit.cli.export import to_timm_folder

    results, _ = pretrained
    loaded = load(results["best_checkpoint"])
    to_timm_folder(loaded, tmp_path / "timm")
    theirs = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), loaded.model(images), atol=1e-5, rtol=1e-5)
    assert loaded.task == "mae"


def test_the_epoch_line_names_val_loss_once():
    from vit.training.epoch_line import EpochLine

    assert EpochLine(None, monitor="val/loss").keys.count("val/loss") == 1


# a Hugging Face MAE whose decoder (48 dims, one layer, two heads) is not the one task=mae scales to its encoder
# (32 dims, one head), that learnt per-patch normalised pixels as task.norm_pix=true does
HF_DECODER = dict(
    decoder_hidden_size=48, decoder_num_hidden_layers=1, decoder_intermediate_size=192, norm_pix_loss=True
)
BRIEF = ("trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1",
         "trainer.limit_test_batches=1")  # fmt: skip


def test_continued_pretraining_from_a_hugging_face_folder_starts_from_its_decoder_at_its_sizes(tmp_path):
    folder = tmp_path / "vit-mae"
    hugging_face_mae(folder, **HF_DECODER)
    found = mae_decoder(folder, load(folder).config)
    module = build(mae(tmp_path / "run", f"model.pretrained={folder}", "compile=true"))[1]
    mine = module.task.decoder.state_dict()
    assert mine.keys() == found.weights.keys() and all(torch.equal(mine[k], found.weights[k]) for k in mine)
    assert module.task.decoder.config.num_heads == 2  # its heads too, which no weight's shape shows
    assert module.task.decoder._compiled_call_impl is not None  # compiled as the decoder it replaced was


@pytest.mark.slow  # a brief run: ~5 s
def test_a_run_continued_from_a_hugging_face_decoder_records_its_sizes_for_what_reloads_it(tmp_path):
    folder = tmp_path / "vit-mae"
    hugging_face_mae(folder, **HF_DECODER)
    results = train(mae(tmp_path / "run", f"model.pretrained={folder}", *BRIEF))
    saved = torch.load(results["best_checkpoint"], weights_only=True)
    record = saved["hyper_parameters"]["task"]  # the folder's sizes, where the run left them null
    assert (record["decoder_dim"], record["decoder_depth"], record["decoder_heads"]) == (48, 1, 2)
    # what rebuilds the task from the record (visualize mae) reads the decoder the run trained
    best = ViTClassifier.load_from_checkpoint(results["best_checkpoint"], weights_only=True)
    trained = {k.removeprefix(DECODER): v for k, v in saved["state_dict"].items() if k.startswith(DECODER)}
    assert trained and all(torch.equal(best.task.decoder.state_dict()[k], v) for k, v in trained.items())


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("task.decoder_dim=64", r"^task\.decoder_dim=64: .*'s MAE decoder has 48; leave task\.decoder_dim null"),
        ("task.decoder_heads=4", r"^task\.decoder_heads=4: .*'s MAE decoder has 2; leave task\.decoder_heads null"),
        ("task.norm_pix=false", r"^task\.norm_pix=false: .*norm_pix_loss=true; set task\.norm_pix=true to continue"),
    ],
)
def test_a_setting_the_hugging_face_decoder_contradicts_is_refused_naming_the_key(setting, said, tmp_path):
    folder = tmp_path / "vit-mae"
    hugging_face_mae(folder, **HF_DECODER)
    with pytest.raises(ConfigError, match=said):
        build(mae(tmp_path, f"model.pretrained={folder}", setting))


def test_a_hugging_face_decoder_of_other_channels_than_the_images_is_left_for_a_fresh_one(tmp_path):
    folder = tmp_path / "vit-mae"
    hugging_face_mae(folder, **HF_DECODER)
    module = build(mae(tmp_path, f"model.pretrained={folder}", "data.in_chans=1"))[1]
    assert module.model.config.in_chans == 1 and module.task.decoder.config.embed_dim == 32  # the encoder's scale


def test_compile_true_compiles_the_layers_and_decoder_mae_computes_with():
    """The network's forward, which compile=true compiles elsewhere, is never what MAE calls (forward_features on the
    visible patches, then the decoder): those are compiled instead, in place (the state dict's keys unchanged)."""
    from tests.helpers import compose

    cfg = compose("data=synthetic", "model.embed_dim=32", "model.depth=2", "model.num_heads=4", "model.patch_size=4",
                  "task=mae", "compile=true", "output_dir=/nonexistent")  # fmt: skip
    module = build(cfg)[1]
    compiled = [m for m in (*module.model.layers, module.task.decoder) if m._compiled_call_impl is not None]
    assert len(compiled) == 3 and module.model._compiled_call_impl is None
    assert all(k.startswith(("model.", DECODER)) for k in module.state_dict())


@pytest.mark.slow  # inductor compiles two layers and a decoder: ~20 s
def test_a_compiled_mae_step_computes_what_the_eager_one_does(tmp_path):
    eager, compiled = (build(mae(tmp_path / name, f"compile={on}"))[1] for name, on in (("e", "false"), ("c", "true")))
    compiled.load_state_dict(eager.state_dict())
    images = torch.rand(8, 3, 16, 16)
    torch.manual_seed(1)
    expected = eager.task.outputs(eager, images)
    torch.manual_seed(1)
    got = compiled.task.outputs(compiled, images)
    assert torch.equal(got.keep, expected.keep)
    torch.testing.assert_close(got.pixels, expected.pixels, rtol=1e-4, atol=1e-5)
    assert compiled.task.decoder._compiled_call_impl is not None
