"""`resume=auto` and `resume=PATH`: which checkpoint a run continues from. The checkpoint itself is written by
Lightning, BestCheckpoint and Preemption; exact_resume.py puts back what Lightning leaves out."""

from __future__ import annotations

import glob
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vit.interop.files import CheckpointError
from vit.interop.lora import ADAPTER
from vit.interop.sharded import is_sharded_checkpoint
from vit.training.run_folder import CHECKPOINT_DIR, LAST, RUN_CONFIG

NOT_COMPARED = ("output_dir", "resume")  # keys that differ between a run and its continuation
log = logging.getLogger(__name__)


def earlier_runs(output_dir: Path, multirun: bool) -> list[Path]:
    """The last.ckpt files of earlier runs, newest first. Hydra gives each run a new folder:
    outputs/<experiment>/<time>/ (siblings), or multirun/<experiment>/<time>/<job>/ (the same job folder name
    under sibling sweep folders); a fixed hydra.run.dir finds its own earlier checkpoint."""
    if multirun:  # a job folder name holds the overrides, e.g. 'data.class_subset=[0,1,2]': not a pattern
        found = output_dir.parent.parent.glob(f"*/{glob.escape(output_dir.name)}/{CHECKPOINT_DIR}/{LAST}")
    else:
        found = output_dir.parent.glob(f"*/{CHECKPOINT_DIR}/{LAST}")
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _earlier_sweeps(output_dir: Path) -> list[Path]:
    """Sweep folders beside this job's that hold a checkpoint of any job: a requeued sweep's earlier run, whose
    jobs after the one it stopped in never started. Newest first."""
    held = {p.parents[2] for p in output_dir.parent.parent.glob(f"*/*/{CHECKPOINT_DIR}/{LAST}")}
    return sorted(held - {output_dir.parent}, key=lambda d: d.stat().st_mtime, reverse=True)


def _differences(run_config: Path, config: dict[str, Any]) -> list[str] | None:
    """Top-level and nested keys whose values differ from the earlier run's config.yaml; None, with a warning naming
    it, where that file cannot be read as a mapping (cut short, overwritten): one broken run folder must not stop
    every resume=auto beside it."""
    if not run_config.is_file():
        return [f"(no {RUN_CONFIG})"]
    try:
        earlier = OmegaConf.to_container(OmegaConf.load(run_config))
        if not isinstance(earlier, dict):
            raise ValueError(f"a {type(earlier).__name__}, not a mapping of keys")
    except Exception as err:  # whatever YAML, OmegaConf or the file system raise for a file they cannot read
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        log.warning(
            "resume=auto: skipping the earlier run %s: its %s is unreadable (%s)", run_config.parent, RUN_CONFIG, reason
        )
        return None
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
    with the same config, `config` being this run's, resolved), or a path to a .ckpt file (a sharded one's folder) or
    to a run folder holding checkpoints/last.ckpt. Asking for one that does not exist is an error, never a silent fresh
    start; except a sweep's job that an earlier run of the sweep never reached, which starts with a warning."""
    if resume is None:
        return None
    if resume == "auto":
        runs = earlier_runs(output_dir, multirun)
        if config is not None:
            differences = {r: _differences(r.parent.parent / RUN_CONFIG, config) for r in runs}
            readable = [r for r in runs if differences[r] is not None]
            same = [r for r in readable if not differences[r]]
            if readable and not same:
                newest = readable[0]
                raise FileNotFoundError(
                    f"resume=auto: the earlier runs were made with another config, e.g. {newest.parent.parent} differs "
                    f"in {', '.join(differences[newest][:8])}; resume one by path with resume=PATH"
                )
            runs = same
        if not runs and multirun and (earlier := _earlier_sweeps(output_dir)):
            log.warning(
                "resume=auto: job %s has no earlier run in the earlier sweep %s: it never started there, so it "
                "starts now",
                output_dir.name,
                earlier[0],
            )
            return None
        if not runs:
            where = output_dir.parent.parent / "*" / output_dir.name if multirun else output_dir.parent / "*"
            raise FileNotFoundError(
                f"resume=auto: no earlier run to continue: no {where / CHECKPOINT_DIR / LAST} "
                f"(start the first run without resume=auto)"
            )
        return runs[0]
    path = Path(resume).expanduser()
    if path.is_dir() and not is_sharded_checkpoint(path):
        path = path / CHECKPOINT_DIR / LAST
    if not (path.is_file() or is_sharded_checkpoint(path)):
        raise FileNotFoundError(f"resume={resume}: no checkpoint at {path}")
    return path


def refuse_unfit(path: Any, saved: dict[str, Sequence[int]], own: dict[str, Sequence[int]]) -> None:
    """Refuse, naming the checkpoint, tensors of other shapes than the resuming module's of the same names (`saved`
    and `own`): LoRA's adapters of another finetune.rank, where the network itself is the same (_check_resumable
    compares that), which Lightning and DCP report as a traceback of size mismatches."""
    differ = [name for name in saved if name in own and tuple(saved[name]) != tuple(own[name])]
    if not differ:
        return
    what = "its LoRA adapters" if all(ADAPTER in name for name in differ) else "its weights"
    shapes = ", ".join(f"{name} is {list(saved[name])} there, {list(own[name])} here" for name in differ[:2])
    raise CheckpointError(
        f"{path}: {what} do not fit the network this run builds ({shapes}); resume with the finetune settings "
        "it was trained with"
    )
