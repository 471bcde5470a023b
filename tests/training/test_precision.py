"""trainer.precision=auto picks bf16-mixed on CPUs with bf16 units and 32-true on the rest, in one log line; bf16
asked of a CPU without the units warns with its measured cost. The CPU's flags are mocked: the host's are what
they are."""

import logging

import pytest
import torch

from tests.helpers import compose
from vit.training import precision
from vit.training.precision import resolve_precision
from vit.training.run import build

ZEN3 = {"fpu", "sse2", "avx", "avx2", "fma"}
ZEN4 = ZEN3 | {"avx512f", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN3 | {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}


@pytest.fixture
def host(monkeypatch):
    def use(flags):
        monkeypatch.setattr(precision, "cpu_flags", lambda: set(flags))
        monkeypatch.setattr(precision, "cpu_name", lambda: "Test CPU")

    return use


@pytest.mark.parametrize(
    "flags, chosen, why",
    [
        (ZEN3, "32-true", "has no bf16 units (avx512_bf16 or amx_bf16)"),
        (ZEN4, "bf16-mixed", "has bf16 units (avx512_bf16)"),
        (SAPPHIRE_RAPIDS, "bf16-mixed", "has bf16 units (avx512_bf16, amx_bf16)"),
    ],
)
def test_auto_picks_bf16_where_the_cpu_has_bf16_units_and_says_why(host, caplog, flags, chosen, why):
    host(flags)
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        assert resolve_precision("auto", "cpu") == chosen
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"trainer.precision=auto: {chosen}, since this CPU (Test CPU) {why}")


@pytest.mark.parametrize(
    ("gpu", "bf16_units", "chosen"), [("Tesla V100", False, "16-mixed"), ("A100", True, "bf16-mixed")]
)
def test_auto_on_a_gpu_picks_bf16_only_where_it_has_bf16_units(monkeypatch, gpu, bf16_units, chosen):
    """torch.cuda.is_bf16_supported() says True on a V100 or T4 by default, where bf16 is emulated."""

    def is_bf16_supported(including_emulation=True):
        return bf16_units or including_emulation

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: gpu)
    assert resolve_precision("auto", "gpu") == chosen


def test_bf16_on_a_cpu_without_bf16_units_warns_with_its_measured_cost_and_is_kept(host, caplog, monkeypatch):
    host(ZEN3)
    measured = {"torch.float32": 120.0, "torch.bfloat16": 0.9}
    monkeypatch.setattr(precision, "matmul_gflops", lambda dtype: measured[str(dtype)])
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "without bf16 units (Test CPU has no avx512_bf16 or amx_bf16): torch emulates bf16" in record.getMessage()
    assert "0.9 GFLOP/s in bf16 against 120.0 in fp32 (133x slower)" in record.getMessage()


def test_precisions_asked_for_by_name_pass_through_silently_where_the_host_has_them(host, caplog):
    host(SAPPHIRE_RAPIDS)
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
        assert resolve_precision("32-true", "cpu") == "32-true"
    host(ZEN3)
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        assert resolve_precision("32-true", "cpu") == "32-true"
    assert not caplog.records


def test_the_bf16_cost_is_measured_not_assumed():
    """The warning's figures come from timing: both positive, whatever the host."""
    import torch

    assert precision.matmul_gflops(torch.float32, n=32, seconds=0.0) > 0
    assert precision.matmul_gflops(torch.bfloat16, n=32, seconds=0.0) > 0


def test_the_flags_are_read_from_the_kernels_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    monkeypatch.setattr(precision, "CPUINFO", info)
    assert precision.cpu_flags() == {"fpu", "avx2", "avx512_bf16"} and precision.cpu_name() == "AMD EPYC 9R14"
    assert precision.bf16_units() == ["avx512_bf16"]
    monkeypatch.setattr(precision, "CPUINFO", tmp_path / "absent")
    assert precision.cpu_flags() == set() and precision.bf16_units() == []


@pytest.mark.parametrize("flags, chosen", [(ZEN3, "32-true"), (ZEN4, "bf16-mixed"), (SAPPHIRE_RAPIDS, "bf16-mixed")])
def test_the_default_run_builds_its_trainer_with_auto_s_choice(host, tmp_path, flags, chosen):
    """`python train.py`'s 64-wide model too: faster in bf16 than in fp32 on a Zen 4 (benchmarks/NOTES.md change 27)."""
    host(flags)
    cfg = compose(f"output_dir={tmp_path}")
    assert cfg.trainer.precision == "auto"
    _, _, trainer = build(cfg)
    assert trainer.precision == chosen
