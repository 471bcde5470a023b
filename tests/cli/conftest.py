"""A checkpoint for the command lines in milliseconds: a tiny untrained model, exported as vit.cli.export writes it."""

import pytest

from tests.helpers import tiny_config
from vit.checkpoint import Loaded
from vit.cli.export import to_safetensors
from vit.model import VisionTransformer


@pytest.fixture
def exported(tmp_path):
    """exported(NAME, **tiny_config overrides) -> the path of tmp_path/NAME, a tiny model's safetensors export."""

    def export(name: str = "model.safetensors", **overrides) -> str:
        path = tmp_path / name
        model = VisionTransformer(tiny_config(**overrides)).eval()
        to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
        return str(path)

    return export
