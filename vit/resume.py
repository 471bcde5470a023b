"""Continuing a run exactly: the random state in checkpoints, preemption by signal, and `resume=auto`.

Lightning's checkpoint already holds the model, optimizer, schedule, loop progress and callback states
(EMA, the training clock); the training loader adds its position (vit/data/loading.py). What Lightning
leaves out is the random state of torch (CPU and CUDA), numpy and python: `ExactResume` adds it, per
rank, and puts it back just before the first resumed step, so dropout, drop path, Mixup/CutMix and the
on-device augmentation draw what the uninterrupted run would have drawn. It also hands the loader its
saved position, which Lightning 2.6 drops when `estimated_stepping_batches` (our schedule's length) has
built the training loader before the checkpoint was restored.

`BestCheckpoint` keeps the best score and checkpoint across the new folder Hydra gives a resumed run.

`Preemption` turns SIGTERM (schedulers, torchrun) and SIGUSR1 (SLURM's warning signal) into: finish the
current optimizer step (and the validation or epoch end that follows it, if one does), write
checkpoints/last.ckpt, exit with 128 + the signal number (143 for SIGTERM) so that the scheduler requeues
the job. Rerunning the command with `resume=auto` continues from the newest last.ckpt among the earlier runs
with the same config.
"""

from __future__ import annotations

import glob
import logging
import random
import shutil
import signal
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from omegaconf import OmegaConf

from vit.atomic import write_atomically

log = logging.getLogger(__name__)

LAST = "last.ckpt"  # ModelCheckpoint's save_last name: the checkpoint a resumed run starts from
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def capture() -> dict[str, Any]:
    """This process's random state as plain values and tensors (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
        "python": random.getstate(),
    }


def restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


class ExactResume(L.Callback):
    """Saves every rank's random state with each checkpoint; a resumed run restores its rank's state, and
    the training loader's position, at on_train_start: after Lightning has restored everything else and
    before the first batch is drawn."""

    def __init__(self) -> None:
        self._pending: list[dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, Any]:
        states = [capture()]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, capture())
        return {"ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict["ranks"]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning applies saved loader states when it builds the loader after the restore; ours was built
        # before it (for the schedule's length), so apply them now. A no-op when there are none.
        trainer.fit_loop._load_combined_loader_states()
        if self._pending is None:
            return
        states, self._pending = self._pending, None
        if len(states) != trainer.world_size:
            log.warning(
                "the checkpoint holds the random state of %d rank(s), this run has %d: not restored "
                "(the run continues, but not bit-exactly)",
                len(states),
                trainer.world_size,
            )
            return
        restore(states[trainer.global_rank])


class BestCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint whose top-k a resumed run continues in its own folder. Lightning forgets the scores of
    a checkpoint written to another dirpath, so a resumed run in a new Hydra folder would take its first
    validation for the best, however well an earlier epoch did. This one keeps the scores, and as the fit starts
    copies the earlier run's top-k files into its own folder: the best checkpoint is always in the run's folder,
    whichever run found it, and a run resumed again continues from there."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._carry: list[tuple[Path, Path]] = []  # (the earlier run's file, its copy here), for on_fit_start

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._carry = []
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)
            return
        best_k = state_dict.get("best_k_models", {})
        here = {path: str(Path(self.dirpath) / Path(path).name) for path in best_k}
        # testing the best checkpoint reloads its state, which names the earlier folder: the copy is here already
        gone = [path for path, copy in here.items() if not Path(path).is_file() and not Path(copy).is_file()]
        if gone:
            log.warning("%s: gone; the earlier run's best checkpoints and scores are not carried over", gone[0])
            super().load_state_dict({**state_dict, "best_model_path": ""})  # Lightning's own: forgets the scores
            return
        self._carry = [(Path(path), Path(copy)) for path, copy in here.items() if Path(path).is_file()]
        best, kth = state_dict["best_model_path"], state_dict.get("kth_best_model_path", "")
        super().load_state_dict(
            {
                **state_dict,
                "dirpath": self.dirpath,
                "best_k_models": {here[path]: score for path, score in best_k.items()},
                "best_model_path": here.get(best, best),
                "kth_best_model_path": here.get(kth, kth),
            }
        )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        carry, self._carry = self._carry, []
        if trainer.is_global_zero:
            for path, copy in carry:
                write_atomically(copy, partial(shutil.copyfile, path))
                log.info("best checkpoint %s carried over to %s", path, copy)
        trainer.strategy.barrier()  # a finished run tests the copy at once, on every rank


class Preempted(SystemExit):
    """Raised after the checkpoint is written; its code is the process's exit status."""


