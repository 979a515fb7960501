"""A slow candidate that carries the requested instructions stops early again (issue 43 item 2, with every
timed run counted: tools.counted.run_counted, tools.timing.paired_steps' `stretches`). The stop is
decided inside the first hardware pass's stretch, by the rule an uncounted phase uses, on that stretch's
pairs; every later pass then gets as many ranged pairs as the first ran, so every pass holds the same
count. A kernel near the library runs its planned pairs; the cap bounds the whole thing (the first
stretch's time times the passes), and COUNTED_CAP_S the counted session (the check skipped, never
passed). CPU: the stand-in worker of tests/test_credit_in_process.py (real timed phases, the counted-run
code, fake CUPTI), with the library side of tests/test_counted_cost.py."""
from __future__ import annotations

import math
import random

import pytest
from test_counted_cost import with_library
from test_counted_every_run import WGMMA_RUN
from test_credit_in_process import META, NO_BULK, WORK, CountedState, request, with_counted_runs
from test_evaluator_cpu import gemm

from tools import counted, credit as rules, timing

PASSES = 4  # the check's metric set on GH100: four hardware passes, none SASS-patched


def slow_request(seed: int, budget_s: float = 100.0, **extra) -> dict:
    """A request whose drawn count is large (the budget buys up to 60-90 pairs on the stand-in): the first
    pass's planned stretch is longer than the stopping rule needs (warm-ups and 4-6 timed pairs)."""
    return request(seed, timing_seed=seed) | {"timing_budget_s": budget_s, **extra}


def state_with_wgmma(ms_of=None) -> CountedState:
    """A kernel whose every run counts as the expert's (wgmma + TMA carry the work)."""
    return CountedState(gemm, metrics_of=lambda runs: dict(WGMMA_RUN), passes=PASSES, instrumented=(), ms_of=ms_of)


def each_pass_holds(state: CountedState, credit: dict, m: int) -> None:
    assert credit["ranged_runs"] == m and credit["stretch_ends"] == [m * (k + 1) for k in range(PASSES)], credit
    assert state.passes_counted() == [p for p in range(PASSES) for _ in range(m)]
    assert [len(x) for x in credit["pass_ms"]] == [m] * PASSES and len(credit["run_ms"]) == PASSES * m


@pytest.mark.parametrize("seed", range(4))
def test_a_slow_kernel_with_the_instructions_stops_after_the_first_pass(monkeypatch, seed):
    """20x slower than the library (no noise: its interval is tight at once): the first stretch stops at
    the rule's fewest pairs (warm-ups and 4-6 timed), as an uncounted phase would; each later pass
    holds as many ranged runs; `timing_stop` says `interval` with the drawn count beside it; the
    speedup comes from every ranged pair (all passes); the credit is what it was (every pass tied)."""
    with_library(monkeypatch, lib_ms=0.05)
    state = state_with_wgmma()
    result, fatal = with_counted_runs(state, slow_request(seed, timing_cap_s=600.0))  # (a slow CPU: no cap)
    assert result["status"] == "passed" and not fatal, result
    credit = result["credit"]
    assert credit["status"] == "ran", credit
    m = credit["ranged_runs"]
    assert result["timing_stop"] == "interval", result["timing_stop"]
    assert timing.MIN_STOP_PAIRS[0] <= m - result["warmup_runs"] <= timing.MIN_STOP_PAIRS[1]
    each_pass_holds(state, credit, m)
    pairs = result["warmup_runs"] + result["timed_runs"]
    assert pairs == PASSES * m and result["timed_runs"] < result["planned_runs"], result  # it would have run more
    assert result["speedup"] == pytest.approx(0.05) and result["timing"]["runs"] == result["timed_runs"]
    wc = rules.credit_in_process(META, credit, ["wgmma", "tma"], WORK, result["timing"]["median_ms"],
                                 module_opcodes=NO_BULK)
    assert wc.status == "ok" and wc.carries == {"wgmma": True, "tma": True}, (wc.shares, wc.notes)


@pytest.mark.parametrize("seed", range(3))
def test_a_kernel_near_the_library_runs_its_planned_pairs(monkeypatch, seed):
    """At 1.0x the rule never stops inside the band: every pass holds a quarter of the drawn count, as
    before the change (the experts keep their precision)."""
    with_library(monkeypatch, lib_ms=1.0)
    state = state_with_wgmma()
    result, fatal = with_counted_runs(state, slow_request(seed, budget_s=1.0))
    assert result["status"] == "passed" and not fatal, result
    credit = result["credit"]
    m = credit["ranged_runs"]
    assert result["timing_stop"] == "planned" and result["timed_runs"] == result["planned_runs"], result
    each_pass_holds(state, credit, m)
    assert result["warmup_runs"] + result["planned_runs"] == PASSES * m and m >= 10 // PASSES


