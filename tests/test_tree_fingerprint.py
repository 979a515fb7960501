"""scripts/tree_fingerprint.sh: the line scripts/gpu_suite.sh prints so that device calls can be shown to have
run one tree. The device gets a copy of the working tree without .git: the same files must give the same
line wherever they lie, and a change to any file the suite runs must change it."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("agent", "tasks", "tools", "knowledge", "tests", "scripts", "pyproject.toml")


def fingerprint(root: Path) -> str:
    out = subprocess.run(["bash", str(root / "scripts" / "tree_fingerprint.sh")], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.startswith("tree ") and out.rstrip().endswith(" files)"), out
    return out.strip()


def test_a_copy_gives_the_same_line_and_a_changed_kernel_another(tmp_path):
    for part in PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, tmp_path / part)
    (tmp_path / "runs").mkdir()  # outside the fingerprint: what a run writes does not change it
    (tmp_path / "runs" / "x.json").write_text("{}")
    here = fingerprint(REPO)
    assert fingerprint(tmp_path) == here
    kernel = tmp_path / "tasks" / "gemm_n7168_k5120" / "expert" / "kernel.cu"
    kernel.write_text(kernel.read_text() + "\n// one line more\n")
    assert fingerprint(tmp_path) != here