class Preemption(Checkpoint):
    """On SIGTERM or SIGUSR1: the optimizer step under way finishes, checkpoints/last.ckpt is written, and the
    process exits with 128 + signal number. Under DDP the ranks agree (a signal on any rank stops all) at the same
    step, so every rank takes part in the save.

    The checkpoint is written where Lightning's own ModelCheckpoint would write one, so that the stopped run and
    its continuation validate, checkpoint, step their schedules and log each epoch once, as an uninterrupted run:
    - after a step that neither a validation nor the epoch's end follows: at once, in on_train_batch_end;
    - after a step that a validation inside the epoch follows (val_check_interval < 1): in on_validation_end, once
      the other checkpoints have recorded the validation; then the process exits;
    - after the epoch's last step: in on_train_epoch_end, after the epoch's validation if it has
      one and every other epoch-end hook; the process exits once Lightning has logged the epoch, at the next hook
      (the next epoch's on_train_epoch_start, after the other callbacks', or on_train_end).
    Lightning 2.6 takes a checkpoint written at an epoch's last on_train_batch_end for a finished epoch (FitLoop.reset):
    that epoch's validation and end, and the next epoch's on_train_epoch_start, never run; a validation due after
    the step it skips (TrainingEpochLoop.advance). The cost of waiting: the grace period after the signal must cover
    a validation. With trainer.max_steps set, Lightning resumes no epoch-end checkpoint rightly (it repeats the
    epoch's end and skips an epoch), ModelCheckpoint's last.ckpt included: vit.training.check_config refuses it.
    As a Checkpoint, this callback runs after all others, ModelCheckpoints included, in every hook."""

    def __init__(self, checkpoint_dir: str | Path):
        self.path = Path(checkpoint_dir) / LAST
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._save_at: str | None = None  # the hook that writes the checkpoint once the ranks have agreed to stop
        self._saved = False

    def _handler(self, signum: int, frame: Any) -> None:
        log.warning("received %s: stopping after this step", signal.Signals(signum).name)
        self.received = signum

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for sig in PREEMPTION_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._uninstall()
        self._exit_if_saved()  # the signal came at the last step of the fit

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._uninstall()

    def _uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        if not stepped:
            return
        # a decision already taken (the same on every rank) whose validation did not come is taken again
        if self._save_at is None and not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        self.received = self.received or signal.SIGTERM  # another rank received it
        # the loop's own tests, made before it makes them: the same on every rank
        loop = trainer.fit_loop.epoch_loop
        if loop._is_training_done:  # the epoch's last batch
            self._save_at = "on_train_epoch_end"
        elif loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
            self._save_at = "on_validation_end"
        else:
            self._save(trainer)
            self._exit_if_saved()
            return
        log.warning("a validation or the epoch's end follows this step: the checkpoint waits for %s", self._save_at)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._save_at == "on_validation_end":
            self._save(trainer)
            self._exit_if_saved()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._save_at == "on_train_epoch_end":
            self._save(trainer)  # exits at the next hook: Lightning logs the epoch's means after this one

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._exit_if_saved()

    def _save(self, trainer: L.Trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)  # everything, to resume from
        self._saved = True

    def _exit_if_saved(self) -> None:
        if self._saved:
            code = 128 + self.received
            log.warning("checkpoint written to %s; exiting with %d (rerun with resume=auto)", self.path, code)
            raise Preempted(code)


