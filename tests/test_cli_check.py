"""`agent doctor`, `agent check`, `agent inspect` as a user runs them (subprocess, real tools)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "corpus"
ROOT = Path(__file__).parent.parent


def agent(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # COLUMNS: rich would otherwise wrap long lines at 80 columns when output is a pipe
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "1000", **(env or {})}, timeout=120)


def test_doctor_json_reports_tools_gpu_packages_and_credentials():
    p = agent("doctor", "--json", env={"OPENAI_API_KEY": "sk-secret-value-123"})
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] and data["toolchain"]["ptx_isa"]["ok"]
    assert data["toolchain"]["tools"]["ptxas"]["version"]
    assert data["gpu"]["gpus"] or data["gpu"]["reason"]
    assert data["packages"]["pydantic"] and "torch" in data["packages"]
    assert data["credentials"]["openai"] == "set"
    assert "sk-secret-value-123" not in p.stdout


def test_doctor_text_never_prints_keys():
    p = agent("doctor", env={"ANTHROPIC_API_KEY": "sk-ant-very-secret"})
    assert p.returncode == 0 and "ptxas" in p.stdout and "anthropic set" in p.stdout
    assert "sk-ant-very-secret" not in p.stdout + p.stderr


def test_inspect_json_contract():
    p = agent("inspect", str(CORPUS / "sm_90a" / "wgmma_serialized.cu"), "--arch", "sm_90a", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["compiled"] is True
    k = data["kernels"]["wgmma_serialized"]
    assert k["opcodes"]["HGMMA"] >= 4 and k["registers"] > 0
    assert data["features"]["wgmma"] is True and data["features"]["tma"] is False
    assert data["flags"] == {"wgmma_serialized": True, "setmaxnreg_ignored": False, "reads_clock": False,
                             "reads_launch_id": False, "reads_perf_counters": False, "module_state": False}
    assert any(d["code"] and d["severity"] == "info" for d in data["diagnostics"])


def test_inspect_raw_ptx_by_suffix():
    p = agent("inspect", str(CORPUS / "sm_100a" / "tcgen05_alloc_pos.ptx"), "--arch", "sm_100a", "--json")
    data = json.loads(p.stdout)
    assert p.returncode == 0 and data["language"] == "ptx" and data["features"]["tcgen05_alloc"]


def test_check_reports_requested_features():
    p = agent("check", str(CORPUS / "common" / "tma_pos.cu"), "--task", "gemm", "--json")
    assert p.returncode == 1, p.stderr  # a requested feature is missing: the exit status says so (issue 23)
    data = json.loads(p.stdout)
    assert data["requested"] == ["wgmma", "tma"] and data["missing"] == ["wgmma"]
    p = agent("check", str(CORPUS / "common" / "tma_pos.cu"), "--task", "gemm")
    assert "requested tma: found" in p.stdout and "requested wgmma: missing" in p.stdout


def test_check_failed_compile_shows_the_line_and_exits_nonzero():
    path = CORPUS / "sm_90a" / "wgmma_pos.cu"
    fence_line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "wgmma.fence" in text)
    p = agent("check", str(path), "--task", "gemm", "--arch", "sm_100a")
    assert p.returncode == 1
    assert f"ptxas error: line {fence_line}: Instruction 'wgmma.fence' not supported on .target 'sm_100a'" in p.stdout
    assert "Traceback" not in p.stdout + p.stderr


@pytest.mark.parametrize("args,needle", [
    (["check", "{missing}", "--task", "gemm"], "no such file"),
    (["check", "{empty}", "--task", "gemm"], "empty"),
    (["inspect", "{nonascii}", "--arch", "sm_90a"], "non-ASCII"),
    (["inspect", "{pdl}", "--arch", "sm_80"], "unknown arch 'sm_80'"),
    (["check", "{pdl}", "--task", "no_such_task"], "unknown task"),
    (["inspect", "{txt}"], "--lang"),
])
def test_bad_input_is_one_line(tmp_path, args, needle):
    files = {"missing": tmp_path / "nope.cu", "empty": tmp_path / "empty.cu", "nonascii": tmp_path / "k.ptx",
             "pdl": CORPUS / "common" / "pdl_pos.cu", "txt": tmp_path / "kernel.txt"}
    files["empty"].write_text("  \n")
    files["nonascii"].write_text(".version 8.0\n.target sm_90a // \u00fc\n")
    files["txt"].write_text("x")
    p = agent(*[a.format(**files) for a in args])
    assert p.returncode == 2
    assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


def test_missing_toolchain_is_one_line(tmp_path):
    p = agent("check", str(CORPUS / "common" / "pdl_pos.cu"), env={"PTXBENCH_PTXAS": str(tmp_path / "ptxas")})
    # the machine's fault, not the kernel's: the infrastructure exit status (issue 23)
    assert p.returncode == 3 and "ptxas not found" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = agent("doctor", env={"PTXBENCH_PTXAS": str(tmp_path / "ptxas")})
    assert p.returncode == 3 and "missing" in p.stdout
