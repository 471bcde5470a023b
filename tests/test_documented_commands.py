"""Every command README.md and docs/*.md show, run as written, end to end. The docs are parsed here, so a command
added to them without a test that runs it fails test_every_documented_command_has_a_test_that_runs_it.

A command is split into words by bash itself (its tildes, $HOME and $C, its comments), in a folder that is both HOME
and the working folder, holding small data the test writes where the docs name it ($HOME/data, best.ckpt, shoe.png,
...). Only what stands for the user's world is substituted, each substitution asserting that the doc still says the
words it replaces: `<date>`-like placeholders, cluster paths and hosts (the test's folders, 127.0.0.1), device counts
(one CPU process a device), a model preset too large for a test (shrunk by overrides after it); an s3:// root is
served by a local S3 server (its endpoint added), a hub name by huggingface_hub's offline cache. Brief settings are
appended: an epoch of two batches, tiny models and images. Nothing appended or substituted switches off what a command
does (compile, precision, augmentation, decoding, figures): `brief_only` holds every run to the sizes, steps and
places of ALLOWED. `python ...` runs in this process (runpy: the same __main__ and argv as the interpreter's, without
its ~6 s start); make, torchrun, srun and Lightning's DDP start processes as the user's do. Marked slow: processes,
and what would take this file past ~45 s of the default suite on a busy two-core host (a compiled run: 5-10 s once
inductor has cached its kernels, 15-45 s before)."""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import re
import runpy
import shlex
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pytest
import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file

from tests.data.encoded import test_stream
from tests.data.memory.test_fashion_mnist import write_fashion_mnist
from tests.helpers import ROOT, needs_fashion_mnist, write_cifar, write_image_folder
from tests.interop import test_hub
from tests.training import test_naflex
from vit.checkpoint import load
from vit.cli.predict import predict as top_classes
from vit.model.presets import preset_config

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PROGRAMS = ("python", "torchrun", "srun", "make", "pip")  # what a block of commands starts lines with

# Every documented command (as `documented()` normalises it) -> the test that runs it as written: a test of this
# file, or an existing test by node id. A python block's statements are each a command; one test runs each block.
BLOCKS = "test_each_python_block_runs_as_written"
SHARDED = "test_sharded_training_on_this_machine_and_two_nodes_then_one_file"  # trainer=fsdp
STATIC_INT8 = "test_a_static_int8_graph_calibrated_on_the_run_predicts_and_serves_in_onnx_runtime"
COVERED = {
    # README.md
    "make train": "test_make_train_trains_the_default_run",
    "make test": "test_make_test_runs_the_suite",
    "python train.py": "test_the_default_run_writes_its_run_folder",
    "python train.py experiment=cifar10 data.root=$HOME/data": "test_the_cifar_and_imagenette_recipes",
    "python train.py data=imagefolder data.root=$HOME/imagenette2-320 model=vit_small_16": (
        "test_an_image_folder_trains_with_its_folders_as_classes"
    ),
    "python train.py data=hf data.root=$HOME/imagenette_hf model=vit_small_16": (
        "test_a_saved_hugging_face_dataset_trains"
    ),
    "python -m vit.cli.shards ~/imagenette2-320 ~/imagenette_shards --resize-short-side 256": (
        "test_shards_written_from_a_folder_then_streamed"
    ),
    "python train.py data=stream data.root=$HOME/imagenette_shards model=vit_small_16": (
        "test_shards_written_from_a_folder_then_streamed"
    ),
    "torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 train.py data=stream "
    "data.root=s3://bucket/shards model=vit_small_16 trainer=ddp trainer.devices=4 trainer.num_nodes=2 "
    "hydra.run.dir=outputs/run1": (
        "tests/data/encoded/test_stream.py::test_the_readmes_two_node_command_runs_as_two_nodes_on_one_machine"
    ),
    "python train.py model.pos_embed=sincos2d optim.lr=5e-4": "test_any_key_can_be_overridden",
    "python train.py -m model.pos_embed=learned,sincos2d,rope2d,none": "test_a_sweep_and_its_table",
    "python train.py debug=fast_dev_run": "test_fast_dev_run_runs_one_batch_of_each_split",
    "python train.py experiment=cifar10 trainer=ddp trainer.devices=4": "test_ddp_on_this_machine",
    "python train.py ... resume=auto": (
        "tests/reliability/test_preemption_cli.py::test_sigterm_exits_143_with_a_checkpoint_and_resume_auto_finishes_the_run"
    ),
    "python train.py experiment=finetune_cifar10 model.pretrained=CHECKPOINT": "test_fine_tuning_a_cifar100_run",
    "python -m vit.cli.predict --checkpoint best.ckpt shoe.png --top-k 3": "test_predict_export_and_visualize_a_run",
    "python -m vit.cli.export --checkpoint best.ckpt --format safetensors --out model.safetensors": (
        "test_predict_export_and_visualize_a_run"
    ),
    "python -m vit.cli.export --checkpoint best.ckpt --format onnx --quantize int8 --out model-int8.onnx": (
        "test_predict_export_and_visualize_a_run"
    ),
    "python -m vit.cli.export --checkpoint best.ckpt --format pt2 --out model.pt2": (
        "test_predict_export_and_visualize_a_run"
    ),
    "python -m vit.cli.export --checkpoint outputs/fashion_mnist/<date>/checkpoints/best.ckpt --format onnx "
    "--quantize int8-static --calibration-images 512 --out model-int8-static.onnx": STATIC_INT8,
    "python -m vit.cli.predict --checkpoint model-int8-static.onnx --runtime onnx shoe.png": STATIC_INT8,
    "python -m vit.cli.serve --checkpoint model-int8-static.onnx --runtime onnx": STATIC_INT8,
    "python -m vit.cli.serve --checkpoint best.ckpt": "test_the_service_answers_as_predict_does",
    "python -m vit.cli.visualize attention --checkpoint best.ckpt --image shoe.png --out attention.png": (
        "test_predict_export_and_visualize_a_run"
    ),
    "python -m vit.cli.sweep multirun/<experiment>/<date>": "test_a_sweep_and_its_table",
    # as written, ~3.5 min on two cores: the test runs the script's own smoke run (--quick) and checks both columns
    "python -m benchmarks.throughput": (
        "tests/test_benchmarks.py::test_throughput_quick_times_both_models_in_every_mode"
    ),
    "import vit": BLOCKS,
    "from vit.checkpoint import load": BLOCKS,
    "model = vit.create_model('vit_small_16', num_classes=10, pos_embed='sincos2d')": BLOCKS,
    "loaded = load('best.ckpt')": BLOCKS,
    # docs/figures.md
    "C=outputs/fashion_mnist/<date>/checkpoints/best.ckpt": "test_the_figures_of_the_default_run",
    "python -m vit.cli.visualize pos-embed --checkpoint $C --out pos_embed.png": "test_the_figures_of_the_default_run",
    "python -m vit.cli.visualize attention --checkpoint $C --image shoe.png --out attention.png [--layer 2]": (
        "test_the_figures_of_the_default_run"
    ),
    "python -m vit.cli.visualize attention-distance --checkpoint $C --data fashion_mnist --out distance.png": (
        "test_the_figures_of_the_default_run"
    ),
    "python -m vit.cli.visualize resample --checkpoint $C --img-size 56 --out resampled.png": (
        "test_the_figures_of_the_default_run"
    ),
    "python -m vit.cli.visualize confusion --checkpoint $C --out confusion.png": "test_the_figures_of_the_default_run",
    "python -m vit.cli.visualize pos-embed --checkpoint vit_base_patch16_224.safetensors --preset vit_base_16 "
    "--out b16.png": "test_the_figures_of_the_default_run",
    # docs/finetune.md
    "python train.py experiment=finetune_cifar10 model.pretrained=outputs/cifar100/<date>/checkpoints/best.ckpt": (
        "test_fine_tuning_a_cifar100_run"
    ),
    "python train.py experiment=finetune_imagefolder model.pretrained=vit_small_patch16_224.safetensors "
    "data.root=$HOME/imagenette2-320": "test_fine_tuning_timm_and_hugging_face_weights_on_an_image_folder",
    "python train.py experiment=finetune_imagefolder model.pretrained=path/to/hf_vit_folder ...": (
        "test_fine_tuning_timm_and_hugging_face_weights_on_an_image_folder"
    ),
    "python -m vit.cli.predict --checkpoint model.safetensors shoe.png cat.jpg --top-k 3": (
        "test_predict_export_and_visualize_a_run"
    ),
    "python train.py experiment=finetune_cifar10 model=vit_small_16 data.img_size=224 "
    "model.pretrained=vit_small.safetensors": "test_an_imagenet_checkpoint_fine_tuned_on_cifar_at_224",
    "python train.py data.class_subset=[0,1,2,3,4,5]": "test_pretrain_on_some_classes_fine_tune_on_the_others",
    "python train.py experiment=finetune_imagefolder data.root=$HOME/pets "
    "model.pretrained=hf-hub:timm/vit_small_patch14_dinov2.lvd142m finetune=lora": (
        "test_lora_on_a_model_named_on_the_hub"
    ),
    "python train.py data.class_subset=[6,7,8,9] data.img_size=42 model.pretrained=outputs/.../best.ckpt": (
        "test_pretrain_on_some_classes_fine_tune_on_the_others"
    ),
    # docs/interop.md
    "python -m vit.cli.predict --checkpoint vit_small_patch16_224.safetensors --preset vit_small_16 cat.jpg": (
        "test_a_timm_file_with_a_preset_for_its_heads"
    ),
    "python -m vit.cli.export --checkpoint vit_small_patch16_224.safetensors --preset vit_small_16 --format onnx "
    "--out m.onnx": "test_a_timm_file_with_a_preset_for_its_heads",
    "python train.py experiment=finetune_imagefolder model.pretrained=vit_small_patch16_224.safetensors ...": (
        "test_fine_tuning_timm_and_hugging_face_weights_on_an_image_folder"
    ),
    "from vit.model.presets import preset_config": BLOCKS,
    "loaded = load('vit_small_patch16_224.safetensors', config=preset_config('vit_small_16'))": BLOCKS,
    # docs/model.md
    "import torch": BLOCKS,
    "images = torch.randn(2, 3, 224, 224)": BLOCKS,
    "logits = model(images)": BLOCKS,
    "tokens = model.forward_features(images)": BLOCKS,
    "maps = model.attention_maps(images)": BLOCKS,
    "model = vit.VisionTransformer(vit.ViTConfig(img_size=(32, 48), patch_size=4, embed_dim=192, depth=6, "
    "num_heads=3))": BLOCKS,
    # docs/training.md
    "python train.py experiment=fashion_mnist_best": "test_the_best_fashion_mnist_recipe",
    "python train.py experiment=imagenette data.root=$HOME/imagenette2-320": "test_the_cifar_and_imagenette_recipes",
    "python train.py model.pos_embed=sincos2d optim.lr=5e-4 trainer.max_epochs=20": "test_any_key_can_be_overridden",
    "torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 train.py data=stream "
    "data.root=s3://bucket/imagenette_shards trainer=ddp trainer.devices=4 trainer.num_nodes=2 "
    "hydra.run.dir=outputs/run1": "test_two_nodes_stream_shards_from_s3_under_torchrun",
    "srun --nodes 2 --ntasks-per-node 4 python train.py data=stream data.root=/shared/imagenette_shards trainer=ddp "
    "trainer.devices=4 trainer.num_nodes=2 hydra.run.dir=outputs/run1": "test_two_nodes_stream_shards_under_srun",
    "python train.py experiment=cifar10 trainer=gpu": "test_cifar10_on_one_gpu",
    "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$HEAD:29500 train.py "
    "experiment=imagenette data.root=/shared/imagenette2-320 trainer=ddp trainer.num_nodes=2 trainer.devices=8 "
    "hydra.run.dir=outputs/run1": "test_imagenette_on_two_nodes_under_torchrun_and_srun",
    "srun python train.py experiment=imagenette data.root=/shared/imagenette2-320 trainer=ddp trainer.num_nodes=2 "
    "trainer.devices=8 hydra.run.dir=outputs/run1": "test_imagenette_on_two_nodes_under_torchrun_and_srun",
    "python train.py model=vit_large_16 trainer=fsdp trainer.devices=8 data=imagefolder data.root=$HOME/imagenet100": (
        SHARDED
    ),
    "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$HEAD:29500 train.py "
    "model=vit_huge_14 trainer=fsdp trainer.num_nodes=2 trainer.devices=8 data=imagefolder "
    "data.root=/shared/imagenet100 hydra.run.dir=outputs/run1": SHARDED,
    "srun python train.py model=vit_huge_14 trainer=fsdp trainer.num_nodes=2 trainer.devices=8 data=imagefolder "
    "data.root=/shared/imagenet100 hydra.run.dir=outputs/run1": SHARDED,
    "python -m vit.cli.consolidate outputs/run1/checkpoints/best.ckpt --out vit_huge_14.ckpt": SHARDED,
    "python train.py data=imagefolder data.root=$HOME/documents model=vit_small_16 data.max_tokens=256": (
        "test_images_at_their_own_aspect_ratio"
    ),
    "python train.py data=imagefolder data.root=$HOME/photos data.labels=$HOME/photos/train.csv": (
        "test_an_image_folder_trains_on_the_classes_of_its_label_file"
    ),
    "python -m vit.cli.shards ~/photos ~/photo_shards --labels ~/photos/tags.jsonl": (
        "test_shards_are_written_from_a_folder_and_its_label_file_of_several_labels_an_image"
    ),
    "python train.py data=imagefolder data.root=$HOME/photos data.labels=$HOME/photos/labels.csv model=vit_small_16 "
    "task=multilabel": "test_several_labels_per_image_from_a_label_file",
    "python train.py task=mae data=images data.root=$HOME/scans model=vit_small_16": (
        "test_mae_pretrains_on_a_folder_without_labels_and_a_labelled_run_fine_tunes_from_it"
    ),
    "python train.py data=imagefolder data.root=$HOME/labelled model=vit_small_16 model.pretrained=$M": (
        "test_mae_pretrains_on_a_folder_without_labels_and_a_labelled_run_fine_tunes_from_it"
    ),
    "python -m vit.cli.visualize mae --checkpoint $M --out mae.png": (
        "test_mae_pretrains_on_a_folder_without_labels_and_a_labelled_run_fine_tunes_from_it"
    ),
    "python train.py -m hparams_search=optuna": "test_an_optuna_search_and_its_continuation",
    "python train.py -m hparams_search=optuna hydra.sweeper.n_trials=40 "
    "hydra.sweep.dir=multirun/fashion_mnist/<date>": "test_an_optuna_search_and_its_continuation",
}

