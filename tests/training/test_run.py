"""End to end: train(cfg) as train.py runs it, on synthetic data and tiny files, within seconds."""

import csv
import inspect
import json
import logging
import re
import warnings
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import hydra
import lightning as L
import pytest
import timm
import torch
from safetensors.torch import save_file
from torch._dynamo.utils import counters

from tests.helpers import ROOT, TINY, compose, run_train_py, tiny_run, write_cifar, write_image_folder
from tests.reliability.faults import RecordWeights
from vit.checkpoint import Loaded, load
from vit.cli.export import to_safetensors
from vit.data.memory.fashion_mnist import DEBIAN_DIR
from vit.model import VisionTransformer
from vit.model.config import ConfigError
from vit.model.presets import preset_config
from vit.training import compiler
from vit.training.checks import check_config
from vit.training.clock import TrainingClock
from vit.training.module import LR, SKIPPED_STEPS
from vit.training.process import NVML_CUDA_CHECK
from vit.training.run import build, train
from vit.training.run_folder import LAST


def one_epoch_of(batches: int) -> list[str]:
    """tiny_run's overrides for one epoch of `batches` training batches, without the position-embedding figure."""
    return ["trainer.max_epochs=1", f"trainer.limit_train_batches={batches}", "callbacks.pos_embed_figure=null"]


EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def test_fit_and_test_write_every_output(tmp_path):
    results = train(tiny_run(tmp_path, "trainer.max_epochs=4"))
    assert {"test_acc", "best_val_acc", "epochs", "train_seconds", "train_images_per_second", "params"} <= set(results)
    assert results["test_acc"] > 0.9  # synthetic classes are separable; the model learns them
    assert results["epochs"] == 4 and results["train_seconds"] > 0 and results["train_images_per_second"] > 0
    assert json.loads((tmp_path / "results.json").read_text()) == results
    assert (tmp_path / "config.yaml").is_file()
    assert {p.name for p in (tmp_path / "checkpoints").iterdir()} == {"best.ckpt", "last.ckpt"}
    with open(tmp_path / "metrics.csv") as f:
        header = next(csv.reader(f))
    assert {"val/acc", "train/loss", "train/images_per_second", "train/lr"} <= set(header)


def test_the_logged_learning_rate_is_the_peak_one_under_layer_decay(tmp_path):
    """Layer decay gives the lower layers lr * decay^k; train/lr is the schedule's own, the head's: it reaches
    optim.lr at the end of warmup."""
    train(tiny_run(tmp_path, "optim.layer_decay=0.5", "optim.lr=1e-3", "callbacks.pos_embed_figure=null"))
    with open(tmp_path / "metrics.csv") as f:
        logged = [float(row[LR]) for row in csv.DictReader(f) if row[LR]]
    assert len(logged) > 5 and max(logged) == pytest.approx(1e-3, rel=1e-6)


def test_a_second_run_in_the_same_folder_replaces_best_ckpt(tmp_path):
    short = one_epoch_of(2)
    first = train(tiny_run(tmp_path, *short))
    second = train(tiny_run(tmp_path, *short, "seed=1"))
    assert first["best_checkpoint"] == second["best_checkpoint"] == str(tmp_path / "checkpoints" / "best.ckpt")
    assert {p.name for p in (tmp_path / "checkpoints").iterdir()} == {"best.ckpt", "last.ckpt"}
    assert load(second["best_checkpoint"]).model.head.weight.equal(
        load(tmp_path / "checkpoints" / LAST).model.head.weight
    )


