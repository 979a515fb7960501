"""The report's numbers (agent/report.py), exactly, on candidate records built here: the per-run
verdicts (correct, correct on the held-out sizes, correct with arch, executed), fast_p, the best
speedup and the held-out speedup that goes with it, the proportions and their Wilson intervals,
the geometric mean and its bootstrap interval. The report's CLI and its files are
tests/test_report.py's and tests/test_audit_report_*.py's; these are fast, for mutation runs."""
from __future__ import annotations

import math

import pytest

from agent.report import (FAST_P, Proportion, bootstrap_geomean_ci, candidate_correct, candidate_correct_held_out,
                          candidate_cwa, geomean, proportion, run_metrics)
from agent.trajectory import CandidateRecord, RunSummary, TurnRecord, Verdicts

OK = dict(compiled=True, arch_sass=True, arch_executed=True, correct=True, correct_held_out=True)


def cand(turn: int = 1, outcome: str = "correct_with_arch", **verdicts) -> CandidateRecord:
    return CandidateRecord(turn=turn, sample=0, path=f"candidates/{turn}-0", outcome=outcome,
                           verdicts=Verdicts(**verdicts))


def summary(*cands: CandidateRecord) -> RunSummary:
    turns = sorted({c.turn for c in cands})
    return RunSummary(run_id="r", task="gemm", arch="sm_90a", model="m", status="finished", turns=max(turns),
                      per_turn=[TurnRecord(turn=t, candidates=[c for c in cands if c.turn == t]) for t in turns])


def test_a_candidates_correctness_from_its_verdict_else_its_outcome():
    assert candidate_correct(cand(correct=True, compiled=True)) is True
    assert candidate_correct(cand(correct=False, compiled=True)) is False
    for outcome in ("model_error", "format_error", "compile_error", "run_failed", "incorrect"):
        assert candidate_correct(cand(outcome=outcome, compiled=True)) is False, outcome
    assert candidate_correct(cand(outcome="correct_with_arch", compiled=False)) is False  # never compiled
    assert candidate_correct(cand(outcome="correct_with_arch", compiled=True)) is True
    assert candidate_correct(cand(outcome="unverified", compiled=True)) is None  # compiled, not run


def test_correct_held_out_needs_the_visible_sizes_first():
    assert candidate_correct_held_out(cand(correct=True, correct_held_out=False, compiled=True)) is False
    assert candidate_correct_held_out(cand(correct=True, correct_held_out=None, compiled=True)) is None
    assert candidate_correct_held_out(cand(correct=True, correct_held_out=True, compiled=True)) is True
    assert candidate_correct_held_out(cand(correct=False, correct_held_out=True, compiled=True)) is False
    assert candidate_correct_held_out(cand(outcome="unverified", correct_held_out=True, compiled=True)) is None


def test_correct_with_arch_with_and_without_the_executed_check():
    assert candidate_cwa(cand(**OK), executed=True) is True
    assert candidate_cwa(cand(**{**OK, "arch_sass": False}), executed=False) is False
    assert candidate_cwa(cand(**{**OK, "correct": False}), executed=False) is False
    assert candidate_cwa(cand(**{**OK, "arch_executed": False}), executed=False) is False
    unchecked = cand(**{**OK, "arch_executed": None})
    assert candidate_cwa(unchecked, executed=False) is True and candidate_cwa(unchecked, executed=True) is None
    gpu_less = cand(outcome="unverified", **{**OK, "correct": None})
    assert candidate_cwa(gpu_less, executed=False) is None


def test_a_runs_verdicts_are_any_candidates_and_unknown_only_where_none_reached_it():
    m = run_metrics(summary(cand(1, "compile_error", compiled=False),
                            cand(2, "unverified", compiled=True, arch_sass=True)), 8)
    assert m.values["compiled"] is True and m.values["arch_sass"] is True
    assert m.values["correct"] is None and m.values["cwa"] is None and m.values["cwa_executed"] is None
    m = run_metrics(summary(cand(1, "incorrect", compiled=True, arch_sass=True, correct=False)), 8)
    assert (m.values["correct"], m.values["correct_held_out"], m.values["cwa"], m.values["cwa_executed"]) == (
        False, False, False, False)
    assert m.values["fast_0"] is False and m.speedup is None
    m = run_metrics(summary(cand(1, "compile_error", compiled=False)), 8)
    assert m.values["compiled"] is False and m.values["arch_sass"] is False
    m = run_metrics(summary(cand(1, "arch_missing", compiled=True, arch_sass=False, correct=True)), 8)
    assert m.values["arch_sass"] is False and m.values["correct"] is True and m.values["cwa"] is False


