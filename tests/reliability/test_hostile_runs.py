"""Hostile runs: a model that does not fit its data, numbers Lightning or numpy take unchecked, an unreadable run
folder beside the one resumed, a loader position of another data source, a damaged Hugging Face folder. Each is one
line naming the key, value or file (a config error, exit 2; a bad file, exit 1), never a traceback or a run whose
reported accuracy is not its checkpoint's."""

import os
import re
import signal

import pytest

from tests.data.encoded.test_hf import three_splits
from tests.data.encoded.test_stream import SIZE, shards, write_folder  # noqa: F401 - shards: the fixture
from tests.helpers import TINY, compose, one_epoch, run_train_py
from vit.checkpoint import CheckpointError
from vit.data.errors import DataError
from vit.model import ConfigError
from vit.training.checks import check_config
from vit.training.resume import resume_path
from vit.training.run import train
from vit.training.run_folder import CHECKPOINT_DIR, LAST, RUN_CONFIG

SYNTHETIC = [*TINY, "trainer.max_epochs=1", "callbacks.pos_embed_figure=null"]  # 16-pixel RGB images


@pytest.mark.slow  # ~7 s: train.py processes
def test_a_model_of_another_image_size_than_the_data_is_refused_by_train_py(tmp_path):
    """model.img_size=8 on 16-pixel data trained (the position table resampled at every step), reported the
    16-pixel accuracy and exited 0, while its checkpoint made predict and export read the images at 8 pixels."""
    run = run_train_py(*SYNTHETIC, "model.img_size=8", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "config error: model.img_size=8, but the data in data.root=data has 16-pixel images (data.img_size): "
        "leave model.img_size out, it follows the data; data.img_size sets both"
    )
    assert "Traceback" not in run.stderr and not (tmp_path / "run" / CHECKPOINT_DIR).exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # 148 lines of traceback in the first step: the patch embedding's channel check
        ("model.in_chans=1", r"^model\.in_chans=1, but the data .* has 3-channel images \(data\.in_chans\): leave"),
        ("model.img_size=[8,16]", r"^model\.img_size=\[8, 16\], but the data .* has 16-pixel images"),
    ],
)
def test_a_model_of_another_input_than_the_data_is_refused(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        check_config(compose(*SYNTHETIC, f"output_dir={tmp_path}", override))
    check_config(compose(*SYNTHETIC, f"output_dir={tmp_path}", "model.img_size=[16,16]"))  # the data's, as a pair


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # a network without a position table states no image size: 235 GB of images at the first batch, a traceback
        (["model.pos_embed=none", "data.img_size=1000000"], r"^data\.batch_size=32 images of data\.img_size=1000000 "
         r"pixels needs 384\.0 TB, more than this machine's .* of memory$"),
        (["data.crop_padding=10000000"], r"^data\.crop_padding=10000000 around data\.batch_size=32 images needs "
         r"38\.4 PB"),
        (["test_time_shift=10000000"], r"^test_time_shift=10000000 around data\.eval_batch_size=64 images of "
         r"data\.img_size=16 pixels needs 307\.2 PB"),
        (["data.train_size=1000000000000"], r"^data\.train_size=1000000000000, data\.test_size=128 images of "
         r"data\.img_size=16 pixels needs 3\.1 PB"),
    ],
)  # fmt: skip
def test_images_the_data_keys_ask_to_hold_at_once_are_checked_against_the_memory(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as refused:
        check_config(compose(*SYNTHETIC, "data.batch_size=32", f"output_dir={tmp_path}", *overrides))
    assert refused.traceback[-1].name == "check_fits"  # by the sizes alone, before any image is made


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # numpy's seeds are 32-bit unsigned: Lightning's seed_everything raised ValueError as the run began
        ("seed=-1", r"^seed=-1: must be a whole number from 0 to 4294967295"),
        ("seed=4294967296", r"^seed=4294967296: must be a whole number from 0 to 4294967295"),
        # a ZeroDivisionError in the first step
        ("trainer.accumulate_grad_batches=0", r"^trainer\.accumulate_grad_batches=0: must be a number of batches"),
        ("trainer.log_every_n_steps=0", r"^trainer\.log_every_n_steps=0: must be a number of steps >= 1$"),
        ("+trainer.check_val_every_n_epoch=0", r"^trainer\.check_val_every_n_epoch=0: must be a number of epochs"),
        ("+trainer.val_check_interval=0", r"^trainer\.val_check_interval=0: must be a share of the epoch"),
        # a TypeError in the first step
        ("trainer.accumulate_grad_batches=abc", r"^trainer\.accumulate_grad_batches='abc': must be int$"),
        ("trainer.max_epochs=abc", r"^trainer\.max_epochs='abc': must be int or null$"),
        # forever (an OverflowError building the schedule), 1000 epochs, or no training and an untrained model tested
        ("trainer.max_epochs=-1", r"^trainer\.max_epochs=-1: must be a number of epochs >= 1"),
        ("trainer.max_epochs=null", r"^trainer\.max_epochs=null: must be a number of epochs >= 1"),
        ("trainer.max_epochs=0", r"^trainer\.max_epochs=0: must be a number of epochs >= 1"),
        ("trainer.limit_train_batches=0", r"^trainer\.limit_train_batches=0: must be a share of the epoch"),
        # Lightning's MisconfigurationException in the first step; a negative norm was ignored
        ("trainer.gradient_clip_val=nan", r"^trainer\.gradient_clip_val=nan: must be a finite number$"),
        ("trainer.gradient_clip_val=-1", r"^trainer\.gradient_clip_val=-1: must be a gradient norm >= 0"),
        ("trainer.num_sanity_val_steps=-5", r"^trainer\.num_sanity_val_steps=-5: must be a number of batches >= 0"),
        # timm's Mixup: a TypeError or bare AssertionError as the module was built, or in the first step; prob=2 ran
        ("+mixup={mixup_alpha: abc}", r"^mixup\.mixup_alpha='abc': must be a number >= 0$"),
        ("+mixup={prob: 2}", r"^mixup\.prob=2: must be a number in \[0, 1\]$"),
        ("+mixup={cutmix_minmax: [0.2]}", r"^mixup=\{'cutmix_minmax': \[0\.2\]\}: timm's Mixup refuses it"),
        ("+mixup={mixup_alpha: 0, cutmix_alpha: 0}", r"^mixup: mixes nothing"),
        # trained on NaN images; a TypeError generating the images
        ("data.noise=nan", r"^data\.noise=nan: must be a finite number$"),
        ("data.img_size=[16,16]", r"^data\.img_size=\[16, 16\]: must be int$"),
    ],
)
def test_numbers_that_reach_numpy_or_lightning_unchecked_are_named_before_any_work(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        check_config(compose(*SYNTHETIC, f"output_dir={tmp_path}", override))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.devices=0", r"^trainer: `Trainer\(devices=0\)` value is not a valid input"),
        ("+trainer.num_nodes=0", r"^trainer: `num_nodes` must be a positive integer, but got 0\.$"),
        ("trainer.precision=17", r"^trainer: Precision 17 is invalid\."),
        ("trainer.limit_val_batches=1.5", r"^trainer: You have passed invalid value 1\.5 for limit_val_batches"),
        ("callbacks.pos_embed_figure.every_n_epochs=0", r"^callbacks\.pos_embed_figure: every_n_epochs must be at"),
    ],
)
def test_values_lightning_or_a_callback_refuses_are_one_line_naming_the_key(tmp_path, override, message):
    """Hydra wrapped their own checks' errors in an InstantiationException: a traceback."""
    more = [o for o in SYNTHETIC if not o.startswith("callbacks.")] if override.startswith("callbacks.") else SYNTHETIC
    with pytest.raises(ConfigError, match=message):
        train(compose(*more, f"output_dir={tmp_path}", override))
    assert not (tmp_path / CHECKPOINT_DIR).exists()


