"""Checkpoints survive failed writes and kills, hold nothing that unpickles to code, and a bad one is refused
by every command that reads one, naming it."""

import errno
import multiprocessing
import os
import pickle
import random
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_run, write_image_folder
from vit.checkpoint import CheckpointError, read
from vit.cli import export, predict, visualize
from vit.training.checkpoint_io import AtomicCheckpointIO
from vit.training.run import train
from vit.training.run_folder import LAST

SHORT = ["trainer.max_epochs=2", "callbacks.pos_embed_figure=null"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    train(tiny_run(out, "trainer.max_epochs=1", "ema_decay=0.9"))
    return out / "checkpoints" / LAST


def test_our_checkpoints_need_no_unsafe_globals(run):
    assert torch.serialization.get_unsafe_globals_in_checkpoint(run) == []
    assert read(run)["hyper_parameters"]["model"]["embed_dim"] == 32


def test_a_failed_save_stops_the_run_naming_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    saves = []

    def save(obj, path):  # the third save (epoch 2's best.ckpt or last.ckpt) finds the disk full
        saves.append(path)
        if len(saves) == 3:
            Path(path).write_bytes(b"half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        original(obj, path)

    original = torch.save
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(CheckpointError, match=r"could not be written \(OSError: .*No space left on device.*intact"):
        train(tiny_run(tmp_path, *SHORT))
    monkeypatch.undo()
    previous = read(tmp_path / "checkpoints" / LAST)  # epoch 1's, whole
    assert previous["epoch"] == 0
    assert not list((tmp_path / "checkpoints").glob(".*partial"))


def test_non_finite_weights_are_never_written(tmp_path):
    path = tmp_path / "nan.ckpt"
    with pytest.raises(CheckpointError, match=r"nan\.ckpt: not written: non-finite values in model\.w"):
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"model.w": torch.tensor([1.0, float("nan")])}}, path)
    assert not path.exists()


SIZE = 10_000_000  # 40 MB: a write takes long enough for kills to land in it


def _write_forever(path: Path, ready) -> None:
    io, n = AtomicCheckpointIO(), 0
    while True:
        n += 1
        io.save_checkpoint({"state_dict": {"w": torch.full((SIZE,), float(n))}, "n": n}, path)
        ready.set()  # from the first complete checkpoint on, there is one to lose


def _await_mid_write(path: Path, pid: int, fraction: float, timeout: float = 60.0) -> None:
    """Return once process `pid`'s temporary file for `path` holds `fraction` of a checkpoint (or was renamed
    into place meanwhile); fail after `timeout` s without one, as a writer that writes in place would."""
    target, started, deadline = fraction * path.stat().st_size, False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            size = next(path.parent.glob(f".{path.name}.*.{pid}-*.partial")).stat().st_size
        except (StopIteration, FileNotFoundError):  # not begun yet, or just renamed into place
            if started:
                return
            continue
        started = True
        if size >= target:
            return
    raise AssertionError(f"process {pid} wrote no temporary file for {path} in {timeout:.0f} s")


@pytest.mark.slow  # kills a writer process at many moments: ~14 s
def test_killing_the_writer_at_any_moment_leaves_a_whole_checkpoint(tmp_path):
    # children fork from a server that imported the writer once and never ran a thread pool: fast and fork-safe
    fork = multiprocessing.get_context("forkserver")
    fork.set_forkserver_preload([__name__])
    path, rng, mid_write = tmp_path / LAST, random.Random(0), 0
    seen: set[Path] = set()
    for i in range(8):
        ready = fork.Event()
        writer = fork.Process(target=_write_forever, args=(path, ready))
        writer.start()
        assert ready.wait(timeout=60)
        if i % 2:  # any moment: where a write spends its time (data, file fsync, folder fsync) varies by disk
            time.sleep(rng.uniform(0.0, 0.3))
        else:  # surely mid-write: once this writer's temporary file holds a random fraction of a checkpoint
            _await_mid_write(path, writer.pid, rng.uniform(0.0, 1.0))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        partials = set(path.parent.glob(f".{path.name}.*.partial"))  # each writer's temporary file is its own
        mid_write += len(partials - seen)  # this one was killed while writing the next checkpoint
        seen |= partials
        contents = read(path)
        assert torch.equal(contents["state_dict"]["w"], torch.full((SIZE,), float(contents["n"])))
    assert mid_write > 0  # some kills did land in the middle of a write
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(SIZE)}, "n": 0}, path)
    assert not list(path.parent.glob(f".{path.name}.*.partial"))  # the killed writers' files are gone


class Payload:
    def __reduce__(self):
        return (exec, ("import pathlib, os; pathlib.Path(os.environ['VIT_PWNED']).touch()",))


