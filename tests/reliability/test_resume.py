"""Interrupted runs continue exactly: a run stopped by a signal mid-epoch or at an epoch's end and resumed
from its checkpoint ends with the same weights, bit for bit, the same logged epoch means, and the same best
checkpoint, score and test accuracy as the run that was never stopped."""

import csv
import os
import signal

import pytest
import torch

from tests.helpers import tiny_run
from tests.reliability.faults import RecordLastCheckpoint
from vit.training.best_checkpoint import BestCheckpoint
from vit.training.clock import THROUGHPUT
from vit.training.module import TRAIN_LOSS, TRAIN_METRICS
from vit.training.resume import resume_path
from vit.training.run import train
from vit.training.run_folder import LAST
from vit.training.tasks import TRAIN_ACC, VAL_ACC

# Everything random switched on: shuffling, dropout, drop path, Mixup/CutMix, crops and flips; and EMA, and
# Muon's momentum buffers beside AdamW's moments (AdamW alone resumes in every other test).
RANDOM = [
    "trainer.max_epochs=3",
    "optim.optimizer=muon",
    "model.dropout=0.1",
    "model.drop_path=0.1",
    "+mixup={mixup_alpha: 0.8, cutmix_alpha: 1.0, switch_prob: 0.5}",
    "data.crop_padding=2",
    "data.flip=true",
    "ema_decay=0.9",
    "callbacks.pos_embed_figure=null",
]
STEPS_PER_EPOCH = (512 - 64) // 64  # synthetic: 512 images, 64 held out; batches of 64 (tiny_run)


def _weights(path):
    return torch.load(path, weights_only=True)["state_dict"]


def _train_means(run):
    """metrics.csv's epoch means of the training loss and accuracy, by epoch, as logged."""
    with open(run / "metrics.csv") as f:
        return {row["epoch"]: (row[TRAIN_LOSS], row.get(TRAIN_ACC)) for row in csv.DictReader(f) if row[TRAIN_LOSS]}


def _stop_at(step):
    return [f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: {step}}}"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    train(tiny_run(out, *RANDOM))
    return out / "checkpoints" / LAST


@pytest.mark.parametrize(
    "step", [STEPS_PER_EPOCH + 3, STEPS_PER_EPOCH - 1], ids=["mid-epoch", "last-batch-of-an-epoch"]
)
def test_a_run_stopped_by_sigterm_and_resumed_ends_bit_identical(uninterrupted, tmp_path, step):
    stop = _stop_at(step)
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
    # the epoch means it logs: the resumed epoch's over all its batches, the next ones' over theirs alone
    resumed, whole = _train_means(tmp_path / "runs" / "2"), _train_means(uninterrupted.parent.parent)
    assert resumed and resumed == {epoch: whole[epoch] for epoch in resumed}


# Epoch 2 validates best, epoch 3 ties it and epoch 4 scores lower (0.609, 0.609, 0.594; AdamW's run), so a
# resumed run that forgot the earlier best would take epoch 4 for it. The signal lands mid-epoch 4 (7 steps an epoch).
BEST = [
    "trainer.max_epochs=5",
    "optim.optimizer=adamw",
    "optim.lr=0.03",
    "data.noise=1.5",
    "callbacks.pos_embed_figure=null",
]


@pytest.fixture(scope="module")
def best_whole(tmp_path_factory):
    """BEST's uninterrupted run, as (its folder, its results): the run every BEST run below is compared with."""
    out = tmp_path_factory.mktemp("best_whole")
    return out, train(tiny_run(out, *BEST))


@pytest.fixture(scope="module")
def whole_and_resumed(tmp_path_factory, best_whole):
    """The uninterrupted run's results, and the same run stopped mid-epoch 4 and resumed in a new folder
    (resume=auto)."""
    out = tmp_path_factory.mktemp("best")
    whole = best_whole[1]
    with pytest.raises(SystemExit):
        train(tiny_run(out / "runs" / "1", *BEST, *_stop_at(30)))
    resumed = train(tiny_run(out / "runs" / "2", *BEST, *_stop_at(30), "resume=auto"))
    return out, whole, resumed


def test_a_resumed_run_keeps_the_earlier_best_checkpoint_score_and_test_accuracy(whole_and_resumed):
    out, whole, resumed = whole_and_resumed
    with open(out / "runs" / "2" / "metrics.csv") as f:
        after = [float(row[VAL_ACC]) for row in csv.DictReader(f) if row[VAL_ACC]]
    assert after and max(after) < whole["best_val_acc"]  # the best came before the interruption
    assert (resumed["best_val_acc"], resumed["test_acc"]) == (whole["best_val_acc"], whole["test_acc"])
    # the tested file is the earlier best's copy, in the resumed run's own folder
    assert resumed["best_checkpoint"] == str(out / "runs" / "2" / "checkpoints" / "best.ckpt")
    expected, got = _weights(whole["best_checkpoint"]), _weights(resumed["best_checkpoint"])
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_resuming_a_finished_run_again_keeps_its_best(whole_and_resumed):
    out, whole, _ = whole_and_resumed
    again = train(tiny_run(out / "runs" / "3", *BEST, *_stop_at(30), "resume=auto"))  # a requeued job: nothing to do
    assert again["resumed_from"] == str(out / "runs" / "2" / "checkpoints" / LAST)
    assert (again["best_val_acc"], again["test_acc"]) == (whole["best_val_acc"], whole["test_acc"])
    assert again["best_checkpoint"] == str(out / "runs" / "3" / "checkpoints" / "best.ckpt")


