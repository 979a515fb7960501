"""`agent check --json`: a SASS that could not be read (no disassembler: exit 3) says nothing
about the requested features; `missing` is null (not checked), not every requested feature,
which a script would count as a kernel without its instructions. Real NVRTC and ptxas."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _check(*args, env=None):
    return subprocess.run([sys.executable, "-m", "agent.cli", "check", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_missing_is_not_checked_when_the_sass_could_not_be_read(tmp_path):
    kernel = str(REPO / "tests" / "corpus" / "common" / "tma_pos.cu")
    blind = {"PTXBENCH_CUOBJDUMP": str(tmp_path / "none"), "PTXBENCH_NVDISASM": str(tmp_path / "none")}
    p = _check(kernel, "--task", "gemm", "--json", env=blind)
    assert p.returncode == 3, p.stderr
    data = json.loads(p.stdout)
    assert data["compiled"] is True and data["inspect"]["status"] != "ok"
    assert data["requested"] == ["wgmma", "tma"] and data["missing"] is None
    p = _check(kernel, "--task", "gemm", "--json")  # read: the verdict as before
    assert p.returncode == 1 and json.loads(p.stdout)["missing"] == ["wgmma"]
