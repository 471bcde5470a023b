import errno
import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from tests.helpers import CONF_DIR, TINY, run_train_py
from vit.cli.sweep import RUN_COLUMNS, write_tables
from vit.cli.sweep import main as sweep
from vit.training.run_folder import LAST, RESULTS_FILE


def _job(folder, setting, acc, **results):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(f"- {setting}\n")
    results = results or {"test_acc": acc}
    (folder / "results.json").write_text(json.dumps({**results, "train_seconds": 12.5, "epochs": 3}))


def test_table_has_one_row_per_finished_job(tmp_path):
    for i, (setting, acc) in enumerate([("model.pos_embed=learned", 0.91), ("model.pos_embed=none", 0.85)]):
        _job(tmp_path / f"{i}_{setting}", setting, acc)
    (tmp_path / "9_crashed" / ".hydra").mkdir(parents=True)  # no results: left out
    rows = write_tables(tmp_path)
    assert [r["setting"] for r in rows] == ["model.pos_embed=learned", "model.pos_embed=none"]
    md = (tmp_path / "comparison.md").read_text().splitlines()
    assert md[0] == "| setting | test_acc | epochs | train_seconds | train_images_per_second | params | error |"
    assert md[2] == "| model.pos_embed=learned | 0.9100 | 3 | 12.5 |  |  |  |"  # no error
    assert (tmp_path / "comparison.csv").read_text().count("\n") == 3


@pytest.mark.parametrize(
    ("results", "scores"),
    [
        (  # a classifier: its per-class accuracies stay in results.json
            dict(test_acc=0.9, test_acc5=None, test_acc_per_class={"cat": 0.9}, best_val_acc=0.91),
            ["test_acc", "best_val_acc"],
        ),
        (  # several labels an image
            dict(test_map=0.8, test_map_micro=0.85, test_f1=0.7, test_ap_per_class={"a": 0.8}, best_val_map=0.82),
            ["test_map", "test_map_micro", "test_f1", "best_val_map"],
        ),
        (dict(test_loss=0.31, best_val_loss=0.3), ["test_loss", "best_val_loss"]),  # MAE
    ],
)
def test_the_table_has_a_column_for_each_score_the_task_gives(tmp_path, results, scores):
    _job(tmp_path / "0_optim.lr=1e-3", "optim.lr=1e-3", None, **results)
    _job(tmp_path / "1_optim.lr=1e-4", "optim.lr=1e-4", None, **{**results, scores[-1]: None})
    rows = write_tables(tmp_path)
    assert list(rows[0]) == ["setting", *scores, *RUN_COLUMNS]
    assert rows[0][scores[-1]] == results[scores[-1]] and rows[1][scores[-1]] is None
    header = (tmp_path / "comparison.csv").read_text().splitlines()[0]
    assert header == ",".join(rows[0])


def test_a_table_that_cannot_be_written_whole_leaves_the_previous_one_and_one_line(tmp_path, monkeypatch):
    _job(tmp_path / "0_model.pos_embed=learned", "model.pos_embed=learned", 0.9)
    write_tables(tmp_path)
    before = (tmp_path / "comparison.md").read_text()
    _job(tmp_path / "1_model.pos_embed=none", "model.pos_embed=none", 0.8)
    write_text = Path.write_text

    def full_disk(self, text, *args, **kwargs):  # half the table, then no space left
        write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(SystemExit, match=r"comparison\.md: could not be written .*No space left.*intact$"):
        sweep([str(tmp_path)])
    assert (tmp_path / "comparison.md").read_text() == before
    assert not list(tmp_path.glob(".*partial"))


def test_rows_follow_the_job_numbers_past_ten(tmp_path):
    for i in range(12):
        _job(tmp_path / f"{i}_optim.lr={i}e-4", f"optim.lr={i}e-4", 0.5)
    rows = write_tables(tmp_path)
    assert [r["setting"] for r in rows] == [f"optim.lr={i}e-4" for i in range(12)]  # not 0, 1, 10, 11, 2, ...


def test_a_results_file_that_cannot_be_read_is_a_row_with_its_error_not_a_traceback(tmp_path):
    _job(tmp_path / "0_model.pos_embed=learned", "model.pos_embed=learned", 0.9)
    _job(tmp_path / "1_model.pos_embed=none", "model.pos_embed=none", 0.8)
    _job(tmp_path / "2_model.pos_embed=rope2d", "model.pos_embed=rope2d", 0.8)
    (tmp_path / "1_model.pos_embed=none" / RESULTS_FILE).write_text('{"test_acc": 0.')  # a job killed mid-write
    (tmp_path / "2_model.pos_embed=rope2d" / RESULTS_FILE).write_text("[0.8]")
    rows = write_tables(tmp_path)
    assert rows[0]["test_acc"] == 0.9 and not rows[0]["error"]
    assert rows[1]["test_acc"] is None and re.search(
        r"1_model\.pos_embed=none/results\.json unreadable", rows[1]["error"]
    )
    assert rows[2]["error"].endswith("results.json holds a list, not a run's results")


