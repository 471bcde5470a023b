"""Compare the runs of a Hydra multirun in one table: each job's overrides -> its task's scores and time.

Runs automatically at the end of `python train.py -m ...` (a Hydra callback in conf/train.yaml), or by
hand: python -m vit.cli.sweep multirun/<experiment>/<date>
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from vit.atomic import WriteError, write_atomically
from vit.training.run_folder import RESULTS_FILE

SCORES = ("test_", "best_")  # results.json's scores start so: a task's test metrics, its best validation value
RUN_COLUMNS = ("epochs", "train_seconds", "train_images_per_second", "params", "error")


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    """The table's columns: the setting, every score that a job's results give as a number (test_acc and
    best_val_acc for a classifier, test_map and best_val_map for several labels an image, test_loss and best_val_loss
    for MAE; per-class scores stay in results.json), test scores first, then the run's size and time."""
    keys = dict.fromkeys(k for row in rows for k in row if k.startswith(SCORES))
    numbers = [k for k in keys if any(_number(row.get(k)) for row in rows)]
    scores = [k for k in numbers if all(_number(row.get(k)) or row.get(k) is None for row in rows)]
    return ["setting", *sorted(scores, key=lambda k: not k.startswith("test_")), *RUN_COLUMNS]


def _number(value: Any) -> bool:
    return isinstance(value, int | float)


def _job_order(sweep_dir: Path, results_path: Path) -> tuple[int, str]:
    """Sort key: the job number that starts the job's folder name (hydra.sweep.subdir in conf/train.yaml), so
    job 10 follows job 9; folders without one go last."""
    num = results_path.relative_to(sweep_dir).parts[0].split("_", 1)[0]
    return (int(num) if num.isdigit() else sys.maxsize, str(results_path))


def collect(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job folder that holds results.json, in job order, labelled by the job's command-line overrides."""
    # At any depth: in sweeps made before job folder names escaped '/' (vit.training.job_folder), a path in an
    # override's value nested the job folder.
    found = sorted(sweep_dir.rglob(RESULTS_FILE), key=lambda path: _job_order(sweep_dir, path))
    rows = []
    for results_path in found:
        job_dir = results_path.parent
        overrides_path = job_dir / ".hydra" / "overrides.yaml"
        overrides = OmegaConf.load(overrides_path) if overrides_path.is_file() else [job_dir.name]
        try:
            results = json.loads(results_path.read_text())
        except (OSError, ValueError) as err:  # a job killed while writing it, or a file edited by hand
            results = {"error": f"{results_path} unreadable: {err}"}
        if not isinstance(results, dict):
            results = {"error": f"{results_path} holds a {type(results).__name__}, not a run's results"}
        rows.append({"setting": " ".join(overrides) or "(defaults)", **results})
    named = _columns(rows)
    return [{c: row.get(c) for c in named} for row in rows]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if value < 1 else f"{value:.1f}"
    return "" if value is None else str(value)


def write_tables(sweep_dir: Path) -> list[dict[str, Any]]:
    """Write comparison.csv and comparison.md into the sweep folder, each whole or not at all (a sweep ending
    on a full disk leaves the previous tables); return the rows."""
    rows = collect(sweep_dir)
    named = list(rows[0]) if rows else ["setting", *RUN_COLUMNS]

    def write_csv(path: Path) -> None:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=named)
            writer.writeheader()
            writer.writerows(rows)

    write_atomically(sweep_dir / "comparison.csv", write_csv)
    lines = ["| " + " | ".join(named) + " |", "|" + "---|" * len(named)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in named) + " |" for row in rows]
    write_atomically(sweep_dir / "comparison.md", lambda path: path.write_text("\n".join(lines) + "\n"))
    return rows


class CompareRuns(Callback):
    """Hydra callback: after a multirun, write the comparison table beside the job folders; exit 1 if a job
    failed (train.py records the failure and lets the sweep go on)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if sweep_dir.is_dir():
            try:
                rows = write_tables(sweep_dir)
            except WriteError as err:
                raise SystemExit(str(err)) from None
            print((sweep_dir / "comparison.md").read_text(), flush=True)
            if failed := [row["setting"] for row in rows if row["error"]]:
                raise SystemExit(f"{len(failed)} of {len(rows)} jobs failed: {'; '.join(failed)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", metavar="MULTIRUN_DIR", type=Path, help="a multirun's folder")
    sweep_dir = parser.parse_args(argv).sweep_dir
    if not sweep_dir.is_dir():
        raise SystemExit(f"{sweep_dir}: not a folder; give a multirun's, e.g. multirun/<experiment>/<date>")
    if next(sweep_dir.rglob(RESULTS_FILE), None) is None:  # checked first: an empty table would pass for a result
        raise SystemExit(f"{sweep_dir}: no {RESULTS_FILE} under it: no job of this sweep has finished")
    try:
        write_tables(sweep_dir)
    except WriteError as err:
        raise SystemExit(str(err)) from None
    print((sweep_dir / "comparison.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