# Brief settings appended to a run: one epoch of two training batches and one batch of each evaluation split
BRIEF = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "data.batch_size=4",
    "data.eval_batch_size=4",
]
# after a preset too large for a test (ViT-S/16, vit_cifar): the same preset one layer deep and 32 wide
SHRUNK = ["model.embed_dim=32", "model.depth=1", "model.num_heads=4"]
# image files decoded in this process, at 32 px: 2x2 patches of 16
SMALL_IMAGES = ["data.img_size=32", "data.num_workers=0"]
# the GPUs of a multi-GPU command, as CPU processes
CPU_PROCESSES = ["trainer.accelerator=cpu"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# folders of image files in Imagenette's layout: three classes, 8 training images each, 2 test images each
CLASSES = {"n01440764": 8, "n02102040": 8, "n02979186": 8}

# What a test may add to a documented command, by key: sizes and steps, never a switch of what the command does
# (compile=false, trainer.precision, data.auto_augment, data.decode, callbacks.pos_embed_figure=null); and where it
# runs: this machine for the user's (its CPU, folders and local servers)
SIZES = ("data.img_size", "data.batch_size", "data.eval_batch_size", "data.val_size", "data.val_fraction",
         "data.num_workers", "data.max_tokens", "model.embed_dim", "model.depth", "model.num_heads",
         "model.patch_size")  # fmt: skip
STEPS = ("trainer.max_epochs", "trainer.limit_train_batches", "trainer.limit_val_batches", "trainer.limit_test_batches",
         "hydra.sweeper.n_trials")  # fmt: skip
PLACES = ("trainer.devices", "data.root", "data.cache_dir", "+data.storage_options.endpoint_url", "hydra.run.dir")
ALLOWED: dict[str, set[str] | None] = {  # key -> the values it may take (None: any)
    **dict.fromkeys((*SIZES, *STEPS, *PLACES)),
    "trainer": {"cpu"},  # as the docs say to, where there is no GPU
    "trainer.accelerator": {"cpu"},  # the GPUs of a multi-GPU command as CPU processes
    "+callbacks.witness": None,  # a callback that records what a run read, for a test to check
}


def brief_only(overrides: Iterable[str]) -> None:
    """Each override of a run one ALLOWED sets, to a value it may take."""
    for override in overrides:
        key, _, value = override.partition("=")
        assert key in ALLOWED, f"{override}: a test may add sizes, steps and places to a command, not {key}"
        assert ALLOWED[key] is None or value in ALLOWED[key], f"{override}: {key} may be {sorted(ALLOWED[key])}"


s3 = test_stream.s3  # the local S3 server on 127.0.0.1 (a fixture of tests/data/encoded/test_stream.py)
s3_server = test_stream.s3_server  # the server itself, which s3 asks for
shards = test_stream.shards  # the shards of 28 16-pixel images of 24 classes it streams
# its runs' settings less data=stream, which the commands say, and less the figure's switch, which a test may not add
STREAM_RUN = [o for o in test_stream.RUN if o not in ("data=stream", "callbacks.pos_embed_figure=null")]
hub_cache = test_hub.hub_cache  # huggingface_hub's cache in tmp_path, offline (tests/interop/test_hub.py's)


def documented() -> dict[str, str]:
    """Each command of the docs' bash blocks, normalised (continued lines joined, comment dropped, words single
    spaced), -> the line as the doc writes it; and each statement of their python blocks, as ast.unparse writes
    it, -> the same."""
    found = {}
    for doc in DOCS:
        for language, body in FENCE.findall(doc.read_text()):
            if language == "python":
                found.update({ast.unparse(statement): ast.unparse(statement) for statement in ast.parse(body).body})
                continue
            if language != "bash":  # a layout or a table: no commands, which would go unseen here
                assert not re.search(rf"^({'|'.join(PROGRAMS)}) ", body, re.MULTILINE), (
                    f"{doc.name}: a ```{language} block holds commands; label it ```bash"
                )
                continue
            lines = iter(body.splitlines())
            for line in lines:
                while line.endswith("\\"):
                    line = line[:-1] + next(lines)
                if words := shlex.split(line, comments=True):
                    found.setdefault(" ".join(words), line)
    return found


def python_blocks() -> dict[str, str]:
    """The docs' python blocks, by the doc that holds them."""
    blocks = {}
    for doc in DOCS:
        for language, body in FENCE.findall(doc.read_text()):
            if language == "python":
                name = doc.relative_to(ROOT).as_posix()
                assert name not in blocks, f"{name} has two python blocks: give the second its own test"
                blocks[name] = body
    return blocks


def test_every_documented_command_has_a_test_that_runs_it():
    commands = documented()
    untested = [command for command in commands if command not in COVERED]
    assert not untested, "documented commands that no test runs (add a runner and a row of COVERED):\n" + "\n".join(
        untested
    )
    stale = [command for command in COVERED if command not in commands]
    assert not stale, "rows of COVERED for commands the docs no longer show:\n" + "\n".join(stale)
    here = sys.modules[__name__]
    functions = {
        node.name: node for node in ast.parse(Path(__file__).read_text()).body if isinstance(node, ast.FunctionDef)
    }
    for command, test in COVERED.items():
        if "::" in test:  # an existing test elsewhere, by node id
            path, name = test.split("::")
            module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
            assert callable(getattr(module, name, None)), f"{command}: {test} does not exist"
            continue
        assert callable(getattr(here, test, None)), f"{command}: {test} is not a test of this file"
        if test != BLOCKS:  # the runner, or a fixture of this file it asks for, names the command it runs
            runner = functions[test]
            nodes = [runner, *(functions[a.arg] for a in runner.args.args if a.arg in functions)]
            said = {n.value for node in nodes for n in ast.walk(node) if isinstance(n, ast.Constant)}
            assert command in said, f"{test} does not run {command!r}"


@pytest.mark.parametrize(
    "switch",
    ["compile=false", "trainer.precision=32-true", "data.auto_augment=null", "data.decode=workers",
     "callbacks.pos_embed_figure=null", "trainer=gpu", "+trainer.fast_dev_run=true"],
)  # fmt: skip
def test_runs_add_sizes_steps_and_places_only(switch):
    """A command run with compile=false passed where the command as written failed (NaFlex under the default
    experiment's compile: true): what this file adds to commands may not switch off what they do."""
    brief_only([*BRIEF, *SHRUNK, *SMALL_IMAGES, *CPU_PROCESSES, *STREAM_RUN])
    with pytest.raises(AssertionError, match=r"a test may add sizes, steps and places to a command|may be"):
        brief_only([*BRIEF, switch])


@dataclass
class Ran:
    status: int
    out: str  # stdout and stderr


class Shell:
    """A user's shell in `home`, which is also the working folder: bash splits each documented command into words,
    then `python ...` runs in this process as the interpreter would run it, other programs as processes."""

    def __init__(self, home: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture | None = None):
        self.home, self.monkeypatch, self.capfd = home, monkeypatch, capfd
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.chdir(home)
        for key, value in OFFLINE.items():
            monkeypatch.setenv(key, value)

    def words(
        self,
        command: str,
        placeholders: dict[str, str] | None = None,
        local: dict[str, list[str]] | None = None,
        **variables: str,
    ) -> list[str]:
        """The words bash gives the program of the documented `command`: its placeholders (`<date>`) replaced in the
        text first, shell `variables` set, then `local`'s words replaced by theirs (each present in the doc)."""
        line = documented().get(command)
        assert line is not None, f"the docs no longer show {command!r}"
        for placeholder, value in (placeholders or {}).items():
            assert placeholder in line, f"{command!r} no longer says {placeholder!r}"
            line = line.replace(placeholder, value)
        env = {**os.environ, **variables}
        said = subprocess.run(
            ["bash", "-c", f"printf '%s\\0' {line}"], cwd=self.home, env=env, capture_output=True, text=True
        )
        assert said.returncode == 0, f"bash cannot read {line!r}: {said.stderr}"
        words = said.stdout.split("\0")[:-1]
        if local:
            assert set(local) <= set(words), f"{command!r} no longer says all of {sorted(local)}"
            said = set(words)
            words = [replaced for word in words for replaced in local.get(word, [word])]
            brief_only(word for word in set(words) - said if "=" in word and not word.startswith("-"))
        return words

    def run(self, words: list[str], *more: str) -> Ran:
        """`python ARGS MORE` in this process: a script (train.py, typed in the repository root) or -m module, run
        by runpy with sys.argv as the interpreter sets it; its exit status and, with capfd, what it printed. What a
        process would take with it when it ends, its environment variables and logging setup, is put back."""
        brief_only(more)
        program, *args = [*words, *more]
        assert program == "python", f"{program} runs as a process: start()"
        if self.capfd is not None:
            self.capfd.readouterr()
        logging_state, environment = _logging_state(), dict(os.environ)
        status = 0
        try:
            with self.monkeypatch.context() as m, warnings.catch_warnings():
                # runpy's warning that the module was imported before it ran as __main__ (by another test here)
                warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
                if args[0] == "-m":
                    m.setattr(sys, "argv", [args[1], *args[2:]])
                    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
                else:
                    script = args[0] if (self.home / args[0]).is_file() else str(ROOT / args[0])
                    m.setattr(sys, "argv", [script, *args[1:]])
                    runpy.run_path(script, run_name="__main__")
        except SystemExit as stop:
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
            status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        finally:
            _restore_logging(logging_state)
            os.environ.clear()
            os.environ.update(environment)
        out = "" if self.capfd is None else "".join(self.capfd.readouterr())
        return Ran(status, out)

    def start(self, words: list[str], *more: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """`PROGRAM ARGS MORE` as a process of its own in `home`: python is this interpreter, torchrun its module,
        train.py the repository's."""
        brief_only(more)
        program, *args = [*words, *more]
        programs = {"python": [sys.executable], "torchrun": [sys.executable, "-m", "torch.distributed.run"]}
        args = [str(ROOT / "train.py") if a == "train.py" else a for a in args]
        return subprocess.Popen(
            [*programs[program], *args],
            cwd=self.home,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


def _logging_state():
    root = logging.getLogger()
    loggers = [logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    return root.handlers[:], root.level, {logger: (logger.level, logger.disabled) for logger in loggers}


def _restore_logging(state) -> None:
    """What Hydra's job logging and the command lines' basicConfig changed, undone: the next test logs as before."""
    handlers, level, loggers = state
    root = logging.getLogger()
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    for logger, (logger_level, disabled) in loggers.items():
        if logger.level != logger_level:  # setLevel clears every logger's cache: thousands of loggers, once each
            logger.setLevel(logger_level)
        logger.disabled = disabled


def finish(processes: list[subprocess.Popen], timeout: float = 300) -> str:
    """Wait for every process (killing all once one fails or time is up), assert each exited 0; their outputs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(p.poll() for p in processes):
        if all(p.poll() == 0 for p in processes):
            break
        time.sleep(0.5)
    for p in processes:
        if p.poll() is None:
            p.kill()
    outputs = [p.communicate()[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * len(processes), "\n".join(out[-3000:] for out in outputs)
    return "".join(outputs)


def run_folder(home: Path, experiment: str) -> Path:
    """The newest run folder outputs/<experiment>/<date>/ in `home` (the dates sort as they fall)."""
    return max((home / "outputs" / experiment).iterdir())


def results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def resolved(folder: Path) -> dict:
    return yaml.safe_load((folder / "config.yaml").read_text())


def write_timm(path: Path, **sizes) -> timm.models.VisionTransformer:
    """A timm ViT of ViT-S/16's shape (or `sizes`) one layer deep, its state dict saved as `path`: a stand-in for
    timm's pretrained file of that name."""
    model = timm.models.vision_transformer.VisionTransformer(**{"embed_dim": 384, "num_heads": 6, **sizes, "depth": 1})
    save_file(model.eval().state_dict(), str(path))
    return model


def write_images(home: Path) -> None:
    """~/shoe.png (grey, 28 px) and ~/cat.jpg (RGB, 40x30): images a user asks about."""
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(home / "shoe.png")
    Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(home / "cat.jpg")


def write_imagenette(root: Path) -> Path:
    """An image folder in Imagenette's layout: train/ and val/, one folder per class."""
    write_image_folder(root, CLASSES, "train")
    write_image_folder(root, {name: 2 for name in CLASSES}, "val")
    return root


def top_k(line: str) -> list[tuple[str, float]]:
    """predict's line `IMAGE: class p%, class p%, ...` -> [(class, p)]."""
    _, listed = line.split(": ", 1)
    return [(name, float(p.rstrip("%"))) for name, p in (item.rsplit(" ", 1) for item in listed.split(", "))]


@pytest.fixture
def shell(tmp_path, monkeypatch, capfd) -> Shell:
    return Shell(tmp_path, monkeypatch, capfd)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Nothing run here reaches past this machine: a connection to anything but the loopback is refused."""
    connect = socket.socket.connect

    def local_only(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"a test tried to reach {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    """`python train.py`, briefly, in a home of its own: its run folder outputs/fashion_mnist/<date>/. Three layers
    of the preset's four, the fewest docs/figures.md's `--layer 2` reads: each export traces the network once for
    each of the run's six test-time views."""
    home = tmp_path_factory.mktemp("default_run")
    with pytest.MonkeyPatch.context() as monkeypatch:
        shell = Shell(home, monkeypatch)
        ran = shell.run(shell.words("python train.py"), *BRIEF, "model.depth=3")
    assert ran.status == 0
    return run_folder(home, "fashion_mnist")


# --- README.md: the default run, and what a run writes ---------------------------------------------------------


@needs_fashion_mnist
def test_the_default_run_writes_its_run_folder(default_run):
    """`python train.py`: outputs/fashion_mnist/<date>/ with the resolved config.yaml, checkpoints/best.ckpt and
    last.ckpt, metrics.csv, results.json, and the position-embedding figure of each epoch."""
    for name in ("config.yaml", "checkpoints/best.ckpt", "checkpoints/last.ckpt", "metrics.csv", "results.json"):
        assert (default_run / name).is_file(), name
    assert (default_run / "figures" / "pos_embed_epoch001.png").is_file()
    assert resolved(default_run)["model"]["patch_size"] == 7  # resolved: the Fashion-MNIST preset's
    facts = results(default_run)
    assert facts["epochs"] == 1 and facts["test_acc"] is not None and facts["best_val_acc"] is not None
    assert load(default_run / "checkpoints" / "best.ckpt").config.img_size == (28, 28)


@pytest.mark.slow  # compiled: 4-19 s with inductor's kernels cached (the default run compiles in the default suite)
@needs_fashion_mnist
@pytest.mark.parametrize(
    "command, epochs",
    [
        ("python train.py model.pos_embed=sincos2d optim.lr=5e-4", 1),
        ("python train.py model.pos_embed=sincos2d optim.lr=5e-4 trainer.max_epochs=20", 20),  # 2-12 s more
    ],
)
def test_any_key_can_be_overridden(shell, command, epochs):
    epochs_said = [] if "trainer.max_epochs" in command else ["trainer.max_epochs=1"]  # else BRIEF's would win
    brief = [setting for setting in BRIEF if not setting.startswith("trainer.max_epochs=")]
    ran = shell.run(shell.words(command), *brief, *epochs_said, "trainer.limit_train_batches=1")
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist")
    model, optim = resolved(folder)["model"], resolved(folder)["optim"]
    assert (model["pos_embed"], optim["lr"], results(folder)["epochs"]) == ("sincos2d", 5e-4, epochs)


@pytest.mark.slow  # compiled: 7-11 s with inductor's kernels cached
@needs_fashion_mnist
def test_fast_dev_run_runs_one_batch_of_each_split(shell):
    ran = shell.run(shell.words("python train.py debug=fast_dev_run"), *BRIEF)  # whose limits fast_dev_run overrides
    assert ran.status == 0, ran.out[-3000:]
    assert "Running in `fast_dev_run` mode" in ran.out
    assert results(run_folder(shell.home, "fashion_mnist"))["global_steps"] == 1


@pytest.mark.slow  # four compiled runs: 30-65 s with inductor's kernels cached, 70-100 s without
@needs_fashion_mnist
def test_a_sweep_and_its_table(shell):
    """`-m` over four position embeddings: one job each and multirun/<experiment>/<date>/comparison.md and .csv
    (setting -> test accuracy, time); `python -m vit.cli.sweep` writes the same table again."""
    ran = shell.run(shell.words("python train.py -m model.pos_embed=learned,sincos2d,rope2d,none"), *BRIEF)
    assert ran.status == 0, ran.out[-3000:]
    (sweep,) = (shell.home / "multirun" / "fashion_mnist").iterdir()
    table = (sweep / "comparison.md").read_text()
    rows = [line for line in table.splitlines()[2:] if line.startswith("| ")]
    assert [row.split(" | ")[0].split()[1] for row in rows] == [
        f"model.pos_embed={kind}" for kind in ("learned", "sincos2d", "rope2d", "none")
    ]
    assert all(results(folder)["test_acc"] is not None for folder in sweep.iterdir() if folder.is_dir())
    csv = (sweep / "comparison.csv").read_text()
    for written in ("comparison.md", "comparison.csv"):
        (sweep / written).unlink()
    placeholders = {"<experiment>": "fashion_mnist", "<date>": sweep.name}
    ran = shell.run(shell.words("python -m vit.cli.sweep multirun/<experiment>/<date>", placeholders))
    assert ran.status == 0, ran.out[-3000:]
    assert (sweep / "comparison.md").read_text() == table and (sweep / "comparison.csv").read_text() == csv
    assert table in ran.out


@pytest.mark.slow  # two compiled trials: 35-95 s with inductor's kernels cached (a quiet to a busy host)
@needs_fashion_mnist
def test_an_optuna_search_and_its_continuation(shell):
    """docs/training.md's search, one trial of it, then the second command continuing it in its folder to two in all:
    each trial's value is its job's best validation accuracy, and every trial is a row of the table."""
    ran = shell.run(shell.words("python train.py -m hparams_search=optuna"), *BRIEF, "hydra.sweeper.n_trials=1")
    assert ran.status == 0, ran.out[-3000:]
    (sweep,) = (shell.home / "multirun" / "fashion_mnist").iterdir()
    words = shell.words(
        "python train.py -m hparams_search=optuna hydra.sweeper.n_trials=40 "
        "hydra.sweep.dir=multirun/fashion_mnist/<date>",
        {"<date>": sweep.name},
        local={"hydra.sweeper.n_trials=40": ["hydra.sweeper.n_trials=2"]},
    )
    ran = shell.run(words, *BRIEF)
    assert ran.status == 0, ran.out[-3000:]
    study = optuna.load_study(study_name="hparams_search", storage=f"sqlite:///{sweep / 'optuna.db'}")
    jobs = {int(job.name): results(job) for job in sweep.iterdir() if (job / "results.json").is_file()}
    assert {t.number: t.value for t in study.trials} == {n: job["best_val_acc"] for n, job in jobs.items()}
    assert sorted(jobs) == [0, 1]
    rows = [line for line in (sweep / "comparison.md").read_text().splitlines()[2:] if line.startswith("| ")]
    assert len(rows) == 2 and all("hparams_search=optuna" in row for row in rows)


# --- README.md and docs/training.md: the recipes and data sources -------------------------------------------------


@pytest.mark.parametrize(
    "command, experiment",
    [
        ("python train.py experiment=cifar10 data.root=$HOME/data", "cifar10"),
        ("python train.py experiment=imagenette data.root=$HOME/imagenette2-320", "imagenette"),
    ],
)
def test_the_cifar_and_imagenette_recipes(shell, command, experiment):
    """Each recipe on its data's file layout under HOME, on the CPU where there is no GPU (as the docs say: add
    trainer=cpu), its preset shrunk."""
    if experiment == "cifar10":
        write_cifar(shell.home / "data")
        data = ["data.val_size=10"]
    else:
        write_imagenette(shell.home / "imagenette2-320")
        data = SMALL_IMAGES
    device = [] if torch.cuda.is_available() else ["trainer=cpu"]
    ran = shell.run(shell.words(command), *device, *BRIEF, *SHRUNK, *data)
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, experiment)
    config = resolved(folder)
    assert config["data"]["num_classes"] == (10 if experiment == "cifar10" else len(CLASSES))
    assert results(folder)["test_acc"] is not None


@needs_fashion_mnist
def test_the_best_fashion_mnist_recipe(shell):
    """One GPU's recipe (EMA, Mixup, a wider model), on the CPU where there is no GPU."""
    device = [] if torch.cuda.is_available() else ["trainer=cpu"]
    ran = shell.run(shell.words("python train.py experiment=fashion_mnist_best"), *device, *BRIEF, *SHRUNK)
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist_best")
    assert resolved(folder)["ema_decay"] == 0.9998 and results(folder)["test_acc"] is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cifar10_on_one_gpu(shell):
    write_cifar(shell.home / "data")
    ran = shell.run(shell.words("python train.py experiment=cifar10 trainer=gpu"), *BRIEF, "data.val_size=10")
    assert ran.status == 0, ran.out[-3000:]
    assert "bf16" in resolved(run_folder(shell.home, "cifar10"))["trainer"]["precision"]


@pytest.mark.slow  # compiled: ~4 s with inductor's kernels cached, ~30 s without (the NaFlex run reads a folder)
def test_an_image_folder_trains_with_its_folders_as_classes(shell):
    write_imagenette(shell.home / "imagenette2-320")
    command = "python train.py data=imagefolder data.root=$HOME/imagenette2-320 model=vit_small_16"
    ran = shell.run(shell.words(command), *BRIEF, *SHRUNK, *SMALL_IMAGES)
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist")  # the default experiment, another data source
    assert resolved(folder)["data"]["num_classes"] == len(CLASSES)
    assert load(folder / "checkpoints" / "best.ckpt").classes == tuple(sorted(CLASSES))


@pytest.mark.slow  # compiled: 4-5 s with inductor's kernels cached
def test_a_saved_hugging_face_dataset_trains(shell):
    datasets = pytest.importorskip("datasets")
    names = sorted(CLASSES)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    rng = np.random.default_rng(0)

    def split(count):
        images = [Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)) for _ in range(count)]
        return datasets.Dataset.from_dict({"image": images, "label": [k % 3 for k in range(count)]}, features=features)

    datasets.DatasetDict(train=split(12), validation=split(3), test=split(3)).save_to_disk(shell.home / "imagenette_hf")
    command = "python train.py data=hf data.root=$HOME/imagenette_hf model=vit_small_16"
    ran = shell.run(shell.words(command), *BRIEF, *SHRUNK, *SMALL_IMAGES)
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist")
    assert resolved(folder)["data"]["num_classes"] == 3
    assert load(folder / "checkpoints" / "best.ckpt").classes == tuple(names)


@pytest.mark.slow  # compiled: 6-7 s with inductor's kernels cached
def test_shards_written_from_a_folder_then_streamed(shell):
    """`python -m vit.cli.shards SRC OUT --resize-short-side 256` writes train/, val/, test/ and shards.json, and
    says so; `data=stream data.root=OUT` trains on them with the classes counted from shards.json."""
    write_imagenette(shell.home / "imagenette2-320")
    command = "python -m vit.cli.shards ~/imagenette2-320 ~/imagenette_shards --resize-short-side 256"
    ran = shell.run(shell.words(command))
    assert ran.status == 0, ran.out[-3000:]
    out = shell.home / "imagenette_shards"
    info = json.loads((out / "shards.json").read_text())
    assert info["num_classes"] == len(CLASSES) and info["settings"]["resize_short_side"] == 256
    assert all((out / split).is_dir() for split in ("train", "val", "test"))
    splits = ", ".join(f"{name} {count}" for name, count in info["splits"].items())
    assert f"wrote {out}: {len(CLASSES)} classes; images: {splits}" in ran.out
    assert sum(info["splits"].values()) == sum(CLASSES.values()) + 2 * len(CLASSES)

    command = "python train.py data=stream data.root=$HOME/imagenette_shards model=vit_small_16"
    ran = shell.run(shell.words(command), *BRIEF, *SHRUNK, *SMALL_IMAGES, f"data.cache_dir={shell.home / 'cache'}")
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist")
    assert resolved(folder)["data"]["num_classes"] == len(CLASSES) and results(folder)["test_acc"] is not None


@pytest.mark.slow  # compiled: ~4 s with inductor's kernels cached, ~30 s without (an image folder, as above)
def test_several_labels_per_image_from_a_label_file(shell):
    """docs/training.md's multi-label command on a folder of photos whose label file gives each several classes: the
    run reports mAP and each class's AP, and its checkpoint a threshold for each class."""
    photos, rng = shell.home / "photos", np.random.default_rng(0)
    photos.mkdir()
    rows = ["image,labels,split"]
    tags = ["cat;sky", "dog", "cat;dog;sky", "sky", ""]  # an image of none of the classes is a negative of each
    for split, count in (("train", 12), ("val", 4), ("test", 4)):
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(photos / f"{split}{i}.png")
            rows.append(f"{split}{i}.png,{tags[i % len(tags)]},{split}")
    (photos / "labels.csv").write_text("\n".join(rows) + "\n")
    command = (
        "python train.py data=imagefolder data.root=$HOME/photos data.labels=$HOME/photos/labels.csv "
        "model=vit_small_16 task=multilabel"
    )
    ran = shell.run(shell.words(command), *BRIEF, *SHRUNK, *SMALL_IMAGES)
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist")
    ran_results = results(folder)
    assert 0 < ran_results["test_map"] <= 1 and list(ran_results["test_ap_per_class"]) == ["cat", "dog", "sky"]
    loaded = load(folder / "checkpoints" / "best.ckpt")
    assert loaded.multilabel and len(loaded.thresholds) == 3


def write_photos(home: Path) -> Path:
    """~/photos/: 20 photos (noise, 30x40) in two folders, none of them a class."""
    rng = np.random.default_rng(0)
    for k in range(20):
        (home / "photos" / f"roll{k % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(
            home / "photos" / f"roll{k % 2}/{k}.png"
        )
    return home / "photos"


@pytest.mark.slow  # compiled: ~5 s with inductor's kernels cached (an image folder, as above)
def test_an_image_folder_trains_on_the_classes_of_its_label_file(shell):
    """docs/training.md's label-file command: train.csv names each photo's one class (the file's, sorted); its split
    column keeps four photos for testing."""
    photos = write_photos(shell.home)
    rows = ["image,label,split"] + [
        f"roll{k % 2}/{k}.png,{['owl', 'cat', 'dog'][k % 3]},{'test' if k >= 16 else 'train'}" for k in range(20)
    ]
    (photos / "train.csv").write_text("\n".join(rows) + "\n")
    command = "python train.py data=imagefolder data.root=$HOME/photos data.labels=$HOME/photos/train.csv"
    # the default model's 7-pixel patches: 28-pixel images (SMALL_IMAGES' 32 suit 16-pixel patches)
    ran = shell.run(shell.words(command), *BRIEF, "data.img_size=28", "data.num_workers=0", "data.val_fraction=0.25")
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist")
    assert resolved(folder)["data"]["num_classes"] == 3 and results(folder)["test_acc"] is not None
    assert load(folder / "checkpoints" / "best.ckpt").classes == ("cat", "dog", "owl")
    assert "20 images of 3 classes; train 12, val 4, test 4" in ran.out


def test_shards_are_written_from_a_folder_and_its_label_file_of_several_labels_an_image(shell):
    """docs/training.md's shards command with --labels: tags.jsonl gives each photo a list of classes, some none."""
    photos = write_photos(shell.home)
    tags = [["sky", "cat"], ["dog"], [], ["cat"]]
    lines = [json.dumps({"image": f"roll{k % 2}/{k}.png", "labels": tags[k % 4]}) for k in range(20)]
    (photos / "tags.jsonl").write_text("\n".join(lines) + "\n")
    ran = shell.run(shell.words("python -m vit.cli.shards ~/photos ~/photo_shards --labels ~/photos/tags.jsonl"))
    assert ran.status == 0, ran.out[-3000:]
    info = json.loads((shell.home / "photo_shards" / "shards.json").read_text())
    assert info["multilabel"] is True and info["classes"] == ["cat", "dog", "sky"]
    assert sum(info["splits"].values()) == 20 and set(info["splits"]) == {"train", "val", "test"}


@pytest.mark.slow  # two compiled runs: ~10 s with inductor's kernels cached
def test_mae_pretrains_on_a_folder_without_labels_and_a_labelled_run_fine_tunes_from_it(shell):
    """docs/training.md's two commands without labels: MAE on ~/scans (images at three depths, no classes), then a
    fine-tune of its best checkpoint on a labelled folder, which reads the encoder and leaves the decoder."""
    rng = np.random.default_rng(0)
    for k in range(30):
        folder = shell.home / "scans" / ("" if k % 3 == 0 else f"day{k % 3}/roll")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40 + k, 50, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    images = ["data.img_size=64", "data.num_workers=0"]  # 4x4 patches of 16: four seen, twelve masked
    pretrain = "python train.py task=mae data=images data.root=$HOME/scans model=vit_small_16"
    ran = shell.run(shell.words(pretrain), *BRIEF, *SHRUNK, *images)
    assert ran.status == 0, ran.out[-3000:]
    mae = run_folder(shell.home, "fashion_mnist")
    assert results(mae)["test_loss"] is not None and "30 images, no labels; train 27, val 1, test 2" in ran.out
    for split in ("train", "val"):
        write_image_folder(shell.home / "labelled", {"cat": 4, "dog": 4}, split)
    best = mae / "checkpoints" / "best.ckpt"
    ran = shell.run(shell.words("python -m vit.cli.visualize mae --checkpoint $M --out mae.png", M=str(best)))
    assert ran.status == 0 and "wrote mae.png" in ran.out, ran.out[-3000:]
    assert Image.open(shell.home / "mae.png").format == "PNG"
    finetune = "python train.py data=imagefolder data.root=$HOME/labelled model=vit_small_16 model.pretrained=$M"
    ran = shell.run(shell.words(finetune, M=str(best)), *BRIEF, *images)
    assert ran.status == 0, ran.out[-3000:]
    tuned = max(run_folder(shell.home, "fashion_mnist").parent.iterdir())
    assert tuned != mae and results(tuned)["pretrained_from"]["path"] == str(best)
    state = torch.load(tuned / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    assert "model.head.weight" in state and not any(k.startswith("task.") for k in state)


# --- README.md and docs/finetune.md, docs/interop.md: checkpoints in and out -------------------------------------


@needs_fashion_mnist
def test_predict_export_and_visualize_a_run(shell, default_run):
    """On a run's best.ckpt: predict lists the top 3 classes of shoe.png; the safetensors export scores as the
    checkpoint does, and predict reads it for two images; the attention figure is written."""
    shutil.copy(default_run / "checkpoints" / "best.ckpt", shell.home / "best.ckpt")
    write_images(shell.home)
    checkpoint = load("best.ckpt")  # read once: what each export is compared with
    classes = checkpoint.classes

    ran = shell.run(shell.words("python -m vit.cli.predict --checkpoint best.ckpt shoe.png --top-k 3"))
    assert ran.status == 0, ran.out[-3000:]
    (line,) = [line for line in ran.out.splitlines() if line.startswith("shoe.png: ")]
    listed = top_k(line)
    assert len(listed) == 3 and {name for name, _ in listed} <= set(classes)

    command = "python -m vit.cli.export --checkpoint best.ckpt --format safetensors --out model.safetensors"
    ran = shell.run(shell.words(command))
    assert ran.status == 0 and "wrote model.safetensors" in ran.out, ran.out[-3000:]
    image = checkpoint.preprocess(Image.open("shoe.png"))
    with torch.no_grad():
        expected = checkpoint.logits(image)
        assert torch.equal(load("model.safetensors").logits(image), expected)

    ran = shell.run(shell.words("python -m vit.cli.predict --checkpoint model.safetensors shoe.png cat.jpg --top-k 3"))
    assert ran.status == 0, ran.out[-3000:]
    lines = [line for line in ran.out.splitlines() if line.startswith(("shoe.png: ", "cat.jpg: "))]
    assert [line.split(": ")[0] for line in lines] == ["shoe.png", "cat.jpg"]
    assert top_k(lines[0]) == listed and len(top_k(lines[1])) == 3  # the export predicts as the checkpoint did

    command = "python -m vit.cli.visualize attention --checkpoint best.ckpt --image shoe.png --out attention.png"
    ran = shell.run(shell.words(command))
    assert ran.status == 0 and "wrote attention.png" in ran.out, ran.out[-3000:]
    assert Image.open("attention.png").format == "PNG"

    # docs/deploy.md: the int8 graph and the torch.export program score the image as the checkpoint does
    for command, out in (
        ("python -m vit.cli.export --checkpoint best.ckpt --format onnx --quantize int8 --out model-int8.onnx",
         "model-int8.onnx"),
        ("python -m vit.cli.export --checkpoint best.ckpt --format pt2 --out model.pt2", "model.pt2"),
    ):  # fmt: skip
        ran = shell.run(shell.words(command))
        assert ran.status == 0 and f"wrote {out}" in ran.out, ran.out[-3000:]
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load("model.pt2").module()(image), expected)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession("model-int8.onnx", providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"images": image.numpy()})
    assert logits.argmax() == expected.argmax()