def test_speed_counts_only_for_kernels_counted_doing_the_work():
    """fast_p and the best speedup come from candidates correct with arch AND executed: a kernel
    whose wgmma was never counted at run time (unchecked) buys nothing, however fast."""
    unchecked = cand(1, **{**OK, "arch_executed": None}, speedup=5.0, sol_score=0.9)
    m = run_metrics(summary(unchecked), 8)
    assert m.values["cwa"] is True and m.values["cwa_executed"] is None
    assert m.speedup is None and m.sol_score is None and m.speedup_held_out is None
    assert all(m.values[f"fast_{p:g}"] is None for p in FAST_P)


def test_fast_p_and_the_held_out_speed_of_the_fastest_kernel():
    slow = cand(1, **OK, speedup=0.8, speedup_held_out=2.0, sol_score=0.3)
    fast = cand(2, **OK, speedup=1.25, speedup_held_out=0.5, sol_score=0.6)
    m = run_metrics(summary(slow, fast), 8)
    assert m.speedup == 1.25 and m.speedup_held_out == 0.5  # the visible speed chooses the kernel
    assert m.sol_score == 0.6
    assert FAST_P == (0.0, 0.5, 0.8, 1.0)
    assert [m.values[f"fast_{p:g}"] for p in FAST_P] == [True, True, True, True]
    m = run_metrics(summary(slow, fast), 1)  # within turn 1 only the slow one
    assert m.speedup == 0.8 and m.speedup_held_out == 2.0 and m.sol_score == 0.3
    assert [m.values[f"fast_{p:g}"] for p in FAST_P] == [True, True, False, False]  # beats p, strictly
    m = run_metrics(summary(cand(1, **OK, speedup=1.0)), 8)
    assert m.values["fast_1"] is False and m.values["fast_0.8"] is True
    untimed = run_metrics(summary(cand(1, **OK)), 8)  # correct with arch, executed, not timed
    assert untimed.values["fast_0"] is True and untimed.values["fast_0.5"] is None
    wrong_held = cand(1, **{**OK, "correct_held_out": False}, speedup=2.0, speedup_held_out=1.5)
    assert run_metrics(summary(wrong_held), 8).speedup_held_out is None  # wrong there: no speed there
    assert run_metrics(summary(slow, cand(2, **OK, sol_score=0.1)), 8).sol_score == 0.3  # best of the timed


def test_proportions_and_their_wilson_intervals():
    p = proportion([True, False, None, True, None])
    assert (p.successes, p.n, p.unknown, p.rate) == (2, 3, 2, 2 / 3)
    assert proportion([None]).rate is None and proportion([None]).wilson() is None
    # Wilson's interval over all runs, the unknown ones counted as failures for the lower end and as
    # successes for the upper: 2 of 5 and 4 of 5
    lo, hi = p.wilson()
    z = 1.959964

    def wilson(s, n):
        q = s / n
        c = (q + z * z / (2 * n)) / (1 + z * z / n)
        h = z * math.sqrt(q * (1 - q) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return max(0.0, c - h), min(1.0, c + h)

    assert lo == pytest.approx(wilson(2, 5)[0], abs=1e-12) and hi == pytest.approx(wilson(4, 5)[1], abs=1e-12)
    assert (lo, hi) == pytest.approx((0.1176, 0.9638), abs=1e-4)
    assert Proportion(0, 4, 0).wilson()[0] == 0.0 and Proportion(4, 4, 0).wilson()[1] == pytest.approx(1.0)
    assert Proportion(0, 4, 0).wilson()[1] == pytest.approx(wilson(0, 4)[1], abs=1e-12)
    assert Proportion(3, 4, 0).wilson() == pytest.approx(wilson(3, 4), abs=1e-12)
    assert Proportion(20, 20, 0).wilson()[1] == 1.0  # never above 100% (the formula gives 1 + 2e-16 here)


def test_the_geometric_mean_and_its_bootstrap_interval():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0) and geomean([3.0]) == pytest.approx(3.0)
    assert bootstrap_geomean_ci([2.0]) is None
    xs = [0.5, 0.7, 1.1, 1.9, 3.3, 6.1, 8.0]
    ci = bootstrap_geomean_ci(xs)
    assert ci == bootstrap_geomean_ci(xs, seed=0)  # seeded: reports are reproducible
    assert ci != bootstrap_geomean_ci(xs, seed=1)
    lo, hi = ci
    assert 0.5 < lo < geomean(xs) < hi < 8.0
    # the 2.5th and 97.5th percentiles of the resampled means, exactly
    import random

    rng = random.Random(0)
    logs = [math.log(x) for x in xs]
    means = sorted(sum(rng.choice(logs) for _ in logs) / len(logs) for _ in range(2000))
    assert ci == (math.exp(means[50]), math.exp(means[1949]))
    assert bootstrap_geomean_ci([2.0, 2.0]) == pytest.approx((2.0, 2.0))
    assert bootstrap_geomean_ci(xs, resamples=40) != ci
