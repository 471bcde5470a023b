import json

from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from tests.helpers import CONF_DIR
from vit.sweep import write_tables


def _job(folder, setting, acc):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(f"- {setting}\n")
    (folder / "results.json").write_text(json.dumps({"test_acc": acc, "train_seconds": 12.5, "epochs": 3}))


def test_table_has_one_row_per_finished_job(tmp_path):
    for i, (setting, acc) in enumerate([("model.pos_embed=learned", 0.91), ("model.pos_embed=none", 0.85)]):
        _job(tmp_path / f"{i}_{setting}", setting, acc)
    (tmp_path / "9_crashed" / ".hydra").mkdir(parents=True)  # no results: left out
    rows = write_tables(tmp_path)
    assert [r["setting"] for r in rows] == ["model.pos_embed=learned", "model.pos_embed=none"]
    md = (tmp_path / "comparison.md").read_text().splitlines()
    assert md[2] == "| model.pos_embed=learned | 0.9100 |  | 3 | 12.5 |  |  |"
    assert (tmp_path / "comparison.csv").read_text().count("\n") == 3


def test_rows_follow_the_job_numbers_past_ten(tmp_path):
    for i in range(12):
        _job(tmp_path / f"{i}_optim.lr={i}e-4", f"optim.lr={i}e-4", 0.5)
    rows = write_tables(tmp_path)
    assert [r["setting"] for r in rows] == [f"optim.lr={i}e-4" for i in range(12)]  # not 0, 1, 10, 11, 2, ...


def test_a_job_folder_nested_by_a_slash_in_an_override_still_has_its_row(tmp_path):
    # Hydra names the folder after the overrides; a '/' in a value not excluded in conf/train.yaml makes folders
    _job(tmp_path / "0_data.train_dir=splits" / "train,model.pos_embed=learned", "data.train_dir=splits/train", 0.9)
    _job(tmp_path / "1_model.pos_embed=none", "model.pos_embed=none", 0.8)
    rows = write_tables(tmp_path)
    assert [r["setting"] for r in rows] == ["data.train_dir=splits/train", "model.pos_embed=none"]


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
