"""Shared by the GPU tests of the task families: one Evaluator per test module, its worker
log and baseline cache in PTXBENCH_GPU_LOGS when scripts/gpu_suite.sh runs them (a module
that needs other limits defines its own `evaluator`)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.evaluator import Evaluator


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    cache = Path(os.environ.get("PTXBENCH_GPU_LOGS") or tmp_path_factory.mktemp("cache"))
    with Evaluator(timeout_s=300, kernel_timeout_s=30, cache_dir=cache) as ev:
        yield ev
