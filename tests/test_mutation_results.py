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
import math

import pytest

from tools.results import CompileResult, EvalResult, ExecutedCheck, FeatureVerdict, InspectResult, WorkloadResult


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
    """The real Evaluator with the stand-in worker, timed (tests/test_credit_in_process.py)."""
    from test_credit_in_process import _through_the_evaluator

    return _through_the_evaluator(mode_name, tmp_path, monkeypatch, time=True)


def test_end_to_end_both_speedups_are_published_when_every_workload_passed(tmp_path, monkeypatch):
    r = _evaluate("timed", tmp_path, monkeypatch)
    assert [(w.split, w.status) for w in r.workloads] == [("visible", "passed"), ("held_out", "passed")]
    assert r.speedup == pytest.approx(2.0) and r.speedup_held_out == pytest.approx(0.5)
    assert r.verdicts()["speedup_held_out"] == pytest.approx(0.5)


def test_end_to_end_no_held_out_speedup_once_a_held_out_workload_failed_after_its_timing(tmp_path, monkeypatch):
    """The held-out workload was timed (it has a speedup of its own), then its counted run
    answered wrong: the held-out split has no speedup; the visible one, all passed, keeps its."""
    r = _evaluate("held_out_wrong", tmp_path, monkeypatch)
    held = r.workloads[1]
    assert held.split == "held_out" and held.status == "failed" and held.reason == "wrong_in_timed_run"
    assert held.speedup == 0.5  # timed before it failed
    assert r.speedup_held_out is None and r.verdicts()["speedup_held_out"] is None
    assert r.speedup == pytest.approx(2.0) and r.correct is True and r.split_correct("held_out") is False


# ---------------------------------------------------------------- the speed summary's rule

def timed(split: str, speedup: float | None, status: str = "passed", ci=None) -> WorkloadResult:
    return WorkloadResult(workload=f"{split}{speedup}", split=split, axes={}, status=status, speedup=speedup,
                          speedup_ci=ci)


def summarised(*wls: WorkloadResult) -> EvalResult:
    from tools.evaluator import _summarise_speed

    r = result()
    r.workloads = list(wls)
    _summarise_speed(r)
    return r


def test_each_split_has_a_speedup_only_when_all_its_workloads_passed_and_were_timed():
    r = summarised(timed("visible", 2.0, ci=(1.0, 4.0)), timed("visible", 8.0, ci=(4.0, 16.0)),
                   timed("held_out", 0.5), timed("held_out", 2.0))
    assert r.speedup == pytest.approx(4.0) and r.speedup_held_out == pytest.approx(1.0)
    assert r.speedup_ci == pytest.approx((2.0, 8.0))  # geometric mean of the ends
    assert r.speedup_spread == pytest.approx(2.0)  # geometric std factor of 2 and 8
    for bad in (timed("held_out", 3.0, status="failed"), timed("held_out", None), timed("held_out", 3.0, "skipped")):
        r = summarised(timed("visible", 2.0), timed("held_out", 0.5), bad)
        assert r.speedup_held_out is None and r.speedup == pytest.approx(2.0), bad
    for bad in (timed("visible", 3.0, status="failed"), timed("visible", None), timed("visible", 3.0, "skipped")):
        r = summarised(timed("visible", 2.0), timed("held_out", 0.5), bad)
        assert r.speedup is None and r.speedup_ci is None and r.speedup_spread is None, bad
        assert r.speedup_held_out == pytest.approx(0.5)
    r = summarised(timed("visible", 2.0, ci=(1.0, 4.0)), timed("visible", 8.0))
    assert r.speedup == pytest.approx(4.0) and r.speedup_ci is None  # an interval only when every one has it
    assert r.speedup_held_out is None  # no held-out workload: none
    r = summarised(timed("held_out", 2.0))
    assert r.speedup is None and r.speedup_held_out == pytest.approx(2.0) and r.speedup_spread is None


# ---------------------------------------------------------------- the other verdicts, exactly

def test_verdicts_names_every_verdict_with_its_value():
    r = result(("visible", "passed"), ("held_out", "failed"))
    r.executed = ExecutedCheck(status="ok", executed={"wgmma": True}, carries={"wgmma": False})
    r.speedup, r.speedup_ci, r.speedup_held_out, r.sol_score = 1.5, (1.25, 1.75), 0.75, 0.5
    assert r.verdicts() == {"compiled": True, "arch_sass": True, "arch_executed_any": True, "arch_executed": False,
                            "correct": True, "correct_held_out": False, "correct_with_arch": False, "speedup": 1.5,
                            "speedup_ci": [1.25, 1.75], "speedup_held_out": 0.75, "sol_score": 0.5}
    r.speedup_ci = None
    assert r.verdicts()["speedup_ci"] is None