def test_results_report_the_whole_fit_not_the_tested_checkpoint(tmp_path, monkeypatch):
    """Testing restores the best checkpoint, whose training clock and skip count stop at its epoch; results
    must report the fit's own. The best checkpoint is made to look like an earlier epoch's (clock and skip
    count rewritten in a copy), so the test never depends on which epoch happens to be best."""
    at_fit_end = {}
    real_test = L.Trainer.test

    def test_an_earlier_best(trainer, module, *args, ckpt_path=None, **kwargs):
        clock = next(c for c in trainer.callbacks if isinstance(c, TrainingClock))
        at_fit_end.update(seconds=clock.seconds, skipped=module.skipped_steps)
        earlier = torch.load(ckpt_path, weights_only=True)
        earlier["callbacks"]["TrainingClock"]["seconds"], earlier[SKIPPED_STEPS] = 1e-6, 7
        torch.save(earlier, tmp_path / "earlier.ckpt")
        return real_test(trainer, module, *args, ckpt_path=tmp_path / "earlier.ckpt", **kwargs)

    monkeypatch.setattr(L.Trainer, "test", test_an_earlier_best)
    results = train(tiny_run(tmp_path, *one_epoch_of(2)))
    assert results["train_seconds"] == round(at_fit_end["seconds"], 3) > 0
    assert results["skipped_steps"] == at_fit_end["skipped"] == 0


def test_checkpoint_loads_with_weights_only(tmp_path):
    train(tiny_run(tmp_path, "trainer.max_epochs=1", "trainer.limit_train_batches=1"))
    ckpt = torch.load(tmp_path / "checkpoints" / "best.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["model"]["embed_dim"] == 32
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "checkpoints" / "best.ckpt") == []


def test_validation_counts_each_sample_once(tmp_path):
    results = train(tiny_run(tmp_path, *one_epoch_of(1), "data.val_size=70", "data.eval_batch_size=32"))
    assert results["val_samples"] == 70


def test_the_training_clock_runs_again_after_a_validation_inside_the_epoch(tmp_path):
    """Every step sleeps 30 ms, two validations an epoch: the clock holds at least all of the steps' sleeps."""
    slow = "+callbacks.slow={_target_: tests.reliability.faults.SlowSteps, seconds: 0.03}"
    check = "+trainer.val_check_interval=0.5"
    results = train(tiny_run(tmp_path, "data.batch_size=32", check, "callbacks.pos_embed_figure=null", slow))
    steps = results["global_steps"]
    assert steps >= 20 and results["train_seconds"] >= 0.03 * steps
    assert results["train_images_per_second"] <= 32 / 0.03  # one batch of 32 per 30 ms at most


class TestedWeights(L.Callback):
    """The weights the test stage runs with (class-level: Hydra builds the instance)."""

    seen: ClassVar[list[dict[str, torch.Tensor]]] = []

    def on_test_start(self, trainer, pl_module):
        TestedWeights.seen.append({k: v.clone() for k, v in pl_module.state_dict().items()})


def test_the_test_stage_tests_the_ema_weights_the_best_checkpoint_holds(tmp_path):
    TestedWeights.seen.clear()
    record = "+callbacks.tested._target_=tests.training.test_run.TestedWeights"
    results = train(tiny_run(tmp_path, "ema_decay=0.5", *one_epoch_of(3), record))
    best = torch.load(results["best_checkpoint"], weights_only=True)
    (tested,) = TestedWeights.seen
    assert all(torch.equal(tested[k], v) for k, v in best["state_dict"].items())  # the average
    live = best["current_model_state"]
    assert not all(torch.equal(tested[k], v) for k, v in live.items() if v.is_floating_point())