@pytest.mark.slow  # a server process: ~15 s
@needs_fashion_mnist
def test_the_service_answers_as_predict_does(shell, default_run):
    """docs/deploy.md's serve command on a run's best.ckpt: shoe.png sent as the raw body is answered with the classes
    and probabilities predict lists for it; SIGTERM stops the server."""
    import signal

    pytest.importorskip("litserve")
    shutil.copy(default_run / "checkpoints" / "best.ckpt", shell.home / "best.ckpt")
    write_images(shell.home)
    server = shell.start(shell.words("python -m vit.cli.serve --checkpoint best.ckpt"))
    try:
        predictions = _serve_shoe(server)
        expected = top_classes(load("best.ckpt"), Image.open("shoe.png"), top_k=5)
        assert [p["class"] for p in predictions] == [name for name, _ in expected]
        np.testing.assert_allclose([p["probability"] for p in predictions], [p for _, p in expected], atol=1e-5)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def _serve_shoe(server: subprocess.Popen) -> list[dict]:
    """The predictions the service on 127.0.0.1:8000 answers for ~/shoe.png sent as the raw body, once it is up."""
    import urllib.request

    for _ in range(240):  # up to 120 s to start
        assert server.poll() is None, server.stdout.read()[-3000:]
        try:
            with urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=5) as answer:
                if answer.read() == b"ok":
                    break
        except OSError:
            time.sleep(0.5)
    body = (Path.home() / "shoe.png").read_bytes()
    request = urllib.request.Request("http://127.0.0.1:8000/predict", data=body, headers={"Content-Type": "image/png"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["predictions"]


@pytest.mark.slow  # a calibrated export of a Fashion-MNIST run and a server process: ~60 s on two busy cores
@needs_fashion_mnist
def test_a_static_int8_graph_calibrated_on_the_run_predicts_and_serves_in_onnx_runtime(default_run, monkeypatch, capfd):
    """docs/deploy.md's static int8 export of the default run, calibrated on its validation images (found through
    the run folder's config.yaml), then predict and the service in ONNX Runtime on the graph alone: both list the
    class the checkpoint gives in torch first, and the service answers what predict lists."""
    import signal

    pytest.importorskip("onnxruntime")
    pytest.importorskip("litserve")
    home = default_run.parents[2]
    shell = Shell(home, monkeypatch, capfd)
    write_images(home)
    command = (
        "python -m vit.cli.export --checkpoint outputs/fashion_mnist/<date>/checkpoints/best.ckpt --format onnx "
        "--quantize int8-static --calibration-images 512 --out model-int8-static.onnx"
    )
    ran = shell.run(shell.words(command, {"<date>": default_run.name}))
    assert ran.status == 0 and "wrote model-int8-static.onnx" in ran.out, ran.out[-3000:]
    predict = "python -m vit.cli.predict --checkpoint model-int8-static.onnx --runtime onnx shoe.png"
    ran = shell.run(shell.words(predict))
    assert ran.status == 0, ran.out[-3000:]
    (line,) = [line for line in ran.out.splitlines() if line.startswith("shoe.png: ")]
    listed = top_k(line)
    in_torch = top_classes(load(default_run / "checkpoints" / "best.ckpt"), Image.open(home / "shoe.png"), top_k=5)
    assert len(listed) == 5 and listed[0][0] == in_torch[0][0]
    server = shell.start(shell.words("python -m vit.cli.serve --checkpoint model-int8-static.onnx --runtime onnx"))
    try:
        predictions = _serve_shoe(server)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert [(p["class"], round(100 * p["probability"], 1)) for p in predictions] == listed


@needs_fashion_mnist
def test_the_figures_of_the_default_run(default_run, monkeypatch, capfd):
    """docs/figures.md's block in the default run's home, $C its best.ckpt: each figure written, as PNG; the
    attention figure with and without its optional [--layer 2]."""
    home = default_run.parents[2]
    shell = Shell(home, monkeypatch, capfd)
    write_images(home)
    write_timm(home / "vit_base_patch16_224.safetensors", embed_dim=768, num_heads=12)
    (c,) = shell.words("C=outputs/fashion_mnist/<date>/checkpoints/best.ckpt", {"<date>": default_run.name})
    path = c.removeprefix("C=")
    assert (home / path).is_file()
    attention = "python -m vit.cli.visualize attention --checkpoint $C --image shoe.png --out attention.png [--layer 2]"
    write_fashion_mnist(home / "small" / "FashionMNIST" / "raw", train=12, test=40)
    small = [f"data.root={home / 'small'}", "data.val_size=4"]
    figures = [
        ("python -m vit.cli.visualize pos-embed --checkpoint $C --out pos_embed.png", {}, "pos_embed.png"),
        (attention, {"[--layer 2]": "--layer 2"}, "attention.png"),
        (attention, {"[--layer 2]": ""}, "attention.png"),  # [...]: optional
        (
            "python -m vit.cli.visualize attention-distance --checkpoint $C --data fashion_mnist --out distance.png",
            {},
            "distance.png",
        ),
        ("python -m vit.cli.visualize resample --checkpoint $C --img-size 56 --out resampled.png", {}, "resampled.png"),
        # the run's data (data.root: 40 test images, not the 10,000 of Debian's copy, minutes in the run's batches of 4)
        ("python -m vit.cli.visualize confusion --checkpoint $C --out confusion.png", {}, "confusion.png", *small),
        (
            "python -m vit.cli.visualize pos-embed --checkpoint vit_base_patch16_224.safetensors --preset vit_base_16 "
            "--out b16.png",
            {},
            "b16.png",
        ),
    ]
    for command, placeholders, figure, *more in figures:
        ran = shell.run(shell.words(command, placeholders, C=path), *more)
        assert ran.status == 0 and f"wrote {figure}" in ran.out, f"{command}: {ran.out[-3000:]}"
        assert Image.open(home / figure).format == "PNG"
        (home / figure).unlink()


@pytest.mark.slow  # an ONNX export: 3-4 s
def test_a_timm_file_with_a_preset_for_its_heads(shell):
    """A timm state dict named after its architecture, the heads from --preset: predict lists its classes; the ONNX
    export gives timm's logits under onnxruntime."""
    onnxruntime = pytest.importorskip("onnxruntime")
    model = write_timm(shell.home / "vit_small_patch16_224.safetensors", num_classes=4)
    write_images(shell.home)
    command = "python -m vit.cli.predict --checkpoint vit_small_patch16_224.safetensors --preset vit_small_16 cat.jpg"
    ran = shell.run(shell.words(command))
    assert ran.status == 0, ran.out[-3000:]
    (line,) = [line for line in ran.out.splitlines() if line.startswith("cat.jpg: ")]
    assert len(top_k(line)) == 4  # the default top 5, of 4 classes

    command = (
        "python -m vit.cli.export --checkpoint vit_small_patch16_224.safetensors --preset vit_small_16 --format onnx "
        "--out m.onnx"
    )
    ran = shell.run(shell.words(command))
    assert ran.status == 0 and "wrote m.onnx" in ran.out, ran.out[-3000:]
    session = onnxruntime.InferenceSession("m.onnx", providers=["CPUExecutionProvider"])
    images = torch.randn(2, 3, 224, 224)
    (logits,) = session.run(["logits"], {"images": images.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(logits, model(images).numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # three runs: 2-4 s
def test_fine_tuning_a_cifar100_run(shell):
    """A run of experiment=cifar100 fine-tuned on CIFAR-10 by the path docs/finetune.md gives (outputs/cifar100/<date>/
    ...) and as the README's CHECKPOINT: a new 10-class head on the run's network."""
    write_cifar(shell.home / "data", "cifar-10")
    write_cifar(shell.home / "data", "cifar-100")
    device = [] if torch.cuda.is_available() else ["trainer=cpu"]
    brief = [*device, *BRIEF, "data.val_size=10"]
    pretrain = ["python", "train.py", "experiment=cifar100", *SHRUNK]  # the README's "also cifar100"
    assert shell.run(pretrain, *brief).status == 0
    pretrained = run_folder(shell.home, "cifar100")
    for command, placeholders in [
        (
            "python train.py experiment=finetune_cifar10 "
            "model.pretrained=outputs/cifar100/<date>/checkpoints/best.ckpt",
            {"<date>": pretrained.name},
        ),
        (
            "python train.py experiment=finetune_cifar10 model.pretrained=CHECKPOINT",
            {"CHECKPOINT": str(pretrained / "checkpoints" / "best.ckpt")},
        ),
    ]:
        ran = shell.run(shell.words(command, placeholders), *brief)
        assert ran.status == 0, ran.out[-3000:]
        folder = run_folder(shell.home, "finetune_cifar10")
        tuned = load(folder / "checkpoints" / "best.ckpt").config
        assert (tuned.num_classes, tuned.embed_dim, tuned.depth) == (10, 32, 1)  # the run's network, a new head


@pytest.mark.slow  # three runs, 224-px ViT-S layers: 2-7 s
def test_fine_tuning_timm_and_hugging_face_weights_on_an_image_folder(shell):
    """experiment=finetune_imagefolder from a timm file (named after its architecture, or with model=vit_small_16
    for its heads) and from a Hugging Face save_pretrained folder: the file's network, the folder's classes."""
    transformers = pytest.importorskip("transformers")
    write_imagenette(shell.home / "imagenette2-320")
    write_timm(shell.home / "vit_small_patch16_224.safetensors")
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8
    )
    transformers.ViTForImageClassification(config).save_pretrained(shell.home / "path" / "to" / "hf_vit_folder")
    root = "data.root=$HOME/imagenette2-320"
    device = [] if torch.cuda.is_available() else ["trainer=cpu"]
    cases = [
        (
            "python train.py experiment=finetune_imagefolder model.pretrained=vit_small_patch16_224.safetensors "
            "data.root=$HOME/imagenette2-320",
            {},
            384,
        ),
        (
            "python train.py experiment=finetune_imagefolder model.pretrained=vit_small_patch16_224.safetensors ...",
            {"...": f"{root} model=vit_small_16"},  # the file is named after its architecture: the preset adds nothing
            384,
        ),
        (
            "python train.py experiment=finetune_imagefolder model.pretrained=path/to/hf_vit_folder ...",
            {"...": root},
            64,
        ),
    ]
    for command, placeholders, width in cases:
        ran = shell.run(shell.words(command, placeholders), *device, *BRIEF, *SMALL_IMAGES)
        assert ran.status == 0, ran.out[-3000:]
        folder = run_folder(shell.home, "finetune_imagefolder")
        tuned = load(folder / "checkpoints" / "best.ckpt")
        assert (tuned.config.embed_dim, tuned.config.depth, tuned.classes) == (width, 1, tuple(sorted(CLASSES)))


@pytest.mark.slow  # 224-px images: 1-3 s
def test_an_imagenet_checkpoint_fine_tuned_on_cifar_at_224(shell):
    """CIFAR's 32-px images resized to 224 for a ViT-S/16 file: the run's model is the file's, at 224."""
    write_cifar(shell.home / "data")
    write_timm(shell.home / "vit_small.safetensors")
    device = [] if torch.cuda.is_available() else ["trainer=cpu"]
    command = (
        "python train.py experiment=finetune_cifar10 model=vit_small_16 data.img_size=224 "
        "model.pretrained=vit_small.safetensors"
    )
    ran = shell.run(shell.words(command), *device, *BRIEF, "data.val_size=10")
    assert ran.status == 0, ran.out[-3000:]
    tuned = load(run_folder(shell.home, "finetune_cifar10") / "checkpoints" / "best.ckpt").config
    assert (tuned.img_size, tuned.patch_size, tuned.embed_dim, tuned.num_classes) == ((224, 224), (16, 16), 384, 10)


@pytest.mark.slow  # peft's LoRA layers: 1-4 s
def test_lora_on_a_model_named_on_the_hub(shell, hub_cache):
    """LoRA on a timm repo named as the hub names it, read from huggingface_hub's cache (offline: what a second run
    does): the adapters and the head learn, the run records which repo and commit it started from, and the
    checkpoint loads as a plain ViT of the repo's network."""
    repo = "timm/vit_small_patch14_dinov2.lvd142m"
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, depth=1, img_size=28, num_classes=0)
    timm.models.save_for_hf(model, str(shell.home / "repo"), safe_serialization=True)
    test_hub.cache_repo(hub_cache, repo, shell.home / "repo")
    write_imagenette(shell.home / "pets")
    command = (
        "python train.py experiment=finetune_imagefolder data.root=$HOME/pets "
        "model.pretrained=hf-hub:timm/vit_small_patch14_dinov2.lvd142m finetune=lora"
    )
    device = [] if torch.cuda.is_available() else ["trainer=cpu"]
    ran = shell.run(shell.words(command), *device, *BRIEF, "data.img_size=28", "data.num_workers=0")
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "finetune_imagefolder")
    facts = results(folder)
    assert facts["pretrained_from"]["repo"] == repo and facts["pretrained_from"]["revision"] == test_hub.COMMIT
    assert 0 < facts["trainable_params"] < facts["params"] / 2
    tuned = load(folder / "checkpoints" / "best.ckpt")
    assert (tuned.config.embed_dim, tuned.config.depth, tuned.classes) == (384, 1, tuple(sorted(CLASSES)))


@pytest.mark.slow  # two compiled Fashion-MNIST runs: ~25 s with inductor's kernels cached, ~80 s without
@needs_fashion_mnist
def test_pretrain_on_some_classes_fine_tune_on_the_others(shell):
    """Six Fashion-MNIST classes, then the other four at 42 px from that run's best.ckpt: a 4-class head, a 6x6
    grid, the four classes' names."""
    ran = shell.run(shell.words("python train.py data.class_subset=[0,1,2,3,4,5]"), *BRIEF)
    assert ran.status == 0, ran.out[-3000:]
    pretrained = run_folder(shell.home, "fashion_mnist")
    assert load(pretrained / "checkpoints" / "best.ckpt").config.num_classes == 6
    command = "python train.py data.class_subset=[6,7,8,9] data.img_size=42 model.pretrained=outputs/.../best.ckpt"
    path = {"...": f"fashion_mnist/{pretrained.name}/checkpoints"}
    ran = shell.run(shell.words(command, path), *BRIEF)
    assert ran.status == 0, ran.out[-3000:]
    tuned = load(run_folder(shell.home, "fashion_mnist") / "checkpoints" / "best.ckpt")
    assert (tuned.config.num_classes, tuned.config.img_size, tuned.config.grid_size) == (4, (42, 42), (6, 6))
    assert tuned.classes == ("Shirt", "Sneaker", "Bag", "Ankle boot")


# --- the python blocks -------------------------------------------------------------------------------------------


def _readme_block(namespace, home, default_run):
    loaded = namespace["loaded"]
    assert namespace["model"].config == preset_config("vit_small_16", num_classes=10, pos_embed="sincos2d")
    assert loaded.model.config == load(default_run / "checkpoints" / "best.ckpt").config
    write_images(home)
    assert loaded.preprocess(Image.open(home / "shoe.png")).shape == (1, 1, 28, 28)


def _model_block(namespace, home, default_run):
    assert namespace["logits"].shape == (2, 10)
    assert namespace["tokens"].shape == (2, 1 + 14 * 14, 384)
    maps = namespace["maps"]
    assert len(maps) == 12 and maps[0].shape == (2, 6, 197, 197)
    torch.testing.assert_close(maps[-1].sum(-1), torch.ones(2, 6, 197))
    assert namespace["model"].config.img_size == (32, 48)


def _interop_block(namespace, home, default_run):
    model = namespace["timm_model"]
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(namespace["loaded"].model(images), model(images), atol=1e-5, rtol=1e-5)


BLOCK_CHECKS = {"README.md": _readme_block, "docs/model.md": _model_block, "docs/interop.md": _interop_block}


@pytest.mark.parametrize(
    "doc", [pytest.param(doc, marks=needs_fashion_mnist) if doc == "README.md" else doc for doc in BLOCK_CHECKS]
)
def test_each_python_block_runs_as_written(doc, tmp_path, monkeypatch, request):
    """Each doc's python block, executed as written in a folder holding the files it names; then what it promises:
    the preset's config, shapes and normalised attention rows, timm's logits, a checkpoint's model."""
    assert sorted(python_blocks()) == sorted(BLOCK_CHECKS), "a doc gained or lost a python block"
    monkeypatch.chdir(tmp_path)
    namespace, default_run = {}, None
    if doc == "README.md":
        default_run = request.getfixturevalue("default_run")
        shutil.copy(default_run / "checkpoints" / "best.ckpt", tmp_path / "best.ckpt")
    if doc == "docs/interop.md":
        namespace["timm_model"] = write_timm(tmp_path / "vit_small_patch16_224.safetensors")
    with torch.no_grad():
        exec(compile(python_blocks()[doc], doc, "exec"), namespace)
    BLOCK_CHECKS[doc](namespace, tmp_path, default_run)


# --- processes: make, DDP, torchrun, srun (slow) -------------------------------------------------------------------


def _make(target: str, *assignments: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`make TARGET` in the repository root, with the .venv this suite runs in taken as built (-o: its stamp is
    older than a pyproject.toml edited since, and rebuilding would reach the package index)."""
    return subprocess.run(
        ["make", "-o", ".venv/.installed", target, *assignments],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow  # a compiled train.py process started by make: 12-16 s with inductor's kernels cached, ~55 s without
@needs_fashion_mnist
def test_make_train_trains_the_default_run(shell):
    (make, target) = shell.words("make train")
    assert make == "make"
    folder = shell.home / "run"  # and the Debian copy of Fashion-MNIST unpacked into HOME, not the repository
    args = [*BRIEF, f"data.root={shell.home}", f"hydra.run.dir={folder}"]
    brief_only(args)
    done = _make(target, "ARGS=" + shlex.join(args))
    assert done.returncode == 0, done.stderr[-3000:]
    assert resolved(folder)["data"]["_target_"].endswith("FashionMNISTDataModule")
    assert results(folder)["test_acc"] is not None


@pytest.mark.slow  # pytest started by make: ~5 s
@needs_fashion_mnist
def test_make_test_runs_the_suite(shell):
    """`make test`, on one small file of the suite (PYTEST_ARGS; the whole suite is what runs this test), in one
    process per core (pytest-xdist, a dev dependency)."""
    (make, target) = shell.words("make test")
    assert make == "make"
    done = _make(target, "PYTEST_ARGS=-p no:cacheprovider tests/test_docs.py")
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"\d+ passed", done.stdout) and re.search(r"\d+ workers \[\d+ items\]", done.stdout)


@pytest.mark.slow  # two DDP processes of train.py: 11-14 s
def test_ddp_on_this_machine(shell):
    """Lightning starts the processes itself: two CPU processes for four GPUs; each validation image counted once."""
    write_cifar(shell.home / "data")
    words = shell.words(
        "python train.py experiment=cifar10 trainer=ddp trainer.devices=4",
        local={"trainer.devices=4": ["trainer.devices=2", *CPU_PROCESSES]},
    )
    finish([shell.start(words, *BRIEF, *SHRUNK, "data.val_size=10", "trainer.limit_val_batches=null")])
    folder = run_folder(shell.home, "cifar10")
    assert results(folder)["val_samples"] == 10


def _slurm_job_id() -> str:
    """A SLURM job id whose port (Lightning's: 15000 + its last four digits) is free here."""
    for port in range(15000 + os.getpid() % 9000, 25000):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return str(port - 15000).zfill(4)
    raise AssertionError("no free port for a SLURM job id")


def srun(shell: Shell, words: list[str], *more: str, nodes: int = 2, tasks_per_node: int = 1) -> str:
    """SLURM's srun on this machine: `--nodes` x `--ntasks-per-node` copies of the command (else the allocation's
    shape, `nodes` x `tasks_per_node`), each with the variables srun gives a task; their outputs."""
    assert words[0] == "srun"
    command = words[1:]
    while command[0].startswith("--"):
        option, value, *command = command
        assert option in ("--nodes", "--ntasks-per-node"), f"srun {option}: not an option the docs use"
        nodes, tasks_per_node = (int(value), tasks_per_node) if option == "--nodes" else (nodes, int(value))
    allocation = {
        "SLURM_JOB_ID": _slurm_job_id(),
        "SLURM_JOB_NAME": "train",
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS": str(nodes * tasks_per_node),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_NODELIST": "127.0.0.1",
    }
    tasks = [
        shell.start(command, *more, env={
            **allocation,
            "SLURM_PROCID": str(node * tasks_per_node + local),
            "SLURM_LOCALID": str(local),
            "SLURM_NODEID": str(node),
        })
        for node in range(nodes)
        for local in range(tasks_per_node)
    ]  # fmt: skip
    return finish(tasks)


def torchrun_two_nodes(shell: Shell, words: list[str], *more: str) -> str:
    """The torchrun command started twice, as its two nodes would start it, on this machine; their outputs."""
    nodes = [shell.start(words, *more) for _ in range(2)]
    return finish(nodes)


@pytest.mark.slow  # two torchrun agents and their compiled train.py processes, an S3 server: 25-40 s
def test_two_nodes_stream_shards_from_s3_under_torchrun(shell, shards, s3):
    """docs/training.md's torchrun command, its bucket on a local S3 server: one run folder, each training image once
    an epoch across the two nodes."""
    test_stream._upload(shards, s3, "bucket", "imagenette_shards")
    words = shell.words(
        "torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 train.py data=stream "
        "data.root=s3://bucket/imagenette_shards trainer=ddp trainer.devices=4 trainer.num_nodes=2 "
        "hydra.run.dir=outputs/run1",
        local={
            "4": ["1"],  # --nproc-per-node: one CPU process a node
            "HOST:29500": [f"127.0.0.1:{test_stream._free_port()}"],
            "trainer.devices=4": ["trainer.devices=1", *CPU_PROCESSES],
        },
    )
    witness = f"+callbacks.witness={{_target_: tests.reliability.faults.RecordLabels, folder: {shell.home / 'seen'}}}"
    outputs = torchrun_two_nodes(
        shell,
        words,
        f"+data.storage_options.endpoint_url={s3}",
        f"data.cache_dir={shell.home / 'cache'}",
        *STREAM_RUN,
        "trainer.max_epochs=2",
        "data.batch_size=2",
        witness,
    )
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs
    test_stream._each_image_once_an_epoch_on_two_ranks(shards, shell.home / "seen")
    assert results(shell.home / "outputs" / "run1")["epochs"] == 2


@pytest.mark.slow  # two compiled train.py processes started as srun's tasks: 20-65 s
def test_two_nodes_stream_shards_under_srun(shell, shards):
    words = shell.words(
        "srun --nodes 2 --ntasks-per-node 4 python train.py data=stream data.root=/shared/imagenette_shards "
        "trainer=ddp trainer.devices=4 trainer.num_nodes=2 hydra.run.dir=outputs/run1",
        local={
            "4": ["1"],  # --ntasks-per-node: one CPU process a node
            "data.root=/shared/imagenette_shards": [f"data.root={shards}"],
            "trainer.devices=4": ["trainer.devices=1", *CPU_PROCESSES],
        },
    )
    witness = f"+callbacks.witness={{_target_: tests.reliability.faults.RecordLabels, folder: {shell.home / 'seen'}}}"
    more = STREAM_RUN
    outputs = srun(shell, words, *more, "trainer.max_epochs=2", "data.batch_size=2", witness)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs
    test_stream._each_image_once_an_epoch_on_two_ranks(shards, shell.home / "seen")
    assert results(shell.home / "outputs" / "run1")["epochs"] == 2


@pytest.mark.slow  # two torchrun agents, then two srun tasks, of train.py: 12-30 s
def test_imagenette_on_two_nodes_under_torchrun_and_srun(shell):
    """docs/training.md's cluster commands for Imagenette: under torchrun ($HEAD, the first node) and srun (the
    allocation's two nodes), one run folder of the two nodes' run."""
    write_imagenette(shell.home / "imagenette2-320")
    shared = {
        "data.root=/shared/imagenette2-320": [f"data.root={shell.home / 'imagenette2-320'}"],
        "trainer.devices=8": ["trainer.devices=1", *CPU_PROCESSES],
    }
    more = [*BRIEF, *SHRUNK, *SMALL_IMAGES, "data.val_fraction=0.25"]  # 6 images held out: 3 a node
    torchrun = shell.words(
        "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$HEAD:29500 train.py "
        "experiment=imagenette data.root=/shared/imagenette2-320 trainer=ddp trainer.num_nodes=2 trainer.devices=8 "
        "hydra.run.dir=outputs/run1",
        {"29500": str(test_stream._free_port())},
        local={**shared, "--nproc_per_node=8": ["--nproc_per_node=1"]},
        HEAD="127.0.0.1",
    )
    outputs = torchrun_two_nodes(shell, torchrun, *more)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs
    assert results(shell.home / "outputs" / "run1")["test_acc"] is not None
    shutil.rmtree(shell.home / "outputs" / "run1")

    words = shell.words(
        "srun python train.py experiment=imagenette data.root=/shared/imagenette2-320 trainer=ddp trainer.num_nodes=2 "
        "trainer.devices=8 hydra.run.dir=outputs/run1",
        local=shared,
    )
    outputs = srun(shell, words, *more)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs
    assert results(shell.home / "outputs" / "run1")["test_acc"] is not None


@pytest.mark.slow  # two FSDP processes, two torchrun agents, two srun tasks of compiled train.py: 60-130 s
def test_sharded_training_on_this_machine_and_two_nodes_then_one_file(shell):
    """docs/training.md's trainer=fsdp commands: Lightning's two processes on this machine; two nodes under torchrun
    and srun writing one run folder of shards; the command that makes one file of them, which the loader reads."""
    write_imagenette(shell.home / "imagenet100")
    small = [*BRIEF, *SHRUNK, *SMALL_IMAGES, "data.val_fraction=0.25"]  # 6 images held out: 3 a process
    words = shell.words(
        "python train.py model=vit_large_16 trainer=fsdp trainer.devices=8 data=imagefolder "
        "data.root=$HOME/imagenet100",
        local={"trainer.devices=8": ["trainer.devices=2", "trainer.accelerator=cpu"]},
    )
    outputs = finish([shell.start(words, *small)])
    assert "rank 1 holds" in outputs
    assert (run_folder(shell.home, "fashion_mnist") / "checkpoints" / "last.ckpt" / "__1_0.distcp").is_file()

    shared = {
        "data.root=/shared/imagenet100": [f"data.root={shell.home / 'imagenet100'}"],
        "trainer.devices=8": ["trainer.devices=1", "trainer.accelerator=cpu"],
        "model=vit_huge_14": ["model=vit_huge_14", "model.patch_size=16"],  # 2x2 patches of the 32-px images
    }
    torchrun = shell.words(
        "torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$HEAD:29500 train.py "
        "model=vit_huge_14 trainer=fsdp trainer.num_nodes=2 trainer.devices=8 data=imagefolder "
        "data.root=/shared/imagenet100 hydra.run.dir=outputs/run1",
        {"29500": str(test_stream._free_port())},
        local={**shared, "--nproc_per_node=8": ["--nproc_per_node=1"]},
        HEAD="127.0.0.1",
    )
    outputs = torchrun_two_nodes(shell, torchrun, *small)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs and "rank 1 holds" in outputs
    shutil.rmtree(shell.home / "outputs" / "run1")
    words = shell.words(
        "srun python train.py model=vit_huge_14 trainer=fsdp trainer.num_nodes=2 trainer.devices=8 data=imagefolder "
        "data.root=/shared/imagenet100 hydra.run.dir=outputs/run1",
        local=shared,
    )
    outputs = srun(shell, words, *small)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs
    assert (shell.home / "outputs" / "run1" / "checkpoints" / "best.ckpt" / "__1_0.distcp").is_file()

    ran = shell.run(
        shell.words("python -m vit.cli.consolidate outputs/run1/checkpoints/best.ckpt --out vit_huge_14.ckpt")
    )
    assert ran.status == 0, ran.out[-3000:]
    loaded = load(shell.home / "vit_huge_14.ckpt")
    assert loaded.config.patch_size == (16, 16) and loaded.classes == tuple(sorted(CLASSES))


def test_images_at_their_own_aspect_ratio(shell):
    """docs/training.md's NaFlex command on a folder of images of five aspect ratios."""
    test_naflex.write_folder(shell.home / "documents")
    words = shell.words(
        "python train.py data=imagefolder data.root=$HOME/documents model=vit_small_16 data.max_tokens=256",
        local={"data.max_tokens=256": ["data.max_tokens=16", "model.patch_size=8"]},
    )
    ran = shell.run(words, *BRIEF, *SHRUNK, *SMALL_IMAGES)
    assert ran.status == 0, ran.out[-3000:]
    folder = run_folder(shell.home, "fashion_mnist")
    assert resolved(folder)["data"]["max_tokens"] == 16 and results(folder)["test_acc"] is not None
