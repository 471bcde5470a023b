import logging
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters

from tests.helpers import ROOT
from vit.data.native_size import fit
from vit.model.presets import preset_config
from vit.training.compiler import compile_problem, isa_cache_dir, resolve_compile
from vit.training.module import ViTClassifier
from vit.training.native_size import NativeSize
from vit.training.tasks import TaskConfig

COMPILER = (inductor_config.cpp.cxx, inductor_config.fx_graph_cache)  # this machine's, as the session began


@pytest.fixture
def no_cxx(tmp_path, monkeypatch):
    """A machine without a C++ compiler, and an empty inductor cache, so that nothing compiled before is reused. By
    torch's config.patch: monkeypatch's undo deletes torch config keys, after which every compile failed."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    with inductor_config.patch({"fx_graph_cache": False, "cpp.cxx": (str(tmp_path / "no-such-g++"),)}):
        yield


def test_a_machine_without_a_cxx_compiler_trains_eager_with_one_warning(no_cxx, caplog):
    problem = compile_problem("cpu")
    assert problem is not None and "\n" not in problem
    with caplog.at_level(logging.WARNING, logger="vit.training.compiler"):
        assert resolve_compile(True, "cpu") is False
    assert [r.getMessage() for r in caplog.records if r.name == "vit.training.compiler"] == [
        f"compile=true: torch.compile cannot build CPU kernels on this machine ({problem}); training eager"
    ]


def test_the_compiler_taken_away_above_is_given_back():
    """After the test above, every compile of the session failed (its fixture deleted inductor's settings), so the
    compiled runs after it trained eager, with a warning, and compile tests were skipped."""
    assert (inductor_config.cpp.cxx, inductor_config.fx_graph_cache) == COMPILER


def test_compile_stays_as_asked_where_it_works_or_was_not_asked(monkeypatch, caplog):
    monkeypatch.setattr("vit.training.compiler.compile_problem", lambda device="cpu": None)
    assert resolve_compile(True, "cpu") is True
    monkeypatch.setattr("vit.training.compiler.compile_problem", lambda device="cpu": pytest.fail("probed"))
    assert resolve_compile(False, "cpu") is False
    assert resolve_compile(True, "gpu") is True  # triton brings its own compiler
    assert not [r for r in caplog.records if r.name == "vit.training.compiler"]


def test_the_inductor_cache_is_kept_per_vector_instruction_set_and_cpu_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    capability = torch.backends.cpu.get_cpu_capability().lower()
    zen4 = {"avx2", "avx512f", "avx512_bf16"}
    monkeypatch.setattr("vit.training.compiler.cpu_flags", lambda: zen4)
    folder = isa_cache_dir()
    assert os.path.dirname(folder) == str(tmp_path) and os.path.basename(folder).startswith(f"cpu-{capability}-")
    assert isa_cache_dir() == folder == os.environ["TORCHINDUCTOR_CACHE_DIR"]  # a second call nests nothing
    # -march=native kernels of a CPU with avx512_bf16 must not reach one without it, though both run AVX-512 code
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("vit.training.compiler.cpu_flags", lambda: zen4 - {"avx512_bf16"})
    assert os.path.dirname(isa_cache_dir()) == str(tmp_path) and isa_cache_dir() != folder
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("vit.training.compiler.cpu_flags", lambda: zen4 | {"amx_tile"})
    assert os.path.basename(isa_cache_dir()).startswith(f"cpu-{capability}-amx-")


def test_torchs_private_cache_dir_is_the_users_folder_else_torchs_default(tmp_path, monkeypatch):
    """isa_cache_dir reads the folder inductor uses from torch._inductor.runtime.cache_dir_utils.cache_dir, private
    to torch: TORCHINDUCTOR_CACHE_DIR when set, made absolute; else torchinductor_<user> in the temporary folder,
    then named in TORCHINDUCTOR_CACHE_DIR."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "relative")
    assert cache_dir() == str(tmp_path / "relative")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    folder = cache_dir()
    assert os.path.dirname(folder) == str(tmp_path / "tmp") and os.path.basename(folder).startswith("torchinductor_")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder


COMPILE_A_STEP = """
import torch
from vit.model.presets import create_model
from vit.training.compiler import resolve_compile
assert resolve_compile(True, "cpu")
model = create_model("vit_fashion_mnist")
torch.compile(model)(torch.randn(16, 1, 28, 28)).sum().backward()
"""


@pytest.mark.slow  # two processes compiling the default model, each with a cold cache: ~60 s
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16"), reason="an AVX2 host")
def test_kernels_compiled_for_avx2_are_not_loaded_by_an_avx512_process(tmp_path):
    """With one cache folder, the AVX-512 process took the AVX2 process's kernels as cache hits and died in malloc
    ('corrupted size vs. prev_size', SIGABRT; torch 2.14, Zen 4)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for capability in ("avx2", None):
        run_env = {**env, "ATEN_CPU_CAPABILITY": capability} if capability else env
        done = subprocess.run([sys.executable, "-c", COMPILE_A_STEP], env=run_env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]


def test_a_naflex_model_compiles_one_graph_for_batches_of_any_packing():
    """compile=true with data.max_tokens was refused: the module compiled only the network's __call__, which packed
    batches never go through. Its layers now compile with dynamic shapes, into one graph for sequences of any count
    and length (and one more for a single sequence: dynamo specialises sizes 0 and 1), computing what eager does."""
    if (problem := compile_problem("cpu")) is not None:
        pytest.skip(f"torch.compile cannot build CPU kernels here: {problem}")
    config = preset_config("vit_small_16", embed_dim=32, depth=2, num_heads=4, patch_size=8)
    task = TaskConfig().build(config)
    eager = ViTClassifier(config, task).eval()
    compiled = ViTClassifier(config, task, compile=True, features=[NativeSize(16)]).eval()
    compiled.load_state_dict(eager.state_dict())
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    eager, compiled = eager.model, compiled.model
    torch._dynamo.reset()
    counters.clear()
    batches = [([(40, 24), (16, 56)], 17), ([(24, 40), (56, 16), (8, 8)], 34)]  # (S, L): (2, 16), then (2, 31)
    with torch.no_grad():
        for sizes, length in batches:
            images = [fit(torch.rand(3, h, w), (8, 8), 16) for h, w in sizes]  # 15-17 tokens each
            torch.testing.assert_close(compiled.forward_packed(images, length), eager.forward_packed(images, length))
    assert counters["stats"]["unique_graphs"] == 1  # both layers, both packings