class MixedInputs(L.Callback):
    """For each training step, whether the network's input differed from the batch the loader gave (class-level)."""

    seen: ClassVar[list[bool]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        loaded = batch[0].clone()
        handle = pl_module.model.register_forward_pre_hook(
            lambda _, args: MixedInputs.seen.append(not torch.equal(args[0], loaded))
        )
        self._remove = handle.remove

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._remove()


@pytest.mark.parametrize("mixup", [True, False], ids=["mixup", "none"])
def test_mixup_from_the_config_mixes_every_training_batch_beside_the_ema(tmp_path, mixup):
    """The command line's +mixup reaches the training step (each network input is a mix of its batch) in a run
    that also averages weights; without it the network sees the loader's batches as they are."""
    MixedInputs.seen.clear()
    TestedWeights.seen.clear()
    spies = ["+callbacks.mixed._target_=tests.training.test_run.MixedInputs"]
    spies.append("+callbacks.tested._target_=tests.training.test_run.TestedWeights")
    mixing = ["+mixup={mixup_alpha: 0.2, cutmix_alpha: 1.0}"] if mixup else []
    results = train(tiny_run(tmp_path, "ema_decay=0.9", "callbacks.pos_embed_figure=null", *spies, *mixing))
    assert len(MixedInputs.seen) == results["global_steps"] == 14
    assert all(MixedInputs.seen) if mixup else not any(MixedInputs.seen)
    live = torch.load(results["best_checkpoint"], weights_only=True)["current_model_state"]
    (tested,) = TestedWeights.seen
    assert not all(torch.equal(tested[k], v) for k, v in live.items() if v.is_floating_point())  # the EMA's


def test_the_checkpointed_ema_is_the_closed_form_average_of_every_steps_weights(tmp_path):
    """ema_1 = w_1, ema_t = d ema_(t-1) + (1 - d) w_t after every optimizer step t; last.ckpt holds ema_T."""
    RecordWeights.history.clear()
    record = "+callbacks.record={_target_: tests.reliability.faults.RecordWeights}"
    train(tiny_run(tmp_path, "ema_decay=0.8", record, "callbacks.pos_embed_figure=null"))
    history, decay = RecordWeights.history, 0.8
    assert len(history) == 2 * 7  # two epochs of seven steps
    expected = dict(history[0])
    for weights in history[1:]:
        average = {k: decay * expected[k] + (1 - decay) * w for k, w in weights.items() if w.is_floating_point()}
        expected = {**weights, **average}  # integer buffers are copied, not averaged
    saved = torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)["state_dict"]
    assert expected.keys() == saved.keys()
    for k in expected:
        torch.testing.assert_close(saved[k], expected[k], msg=lambda m, k=k: f"{k}: {m}")
    assert not torch.equal(saved["model.head.weight"], history[-1]["model.head.weight"])  # not the live weights


def experiment_overrides(name: str, tmp_path: Path) -> list[str]:
    """Tiny stand-ins for each experiment's real data, in the same on-disk formats."""
    data = {
        "cifar10": lambda: write_cifar(tmp_path / "data", "cifar-10"),
        "cifar100": lambda: write_cifar(tmp_path / "data", "cifar-100"),
    }
    overrides = [
        f"experiment={name}",
        f"output_dir={tmp_path / 'out'}",
        "debug=fast_dev_run",
        "trainer.accelerator=cpu",
    ]
    overrides += ["trainer.precision=32-true", "data.batch_size=4", "data.eval_batch_size=4"]
    base = name.removeprefix("finetune_")
    if base != name:  # a pretrained checkpoint of the experiment's model, in a foreign format
        overrides.append(f"model.pretrained={write_pretrained(tmp_path, name)}")
    if base.startswith("cifar"):
        data[base]()
        overrides += [f"data.root={tmp_path / 'data'}", "data.download=false", "data.val_size=10"]
    elif name in ("imagenette", "finetune_imagefolder"):
        classes = {f"n0{i}": 6 for i in range(10)}
        write_image_folder(tmp_path / "data", classes, "train")
        write_image_folder(tmp_path / "data", classes, "val")
        overrides += [f"data.root={tmp_path / 'data'}", "data.num_workers=0", "data.img_size=32"]
    return overrides


def write_pretrained(tmp_path: Path, experiment: str) -> Path:
    """finetune_cifar*: our exported .safetensors of a 100-class vit_cifar; finetune_imagefolder: timm's
    ViT-S/16 at 224 with 1000 classes, as a timm state dict in .safetensors."""
    path = tmp_path / "pretrained.safetensors"
    if experiment == "finetune_imagefolder":
        model = timm.create_model("vit_small_patch16_224", pretrained=False)
        save_file(model.state_dict(), str(path))
    else:
        config = replace(preset_config("vit_cifar"), num_classes=100)
        to_safetensors(Loaded(VisionTransformer(config), (0.5,) * 3, (0.25,) * 3, None, path), path)
    return path


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_fast_dev_run_of_every_experiment(name, tmp_path):
    if name.startswith("fashion_mnist") and not DEBIAN_DIR.is_dir():
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    cfg = compose(*experiment_overrides(name, tmp_path))
    results = train(cfg)
    assert results["global_steps"] == 1