def test_a_job_folder_nested_by_a_slash_in_an_override_still_has_its_row(tmp_path):
    # a sweep made before job folder names escaped '/' (vit.training.job_folder): Hydra's name made two folders
    _job(tmp_path / "0_data.train_dir=splits" / "train,model.pos_embed=learned", "data.train_dir=splits/train", 0.9)
    _job(tmp_path / "1_model.pos_embed=none", "model.pos_embed=none", 0.8)
    rows = write_tables(tmp_path)
    assert [r["setting"] for r in rows] == ["data.train_dir=splits/train", "model.pos_embed=none"]


def test_the_command_line_refuses_a_path_without_finished_jobs_in_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "empty" / "0_crashed" / ".hydra").mkdir(parents=True)
    refusals = {
        "missing": "not a folder; give a multirun's, e.g. multirun/<experiment>/<date>",
        "file": "not a folder; give a multirun's, e.g. multirun/<experiment>/<date>",
        "empty": f"no {RESULTS_FILE} under it: no job of this sweep has finished",
    }
    for name, reason in refusals.items():
        with pytest.raises(SystemExit) as exit:
            sweep([str(tmp_path / name)])
        assert str(exit.value) == f"{tmp_path / name}: {reason}"
    assert not list((tmp_path / "empty").glob("comparison.*"))  # no empty table to pass for a result


def _job_folder(num, *overrides):
    """hydra.sweep.subdir as Hydra resolves it for job `num` of `python train.py -m OVERRIDES`."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.job.num = num
    return cfg.hydra.sweep.subdir


def test_path_overrides_leave_the_job_folder_flat():
    paths = ["data.root=/data/fmnist", "model.pretrained=/ckpt/vit.npz", "output_dir=/tmp/out", "resume=/tmp/out"]
    assert _job_folder(3, *paths, "model.pos_embed=learned") == "3_model.pos_embed=learned"


def test_jobs_that_differ_only_in_a_path_keep_apart_by_their_numbers():
    # and a rerun with resume=auto gives each job the same folder name, so it finds its own earlier run
    assert [_job_folder(0, "data.root=/a", "model.depth=2"), _job_folder(1, "data.root=/b", "model.depth=2")] == [
        "0_model.depth=2",
        "1_model.depth=2",
    ]


def test_no_override_nests_the_job_folder():
    overrides = ["+callbacks.pos_embed_figure.dirname=figs/a%b", "data.class_subset=[0,1,2]", "data.num_classes=3"]
    folder = _job_folder(2, *overrides, "resume=auto")
    assert folder == "2_+callbacks.pos_embed_figure.dirname=figs%2Fa%25b,data.class_subset=[0,1,2],data.num_classes=3"
    assert unquote(folder.split("_", 1)[1]) == ",".join(overrides)  # readable, and the overrides come back


@pytest.mark.slow  # two train.py sweeps: ~12 s
def test_a_resumed_sweep_finds_each_jobs_checkpoint_whatever_its_overrides_hold(tmp_path):
    sweep = [
        "-m",
        *TINY,
        "trainer.max_epochs=1",
        "+callbacks.pos_embed_figure.dirname=figures/a,figures/b",  # a value with '/', in no exclude_keys
        "hydra.sweep.dir=multirun/${now:%Y-%m-%d_%H-%M-%S-%f}",
    ]
    first = run_train_py(*sweep, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_train_py(*sweep, "resume=auto", cwd=tmp_path)  # the requeued sweep
    assert second.returncode == 0, second.stderr[-3000:]
    earlier, resumed = sorted((tmp_path / "multirun").iterdir())
    for sweep_dir in (earlier, resumed):
        jobs = sorted(p.parent for p in sweep_dir.rglob(RESULTS_FILE))
        assert [job.parent for job in jobs] == [sweep_dir, sweep_dir]  # flat
        assert [job.name.split(",")[0] for job in jobs] == [
            "0_+callbacks.pos_embed_figure.dirname=figures%2Fa",
            "1_+callbacks.pos_embed_figure.dirname=figures%2Fb",
        ]
        assert len(write_tables(sweep_dir)) == 2
    for job in (p.parent for p in resumed.glob(f"*/{RESULTS_FILE}")):
        results = json.loads((job / RESULTS_FILE).read_text())
        assert results["resumed_from"] == str(earlier / job.name / "checkpoints" / LAST)
