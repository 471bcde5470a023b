"""Every test starts from the same random state, so failures reproduce; config files are parsed once a run; under
`pytest -n N` (make test) each process takes its share of the cores' threads."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from hydra.plugins.config_source import ConfigResult

from vit.training.registry import register

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # `pytest -n N` (make test): the cores shared among the N processes
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # Linux; others
    torch.set_num_threads(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _resolvers() -> None:
    """The resolvers and the nodes conf/train.yaml names, as train.py registers them before Hydra composes."""
    register()


@pytest.fixture(autouse=True, scope="session")
def _parsed_config_files() -> Iterator[None]:
    """Each config file parsed once a test run, not at every compose: reading YAML is a third of a compose, and the
    suite composes hundreds of times. A file is read again when its size or time changes (tests write experiment files
    of their own); every compose gets its own copy of the parsed config."""
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource

    parsed: dict[tuple, ConfigResult] = {}

    def cached(read: Callable[[Any, str], ConfigResult], stamp: Callable[[Any, str], tuple]) -> Callable:
        def load_config(self: Any, config_path: str) -> ConfigResult:
            key = (type(self).__name__, self.path, config_path, *stamp(self, config_path))
            if key not in parsed:
                parsed[key] = read(self, config_path)
            return replace(parsed[key], config=copy.deepcopy(parsed[key].config), header=dict(parsed[key].header))

        return load_config

    def file_stamp(source: Any, config_path: str) -> tuple:
        path = os.path.realpath(os.path.join(source.path, source._normalize_file_name(config_path)))
        try:
            stat = os.stat(path)
        except OSError:
            return (path, None)  # not there: read() raises as it would
        return (path, stat.st_mtime_ns, stat.st_size)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FileConfigSource, "load_config", cached(FileConfigSource.load_config, file_stamp))
        packaged = ImportlibResourcesConfigSource.load_config  # hydra's own files, inside its package
        patch.setattr(ImportlibResourcesConfigSource, "load_config", cached(packaged, lambda source, path: ()))
        yield