@pytest.mark.parametrize("data", sorted(p.stem for p in (ROOT / "conf" / "data").glob("*.yaml")))
def test_the_default_experiment_composes_with_every_data_group(data):
    """`python train.py data=X`: whatever the default experiment sets under data must be an argument of every
    data module (it once set crop_padding, which image folders do not take)."""
    cfg = compose(f"data={data}", "data.num_classes=2", "data.root=somewhere")
    keys = {k: v for k, v in cfg.data.items() if k != "_target_"}
    inspect.signature(hydra.utils.get_class(cfg.data._target_)).bind(**keys)  # TypeError names an unknown key


def test_an_experiments_data_setting_that_the_chosen_data_group_lacks_is_named_before_any_work(tmp_path):
    image_folder = [
        "data=imagefolder",
        "data.num_classes=3",
        "data.root=somewhere",
        f"output_dir={tmp_path}",
        "trainer=cpu",
    ]
    cfg = compose("experiment=fashion_mnist_best", *image_folder)
    with pytest.raises(
        ConfigError, match=r"data\.crop_padding: not a setting of ImageFolderDataModule.*~data\.crop_padding"
    ):
        check_config(cfg)
    check_config(compose("experiment=fashion_mnist_best", *image_folder, "~data.crop_padding"))  # as suggested


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.num_heads=3", "model.embed_dim=64 is not divisible by num_heads=3"),
        ("model.pos_embed=learnt", "model.pos_embed='learnt' is not one of"),
        ("optim.lr=fast", r"key: optim\.lr"),
        ("data.root=???", r"^missing value\(s\) for data\.root: set them on the command line"),
        ("model.num_classes=7", r"^model\.num_classes=7, but the data in data\.root=/nonexistent has 10 classes"),
        ("+optim.lrr=1", r"key: optim\.lrr"),  # an unknown key
        ("optim.nonfinite=ignore", r"optim\.nonfinite='ignore' must be one of \('halt', 'skip'\)"),
        # a broken interpolation, in one line: OmegaConf's full_key and object_type lines were printed under it
        ("label_smoothing=${nowhere}", r"^Interpolation key 'nowhere' not found \(needed by label_smoothing\)$"),
        # its ??? was dropped by the merge onto train.yaml's null: the fine-tune trained from scratch
        ("experiment=finetune_cifar10", r"^model\.pretrained is required by this experiment: add model\.pretrained="),
        ("label_smoothing=high", r"^label_smoothing: Value 'high' of type 'str' could not be converted to Float$"),
        ("seed=abc", r"^seed: Value 'abc' of type 'str' could not be converted to Integer$"),
        ("test_time_flip=maybe", r"^test_time_flip: Value 'maybe' is not a valid bool"),
        ("test_time_shift=-1", r"^test_time_shift=-1 must be a number of pixels >= 0$"),
        ("ema_decay=fast", r"^ema_decay: Value 'fast' of type 'str' could not be converted to Float$"),
        ("ema_decay=1.5", r"ema_decay=1.5 must be in \(0, 1\)"),
        ("matmul_precision=low", r"matmul_precision='low' is not one of"),
        ("+mixup={mixup_alph: 0.8}", r"mixup\.mixup_alph: not a setting of Mixup; drop it with ~mixup\.mixup_alph"),
        ("+trainer.max_epoch=3", r"trainer\.max_epoch: not a setting of Trainer"),
        ("+trainer.max_steps=100", r"trainer\.max_steps=100: runs are counted in epochs"),
        # every experiment but the default selects trainer=gpu: without one, 26 lines of torch's driver error
        pytest.param(
            "trainer=gpu",
            r"^trainer\.accelerator=gpu, but torch sees no GPU here: add trainer=cpu",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there"),
        ),
        ("optim.lr=nan", r"^optim\.lr=nan: must be a finite number$"),  # NaN passes every comparison
        ("optim.weight_decay=inf", r"^optim\.weight_decay=inf: must be a finite number$"),
        ("optim.lr=-0.1", r"optim\.lr must be positive, got -0\.1"),
        ("data.batch_size=0", r"^data\.batch_size=0: must be a positive whole number$"),
        ("data.eval_batch_size=-8", r"^data\.eval_batch_size=-8: must be a positive whole number$"),
        ("data.in_chans=2", r"^data\.in_chans=2: images are read as 1 \(grayscale\) or 3 \(RGB\) channels$"),
    ],
)
def test_config_mistakes_fail_before_data_naming_the_key(tmp_path, override, message):
    cfg = compose("data.root=/nonexistent", f"output_dir={tmp_path}", override)
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


