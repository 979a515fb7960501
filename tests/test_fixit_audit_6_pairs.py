"""Audit 6 of Fixit's pairs: a correction is another kernel.

A GPU verdict can flip on the same kernel: the inputs are fresh random values every check (rare large
outliers included), a borderline kernel passes one draw and fails the next, and a watchdog timeout
depends on the machine's load. A model that sent its failed kernel again unchanged, and was judged
correct the second time, fixed nothing: the pair taught "answer this failure with the same kernel"
as a correction, its explanation describing a change that was never made. Such a resubmission is no
correction (comments and whitespace aside, with the same launch manifest); a later kernel that
differs and passes still is.

Run folders written with the real TrajectoryWriter and hand-made GPU verdicts
(tests/trajectory_fixtures.py), built with the real `agent fixit build`.
"""
from __future__ import annotations

import json

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from trajectory_fixtures import eval_result, kernel, reply_for, write_run

from agent.fixit.build import BuildOptions, build, find_pairs, load_attempts
from tools.results import Timing
from tools.solution import Solution


def _c(kind: str, solution: Solution, why: str):
    ev = eval_result(kind, speedup=1.0 if kind == "correct" else None)
    if kind == "correct":
        ev.workloads[0].timing = Timing(median_ms=1.0, iqr_ms=0.01, cv=0.01, runs=10)
    return (solution, ev, reply_for(solution, why))


def _resent(s: Solution) -> Solution:
    """The same kernel sent again, with a comment and other spacing."""
    return s.model_copy(update={"source": "// unchanged, sent again\n" + s.source.replace("\n  ", "\n    ")})


def test_the_same_kernel_sent_again_is_no_correction(tmp_path):
    runs = tmp_path / "runs"
    flaky, hung, fixed = kernel("f1"), kernel("h1"), kernel("f3")
    write_run(runs, "flaky", [[_c("numerical", flaky, "First.")],
                              [_c("correct", _resent(flaky), "Fixed the accumulator reset.")],
                              [_c("correct", fixed, "Rewrote the epilogue.")]])
    write_run(runs, "hung", [[_c("timeout", hung, "First.")], [_c("correct", hung, "Removed the deadlock.")]])
    pairs, unfixed = find_pairs(load_attempts(runs / "flaky"))
    # turn 2 is turn 1's kernel: the correction is turn 3, the first kernel that changed and passed
    assert [(p.error, p.failed.record.turn, p.fixed.record.turn) for p in pairs] == [("numerical", 1, 3)]
    pairs, unfixed = find_pairs(load_attempts(runs / "hung"))
    assert not pairs and [(a.record.turn, e) for a, e in unfixed] == [(1, "timeout")]

    res = build([runs], tmp_path / "data", BuildOptions())
    rows = [json.loads(x) for x in (tmp_path / "data/train.jsonl").read_text().splitlines()]
    assert res.examples == len(rows) == 1 and res.card["unfixed_failures"] == 1
    assert (rows[0]["meta"]["failed_turn"], rows[0]["meta"]["fixed_turn"]) == (1, 3)


def test_a_changed_manifest_is_a_changed_kernel(tmp_path):
    """The same source launched another way (a grid that covers the last tile) is a correction."""
    runs = tmp_path / "runs"
    s = kernel("g1")
    wider = s.model_copy(update={"manifest": s.manifest.model_copy(update={"launches": [
        s.manifest.launches[0].model_copy(update={"grid": [2]})]})})
    write_run(runs, "grid", [[_c("numerical", s, "First.")], [_c("correct", wider, "Two blocks cover every row.")]])
    pairs, _ = find_pairs(load_attempts(runs / "grid"))
    assert [(p.error, p.failed.record.turn, p.fixed.record.turn) for p in pairs] == [("numerical", 1, 2)]