def test_an_epoch_resumed_mid_way_logs_the_means_of_all_its_batches(whole_and_resumed, best_whole):
    out = whole_and_resumed[0]
    resumed, whole = _train_means(out / "runs" / "2"), _train_means(best_whole[0])
    assert resumed == {"4": whole["4"]} and None not in whole["4"]  # loss and accuracy, to the last digit


def test_a_checkpoint_written_before_the_train_means_were_saved_still_resumes(whole_and_resumed, best_whole, tmp_path):
    out = whole_and_resumed[0]
    old = torch.load(out / "runs" / "1" / "checkpoints" / LAST, weights_only=True)
    del old[TRAIN_METRICS]
    torch.save(old, tmp_path / "old.ckpt")
    results = train(tiny_run(tmp_path / "run", *BEST, f"resume={tmp_path / 'old.ckpt'}"))
    whole = whole_and_resumed[1]
    assert results["global_steps"] == 5 * 7
    assert (results["best_val_acc"], results["test_acc"]) == (whole["best_val_acc"], whole["test_acc"])
    expected, got = _weights(best_whole[0] / "checkpoints" / LAST), _weights(tmp_path / "run" / "checkpoints" / LAST)
    assert all(torch.equal(expected[k], got[k]) for k in expected)  # only the resumed epoch's logged means differ


def _logged(run, key):
    """metrics.csv's rows that hold `key`, as (epoch, step, value)."""
    with open(run / "metrics.csv") as f:
        return [(row["epoch"], row["step"], row[key]) for row in csv.DictReader(f) if row.get(key)]


# Signals at steps that a validation or an epoch's end follows (BEST: 5 epochs of 7 steps). Lightning resumes a
# checkpoint written at such a step without them: at the best epoch's last step, it changed the best checkpoint
# and the test accuracy (0.461 against 0.500).
FOLLOWED = {
    "best-epochs-last-step": ([], 20),
    "validation-inside-an-epoch": (["+trainer.val_check_interval=0.5"], 12),  # after steps 3 and 6 of each epoch
    "last-step-of-an-epoch-without-validation": (["+trainer.check_val_every_n_epoch=2"], 6),
    "last-step-of-the-fit": ([], 34),
}


@pytest.mark.parametrize("case", FOLLOWED)
def test_the_validation_or_epoch_end_after_the_stopped_step_runs_once(tmp_path, case, best_whole):
    settings, step = FOLLOWED[case]
    if settings:
        folder, whole = tmp_path / "whole", train(tiny_run(tmp_path / "whole", *BEST, *settings))
    else:  # BEST's own run, trained once for the module
        folder, whole = best_whole
    command = [*BEST, *settings, *_stop_at(step)]
    with pytest.raises(SystemExit) as stopped:
        train(tiny_run(tmp_path / "runs" / "1", *command))
    assert stopped.value.code == 128 + signal.SIGTERM
    resumed = train(tiny_run(tmp_path / "runs" / "2", *command, "resume=auto"))
    runs = [tmp_path / "runs" / "1", tmp_path / "runs" / "2"]
    # each validation and each epoch's end (its logged means and throughput) in one of the two runs, as in the whole
    for key in (VAL_ACC, TRAIN_LOSS, TRAIN_ACC):
        assert [row for run in runs for row in _logged(run, key)] == _logged(folder, key), key
    epoch_ends = [row[:2] for row in _logged(folder, THROUGHPUT)]
    assert [row[:2] for run in runs for row in _logged(run, THROUGHPUT)] == epoch_ends
    for key in ("best_val_acc", "test_acc", "epochs", "global_steps"):
        assert resumed[key] == whole[key], key
    expected, got = _weights(whole["best_checkpoint"]), _weights(resumed["best_checkpoint"])
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize("earlier_best_kept", [True, False], ids=["kept", "deleted"])
def test_best_checkpoint_takes_the_scores_over_only_with_the_files(tmp_path, earlier_best_kept):
    earlier = tmp_path / "1" / "checkpoints"
    earlier.mkdir(parents=True)
    if earlier_best_kept:
        (earlier / "best.ckpt").write_bytes(b"a checkpoint")
    best, score = str(earlier / "best.ckpt"), torch.tensor(0.75)
    checkpoint = BestCheckpoint(dirpath=tmp_path / "2" / "checkpoints", filename="best", monitor=VAL_ACC, mode="max")
    checkpoint.load_state_dict(
        {
            "dirpath": str(earlier),
            "best_model_path": best,
            "best_model_score": score,
            "best_k_models": {best: score},
            "kth_best_model_path": best,
            "kth_value": score,
        }
    )
    if earlier_best_kept:
        here = os.path.join(checkpoint.dirpath, "best.ckpt")
        assert (checkpoint.best_model_score, checkpoint.best_model_path) == (score, here)
        assert checkpoint.best_k_models == {here: score} and checkpoint.kth_best_model_path == here
    else:  # Lightning's own behaviour, without a path to a file that is gone
        assert (checkpoint.best_model_score, checkpoint.best_model_path, checkpoint.best_k_models) == (None, "", {})


