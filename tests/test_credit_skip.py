"""Counted runs are skipped where the module's SASS holds none of the requested instructions:
an instruction the SASS does not hold cannot execute, so the executed check's verdict is known
(not credited, the reason says so) and the counted runs, whose SASS-patched pass runs a slow
kernel some 50 times slower, would only confirm zeros. End to end on the CPU: real NVRTC, ptxas
and disassembler; a stand-in worker (tests/fake_worker.py, mode fp8_wgmma) that, if asked for
counted runs, would report an honest wgmma kernel's counters, so a verdict that came from
counted runs would show as credit."""
from __future__ import annotations

import sys

import pytest
from test_credit_in_process import FIXTURES, WARP_MMA
from test_evaluator_cpu import ROOT, small_gemm

from tools.evaluator import NO_REQUESTED_SASS, Evaluator, _no_requested_sass
from tools.results import InspectResult, KernelSass
from tools.solution import Solution


def _evaluate(tmp_path, monkeypatch, source: str):
    mode = tmp_path / "mode"
    mode.write_text("fp8_wgmma")
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(mode))
    monkeypatch.delenv("PTXBENCH_CREDIT", raising=False)
    sol = tmp_path / "sol"
    sol.mkdir(exist_ok=True)
    (sol / "kernel.cu").write_text(source)
    (sol / "launch.json").write_text((FIXTURES / "good" / "launch.json").read_text())
    with Evaluator(gpus=[0], worker_cmd=[sys.executable, str(ROOT / "tests" / "fake_worker.py")], timeout_s=30,
                   cache_dir=tmp_path) as ev:
        return ev.evaluate(Solution.from_dir(sol), small_gemm(), "sm_90a", workloads="all", executed_check=True,
                           time=False)


def test_a_simt_module_gets_its_verdict_without_counted_runs(tmp_path, monkeypatch):
    r = _evaluate(tmp_path, monkeypatch, (FIXTURES / "good" / "kernel.cu").read_text())
    assert r.correct is True and r.inspect.status == "ok"
    ex = r.executed
    assert ex.status == "ok" and ex.reason == NO_REQUESTED_SASS
    assert not any(ex.executed.values()) and not any(ex.carries.values()) and set(ex.carries) == set(
        r.requested_features)
    assert r.correct_with_arch is False and r.arch_executed_any is False
    # no workload was counted: the stand-in would have answered with a wgmma kernel's counters
    for w in r.workloads:
        assert (w.credit or {}).get("status") in (None, "skipped"), w.credit
        assert (w.credit or {}).get("status") is None or w.credit["reason"] == NO_REQUESTED_SASS
    assert "counted_runs" not in r.phase_s


def test_a_requested_instruction_anywhere_in_the_module_keeps_the_counted_runs(tmp_path, monkeypatch):
    """A wgmma in a kernel no launch names still counts: a launched kernel could start it."""
    r = _evaluate(tmp_path, monkeypatch, (FIXTURES / "good" / "kernel.cu").read_text() + WARP_MMA["qgmma"])
    assert "spare" in r.inspect.uncounted_kernels
    assert r.executed.reason != NO_REQUESTED_SASS
    assert all((w.credit or {}).get("status") == "ran" for w in r.workloads), [w.credit for w in r.workloads]


@pytest.mark.parametrize("sass,known", [
    (None, False),  # not read yet
    (InspectResult(status="skipped", arch="sm_90a"), False),
    (InspectResult(status="ok", arch="sm_90a"), False),  # no kernels read: nothing may be taken as absent
    (InspectResult(status="ok", arch="sm_90a", kernels={"k": KernelSass(opcodes={"FFMA": 9})}), True),
    (InspectResult(status="ok", arch="sm_90a", kernels={"k": KernelSass(opcodes={"FFMA": 9}),
                                                       "spare": KernelSass(opcodes={"UTMALDG": 1})}), False),
    (InspectResult(status="ok", arch="sm_90a", infra_error="no disassembler",
                   kernels={"k": KernelSass(opcodes={"FFMA": 9})}), False),
])
def test_the_verdict_is_known_only_from_a_module_read_whole(sass, known):
    assert _no_requested_sass(sass, ["wgmma", "tma"]) is known
    assert _no_requested_sass(sass, []) is False


def test_the_feedback_says_missing_not_never_executed():
    """The known verdict's feedback: a feature absent from the SASS is MISSING, never "in the SASS
    but never executed"."""
    from agent.feedback import arch_section
    from tools.results import CompileResult, EvalResult, ExecutedCheck

    f = ["wgmma", "tma"]
    ex = ExecutedCheck(status="ok", reason=NO_REQUESTED_SASS, counts={x: 0 for x in f},
                       executed={x: False for x in f}, carries={x: False for x in f})
    ev = EvalResult(task="gemm_n7168_k5120", arch="sm_90a", requested_features=f, executed=ex,
                    compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                    inspect=InspectResult(status="ok", arch="sm_90a"))
    text = arch_section(ev)
    assert "`wgmma`: MISSING" in text and "`tma`: MISSING" in text
    assert "never executed" not in text and "missing wgmma, tma" in text
