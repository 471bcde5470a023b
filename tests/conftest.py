"""Every test starts from the same random state, so failures reproduce."""

from __future__ import annotations

import pytest
import torch

from vit.training.registry import register


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _resolvers() -> None:
    """The resolvers and the nodes conf/train.yaml names, as train.py registers them before Hydra composes."""
    register()