RUN_CONFIG = "config.yaml"  # the resolved config each run writes into its folder (vit/training.py)
NOT_COMPARED = ("output_dir", "resume")  # keys that differ between a run and its continuation


JOB_FOLDER = "vit.job_folder"  # the resolver that conf/train.yaml's hydra.sweep.subdir names job folders with


def job_folder(override_dirname: str) -> str:
    """A sweep job's folder name from Hydra's hydra.job.override_dirname: '/' (in a path value) as %2F and '%' as
    %25, so that the folder never nests, whatever the overrides, and urllib.parse.unquote gives them back."""
    return override_dirname.replace("%", "%25").replace("/", "%2F")


# on import: train.py imports this module (through vit.training) before Hydra composes a config or names a job folder
OmegaConf.register_new_resolver(JOB_FOLDER, job_folder, replace=True)


def earlier_runs(output_dir: Path, multirun: bool) -> list[Path]:
    """The last.ckpt files of earlier runs, newest first. Hydra gives each run a new folder:
    outputs/<experiment>/<time>/ (siblings), or multirun/<experiment>/<time>/<job>/ (the same job folder name
    under sibling sweep folders); a fixed hydra.run.dir finds its own earlier checkpoint."""
    if multirun:  # a job folder name holds the overrides, e.g. 'data.class_subset=[0,1,2]': not a pattern
        found = output_dir.parent.parent.glob(f"*/{glob.escape(output_dir.name)}/checkpoints/{LAST}")
    else:
        found = output_dir.parent.glob(f"*/checkpoints/{LAST}")
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _differences(run_config: Path, config: dict[str, Any]) -> list[str]:
    """Top-level and nested keys whose values differ from the earlier run's config.yaml."""
    if not run_config.is_file():
        return [f"(no {RUN_CONFIG})"]
    earlier = OmegaConf.to_container(OmegaConf.load(run_config))
    flat = lambda d, prefix="": {  # noqa: E731
        k2: v2
        for k, v in d.items()
        if k not in NOT_COMPARED
        for k2, v2 in (flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(f"{prefix}{k}", v)])
    }
    a, b = flat(earlier), flat(config)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def resume_path(
    resume: str | None, output_dir: Path, multirun: bool = False, config: dict[str, Any] | None = None
) -> Path | None:
    """The checkpoint `resume` asks for: None (start fresh), 'auto' (the newest last.ckpt of an earlier run
    with the same config, `config` being this run's, resolved), or a path to a .ckpt file or to a run folder
    holding checkpoints/last.ckpt. Asking for one that does not exist is an error, never a silent fresh start."""
    if resume is None:
        return None
    if resume == "auto":
        runs = earlier_runs(output_dir, multirun)
        if config is not None:
            same = [r for r in runs if not _differences(r.parent.parent / RUN_CONFIG, config)]
            if runs and not same:
                newest = runs[0].parent.parent
                raise FileNotFoundError(
                    f"resume=auto: the earlier runs were made with another config, e.g. {newest} differs in "
                    f"{', '.join(_differences(newest / RUN_CONFIG, config)[:8])}; resume one by path with resume=PATH"
                )
            runs = same
        if not runs:
            where = output_dir.parent.parent / "*" / output_dir.name if multirun else output_dir.parent / "*"
            raise FileNotFoundError(
                f"resume=auto: no earlier run to continue: no {where / 'checkpoints' / LAST} "
                f"(start the first run without resume=auto)"
            )
        return runs[0]
    path = Path(resume).expanduser()
    if path.is_dir():
        path = path / "checkpoints" / LAST
    if not path.is_file():
        raise FileNotFoundError(f"resume={resume}: no checkpoint at {path}")
    return path
