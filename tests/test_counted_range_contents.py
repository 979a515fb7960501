"""What a counted range holds (issue 42 item 7, the counted runs' cost), on the CPU stand-in worker
(real timed phases and counted-run code, fake CUPTI): exactly one candidate run, and none of the
harness's own GPU work.

A CUPTI range counts everything the context runs between its push and its pop. One range over two
adjacent candidate runs (the pair order alternates, A B | B A, so the candidate's runs meet across
a pair boundary) would halve the pushes and pops, but between those two runs the harness judges the
first one (its reference rows: a GEMM on the same tensor cores, TMA included, whose work depends on
the candidate's output through the lazy term scales), loads the next pair's fresh inputs, poisons
the outputs and flushes L2: all of it would be counted as the candidate's (docs/METHODOLOGY.md,
"The counted runs' cost"). These tests hold the rule a range is built on, so that a cheaper range
that breaks it fails here and not on the H200."""
from __future__ import annotations

import collections

from test_counted_spacing import with_library
from test_credit_in_process import CountedState, request, with_counted_runs
from test_evaluator_cpu import gemm

from tools import counted, timed, workspace


def harness_work_while_ranged(monkeypatch, seed: int) -> tuple[dict, CountedState, list[tuple[str, bool]]]:
    """One evaluation with a library side; every piece of the harness's GPU work between runs
    recorded with whether a CUPTI range was open: (what, inside)."""
    with_library(monkeypatch)
    log: list[tuple[str, bool]] = []
    state = CountedState(gemm)

    def recorded(what: str, fn):
        def wrapper(*a, **k):
            log.append((what, state.inside))
            return fn(*a, **k)
        return wrapper

    flush = state.flusher.flush
    state.flusher.flush = recorded("flush", flush)
    for name in ("before_pair", "after_pair", "inputs_for_run"):  # fresh inputs, the judge's reference
        monkeypatch.setattr(timed.TimedJudge, name, recorded(name, getattr(timed.TimedJudge, name)))
    monkeypatch.setattr(workspace.Workspace, "prepare", recorded("poison", workspace.Workspace.prepare))
    monkeypatch.setattr(workspace, "judge_run", recorded("judge_run", workspace.judge_run))
    monkeypatch.setattr(counted, "judge_run", recorded("judge_run", counted.judge_run))
    library = timed.library_baseline

    def library_recorded(*a, **k):
        side, name, note = library(*a, **k)
        side.run = recorded("library_run", side.run)
        return side, name, note
    monkeypatch.setattr(timed, "library_baseline", library_recorded)
    result, fatal = with_counted_runs(state, request(seed, timing_seed=seed))
    assert result["status"] == "passed" and not fatal, result
    assert result["credit"]["status"] == "ran", result["credit"]
    return result, state, log


def test_no_harness_gpu_work_runs_inside_a_counted_range(monkeypatch):
    """The flush, the fresh inputs, the poisoning, the judge (its reference) and the library's run all
    happen with no range open: a range counts the candidate's launches only."""
    for seed in range(3):
        _, _, log = harness_work_while_ranged(monkeypatch, seed)
        kinds = {what for what, _ in log}
        assert {"flush", "before_pair", "after_pair", "poison", "library_run"} <= kinds, kinds
        inside = [what for what, ranged in log if ranged]
        assert inside == [], collections.Counter(inside)


def test_each_timed_range_holds_exactly_one_candidate_run(monkeypatch):
    """Each range pushed for a timed run holds one candidate launch of its pass (so mean_counts'
    'sum over a pass's ranges / their number' is the average run), and every candidate launch of the
    timed sequence is in one; the instrumented pass's one range likewise."""
    for seed in range(3):
        result, state, _ = harness_work_while_ranged(monkeypatch, seed)
        held = collections.Counter((c["pass"], c["label"]) for c in state.counted)
        pushed = collections.Counter(state.profiler.ranges)
        assert set(pushed.values()) == {1}, pushed  # each name once a pass
        assert held == pushed, (held, pushed)
        pairs = result["warmup_runs"] + result["timed_runs"]
        assert sum(n for (_, label), n in held.items() if counted.RUN_SEP in label) == pairs
