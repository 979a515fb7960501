"""Where the counted runs' cost goes (issue 42 item 7's cost; tools.counted.COST_PARTS): the credit op
takes its own time apart (padding, CUPTI's set-up and pass boundaries, runs made outside a timed phase,
the SASS-patched run, the exact-count run, the phases' results, letting the kept workloads go, the rest),
every counted run records CUPTI's push and pop, and the evaluation reports the parts. CPU: the stand-in
worker of tests/test_credit_in_process.py (real timed phases, fake CUPTI)."""
from __future__ import annotations

import pytest
import test_credit_in_process
from test_credit_in_process import CountedState, _through_the_evaluator, request

from tools import counted, timed, worker
from tools.timing import Side
from test_evaluator_cpu import gemm


def with_library(monkeypatch, lib_ms: float = 1.0) -> list:
    """The timed phases get a library side (the CPU stand-in has none): a run that advances the
    stand-in's clock by `lib_ms`; returns the list its runs are logged in (whether a pause was around)."""
    runs: list = []

    def library_baseline(state, req, task, wl, inputs, limit):
        def run():
            runs.append(state.pass_index)
            state.clock_ms += lib_ms
        return Side("baseline:fake", run), "fake", None
    monkeypatch.setattr(timed, "library_baseline", library_baseline)
    return runs


def _op(state, time: bool = True, seed: int = 3) -> tuple[dict, dict]:
    """One workload's request, then the credit op: (the workload's result, the op's reply)."""
    result, fatal = worker.run_workload(state, request(seed, time=time, timing_seed=seed))
    assert not fatal and result["credit"]["status"] == "pending", result
    reply, fatal = counted.run_pending(state)
    assert not fatal
    return result, reply


def test_the_credit_op_takes_its_own_time_apart(monkeypatch):
    """Every part named, none negative; with `timed_s` they make up the op's seconds (`other` is what
    no part names); the padding is the padded runs' (each matched to the push and pop last measured);
    CUPTI's set-up, decode and disable, and its Start and Stop at each pass boundary (recorded per pass)."""
    state = CountedState(gemm)
    state.profiler.last_pass_s = [[0.0, 0.0]] * 3  # the stand-in's CUPTI takes no time
    monkeypatch.setattr(test_credit_in_process, "PHASES", {"setup": 0.0, "decode": 0.0, "disable": 0.0})
    _, reply = _op(state)
    parts, credit = reply["cost_parts"], next(iter(reply["credits"].values()))
    assert list(parts) == list(counted.COST_PARTS) and all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(reply["seconds"] - reply["timed_s"], abs=2e-3), (parts, reply)
    # with the figures a real profiler records (tests/test_credit_in_process.PHASES: 0.25 s set-up ...)
    monkeypatch.undo()
    with_library(monkeypatch)
    state = CountedState(gemm)
    state.profiler.last_pass_s = [[0.01, 0.02], [0.01, 0.02], [0.01, 0.02]]
    _, reply = _op(state)
    parts, credit = reply["cost_parts"], next(iter(reply["credits"].values()))
    assert parts["cupti"] == pytest.approx(0.253)
    # every library run of the session paused to match (one per ranged candidate run), both charged
    assert credit["padded_runs"] == len(credit["run_ms"]) > 0 and parts["padding"] >= credit["padded_runs"] * 2 * 1e-6
    assert parts["pass_boundaries"] == pytest.approx(0.09) and credit["pass_start_stop_s"] == [[0.01, 0.02]] * 3
    assert parts["untimed_runs"] == 0.0 and parts["instrumented_run"] > 0  # the hardware passes' runs were timed runs
    assert parts["exact_count_run"] == 0.0  # no sites asked
    # CUPTI's push and pop around every ranged (timed) run (ms): what the library's run beside it waits
    assert len(credit["push_pop_ms"]) == len(credit["run_ms"]) and all(len(x) == 2 and min(x) >= 0
                                                                        for x in credit["push_pop_ms"])