CONFIG = {"seed": 0, "model": {"depth": 1}}  # a run's resolved config, as config.yaml holds it


def _earlier_run(folder, config_text, age):
    (folder / CHECKPOINT_DIR).mkdir(parents=True)
    (folder / CHECKPOINT_DIR / LAST).write_bytes(b"")  # resume_path only looks for the file
    (folder / RUN_CONFIG).write_text(config_text)
    os.utime(folder / CHECKPOINT_DIR / LAST, (age, age))


@pytest.mark.parametrize(
    "broken",
    ["seed: 0\0\0\0", "- 1\n- 2\n", "model: {depth: [", "42"],
    ids=["NUL bytes", "a list", "cut short", "a number"],
)
def test_resume_auto_skips_an_earlier_run_whose_config_yaml_is_unreadable(tmp_path, caplog, broken):
    """A YAML error, AttributeError or OSError from the newest sibling stopped every resume=auto in the folder."""
    _earlier_run(tmp_path / "a", "seed: 0\nmodel:\n  depth: 1\n", age=1_000_000)
    _earlier_run(tmp_path / "b", broken, age=2_000_000)  # the newest
    with caplog.at_level("WARNING"):
        assert resume_path("auto", tmp_path / "c", config=CONFIG) == tmp_path / "a" / CHECKPOINT_DIR / LAST
    assert f"resume=auto: skipping the earlier run {tmp_path / 'b'}: its config.yaml is unreadable (" in caplog.text