SYNTHETIC, FOLDER = ["data=synthetic"], ["data=imagefolder", "data.root={two_classes}"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*SYNTHETIC, "data.noise=abc"], r"^data\.noise='abc': must be float$"),  # was a TypeError inside setup
        ([*SYNTHETIC, "data.split_seed=abc"], r"^data\.split_seed='abc': must be int$"),
        ([*SYNTHETIC, "data.flip=3"], r"^data\.flip=3: must be bool$"),
        ([*SYNTHETIC, "data.train_size=0"], r"^data\.train_size=0: must be a positive whole number$"),
        ([*SYNTHETIC, "data.crop_padding=-1"], r"^data\.crop_padding=-1: must be >= 0$"),  # not test_time_shift
        ([*FOLDER, "data.crop_pct=1.5"], r"^data\.crop_pct=1\.5: the share of the image evaluation keeps"),
        ([*FOLDER, "data.auto_augment=typo"], r"^data\.auto_augment='typo': not a timm augmentation policy"),
        ([*FOLDER, "data.val_fraction=1"], r"^data\.val_fraction=1: the share held out for validation"),
        (["data=imagefolder", "data.root={one_class}"], r"^data\.num_classes=1 in data\.root=\S+: a classifier needs"),
    ],
)
def test_data_values_of_every_group_are_named_before_any_data_is_read(tmp_path, overrides, message):
    """crop_pct=1.5 trained to the end, then every reader refused its checkpoints; the rest were tracebacks."""
    write_image_folder(tmp_path / "two", {"a": 1, "b": 1}, "train")
    write_image_folder(tmp_path / "one", {"a": 1}, "train")
    folders = {"two_classes": tmp_path / "two", "one_class": tmp_path / "one"}
    cfg = compose(*(o.format(**folders) for o in overrides), "model.patch_size=4", f"output_dir={tmp_path}")
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


@pytest.mark.slow  # two train.py processes; the checks are tested in process above, train.py's one line below
def test_train_py_reports_a_typo_and_an_impossible_shape_without_a_traceback(tmp_path):
    typo = run_train_py("model.embed_dimm=64", cwd=tmp_path)
    assert typo.returncode != 0 and "embed_dimm" in typo.stderr
    shape = run_train_py(
        "model.num_heads=3", "model.patch_size=4", "data=cifar10", "data.root=/nonexistent", cwd=tmp_path
    )
    assert shape.returncode == 2
    assert "config error: model.embed_dim=64 is not divisible by num_heads=3" in shape.stderr
    assert "Traceback" not in shape.stderr and "CIFAR" not in shape.stderr  # no data was looked for


