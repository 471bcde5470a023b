"""The package's floors (pyproject.toml's [tool.importlinter]) hold, and the light entry points stay light."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_imports_point_one_way_floor_by_floor():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency (pip install -e '.[dev]')"
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_model_loader_and_prediction_import_without_lightning():
    # what `python -m vit.cli.predict` and `vit.checkpoint.load` bring with them, in a fresh interpreter
    code = (
        "import sys, vit, vit.checkpoint, vit.cli.predict, vit.cli.export, vit.figures.drawing, vit.interop.finetune; "
        "print(sorted(m for m in ('lightning', 'torchmetrics', 'hydra') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_importing_the_package_registers_nothing():
    # conf/train.yaml's resolver is registered by one named call (train.py, conftest), not as an import side effect
    code = (
        "from omegaconf import OmegaConf; import vit.training.run, vit.cli.sweep; "
        "print(OmegaConf.has_resolver('vit.job_folder'))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"
