"""`agent eval --json` is JSON any parser reads, with the values eval.json records.

A wrong kernel's mismatch carries inf (an output of the wrong shape) or NaN (the element it got):
`json.dumps` writes those as the bare words Infinity / NaN, which no strict JSON parser (jq, a
browser, most languages) accepts; stdout says null, as pydantic writes them. The GPU's
verdict is the only stand-in here: the real evaluator compiles and inspects on this machine, and a
failed workload as the GPU worker reports it is added to its result."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import tools.evaluator
from agent.commands import evaluate
from tools.results import EvalResult, Mismatch, WorkloadResult

REPO = Path(__file__).resolve().parents[1]
GEMM = "gemm_n7168_k5120"


def _strict(text: str):
    def refuse(word):
        raise ValueError(f"not JSON: {word}")
    return json.loads(text, parse_constant=refuse)


# how a wrong kernel's output compared: the wrong shape (inf), NaN where a number belongs
BAD = Mismatch(output="C", max_abs_err=math.inf, max_rel_err=math.inf, mismatch_frac=1.0, nan_count=3,
               got=math.nan, expected=1.0, passed=False)


class _GpuVerdict(tools.evaluator.Evaluator):
    """The real evaluator (compile, SASS), plus the GPU worker's verdict on one visible workload."""

    def evaluate(self, *args, **kwargs) -> EvalResult:
        res = super().evaluate(*args, **kwargs)
        res.run_status, res.run_reason = "ok", None
        res.workloads = [WorkloadResult(workload="M8192", split="visible", axes={"M": 8192}, status="failed",
                                        reason="incorrect", outputs=[BAD])]
        return res


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def test_eval_json_has_no_bare_nan_or_infinity(monkeypatch):
    monkeypatch.setattr(tools.evaluator, "Evaluator", _GpuVerdict)
    app = typer.Typer()
    evaluate.register(app)
    app.command("unused")(lambda: None)  # two commands: typer keeps "eval" as a subcommand name
    r = CliRunner().invoke(app, ["eval", str(REPO / "tasks" / GEMM / "expert"), "--task", GEMM, "--no-executed",
                                 "--json"])
    assert r.exit_code == 1, r.output  # a failed workload
    data = _strict(r.stdout)
    [m] = data["workloads"][0]["outputs"]
    recorded = json.loads(BAD.model_dump_json())
    assert m["max_abs_err"] is None and m["got"] is None and m["nan_count"] == 3
    assert (recorded["max_abs_err"], recorded["got"]) == (None, None)  # as pydantic writes them
    assert data["verdicts"]["correct"] is False


def test_eval_json_lists_no_kernel_failure_when_the_toolchain_failed(tmp_path):
    """ptxas missing: nothing was judged (exit 3), so `failures` (what the kernel failed) is empty
    rather than "did not compile", which a script reading the JSON would count against the kernel."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "agent.cli", "eval", str(REPO / "tasks" / GEMM / "expert"), "--task",
                        GEMM, "--json"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PTXBENCH_PTXAS": str(tmp_path / "none"),
                            "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 3, p.stderr
    data = _strict(p.stdout)
    assert data["infra_error"] and "ptxas" in data["infra_error"]
    assert data["failures"] == []
