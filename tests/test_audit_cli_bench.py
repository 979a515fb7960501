"""`agent bench`'s exit status: an expert that lost the requested instructions is a failed
check (README: "a requested feature missing" is status 1), not a success; a simple solution
without them is what it is. Real NVRTC/ptxas/SASS inspection; the shipped-solutions folder is a
copy in tmp_path (the CLI's own command function, in process)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agent.commands import bench

REPO = Path(__file__).resolve().parents[1]
GEMM = "gemm_n7168_k5120"


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def _bench(tasks_dir: Path, monkeypatch, *args: str):
    monkeypatch.setattr(bench, "TASKS_DIR", tasks_dir)
    app = typer.Typer()
    bench.register(app)
    app.command("unused")(lambda: None)  # two commands: typer keeps "bench" as a subcommand name
    return CliRunner().invoke(app, ["bench", *args])


def test_an_expert_without_its_requested_instructions_fails_the_bench(tmp_path, monkeypatch):
    # the SIMT kernel shipped as `simple`, put where an expert belongs: compiles, no wgmma/TMA
    shutil.copytree(REPO / "tasks" / GEMM / "simple", tmp_path / GEMM / "expert")
    shutil.copytree(REPO / "tasks" / GEMM / "simple", tmp_path / GEMM / "simple")
    r = _bench(tmp_path, monkeypatch, "--model", "expert", "--task", GEMM, "--no-executed", "--json")
    [row] = json.loads(r.stdout[r.stdout.index("["):])
    assert row["compiled"] is True and row["arch_sass"] is False
    assert r.exit_code == 1, r.output
    r = _bench(tmp_path, monkeypatch, "--model", "simple", "--task", GEMM, "--no-executed", "--json")
    assert r.exit_code == 0, r.output  # a simple solution is not asked for the instructions


def test_the_shipped_expert_still_passes(monkeypatch):
    r = _bench(REPO / "tasks", monkeypatch, "--model", "expert", "--task", GEMM, "--no-executed", "--json")
    [row] = json.loads(r.stdout[r.stdout.index("["):])
    assert row["arch_sass"] is True and r.exit_code == 0, r.output


def test_a_row_the_toolchain_could_not_judge_says_so(tmp_path):
    """ptxas missing: exit 3, and the row (stdout, --out) names the fault, not just compiled=false,
    which reads as a shipped expert that does not compile."""
    import os
    import subprocess
    import sys

    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "-m", "agent.cli", "bench", "--model", "expert", "--task", GEMM,
                        "--no-executed", "--json", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PTXBENCH_PTXAS": str(tmp_path / "none")})
    assert p.returncode == 3, p.stderr
    [row] = json.loads(out.read_text())
    assert json.loads(p.stdout) == [row]
    assert row["infra_error"] and "ptxas" in row["infra_error"]