def test_untimed_the_counted_runs_are_their_own_cost_and_nothing_is_padded(monkeypatch):
    """Nothing timed: the lead runs and the hardware passes' runs are the check's own (untimed_runs),
    and no run is padded (there is no timed run to look like)."""
    monkeypatch.setattr(test_credit_in_process, "PHASES", {"setup": 0.0, "decode": 0.0, "disable": 0.0})
    state = CountedState(gemm)
    _, reply = _op(state, time=False)
    parts, credit = reply["cost_parts"], next(iter(reply["credits"].values()))
    assert parts["untimed_runs"] > 0 and parts["padding"] == 0.0 and "padded_runs" not in credit, (parts, credit)
    assert "push_pop_ms" not in credit  # the counted runs are not runs of a timed phase: nothing to match
    assert sum(parts.values()) == pytest.approx(reply["seconds"] - reply["timed_s"], abs=2e-3)


def test_the_evaluation_reports_where_its_counted_runs_went(tmp_path, monkeypatch):
    """The evaluator keeps the worker's parts in phase_s (counted_runs.<part>, the round trip beyond the
    worker's seconds added to `other`) and in the executed check's phase_s, beside counted_runs."""
    r = _through_the_evaluator("fp8_wgmma", tmp_path, monkeypatch)
    assert r.executed.status == "ok", r.executed
    for phases in (r.phase_s, r.executed.phase_s):
        assert phases["counted_runs.padding"] == pytest.approx(0.03) and phases["counted_runs.cupti"] == 0.02
        assert phases["counted_runs.other"] >= 0 and "counted_runs" in phases


def test_every_run_waits_for_the_gpu_and_the_padding_after_it_is_charged(monkeypatch):
    """CUPTI's push and pop wait for the GPU to run what is queued before their own work, so every
    run of the session first drains the stream (polled: a host query), the candidate's (ranged) and
    the library's (paused to match); the library's pause after a drain matches CUPTI's own part, and
    the GPU sits idle through it: the check's cost (`padding_s` = [waited for, hidden])."""
    with_library(monkeypatch)
    state = CountedState(gemm)
    polls = {"n": 0}

    def stream_busy():  # busy on every other poll: each drain ends within two polls
        polls["n"] += 1
        return polls["n"] % 2 == 1
    state.stream_busy = stream_busy
    _, reply = _op(state)
    credit = next(iter(reply["credits"].values()))
    waited, hidden = credit["padding_s"]
    assert credit["padded_runs"] > 0 and polls["n"] >= 4 * credit["padded_runs"]  # two drains and two waits a run
    assert waited > 0 and hidden < waited and reply["cost_parts"]["padding"] == pytest.approx(waited, abs=1e-4)


def test_a_gpu_that_never_drains_is_a_timeout_not_a_silent_wait():
    """Every run in the session first waits for the GPU to run what is queued (as CUPTI's push and pop
    do): a GPU that never finishes is the workload's timeout, fatal as a hung timed run is."""
    state = CountedState(gemm)
    state.stream_busy = lambda: True
    result, fatal = worker.run_workload(state, request(3))
    assert not fatal and result["credit"]["status"] == "pending"
    reply, fatal = counted.run_pending(state)
    assert fatal and next(iter(reply["failed"].values()))["reason"] == "timeout", reply["failed"]


def test_with_hardware_counters_only_every_pass_counts_a_timed_run():
    """The check's metrics are hardware counters only (4 passes on GH100, none SASS-patched): each pass
    counts every run of its own stretch of the timed sequence, no run follows the timed ones, nothing
    is instrumented, and no counted run is the check's own cost (only CUPTI's and the pauses)."""
    from tools import credit as rules, cupti

    assert not [m for m in rules.credit_metrics() if cupti.is_sass_patched(m)]
    state = CountedState(gemm, passes=4, instrumented=())
    result, reply = _op(state)
    credit = next(iter(reply["credits"].values()))
    m = credit["ranged_runs"]
    assert credit["status"] == "ran" and credit["passes"] == 4 and m >= 1 and credit["stretch_ends"][-1] == 4 * m, credit
    assert len(credit["run_ms"]) == 4 * m and credit["instrumented_ms"] == [] and len(credit["push_pop_ms"]) == 4 * m
    timed = next(iter(reply["results"].values()))
    assert timed["warmup_runs"] + timed["timed_runs"] == 4 * m  # every pair's candidate run counted
    assert state.passes_counted() == [p for p in range(4) for _ in range(m)]
    parts = reply["cost_parts"]
    assert parts["instrumented_run"] == 0.0 and parts["untimed_runs"] == 0.0