def test_last_checkpoint_is_rewritten_after_every_epoch_when_validation_is_not(tmp_path):
    """Lightning's ModelCheckpoint without a monitor saves at validation ends alone when validation is not every
    epoch: a kill in epoch 3 then lost epoch 2 (last.ckpt held step 7 of 14)."""
    RecordLastCheckpoint.steps.clear()
    witness = "+callbacks.witness._target_=tests.reliability.faults.RecordLastCheckpoint"
    settings = ["trainer.max_epochs=3", "+trainer.check_val_every_n_epoch=2", "callbacks.pos_embed_figure=null"]
    train(tiny_run(tmp_path, *settings, witness))
    assert RecordLastCheckpoint.steps == [None, STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]


def test_a_run_stopped_mid_epoch_reports_the_training_time_of_the_stopped_epoch_too(tmp_path):
    """Every step sleeps 0.1 s: the stopped and resumed run's train_seconds hold all 14 sleeps. The clock was saved
    without the running epoch's time, so the 4 steps of epoch 2 before the signal went uncounted (1.15 s of 1.4)."""
    slow = "+callbacks.slow={_target_: tests.reliability.faults.SlowSteps, seconds: 0.1}"
    command = ["trainer.max_epochs=2", "callbacks.pos_embed_figure=null", slow, *_stop_at(STEPS_PER_EPOCH + 3)]
    with pytest.raises(SystemExit):
        train(tiny_run(tmp_path / "runs" / "1", *command))
    results = train(tiny_run(tmp_path / "runs" / "2", *command, "resume=auto"))
    assert results["global_steps"] == 2 * STEPS_PER_EPOCH
    assert results["train_seconds"] >= 0.1 * 2 * STEPS_PER_EPOCH


def test_a_fine_tuning_run_resumes_though_its_preset_is_not_the_pretrained_network(tmp_path):
    """The pretrained file is the network (48 wide, one layer); the preset (32 wide, two layers) was what resuming
    compared the checkpoint with, so every preempted fine-tune of another architecture was refused."""
    network = ["model.embed_dim=48", "model.depth=1", "trainer.max_epochs=1", "trainer.limit_train_batches=1"]
    train(tiny_run(tmp_path / "pretrained", *network, "callbacks.pos_embed_figure=null"))  # a file, not a run
    pretrained = f"model.pretrained={tmp_path / 'pretrained' / 'checkpoints' / LAST}"
    command = [pretrained, "trainer.max_epochs=1", "callbacks.pos_embed_figure=null"]
    whole = train(tiny_run(tmp_path / "whole", *command))
    with pytest.raises(SystemExit):
        train(tiny_run(tmp_path / "runs" / "1", *command, *_stop_at(3)))
    resumed = train(tiny_run(tmp_path / "runs" / "2", *command, *_stop_at(3), "resume=auto"))
    assert resumed["resumed_from"] == str(tmp_path / "runs" / "1" / "checkpoints" / LAST)
    assert resumed["params"] == whole["params"]
    expected, got = (
        _weights(tmp_path / "whole" / "checkpoints" / LAST),
        _weights(tmp_path / "runs" / "2" / "checkpoints" / LAST),
    )
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


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


def test_a_requeued_sweep_starts_the_jobs_its_earlier_run_never_reached(tmp_path, caplog):
    """A sweep stopped in its second job and rerun with resume=auto: the first jobs continue, the rest had nothing
    to continue and start, with a warning, instead of ending the sweep at the first of them."""
    earlier, now = tmp_path / "2024-01-01_00-00-00", tmp_path / "2024-01-02_00-00-00"
    for job in ("0_model.pos_embed=learned", "1_model.pos_embed=sincos2d"):
        (earlier / job / "checkpoints").mkdir(parents=True)
        (earlier / job / "checkpoints" / LAST).write_bytes(b"a checkpoint")
    assert resume_path("auto", now / "1_model.pos_embed=sincos2d", multirun=True) == (
        earlier / "1_model.pos_embed=sincos2d" / "checkpoints" / LAST
    )
    with caplog.at_level("WARNING"):
        assert resume_path("auto", now / "2_model.pos_embed=none", multirun=True) is None
    assert f"job 2_model.pos_embed=none has no earlier run in the earlier sweep {earlier}" in caplog.text
    with pytest.raises(FileNotFoundError, match="no earlier run to continue"):  # no earlier sweep: a mistake
        resume_path("auto", tmp_path / "elsewhere" / "now" / "0_model.pos_embed=none", multirun=True)
