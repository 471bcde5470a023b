import logging

import pytest
import torch._inductor.config as inductor_config

from vit.training.compiler import compile_problem, resolve_compile


@pytest.fixture
def no_cxx(tmp_path, monkeypatch):
    """A machine without a C++ compiler, and an empty inductor cache, so that nothing compiled before is reused."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    monkeypatch.setattr(inductor_config.cpp, "cxx", (str(tmp_path / "no-such-g++"),))


def test_a_machine_without_a_cxx_compiler_trains_eager_with_one_warning(no_cxx, caplog):
    problem = compile_problem("cpu")
    assert problem is not None and "\n" not in problem
    with caplog.at_level(logging.WARNING, logger="vit.training.compiler"):
        assert resolve_compile(True, "cpu") is False
    assert [r.getMessage() for r in caplog.records if r.name == "vit.training.compiler"] == [
        f"compile=true: torch.compile cannot build CPU kernels on this machine ({problem}); training eager"
    ]


def test_compile_stays_as_asked_where_it_works_or_was_not_asked(monkeypatch, caplog):
    monkeypatch.setattr("vit.training.compiler.compile_problem", lambda device="cpu": None)
    assert resolve_compile(True, "cpu") is True
    monkeypatch.setattr("vit.training.compiler.compile_problem", lambda device="cpu": pytest.fail("probed"))
    assert resolve_compile(False, "cpu") is False
    assert resolve_compile(True, "gpu") is True  # triton brings its own compiler
    assert not [r for r in caplog.records if r.name == "vit.training.compiler"]
