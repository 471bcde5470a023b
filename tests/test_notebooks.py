"""Each notebook runs top to bottom on a tiny checkpoint, and its figures come out."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import tiny_run
from vit.training.run import train

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return train(tiny_run(tmp_path_factory.mktemp("run"), "trainer.max_epochs=1"))["best_checkpoint"]


def test_every_notebook_is_stored_without_outputs():
    for path in NOTEBOOKS.glob("*.ipynb"):
        cells = nbformat.read(path, as_version=4).cells
        assert all(not c.get("outputs") and not c.get("execution_count") for c in cells if c.cell_type == "code"), path


@pytest.mark.slow  # a Jupyter kernel each, ~9 s; their figures are tested apart (tests/figures, tests/cli)
@pytest.mark.parametrize("name", ["position_embeddings", "attention"])
def test_notebook_runs_top_to_bottom(name, checkpoint, monkeypatch):
    monkeypatch.setenv("VIT_CHECKPOINT", str(checkpoint))
    monkeypatch.setenv("VIT_DATA", "synthetic")  # the data the tiny checkpoint was trained on
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    where = {"metadata": {"path": str(NOTEBOOKS)}}  # run from notebooks/, as Jupyter would
    NotebookClient(notebook, timeout=120, kernel_name="python3", resources=where).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) == {"position_embeddings": 3, "attention": 2}[name]


@pytest.mark.slow  # its steps are tested apart: tests/interop/test_finetune.py, tests/cli/test_predict.py
def test_the_finetuning_notebook_runs_from_a_dinov2_hub_folder_to_predictions(monkeypatch):
    monkeypatch.setenv("VIT_STEPS", "4")  # VIT_PRETRAINED unset: it writes a timm hub folder stand-in itself
    notebook = nbformat.read(NOTEBOOKS / "finetune.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    text = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert "position table resampled from (37, 37) to (4, 4)" in text and "new head: 0 -> 4 classes" in text
    assert float(text.split("largest feature difference from timm: ")[1].split()[0]) < 1e-4
    assert "'global_steps': 4" in text
    figures = [
        o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
    ]
    assert len(figures) == 1
