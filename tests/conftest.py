"""Shared test setup: `gpu` tests run only where a CUDA GPU is visible (the device machine)."""
from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _has_gpu() -> bool:
    if os.environ.get("PTXBENCH_FORCE_GPU_TESTS") == "1":
        return True
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run scripts/gpu_suite.sh on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With PTXBENCH_TEST_TIMES=file, each test's duration is appended as it finishes, so a
    GPU suite cut off by the device call's time limit still says where its time went."""
    path = os.environ.get("PTXBENCH_TEST_TIMES")
    if path and (report.when == "call" or report.outcome != "passed"):
        with open(path, "a") as f:
            f.write(f"{report.duration:8.1f} s  {report.when:8s} {report.outcome:7s} {report.nodeid}\n")