STOP = "+callbacks.fault={_target_: tests.reliability.faults.SignalAt, step: 2}"  # in the first epoch's 5 steps


@pytest.mark.parametrize("first", ["stream", "imagefolder"])
def test_a_mid_epoch_checkpoint_resumed_with_another_data_source_is_refused(shards, tmp_path, first):  # noqa: F811
    """The loader position of litdata's StreamingDataLoader given to our image-folder loader, or the reverse: a
    KeyError ('epoch', 'dataset') as the first resumed batch was drawn."""
    folder = write_folder(tmp_path / "folder")  # the shards' images: the same model reads both
    runs = {"stream": [*one_epoch("stream", SIZE), f"data.root={shards}"]}
    runs["imagefolder"] = [*one_epoch("imagefolder", SIZE), f"data.root={folder}"]
    second = "imagefolder" if first == "stream" else "stream"
    with pytest.raises(SystemExit) as stopped:
        train(compose(*runs[first], f"output_dir={tmp_path / '1'}", STOP))
    assert stopped.value.code == 128 + signal.SIGTERM
    last = tmp_path / "1" / CHECKPOINT_DIR / LAST
    modules = {
        "stream": "vit.data.encoded.stream.StreamDataModule",
        "imagefolder": "vit.data.encoded.imagefolder.ImageFolderDataModule",
    }
    with pytest.raises(
        CheckpointError,
        match=rf"^{re.escape(str(last))}: saved mid-epoch while reading data\._target_={modules[first]}, whose "
        rf"loader position this run's data\._target_={modules[second]} cannot continue",
    ):
        train(compose(*runs[second], f"output_dir={tmp_path / '2'}", f"resume={last}"))


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda text: text[: len(text) // 2], r"\(JSONDecodeError: "),  # written in part
        (lambda text: "\0" * 8, r"\(JSONDecodeError: "),
        (lambda text: '{"_fingerprint": "x"}', r"\(no key '_data_files'\)"),
        (lambda text: '{"_data_files": 3}', r"\(TypeError: _data_files is int, not a list\)"),
    ],
    ids=["cut short", "NUL bytes", "no data files", "not a list"],
)
def test_a_damaged_state_json_of_a_saved_dataset_is_named(tmp_path, damage, says):
    """'config error: JSONDecodeError raised while resolving interpolation ...', naming neither file nor folder."""
    three_splits().save_to_disk(tmp_path / "saved")
    state = tmp_path / "saved" / "train" / "state.json"
    state.write_text(damage(state.read_text()))
    cfg = compose(*one_epoch("hf", SIZE), f"data.root={tmp_path / 'saved'}", f"output_dir={tmp_path / 'run'}")
    with pytest.raises(DataError, match=rf"^{re.escape(str(state))}: not a readable save_to_disk state file {says}"):
        check_config(cfg)
