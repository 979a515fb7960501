"""The verdicts an evaluation publishes (tools/results.py, tools/evaluator.py), by their rules:

- `split_correct` (correct, correct_held_out): every workload of the split passed. A skipped
  workload never counts as passed (tools/results.py's contract). Issue 46's planted bug: a
  skipped workload counted as passed.
- the speedups: visible and held-out apart, each published only when every workload of its split
  passed and was timed. Planted bug: a held-out speedup published when a held-out workload
  failed after its timing (its counted run answered wrong), run here end to end through the
  Evaluator and the CPU stand-in worker (tests/fake_worker.py, modes `timed`, `held_out_wrong`).
"""
from __future__ import annotations

import itertools
import sys

import pytest

from test_evaluator_cpu import FIXTURES, ROOT, small_gemm
from tools.results import CompileResult, EvalResult, ExecutedCheck, FeatureVerdict, InspectResult, WorkloadResult
from tools.solution import Solution


def result(*statuses: tuple[str, str], run_status: str = "ok") -> EvalResult:
    """An evaluation whose workloads have these (split, status)."""
    wls = [WorkloadResult(workload=f"W{i}", split=split, axes={}, status=status)
           for i, (split, status) in enumerate(statuses)]
    return EvalResult(task="gemm_n7168_k5120", arch="sm_90a", requested_features=["wgmma"],
                      compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                      inspect=InspectResult(status="ok", arch="sm_90a",
                                            features={"wgmma": FeatureVerdict(present=True, opcodes={"HGMMA": 8})}),
                      run_status=run_status, workloads=wls)


@pytest.mark.parametrize("split", ["visible", "held_out"])
def test_a_split_is_correct_only_when_every_workload_of_it_passed(split):
    other = "held_out" if split == "visible" else "visible"
    for statuses in itertools.product(["passed", "failed", "skipped"], repeat=2):
        r = result(*((split, s) for s in statuses), (other, "failed"))
        assert r.split_correct(split) is all(s == "passed" for s in statuses), statuses
    assert result((split, "skipped")).split_correct(split) is False  # skipped is never passed
    assert result((other, "passed")).split_correct(split) is None  # no workload of the split
    assert result((split, "passed"), run_status="skipped").split_correct(split) is None  # not run: unknown
    assert result((split, "passed"), run_status="failed").split_correct(split) is None


def test_correct_and_correct_held_out_are_the_two_splits():
    r = result(("visible", "passed"), ("held_out", "skipped"))
    assert r.correct is True and r.verdicts()["correct_held_out"] is False
    r = result(("visible", "skipped"), ("held_out", "passed"))
    assert r.correct is False and r.verdicts()["correct_held_out"] is True


def test_correct_with_arch_needs_every_part_and_is_never_true_unverified():
    ok = ExecutedCheck(status="ok", executed={"wgmma": True}, carries={"wgmma": True})
    r = result(("visible", "passed"))
    r.executed = ok
    assert r.arch_ok and r.correct_with_arch is True
    r.executed = ExecutedCheck(status="skipped", reason="no GPU")
    assert r.correct_with_arch is None  # unverified
    r.executed = ok
    r.inspect.flags["wgmma_serialized"] = True
    assert r.correct_with_arch is False
    r.inspect.flags["wgmma_serialized"] = False
    r.executed = ok.model_copy(update={"carries": {"wgmma": False}})
    assert r.correct_with_arch is False
    r = result(("visible", "skipped"))
    r.executed = ok
    assert r.correct_with_arch is False


def _evaluate(mode_name: str, tmp_path, monkeypatch):
    from tools.evaluator import Evaluator

    mode = tmp_path / "mode"
    mode.write_text(mode_name)
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(mode))
    monkeypatch.delenv("PTXBENCH_CREDIT", raising=False)
    with Evaluator(gpus=[0], worker_cmd=[sys.executable, str(ROOT / "tests" / "fake_worker.py")], timeout_s=30,
                   cache_dir=tmp_path) as ev:
        return ev.evaluate(Solution.from_dir(FIXTURES / "good"), small_gemm(), "sm_90a", executed_check=True,
                           time=True, workloads="all")


def test_both_speedups_are_published_when_every_workload_passed(tmp_path, monkeypatch):
    r = _evaluate("timed", tmp_path, monkeypatch)
    assert [(w.split, w.status) for w in r.workloads] == [("visible", "passed"), ("held_out", "passed")]
    assert r.speedup == pytest.approx(2.0) and r.speedup_held_out == pytest.approx(0.5)
    assert r.verdicts()["speedup_held_out"] == pytest.approx(0.5)


def test_no_held_out_speedup_once_a_held_out_workload_failed_after_its_timing(tmp_path, monkeypatch):
    """The held-out workload was timed (it has a speedup of its own), then its counted run
    answered wrong: the held-out split has no speedup; the visible one, all passed, keeps its."""
    r = _evaluate("held_out_wrong", tmp_path, monkeypatch)
    held = r.workloads[1]
    assert held.split == "held_out" and held.status == "failed" and held.reason == "wrong_in_timed_run"
    assert held.speedup == 0.5  # timed before it failed
    assert r.speedup_held_out is None and r.verdicts()["speedup_held_out"] is None
    assert r.speedup == pytest.approx(2.0) and r.correct is True and r.split_correct("held_out") is False
