"""scripts/gemm_window.py (a GPU window's GEMM jobs in one evaluator): bad job specs and unknown
variants are refused with one line and exit 2 before anything is written or any GPU is looked for."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args, says", [
    (["--ab", "gemm_n7168_k5120:shipped"], "want TASK:VARIANT:WORKLOADS[:ROUNDS]"),
    (["--ab", "gemm_n7168_k5120:shipped:M70:two"], "want TASK:VARIANT:WORKLOADS[:ROUNDS]"),
    (["--check", "gemm_n7168_k5120:shipped:M70:creditt"], "want TASK:VARIANTS:WORKLOADS[:credit]"),
    (["--check", "gemm_n7168_k5120:shipped,no_such:M70"], "unknown GEMM variant(s) no_such"),
])
def test_bad_jobs_exit_2_and_write_nothing(args, says, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gemm_window.py"), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert not out.exists()
