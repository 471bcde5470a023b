"""Interrupted runs continue exactly: a run stopped by a signal mid-epoch or at an epoch's end and resumed
from its checkpoint ends with the same weights, bit for bit, as the run that was never stopped."""

import signal

import pytest
import torch

from tests.helpers import tiny_run
from vit.resume import LAST, resume_path
from vit.training import train

# Everything random switched on: shuffling, dropout, drop path, Mixup/CutMix, crops and flips; and EMA.
RANDOM = [
    "trainer.max_epochs=3",
    "model.dropout=0.1",
    "model.drop_path=0.1",
    "+mixup={mixup_alpha: 0.8, cutmix_alpha: 1.0, switch_prob: 0.5}",
    "data.crop_padding=2",
    "data.flip=true",
    "ema_decay=0.9",
    "callbacks.pos_embed_figure=null",
]
STEPS_PER_EPOCH = (512 - 64) // 64  # synthetic: 512 images, 64 held out; batches of 64 (experiment=fashion_mnist)


def _weights(path):
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    train(tiny_run(out, *RANDOM))
    return out / "checkpoints" / LAST


@pytest.mark.parametrize(
    "step", [STEPS_PER_EPOCH + 3, STEPS_PER_EPOCH - 1], ids=["mid-epoch", "last-batch-of-an-epoch"]
)
def test_a_run_stopped_by_sigterm_and_resumed_ends_bit_identical(uninterrupted, tmp_path, step):
    stop = [f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: {step}}}"]
    with pytest.raises(SystemExit) as stopped:
        train(tiny_run(tmp_path / "runs" / "1", *RANDOM, *stop))
    assert stopped.value.code == 128 + signal.SIGTERM
    saved = torch.load(tmp_path / "runs" / "1" / "checkpoints" / LAST, weights_only=True)
    assert saved["global_step"] == step + 1  # the step under way when the signal came was finished
    results = train(tiny_run(tmp_path / "runs" / "2", *RANDOM, *stop, "resume=auto"))  # the same command
    assert results["resumed_from"] == str(tmp_path / "runs" / "1" / "checkpoints" / LAST)
    assert results["global_steps"] == 3 * STEPS_PER_EPOCH
    expected, got = _weights(uninterrupted), _weights(tmp_path / "runs" / "2" / "checkpoints" / LAST)
    assert expected.keys() == got.keys()
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"differ after resuming: {different}"


def test_sigusr1_stops_the_same_way_for_slurm(tmp_path):
    stop = [f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: 3, signum: {int(signal.SIGUSR1)}}}"]
    with pytest.raises(SystemExit) as stopped:
        train(tiny_run(tmp_path, "trainer.max_epochs=1", *stop))
    assert stopped.value.code == 128 + signal.SIGUSR1
    assert (tmp_path / "checkpoints" / LAST).is_file()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler is gone with the run


def test_asking_to_resume_without_a_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"resume=auto: no earlier run to continue: no .*last\.ckpt"):
        train(tiny_run(tmp_path / "runs" / "1", "resume=auto"))
    with pytest.raises(FileNotFoundError, match=r"resume=.*nowhere: no checkpoint at"):
        train(tiny_run(tmp_path / "runs" / "1", f"resume={tmp_path / 'nowhere'}"))


def test_same_seed_same_run_and_another_seed_another(tmp_path):
    def run(name, seed):
        short = ["trainer.max_epochs=1", "trainer.limit_train_batches=3", "callbacks.pos_embed_figure=null"]
        try:
            results = train(tiny_run(tmp_path / name, *short, "trainer.deterministic=true", f"seed={seed}"))
        finally:
            torch.use_deterministic_algorithms(False)  # Lightning sets it for the whole process
        return results, _weights(tmp_path / name / "checkpoints" / LAST)

    (a, wa), (b, wb), (_, wc) = run("a", 1), run("b", 1), run("c", 2)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (a["test_acc"], a["best_val_acc"]) == (b["test_acc"], b["best_val_acc"])
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_resume_auto_skips_runs_of_another_config_and_says_so(tmp_path):
    short = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "callbacks.pos_embed_figure=null"]
    train(tiny_run(tmp_path / "runs" / "1", *short, "optim.lr=0.002"))
    with pytest.raises(FileNotFoundError, match=r"another config, e\.g\. .*runs/1 differs in optim\.lr"):
        train(tiny_run(tmp_path / "runs" / "2", *short, "optim.lr=0.001", "resume=auto"))
    results = train(tiny_run(tmp_path / "runs" / "3", *short, "optim.lr=0.002", "resume=auto"))
    assert results["resumed_from"] == str(tmp_path / "runs" / "1" / "checkpoints" / LAST)


def test_resume_auto_finds_a_sweep_job_whose_folder_name_holds_brackets(tmp_path):
    job = "0_data.class_subset=[0,1,2],data.num_classes=3"  # Hydra's job folder name for a list override
    earlier = tmp_path / "2024-01-01_00-00-00" / job / "checkpoints" / LAST
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"a checkpoint")
    assert resume_path("auto", tmp_path / "2024-01-02_00-00-00" / job, multirun=True) == earlier
