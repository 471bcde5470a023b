"""The package's floors (pyproject.toml's [tool.importlinter]) hold, and the light entry points stay light."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fresh_python(code: str) -> str:
    """What `code` prints in a new interpreter, where nothing a test imported is loaded yet."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_imports_point_one_way_floor_by_floor():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency (pip install -e '.[dev]')"
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_light_entry_points_import_without_lightning_and_no_import_registers_a_resolver():
    """One fresh interpreter for all three (each start imports torch again): `import vit` leaves torch's compiler
    unloaded; what `python -m vit.cli.predict` and `vit.checkpoint.load` bring with them; then conf/'s resolvers,
    registered by one named call (train.py, conftest), not as an import side effect of the modules that name them."""
    light = "vit.checkpoint, vit.cli.predict, vit.cli.export, vit.figures.drawing, vit.interop.finetune"
    code = (
        "import sys, vit; print('torch._dynamo' in sys.modules); "
        f"import {light}; print([m for m in ('lightning', 'torchmetrics', 'hydra') if m in sys.modules]); "
        "import vit.training.resolvers as r, vit.cli.sweep, vit.cli.visualize, omegaconf as o; "
        "print([o.OmegaConf.has_resolver(n) for n in (r.JOB_FOLDER, r.CLASS_FOLDERS, r.DATASET_CLASSES)])"
    )
    assert _fresh_python(code).split() == ["False", "[]", "[False,", "False,", "False]"]