@pytest.mark.slow  # a train.py process: ~9 s
def test_train_py_reports_a_data_fault_in_one_line(tmp_path):
    run = run_train_py(*TINY, "data.val_size=100000", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    assert (
        run.stderr.strip().splitlines()[-1]
        == "error: data.val_size=100000 must be between 0 and the 512 training images"
    )
    assert "Traceback" not in run.stderr


@pytest.mark.slow  # a Hydra multirun of two train.py jobs in a subprocess: ~14 s
def test_multirun_writes_a_comparison_table(tmp_path):
    run = run_train_py("-m", *TINY, "trainer.max_epochs=1", "model.pos_embed=learned,none", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    (table,) = tmp_path.glob("multirun/*/*/comparison.md")
    lines = table.read_text().splitlines()
    assert lines[0].startswith("| setting | test_acc")
    assert any("model.pos_embed=learned" in line for line in lines) and any(
        "model.pos_embed=none" in line for line in lines
    )
    assert (table.parent / "comparison.csv").is_file()


@pytest.mark.slow  # a Hydra multirun of two train.py jobs in a subprocess: ~12 s
def test_a_failed_sweep_job_is_a_row_of_the_table_and_the_sweep_goes_on(tmp_path):
    """train.py's SystemExit ended the sweep at the failed job: the later ones never ran and no table was written."""
    run = run_train_py("-m", *TINY, "trainer.max_epochs=1", "model.num_heads=3,4", cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("1 of 2 jobs failed: ") and "model.num_heads=3" in last and "num_heads=4" not in last
    (table,) = tmp_path.glob("multirun/*/*/comparison.csv")
    failed, done = csv.DictReader(table.open())  # in job order
    assert "model.num_heads=3" in failed["setting"] and "model.num_heads=4" in done["setting"]
    assert failed["error"].startswith("config error: model.embed_dim=32 is not divisible by num_heads=3")
    assert float(done["test_acc"]) > 0 and not done["error"]


@pytest.mark.slow  # two DDP processes started by train.py: ~24 s
def test_ddp_on_two_cpu_processes_counts_each_validation_sample_once(tmp_path):
    run = run_train_py(
        *TINY,
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "trainer.max_epochs=1",
        "data.val_size=75",  # odd, so padded sharding would count some samples twice
        "data.eval_batch_size=16",
        f"output_dir={tmp_path / 'out'}",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["val_samples"] == 75
    assert results["test_acc"] is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_training_without_a_gpu_steps_adamw_without_asking_nvml(tmp_path, monkeypatch):
    monkeypatch.setenv(NVML_CUDA_CHECK, "1")  # as `import lightning` leaves it
    asked = []
    nvml_count = torch.cuda._device_count_nvml
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: asked.append(1) or nvml_count())
    steps = train(tiny_run(tmp_path, "trainer.max_epochs=2", "callbacks.pos_embed_figure=null"))["global_steps"]
    assert steps >= 8
    assert len(asked) < steps  # Lightning's few questions while setting up; before: those, and one a step


@pytest.mark.parametrize(("data", "pixels"), [("synthetic", 16), ("cifar10", 32)])
def test_a_data_group_alone_names_the_model_presets_that_fit_it_and_they_do(tmp_path, data, pixels):
    # the default experiment's model has patch 7 (28 px Fashion-MNIST); other data needs another preset
    with pytest.raises(ConfigError, match=rf"patch_size=7x7 .*fit {pixels}x{pixels} images: .*model=vit_cifar") as err:
        check_config(compose(f"data={data}", "data.root=/nonexistent", f"output_dir={tmp_path}"))
    for preset in re.findall(r"model=(\w+)", str(err.value)):
        check_config(compose(f"data={data}", f"model={preset}", "data.root=/nonexistent", f"output_dir={tmp_path}"))


def test_a_run_prints_no_deprecation_of_lightnings_own_torch_calls(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tiny_run(tmp_path, "trainer.max_epochs=1", "trainer.limit_train_batches=1"))
    assert [str(w.message) for w in caught if "LeafSpec" in str(w.message)] == []


def test_building_a_run_prints_no_lightning_advert(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    build(tiny_run(tmp_path))
    assert "GPU available" in caplog.text  # Lightning's own lines still reach the log
    assert "litlogger" not in caplog.text and "💡" not in caplog.text


def test_the_default_experiment_flips_and_shifts_at_test_time_exactly_where_its_data_trains_so():
    assert compose().test_time_flip is True  # Fashion-MNIST trains with data.flip
    assert compose("data=synthetic").test_time_flip is False  # patterns that are not their own mirror images
    assert compose("data=fashion_mnist", "data.flip=false").test_time_flip is False
    assert compose("experiment=cifar10").test_time_flip is False  # measured on Fashion-MNIST only
    assert compose().test_time_shift == 1  # as far as its crops move images
    assert compose("data=synthetic").test_time_shift == 0  # no crops there
    assert compose("data=fashion_mnist", "data.crop_padding=0").test_time_shift == 0
    assert compose("experiment=cifar10").test_time_shift == 0


def test_the_default_experiment_compiles_and_the_tests_runs_do_not():
    """`python train.py` compiles (the 16-token model's step is mostly per-op cost); the tests' runs train eager."""
    with hydra.initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        assert hydra.compose("train").compile is True
    assert compose().compile is False and compose("compile=true").compile is True


@pytest.mark.slow  # inductor builds the CPU kernels: ~30 s on 2 cores with an empty cache
def test_a_compiled_run_trains_on_the_cpu_checkpoints_and_resumes(tmp_path, monkeypatch):
    probe = compiler.compile_problem
    if (problem := probe("cpu")) is not None:
        pytest.skip(f"torch.compile cannot build CPU kernels here: {problem}")
    monkeypatch.setattr(compiler, "compile_problem", lambda device: probe(device) or counters.clear())  # its graph
    torch._dynamo.reset()
    first = train(tiny_run(tmp_path / "run", "compile=true", "trainer.max_epochs=1"))
    assert counters["stats"]["unique_graphs"] >= 1  # compiled, not silently eager
    assert first["global_steps"] == 7 and 0 <= first["test_acc"] <= 1
    last = tmp_path / "run" / "checkpoints" / LAST  # the compiled network's weights, under the eager keys
    resumed = train(tiny_run(tmp_path / "more", "compile=true", "trainer.max_epochs=2", f"resume={last}"))
    assert resumed["global_steps"] == 14 and resumed["resumed_from"] == str(last)


def test_config_yaml_and_results_json_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """resume=auto and the sweep table read them: a run killed while writing one left it cut short. A failed write
    now leaves the previous file, as checkpoints do (vit.atomic)."""
    from vit.atomic import WriteError
    from vit.training import run

    short = one_epoch_of(1)
    train(tiny_run(tmp_path, *short))
    before = (tmp_path / "results.json").read_text()
    real = run.write_atomically

    def cut_short(temporary):  # a disk that fills after the first byte
        temporary.write_text("{")
        raise OSError("No space left on device")

    def failing(path, write):
        real(path, cut_short if path.name == "results.json" else write)

    monkeypatch.setattr(run, "write_atomically", failing)
    with pytest.raises(WriteError, match=r"results\.json"):
        train(tiny_run(tmp_path, *short))
    assert (tmp_path / "results.json").read_text() == before and json.loads(before)["epochs"] == 1


def test_images_of_no_whole_number_of_patches_train_only_where_the_pretrained_network_was_made_so():
    """The network floors its grid, as timm's does for SigLIP so400m at 384 px and patch 14 (27 x 27): a run may
    fine-tune such a checkpoint at such a size, but a run from scratch, or from a network of whole patches, may not
    silently leave its images' last rows and columns out."""
    from vit.model import ViTConfig
    from vit.training.checks import check_whole_patches

    uneven = ViTConfig(img_size=30, patch_size=14, embed_dim=32, depth=1, num_heads=2)  # 2x2 patches, 2 px unread
    with pytest.raises(ConfigError, match=r"^model\.img_size=30x30 is not divisible by patch_size=14x14"):
        check_whole_patches(uneven)
    with pytest.raises(ConfigError, match=r"^the pretrained network cannot take"):
        check_whole_patches(uneven, source=ViTConfig(img_size=28, patch_size=14, embed_dim=32, depth=1, num_heads=2))
    check_whole_patches(uneven, source=ViTConfig(img_size=384, patch_size=14, embed_dim=32, depth=1, num_heads=2))