def test_the_cap_is_decided_in_the_first_pass_at_its_share(monkeypatch):
    """A kernel at 0.3x whose runs scatter by ~80% never gets an interval tight enough; the cap stops
    the first stretch once it has run cap_s / passes of pairs (at least MIN_CAP_PAIRS timed), and every
    later pass holds as many pairs: the passes together take about the cap, as an uncounted phase."""
    with_library(monkeypatch, lib_ms=0.3)
    noise = random.Random(3)
    state = state_with_wgmma(ms_of=lambda p: math.exp(noise.gauss(0.0, 0.6)))
    state.timed_ms = 1.0
    cap_s = 0.08
    result, fatal = with_counted_runs(state, slow_request(3, timing_cap_s=cap_s))
    assert result["status"] == "passed" and not fatal, result
    credit = result["credit"]
    m = credit["ranged_runs"]
    assert result["timing_stop"] == "cap", (result["timing_stop"], result["speedup_ci"])
    assert m - result["warmup_runs"] >= timing.MIN_CAP_PAIRS and PASSES * m < result["planned_runs"]
    each_pass_holds(state, credit, m)
    lo, hi = result["speedup_ci"]
    assert hi < 1 / timing.NEAR_BAND, result["speedup_ci"]  # the interval it left, far from 1, from every pass


def test_past_the_counted_cap_the_check_is_skipped_and_the_slow_phase_ends(monkeypatch):
    """COUNTED_CAP_S bounds the session: where a later stretch (as long as the first) would end past it,
    nothing is counted (`skipped`, with the figures; never credited), and a phase whose stop was
    decided ends before its next pair: its timed pairs are those it ran, its stop still `interval`."""
    with_library(monkeypatch, lib_ms=0.05)
    monkeypatch.setattr(counted, "COUNTED_CAP_S", 1e-6)
    state = state_with_wgmma()
    result, fatal = with_counted_runs(state, slow_request(1, timing_cap_s=600.0))
    assert result["status"] == "passed" and not fatal, result
    credit = result["credit"]
    assert credit["status"] == "skipped" and "cap" in credit["reason"] and "pass 2" in credit["reason"], credit
    m = credit["ranged_runs"]
    assert result["timing_stop"] == "interval" and result["warmup_runs"] + result["timed_runs"] == m, result
    assert state.launches == 2 + m  # the seeded checks, then the first stretch only: nothing ran after the cap
    assert len(credit["pair_ms"]) == m  # each pair recorded once (the halt ran none)
    wc = rules.credit_in_process(META, credit, ["wgmma", "tma"], WORK, result["timing"]["median_ms"],
                                 module_opcodes=NO_BULK)
    assert wc.status == "skipped" and not any(wc.carries.values()), wc


def test_past_the_counted_cap_a_kernel_near_the_library_keeps_its_planned_pairs(monkeypatch):
    """The same bound on a kernel at 1.0x: nothing counted, but its timed pairs run on to the drawn
    count (uncounted), so its precision is today's."""
    with_library(monkeypatch, lib_ms=1.0)
    monkeypatch.setattr(counted, "COUNTED_CAP_S", 1e-6)
    state = state_with_wgmma()
    result, fatal = with_counted_runs(state, slow_request(2, budget_s=1.0))
    assert result["status"] == "passed" and not fatal, result
    assert result["credit"]["status"] == "skipped", result["credit"]
    assert result["timing_stop"] == "planned" and result["timed_runs"] == result["planned_runs"], result



def test_with_one_hardware_pass_the_stop_ends_the_sequence_and_its_ranges(monkeypatch):
    """One pass (a metric set read in one): the stop ends the sequence inside it, as an uncounted
    phase's does, and the pass holds exactly the pairs that ran (no empty ranges pushed after them)."""
    with_library(monkeypatch, lib_ms=0.05)
    state = CountedState(gemm, metrics_of=lambda runs: dict(WGMMA_RUN), passes=1, instrumented=())
    result, fatal = with_counted_runs(state, slow_request(0, timing_cap_s=600.0))
    assert result["status"] == "passed" and not fatal, result
    credit, pairs = result["credit"], result["warmup_runs"] + result["timed_runs"]
    assert result["timing_stop"] == "interval" and result["timed_runs"] < result["planned_runs"], result
    assert credit["status"] == "ran" and credit["ranged_runs"] == pairs and credit["stretch_ends"] == [pairs], credit
    assert state.passes_counted() == [0] * pairs and len(state.profiler.ranges) == pairs