def test_the_sass_verdict():
    r = result(("visible", "passed"))
    assert r.compiled and r.arch_ok
    r.requested_features = ["wgmma", "tma"]
    assert not r.arch_ok and r.inspect.missing(["wgmma", "tma"]) == ["tma"]
    r.inspect.features["tma"] = FeatureVerdict(present=False)
    assert not r.arch_ok and r.inspect.missing(["tma", "wgmma"]) == ["tma"]
    r.inspect.features["tma"] = FeatureVerdict(present=True)
    assert r.arch_ok and r.inspect.feature_present("tma") and not r.inspect.feature_present("x")
    r.inspect.status = "skipped"
    assert not r.arch_ok
    r.inspect.status = "ok"
    r.compile.status = "failed"
    assert not r.compiled and not r.arch_ok


def test_the_executed_verdicts():
    r = result(("visible", "passed"))
    r.requested_features = ["wgmma", "tma"]
    assert r.arch_executed is None and r.arch_executed_any is None  # not requested: not checked
    r.executed = ExecutedCheck(status="failed", executed={"wgmma": True, "tma": True},
                               carries={"wgmma": True, "tma": True})
    assert r.arch_executed is None and r.arch_executed_any is None
    r.executed = ExecutedCheck(status="ok", executed={"wgmma": True, "tma": True}, carries={"wgmma": True})
    assert r.arch_executed_any is True and r.arch_executed is False
    r.executed = ExecutedCheck(status="ok", executed={"wgmma": True}, carries={"wgmma": True, "tma": True})
    assert r.arch_executed_any is False and r.arch_executed is True


def test_infra_error_and_implausible():
    r = result(("visible", "passed"))
    assert r.infra_error is None and r.implausible is None
    r.harness_fault = "worker did not start"
    assert r.infra_error == "worker did not start"
    r.inspect.infra_error = "no disassembler"
    assert r.infra_error == "no disassembler"
    r.compile.infra_error = "no ptxas"
    assert r.infra_error == "no ptxas"
    r.workloads += [WorkloadResult(workload="a", split="visible", axes={}, status="failed", reason="incorrect",
                                   detail="wrong"),
                    WorkloadResult(workload="b", split="visible", axes={}, status="failed", reason="implausible",
                                   detail="above the ceiling"),
                    WorkloadResult(workload="c", split="visible", axes={}, status="failed", reason="implausible",
                                   detail="second")]
    assert r.implausible == "above the ceiling"


def test_the_one_line_reasons():
    from tools.results import Diagnostic, Mismatch, Timing

    d = Diagnostic(tool="ptxas", severity="error", code="C7515", message="bad", line=12, ptx_line=40)
    assert d.render() == "ptxas error (C7515): line 12: bad"
    assert d.model_copy(update={"line": None}).render() == "ptxas error (C7515): ptx line 40: bad"
    assert Diagnostic(tool="nvrtc", severity="warning", message="w").render() == "nvrtc warning: w"
    c = CompileResult(status="failed", arch="sm_90a", language="cuda", diagnostics=[d, Diagnostic(
        tool="nvrtc", severity="warning", message="w")])
    assert c.errors() == [d] and not c.ok
    base = dict(output="C", max_abs_err=0.5, max_rel_err=1.0, mismatch_frac=0.25, passed=False)
    assert Mismatch(**base).describe() == "output 'C': 25.00% of elements off (max abs err 0.5)"
    assert Mismatch(**base, rel_l2=0.125, first_mismatch=[1, 2], got=1.5, expected=2.0).describe() == (
        "output 'C': 25.00% of elements off (max abs err 0.5, relative L2 error 0.125); first at [1, 2]: got 1.5, "
        "expected 2")
    assert Mismatch(**base, first_mismatch=[1, 2], got=None, expected=2.0).describe() == (
        "output 'C': 25.00% of elements off (max abs err 0.5)")
    assert Mismatch(**base, rel_l2=0.01, rel_l2_bound=0.005).describe() == (
        "output 'C': relative L2 error 0.01 exceeds the bound 0.005 (every element is within the elementwise "
        "tolerance, the whole is not)")
    assert Mismatch(**base, rel_l2=0.005, rel_l2_bound=0.005).describe().endswith("relative L2 error 0.005)")
    assert Mismatch(**base, bad_rows=3, worst_row=[0, 7], row_ratio=2.5).describe() == (
        "output 'C': 3 row(s) off (the worst, at [0, 7], errs by 2.5x its row's allowance; every element is "
        "within the elementwise tolerance)")
    assert Mismatch(**base, bad_rows=3, worst_row=[0], row_ratio=2.5, first_mismatch=[0], got=1.0,
                    expected=2.0).describe().startswith("output 'C': 25.00% of elements off")
    assert Mismatch(**base, rel_l2=0.01, rel_l2_bound=0.005, first_mismatch=[0], got=1.0,
                    expected=2.0).describe().startswith("output 'C': 25.00% of elements off")
    assert Timing(median_ms=2.0, iqr_ms=0.5, cv=0.1, runs=10).spread == 0.25
    assert math.isnan(Timing(median_ms=0.0, iqr_ms=0.5, cv=0.1, runs=10).spread)