@pytest.fixture
def bad_files(run, tmp_path, monkeypatch):
    """evil.ckpt: a checkpoint carrying a pickled payload that would create a marker file; broken.ckpt: truncated;
    cut.ckpt: its first 5000 bytes (torch's zip reader says EINVAL, once read as a disk fault); random.ckpt: random
    bytes; nan.ckpt: a whole checkpoint with a NaN in the head."""
    monkeypatch.setenv("VIT_PWNED", str(tmp_path / "ran"))
    contents = torch.load(run, weights_only=True)
    contents["hyper_parameters"]["extra"] = Payload()
    torch.save(contents, tmp_path / "evil.ckpt")
    data = run.read_bytes()
    (tmp_path / "broken.ckpt").write_bytes(data[: len(data) // 2])
    (tmp_path / "cut.ckpt").write_bytes(data[:5000])
    (tmp_path / "random.ckpt").write_bytes(random.Random(0).randbytes(4096))
    contents = torch.load(run, weights_only=True)
    contents["state_dict"]["model.head.weight"][1, 2] = float("nan")
    torch.save(contents, tmp_path / "nan.ckpt")
    return tmp_path


def _image(folder):
    write_image_folder(folder / "images", {"a": 1}, "x")
    return str(next((folder / "images").rglob("*.png")))


READERS = {
    "resume": lambda path, tmp: train(tiny_run(tmp / "resumed", f"resume={path}")),
    "fine-tune": lambda path, tmp: train(tiny_run(tmp / "finetuned", f"model.pretrained={path}")),
    "visualize": lambda path, tmp: visualize.main(
        ["pos-embed", "--checkpoint", str(path), "--out", str(tmp / "a.png")]
    ),
    "export": lambda path, tmp: export.main(
        ["--checkpoint", str(path), "--format", "safetensors", "--out", str(tmp / "m.safetensors")]
    ),
    "predict": lambda path, tmp: predict.main(["--checkpoint", str(path), _image(tmp)]),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("name", ["evil.ckpt", "broken.ckpt", "cut.ckpt"])
def test_every_reader_refuses_a_bad_checkpoint_naming_it_and_runs_nothing(bad_files, reader, name):
    with pytest.raises((CheckpointError, SystemExit)) as refused:
        READERS[reader](bad_files / name, bad_files)
    message = str(refused.value)
    assert name in message and ("refused" in message or "not a readable checkpoint" in message), message
    assert not (bad_files / "ran").exists()
    assert not (bad_files / "resumed").exists() and not (bad_files / "finetuned" / "checkpoints").exists()


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("nan.ckpt", r"non-finite values \(NaN or infinity\) in model\.head\.weight|in head\.weight"),
        ("random.ckpt", r"not a readable checkpoint \(truncated, corrupt, or another kind of file\)$"),
    ],
)
def test_every_reader_names_nan_weights_and_random_bytes_for_what_they_are(bad_files, reader, name, says):
    with pytest.raises((CheckpointError, SystemExit)) as refused:
        READERS[reader](bad_files / name, bad_files)
    message = str(refused.value)
    assert name in message and re.search(says, message), message
    assert "weights_only" not in message and "run code" not in message  # neither torch's advice nor a false alarm


def test_a_bare_pickle_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_PWNED", str(tmp_path / "ran"))
    with open(tmp_path / "evil.ckpt", "wb") as f:
        pickle.dump(Payload(), f, protocol=2)
    with pytest.raises(CheckpointError, match=r"evil\.ckpt"):
        train(tiny_run(tmp_path / "run", f"resume={tmp_path / 'evil.ckpt'}"))
    assert not (tmp_path / "ran").exists()


def test_resuming_a_checkpoint_of_another_model_names_the_file_and_the_settings_that_differ(run, tmp_path):
    cfg = tiny_run(tmp_path / "wider", f"resume={run}", "model.embed_dim=64", "model.depth=3")
    with pytest.raises(CheckpointError) as refused:
        train(cfg)
    assert str(refused.value) == (
        f"{run}: a checkpoint of another model, so it cannot be resumed: "
        "model.embed_dim is 32 there, 64 here, model.depth is 2 there, 3 here"
    )
    assert not (tmp_path / "wider" / "checkpoints").exists()  # refused before any training
    # regularisation may change between a run and its continuation
    train(tiny_run(tmp_path / "more_drop", f"resume={run}", "model.drop_path=0.1", "trainer.max_epochs=2"))


def test_resuming_with_another_optimizer_names_both(run, tmp_path):
    """Muon's state (momentum of the layers' matrices) and AdamW's (two moments of every parameter) do not map onto
    each other: torch would stop on 'a different number of parameter groups', with a traceback."""
    with pytest.raises(CheckpointError) as refused:
        train(tiny_run(tmp_path / "other", f"resume={run}", "optim.optimizer=adamw"))
    assert str(refused.value) == (
        f"{run}: trained with optim.optimizer=muon, whose state cannot continue as optim.optimizer=adamw: resume "
        "with optim.optimizer=muon, or start from its weights with model.pretrained"
    )
