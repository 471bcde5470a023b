import os
import warnings

import pytest
import torch

from vit.training.process import NVML_CUDA_CHECK, drop_nvml_cuda_check, set_matmul_precision, tune_process


def test_matmul_precision_reaches_gpus_only():
    """'high' means TF32 on GPUs; CPU matrix products stay on torch's default fp32 path (torch would send them
    to oneDNN's TF32 path, which made a patch-4 model train 4.4x slower on a CPU with AMX)."""
    before = torch.get_float32_matmul_precision()
    try:
        set_matmul_precision("high")
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.mkldnn.matmul.fp32_precision == "none"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("gpu", [False, True])
def test_the_nvml_cuda_check_goes_only_where_no_gpu_is_visible(monkeypatch, gpu):
    """Lightning's NVML_CUDA_CHECK made each AdamW step on a machine without NVIDIA's driver try to load NVML
    (~0.2 ms): dropped there, and kept where a GPU is, as it guards CUDA against initialising before a fork."""
    monkeypatch.setenv(NVML_CUDA_CHECK, "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    drop_nvml_cuda_check()
    assert (NVML_CUDA_CHECK in os.environ) == gpu


@pytest.mark.parametrize("training_warnings", [False, True])
def test_the_benchmarks_tuning_leaves_matmul_precision_and_warnings_as_they_were(monkeypatch, training_warnings):
    monkeypatch.setenv(NVML_CUDA_CHECK, "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    precision = torch.get_float32_matmul_precision()
    with warnings.catch_warnings():
        filters = list(warnings.filters)
        tune_process(None, training_warnings=training_warnings)
        assert (list(warnings.filters) == filters) is not training_warnings
    assert torch.get_float32_matmul_precision() == precision
    assert NVML_CUDA_CHECK not in os.environ  # the part the benchmarks share with train()
