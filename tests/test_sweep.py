import json

from vit.sweep import write_tables


def test_table_has_one_row_per_finished_job(tmp_path):
    for i, (setting, acc) in enumerate([("model.pos_embed=learned", 0.91), ("model.pos_embed=none", 0.85)]):
        job = tmp_path / f"{i}_{setting}"
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- {setting}\n")
        (job / "results.json").write_text(json.dumps({"test_acc": acc, "train_seconds": 12.5, "epochs": 3}))
    (tmp_path / "9_crashed" / ".hydra").mkdir(parents=True)  # no results: left out
    rows = write_tables(tmp_path)
    assert [r["setting"] for r in rows] == ["model.pos_embed=learned", "model.pos_embed=none"]
    md = (tmp_path / "comparison.md").read_text().splitlines()
    assert md[2] == "| model.pos_embed=learned | 0.9100 |  | 3 | 12.5 |  |  |"
    assert (tmp_path / "comparison.csv").read_text().count("\n") == 3
