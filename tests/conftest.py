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
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run tools/gpu_suite.sh on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
