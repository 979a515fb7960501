"""The timing loop's decisions (tools/timing.py), exactly, on CPU stand-ins for what only a GPU has:
events on a GPU timeline the test advances, the host clock (`timing.time`) the test advances, a
recorded stream gate, a scripted random source and a stand-in CUDA driver. So every duration the
loop measures, every pair it runs and every stop it decides is known in advance: the draws
(warm-ups, the fewest pairs to stop at, the plan), the order of each pair, the warm-ups dropped,
the slow first pair, the stop by interval, by cap or by the caller's halt, the stretches, the time
held by the caller, the gate's hold and release and the driver calls behind it. Fast, for
mutation runs; tests/test_timing_stop.py and test_timing_gate.py are the same rules on noisy
stand-ins, tests/gpu/test_timing_gate_gpu.py the real gate."""
from __future__ import annotations

import ctypes
import enum
import math
import types
from contextlib import contextmanager

import pytest

from tools import launch, timing
from tools.timing import GATE_LIMIT_S, GATE_SLOTS, Hold, Side

MS = 1e-3


class Clock:
    """The host's perf_counter and the GPU's timeline, each moved only by the test."""

    def __init__(self):
        self.host = 0.0
        self.gpu = 0.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.host

    monotonic = perf_counter

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.host += s


class Event:
    def __init__(self, clock: Clock, log: list[str]):
        self.clock, self.log, self.t = clock, log, None

    def record(self) -> None:
        self.t = self.clock.gpu
        self.log.append("event")

    def elapsed_time(self, other: "Event") -> float:
        return (other.t - self.t) * 1e3


class Gate:
    """Records holds and releases, each hold with its own token."""

    def __init__(self, log: list[str]):
        self.log, self.count = log, 0

    def hold(self) -> Hold:
        self.count += 1
        self.log.append("hold")
        return Hold(self.count, 100 + self.count)

    def release(self, hold: Hold) -> None:
        self.log.append(f"release {hold.token}")


class State:
    """What the loop needs of tools.worker.State: events, the L2 flush, the wait for the GPU (`wait_s`
    of host time each, its limit recorded), a gate where given."""

    def __init__(self, clock: Clock, gate: bool = False, wait_s: float = 0.0):
        self.clock, self.log, self.wait_s, self.waits = clock, [], wait_s, []
        if gate:
            self.gate = Gate(self.log)
        self.flusher = types.SimpleNamespace(flush=lambda: self.log.append("flush"))

    def event(self) -> Event:
        return Event(self.clock, self.log)

    def wait(self, limit_s: float) -> None:
        self.waits.append(limit_s)
        self.clock.host += self.wait_s


class Draws:
    """A random source whose randint gives the test's values in order, recording what was asked."""

    def __init__(self, *values: int):
        self.values, self.asked = list(values), []

    def randint(self, a: int, b: int) -> int:
        self.asked.append((a, b))
        v = self.values.pop(0)
        assert a <= v <= b, (a, b, v)
        return v


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=c.perf_counter, monotonic=c.monotonic,
                                                               sleep=c.sleep))
    return c


def side(name: str, clock: Clock, state: State, gpu_ms, host_s: float = 0.0) -> Side:
    """A side whose k-th run takes gpu_ms(k) (or gpu_ms) of GPU time and host_s of host time."""
    runs = []

    def run():
        ms = gpu_ms(len(runs)) if callable(gpu_ms) else gpu_ms
        runs.append(ms)
        clock.gpu += ms * MS
        clock.host += host_s
        state.log.append(f"run {name}")

    return Side(name, run, prepare=lambda: state.log.append(f"prepare {name}"),
                finish=lambda: state.log.append(f"finish {name}"))


class Driver:
    """Drives paired_steps to its end as tools.counted does: records each yield and each
    before/after call, advances the host clock by inputs_s and judge_s in them, holds the sequence
    `held_s` between pairs, and says halted from pair `halt_at` on."""

    def __init__(self, clock: Clock, inputs_s: float = 0.0, judge_s: float = 0.0, held_s: float = 0.0,
                 halt_at: int | None = None, slow: dict[int, float] | None = None):
        self.clock, self.inputs_s, self.judge_s, self.held_s, self.halt_at = clock, inputs_s, judge_s, held_s, halt_at
        self.slow = slow or {}
        self.yields, self.before, self.after, self.asked = [], [], [], []

    def before_pair(self, i: int, total: int) -> None:
        self.before.append((i, total))
        self.clock.host += self.inputs_s + self.slow.get(i, 0.0)

    def after_pair(self, i: int, total: int) -> None:
        self.after.append((i, total))
        self.clock.host += self.judge_s

    def halted(self) -> bool:
        self.asked.append(len(self.before))
        return self.halt_at is not None and len(self.before) >= self.halt_at

    def drain(self, steps) -> timing.PairedTimes:
        while True:
            try:
                self.yields.append(next(steps))
            except StopIteration as done:
                return done.value
            self.clock.host += self.held_s


def run_steps(clock, cand, base, state, rng, drv: Driver, **kw) -> timing.PairedTimes:
    return drv.drain(timing.paired_steps(cand, base, state, rng, drv.before_pair, drv.after_pair,
                                         halted=drv.halted, **kw))


def both(clock, state, cand_ms, base_ms, host_s=0.0):
    return side("candidate", clock, state, cand_ms, host_s), side("baseline:lib", clock, state, base_ms, host_s)


# ---------------------------------------------------------------------------------------------- the plan
def test_the_draws_the_plan_and_every_pair_in_order(clock):
    """Warm-ups 1-3, then the fewest pairs to stop at 4-6, then the plan's extra: drawn in that order.
    A first pair of 1/32 s plans 32 pairs plus 0-16; the warm-ups' times are dropped, every pair is
    judged, the order flips every pair, and the phase's own seconds add up exactly."""
    state = State(clock, wait_s=1 / 256)
    cand, base = both(clock, state, lambda k: 1.0 + k / 64, lambda k: 1.0 + k / 128, host_s=1 / 512)
    drv = Driver(clock, inputs_s=1 / 64, judge_s=1 / 128)
    rng = Draws(2, 5, 3)
    times = run_steps(clock, cand, base, state, rng, drv, budget_s=1.0, limit_s=7.5)
    total = 2 + 32 + 3
    assert rng.asked == [(1, 3), (4, 6), (0, 16)]
    assert (times.warmup, times.planned, times.stop, times.ungated) == (2, 35, "planned", ())
    assert drv.yields == [(0, -1)] + [(i, total) for i in range(1, total)]
    assert drv.before == drv.after == drv.yields
    assert drv.asked == list(range(total))  # halted() asked before every pair
    assert times.candidate_ms == pytest.approx([1.0 + k / 64 for k in range(2, total)])
    assert times.baseline_ms == pytest.approx([1.0 + k / 128 for k in range(2, total)])
    assert state.waits == [7.5] * total
    assert times.inputs_s == pytest.approx(total / 64)
    assert times.runs_s == pytest.approx(total * (2 / 512 + 1 / 256))
    assert times.judge_s == pytest.approx(total / 128)
    runs = [x for x in state.log if x.startswith("run")]
    assert runs == [f"run {n}" for i in range(total)
                    for n in (("candidate", "baseline:lib") if i % 2 == 0 else ("baseline:lib", "candidate"))]
    first = ["prepare candidate", "flush", "event", "run candidate", "event", "finish candidate",
             "prepare baseline:lib", "flush", "event", "run baseline:lib", "event", "finish baseline:lib"]
    assert state.log[:12] == first and state.log[12:18] == first[6:]


def test_the_plan_without_a_baseline_and_with_default_limits(clock):
    """No baseline: only the candidate runs, nothing ranks it, the drawn count runs. Defaults: 60 s a
    wait, TIMING_BUDGET_S of pairs (a first pair of 1/8 s plans 8, held to the 10 at least)."""
    state = State(clock)
    cand = side("candidate", clock, state, 1.0)
    drv = Driver(clock, inputs_s=1 / 8)
    times = drv.drain(timing.paired_steps(cand, None, state, Draws(1, 6, 5), drv.before_pair, drv.after_pair))
    assert (times.warmup, times.planned, times.stop, times.baseline_ms) == (1, 15, "planned", [])
    assert len(times.candidate_ms) == 15 and state.waits == [60.0] * 16
    assert [x for x in state.log if x.startswith("run")] == ["run candidate"] * 16
    assert timing.TIMING_BUDGET_S == 1.0


def test_paired_runs_the_steps_with_its_own_limits(clock):
    """`paired` hands its limit, budget and cap to the steps and returns their result."""
    state = State(clock)
    cand, base = both(clock, state, lambda k: 2.0 + (k % 2) * 3.0, 1.0)  # ratios 0.5 and 0.2: far, never tight
    drv = Driver(clock, inputs_s=1 / 16)
    times = timing.paired(cand, base, state, Draws(1, 4, 0), drv.before_pair, drv.after_pair, limit_s=3.0,
                          budget_s=2.0, cap_s=0.5)
    assert (times.stop, times.warmup, times.planned) == ("cap", 1, 32)
    assert len(state.waits) == 8 and set(state.waits) == {3.0}  # 8 pairs of 1/16 s: the cap of 0.5 s
    defaults = State(clock)
    cand, base = both(clock, defaults, 1.0, 1.0)
    times = timing.paired(cand, base, defaults, Draws(3, 4, 0), lambda i, n: None, lambda i, n: None)
    assert set(defaults.waits) == {60.0} and times.planned == 60  # no host time: the cap of 60 pairs


def test_a_slow_first_pair_is_timed_and_only_the_first(clock):
    """A first pair of SLOW_PAIR_S or more (inputs, runs, judging) drops the warm-ups; a hair less
    keeps them; a slow later pair changes nothing."""
    for slow_s, warmup in ((timing.SLOW_PAIR_S, 0), (timing.SLOW_PAIR_S - 1 / 1024, 3)):
        state = State(clock)
        cand, base = both(clock, state, 1.0, 1.0)
        drv = Driver(clock, slow={0: slow_s})
        times = run_steps(clock, cand, base, state, Draws(3, 4, 0), drv, budget_s=0.0)
        assert times.warmup == warmup and len(times.candidate_ms) == 10, slow_s  # the drawn count, warm-ups included
    state = State(clock)
    cand, base = both(clock, state, 1.0, 1.0)
    times = run_steps(clock, cand, base, state, Draws(2, 4, 0), Driver(clock, slow={1: 1.0}), budget_s=0.0)
    assert times.warmup == 2 and len(times.candidate_ms) == 10
    assert timing.SLOW_PAIR_S == 0.15


# ---------------------------------------------------------------------------------------------- the stops
def test_a_far_kernel_stops_at_the_fewest_pairs_drawn(clock):
    """20x slower with no noise: the interval is a point, so the rule stops as soon as it may, after
    the drawn fewest timed pairs (here 4 after 1 warm-up: 5 pairs); no pair runs after the stop."""
    state = State(clock)
    cand, base = both(clock, state, 20.0, 1.0)
    drv = Driver(clock)
    times = run_steps(clock, cand, base, state, Draws(1, 4, 5), drv, budget_s=0.0)
    assert (times.stop, times.warmup, times.planned, len(times.candidate_ms)) == ("interval", 1, 15, 4)
    assert drv.yields == [(0, -1)] + [(i, 16) for i in range(1, 5)] and len(drv.after) == 5
    assert times.ratios == pytest.approx([0.05] * 4)


def test_in_stretches_the_stop_sets_every_stretchs_count(clock):
    """Two stretches: the stop after 5 pairs (1 warm-up, 4 timed) makes the count 10, and the yields say
    so from the stop on; the drawn count (1 + 10 + 1 = 12, a multiple of 2) stays the plan."""
    state = State(clock)
    cand, base = both(clock, state, 20.0, 1.0)
    drv = Driver(clock)
    times = run_steps(clock, cand, base, state, Draws(1, 4, 1), drv, budget_s=0.0, stretches=2)
    assert (times.stop, times.planned, len(times.candidate_ms)) == ("interval", 11, 9)
    assert drv.yields == [(0, -1)] + [(i, 12) for i in range(1, 5)] + [(i, 10) for i in range(5, 10)]


def test_the_stop_is_decided_before_the_first_stretchs_end_only(clock):
    """A rule first met at the last pair of the first stretch (3 warm-ups, then 6 timed: pair 9 of
    2 x 9) decides nothing: the sequence runs its plan, `planned`. Met one pair earlier (5 timed), it
    stops there."""
    for fewest, stop, pairs in ((6, "planned", 18), (5, "interval", 16)):
        state = State(clock)
        cand, base = both(clock, state, 20.0, 1.0)
        times = run_steps(clock, cand, base, state, Draws(3, fewest, 5), Driver(clock), budget_s=0.0, stretches=2,
                          cap_s=1e9)
        assert (times.stop, times.warmup + len(times.candidate_ms), times.planned) == (stop, pairs, 15), fewest


def test_the_count_is_rounded_up_to_a_multiple_of_the_stretches(clock):
    """2 warm-ups + 10 + 1 = 13 pairs: 16 in 4 stretches, 13 in one (also for stretches 0)."""
    for stretches, total in ((4, 16), (1, 13), (0, 13), (2.5, 14)):
        state = State(clock)
        cand, base = both(clock, state, 1.0, 1.0)
        drv = Driver(clock)
        times = run_steps(clock, cand, base, state, Draws(2, 4, 1), drv, budget_s=0.0, stretches=stretches)
        assert times.planned == total - 2 and len(drv.before) == total and drv.yields[1] == (1, total), stretches


def _noisy(clock, state):
    """Ratios 0.5 and 0.2 in turn: far from 1, an interval never tight enough to rank: only a cap stops it."""
    return both(clock, state, lambda k: 2.0 + (k % 2) * 3.0, 1.0)


def test_the_cap_stops_a_far_noisy_kernel_at_its_time(clock):
    """Pairs of 1/16 s and a cap of 0.5 s: the check after the 8th pair stops it (the cap reached, not
    passed); 2 stretches halve the cap and double the count."""
    for stretches, cap_s, pairs in ((1, 0.5, 8), (2, 1.0, 16), (1, 0.5 + 1 / 1024, 9)):
        state = State(clock)
        cand, base = _noisy(clock, state)
        times = run_steps(clock, cand, base, state, Draws(1, 6, 0), Driver(clock, inputs_s=1 / 16), budget_s=4.0,
                          cap_s=cap_s, stretches=stretches)
        assert (times.stop, times.warmup + len(times.candidate_ms)) == ("cap", pairs), (stretches, cap_s)


def test_time_the_caller_holds_the_sequence_is_not_the_phases(clock):
    """Held a whole second between pairs, the phase still stops at its own 0.5 s of pairs."""
    state = State(clock)
    cand, base = _noisy(clock, state)
    drv = Driver(clock, inputs_s=1 / 16, held_s=1.0)
    times = run_steps(clock, cand, base, state, Draws(1, 6, 0), drv, budget_s=0.5, cap_s=0.5)
    assert (times.stop, times.warmup + len(times.candidate_ms)) == ("cap", 8)


def test_the_cap_needs_three_timed_pairs_and_never_cuts_a_kernel_near_the_library(clock):
    """A cap reached at once stops only once 3 pairs are timed, far from 1; a kernel near the library
    (1.1x and 0.95x in turn) runs its plan whatever the cap."""
    state = State(clock)
    cand, base = _noisy(clock, state)
    times = run_steps(clock, cand, base, state, Draws(2, 6, 0), Driver(clock, inputs_s=1 / 8), budget_s=0.0, cap_s=0.1)
    assert (times.stop, times.warmup, len(times.candidate_ms)) == ("cap", 2, timing.MIN_CAP_PAIRS)
    state = State(clock)
    cand, base = both(clock, state, lambda k: 1.0 / (1.1 if k % 2 else 0.95), 1.0)
    times = run_steps(clock, cand, base, state, Draws(1, 4, 0), Driver(clock, inputs_s=1 / 8), budget_s=0.0, cap_s=0.1)
    assert (times.stop, len(times.candidate_ms)) == ("planned", 10)


def test_halted_ends_where_the_cap_may_and_only_there(clock):
    """The caller's bound, asked before each pair: a far kernel with 3 timed pairs ends there as `cap`
    (before the pair asked about runs); with fewer it runs on until it has them; a decided stop keeps
    its name; a kernel near the library, or one without a baseline, runs its plan."""
    state = State(clock)
    cand, base = _noisy(clock, state)
    drv = Driver(clock, halt_at=5)
    times = run_steps(clock, cand, base, state, Draws(1, 6, 0), drv, budget_s=0.0, cap_s=1e9)
    assert (times.stop, len(drv.before), len(times.candidate_ms)) == ("cap", 5, 4)
    state = State(clock)
    cand, base = _noisy(clock, state)
    drv = Driver(clock, halt_at=1)
    times = run_steps(clock, cand, base, state, Draws(2, 6, 0), drv, budget_s=0.0, cap_s=1e9)
    assert (times.stop, len(drv.before), len(times.candidate_ms)) == ("cap", 5, timing.MIN_CAP_PAIRS)
    state = State(clock)
    cand, base = both(clock, state, 20.0, 1.0)
    drv = Driver(clock, halt_at=7)
    times = run_steps(clock, cand, base, state, Draws(1, 4, 0), drv, budget_s=0.0, stretches=2)
    assert (times.stop, len(drv.before)) == ("interval", 7)
    state = State(clock)
    cand, base = both(clock, state, 1.0, 1.0)
    drv = Driver(clock, halt_at=3)
    times = run_steps(clock, cand, base, state, Draws(1, 4, 0), drv, budget_s=0.0)
    assert (times.stop, len(times.candidate_ms)) == ("planned", 10)
    state = State(clock)
    cand = side("candidate", clock, state, 20.0)
    drv = Driver(clock, halt_at=0)
    times = run_steps(clock, cand, None, state, Draws(1, 4, 0), drv, budget_s=0.0)
    assert (times.stop, len(times.candidate_ms)) == ("planned", 10)


def test_by_default_nothing_outside_halts_the_sequence(clock):
    state = State(clock)
    cand, base = _noisy(clock, state)
    times = timing.paired_steps(cand, base, state, Draws(1, 4, 0), lambda i, n: None, lambda i, n: None, budget_s=0.0)
    drv = Driver(clock)
    assert drv.drain(times).stop == "planned"


# ---------------------------------------------------------------------------------------------- the gate
def test_a_gated_run_holds_issues_and_releases_its_own_hold(clock):
    """Hold, start event, run, end event, then the same hold's release; the host time of run() alone
    is what the side's stall count sees; `released` is the host clock at the release."""
    state = State(clock, gate=True)
    s = side("candidate", clock, state, 2.0, host_s=GATE_LIMIT_S)
    clock.host = 10.0
    start, end = timing.gated_run(s, state)
    assert state.log == ["hold", "event", "run candidate", "event", "release 101"]
    assert start.elapsed_time(end) == pytest.approx(2.0) and s.released == [10.0 + GATE_LIMIT_S]
    assert s.stalls == 1 and s.gated
    timing.gated_run(s, state)
    assert s.stalls == 2 and not s.gated  # waited for the GPU twice: ungated from now on
    state.log.clear()
    timing.gated_run(s, state)
    assert state.log == ["event", "run candidate", "event"] and s.stalls == 2


def test_without_a_gate_nothing_is_held_or_counted(clock):
    state = State(clock)
    s = side("candidate", clock, state, 1.0, host_s=1.0)
    start, end = timing.gated_run(s, state)
    assert state.log == ["event", "run candidate", "event"] and s.stalls == 0 and s.gated
    assert start.elapsed_time(end) == pytest.approx(1.0)


def test_two_stalls_in_a_row_ungate_and_a_quick_run_between_resets_them():
    s = Side("baseline:lib", lambda: None)
    limit = 0.9 * GATE_LIMIT_S
    s.issued(limit)
    s.issued(limit - 1e-6)
    assert (s.stalls, s.gated) == (0, True)
    s.issued(limit)
    assert (s.stalls, s.gated) == (1, True)
    s.issued(limit)
    assert (s.stalls, s.gated) == (2, False)


def test_a_cold_run_prepares_flushes_runs_in_its_context_and_finishes(clock):
    """`around` (a counted run's range) wraps the next cold run only, then is cleared; `pad` wraps
    every cold run while set; the events are kept in `last`."""
    state = State(clock)
    s = side("candidate", clock, state, 1.0)

    @contextmanager
    def ctx(name):
        state.log.append(f"enter {name}")
        yield
        state.log.append(f"exit {name}")

    s.around = lambda: ctx("around")
    events = timing._cold_run(s, state)
    assert state.log == ["prepare candidate", "flush", "enter around", "event", "run candidate", "event",
                         "exit around", "finish candidate"]
    assert s.around is None and s.last == events
    state.log.clear()
    s.pad = lambda: ctx("pad")
    s.around = lambda: ctx("around")
    timing._cold_run(s, state)
    timing._cold_run(s, state)
    assert [x for x in state.log if x.startswith(("enter", "exit"))] == ["enter around", "exit around", "enter pad",
                                                                         "exit pad"]


def test_measure_times_n_cold_runs_and_waits_once(clock):
    state = State(clock)
    s = side("baseline:lib", clock, state, lambda k: 1.0 + k)
    assert timing.measure(s, state, 3, 2.5) == pytest.approx([1.0, 2.0, 3.0])
    assert state.waits == [2.5] and state.log.count("flush") == 3


# ---------------------------------------------------------------------------------------------- the rules
def test_far_from_one_is_the_whole_interval_outside_the_band():
    band = timing.NEAR_BAND
    assert band == 1.25 and timing.STOP_K == 0.1
    assert timing.far_from_one(0.5, 1 / band - 1e-9) and not timing.far_from_one(0.5, 1 / band)
    assert timing.far_from_one(band + 1e-9, 3.0) and not timing.far_from_one(band, 3.0)
    assert timing.far_from_one(1.6, 3.0, band=1.5) and not timing.far_from_one(1.4, 3.0, band=1.5)


def test_the_stopping_rule_at_its_edges():
    """At least max(2, min_pairs) ratios; a median outside the band; an interval outside it too; its
    log half-width at most k |ln median| (a point interval passes at once)."""
    assert timing.stop_early([0.05, 0.05], 0) and not timing.stop_early([0.05], 0)
    assert timing.stop_early([0.05] * 4, 4) and not timing.stop_early([0.05] * 3, 4)
    assert not timing.stop_early([0.5] * 4, 4, band=2.0) and timing.stop_early([0.49] * 4, 4, band=2.0)
    assert timing.stop_early([1.2] * 4, 2, band=1.1)  # a narrower band than NEAR_BAND, for median and interval
    assert timing.stop_early([0.05] * 4, 2, k=0.0)  # a point interval: a half-width of 0 is at most 0
    assert not timing.stop_early([0.0] * 4, 2)  # a baseline timed at 0: no interval to rank (no log of 0)
    spread = [0.2, 0.2, 0.2, 0.21, 0.22]  # median 0.2, interval [0.2, 0.22]: half-width ln(1.1)/2 = 0.0477
    half = math.log(1.1) / 2
    k_edge = half / abs(math.log(0.2))
    assert timing.median_ci(spread, timing._STOP_RNG) == pytest.approx((0.2, 0.22))
    assert timing.stop_early(spread, 2, k=k_edge * (1 + 1e-9)) and not timing.stop_early(spread, 2, k=k_edge * 0.99)
    # a median far from 1 but an interval reaching into the band: no stop, however loose k
    assert not timing.stop_early([0.5, 0.5, 0.5, 0.9, 0.9], 2, k=100.0)
    # fast kernels too (|ln m|), the default k: 0.1
    assert timing.stop_early([20.0] * 5, 2) and not timing.stop_early([4.0, 4.0, 4.0, 6.0, 6.0], 2)
    assert timing.stop_early([4.0, 4.0, 4.0, 6.0, 6.0], 2, k=0.5)


def test_the_stopping_rules_resamples_are_fixed():
    """The rule's interval is the same for the same ratios whatever was drawn before."""
    a = timing.median_ci([0.1, 0.2, 0.3, 0.4], timing._STOP_RNG)
    assert a == timing.median_ci([0.1, 0.2, 0.3, 0.4], timing._STOP_RNG)
    assert timing._FixedRandom.getrandbits(63) == timing._STOP_RNG.getrandbits(1)


def test_the_cap_may_stop_from_three_ratios_far_from_one():
    assert timing._cap_may_stop([0.5, 0.2, 0.5]) and not timing._cap_may_stop([0.5, 0.2])
    assert timing._cap_may_stop([5.0, 2.0, 5.0])  # fast kernels too
    assert not timing._cap_may_stop([0.5, 0.5, 0.9, 0.9, 0.9])  # median inside the band
    assert not timing._cap_may_stop([0.5, 0.5, 0.5, 0.9, 0.9])  # interval reaching into it
    assert timing._ratios([2.0, 0.0, 4.0, 0.5], [1.0, 1.0, 1.0, 1.0]) == [0.5, 0.25, 2.0]


# ---------------------------------------------------------------------------------------------- the driver
class CUresult(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_ILLEGAL_ADDRESS = 700


class FakeDriver:
    """The cuda.bindings.driver calls the gate and wait_idle make, recorded; host memory real."""

    CUresult = CUresult
    CUevent_flags = types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)
    CU_MEMHOSTALLOC_DEVICEMAP = 4

    def __init__(self, queries=(), fail: str | None = None):
        self.calls, self.queries, self.memory, self.fail = [], list(queries), None, fail

    def CUstream(self, n):  # noqa: N802 - the driver's name
        return ("stream", n)

    def _ok(self, name, *args, value=None):
        self.calls.append((name, *args))
        return (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS if name == self.fail else CUresult.CUDA_SUCCESS), value

    def cuInit(self, flags):  # noqa: N802
        return (self._ok("cuInit", flags)[0],)

    def cuModuleLoadData(self, image):  # noqa: N802
        return self._ok("cuModuleLoadData", image, value="module")

    def cuModuleGetFunction(self, module, name):  # noqa: N802
        return self._ok("cuModuleGetFunction", module, name, value="gate")

    def cuMemHostAlloc(self, size, flags):  # noqa: N802
        self.memory = (ctypes.c_uint64 * (size // 8))()
        return self._ok("cuMemHostAlloc", size, flags, value=ctypes.addressof(self.memory))

    def cuMemHostGetDevicePointer(self, host, flags):  # noqa: N802
        return self._ok("cuMemHostGetDevicePointer", host, flags, value=1 << 40)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
        args = (ctypes.c_void_p * 3).from_address(params)
        values = tuple(ctypes.c_uint64.from_address(a).value for a in args)
        return (self._ok("cuLaunchKernel", fn, gx, gy, gz, bx, by, bz, shared, stream, values, extra)[0],)

    def cuEventCreate(self, flags):  # noqa: N802
        return self._ok("cuEventCreate", flags, value="ev")

    def cuEventRecord(self, ev, stream):  # noqa: N802
        return (self._ok("cuEventRecord", ev, stream)[0],)

    def cuEventQuery(self, ev):  # noqa: N802
        self.calls.append(("cuEventQuery", ev))
        r = self.queries.pop(0)
        return (r,) if r is not CUresult.CUDA_ERROR_NOT_READY else r  # either shape, as cuda-python gives

    def cuEventDestroy(self, ev):  # noqa: N802
        self.calls.append(("cuEventDestroy", ev))


@pytest.fixture
def driver(monkeypatch):
    import cuda.bindings

    def install(queries=(), fail=None):
        d = FakeDriver(queries, fail)
        monkeypatch.setattr(cuda.bindings, "driver", d)
        return d

    return install


def test_the_gate_loads_its_kernel_and_holds_each_run_with_its_own_word_and_token(driver):
    d = driver()
    gate = timing.StreamGate(limit_s=0.5)
    assert d.calls[0] == ("cuInit", 0)
    assert d.calls[1] == ("cuModuleLoadData", timing.GATE_PTX.encode() + b"\0")
    assert d.calls[2] == ("cuModuleGetFunction", "module", b"ptxbench_gate")
    assert d.calls[3] == ("cuMemHostAlloc", 8 * GATE_SLOTS, 4)
    assert d.calls[4] == ("cuMemHostGetDevicePointer", ctypes.addressof(d.memory), 0)
    d.memory[0] = d.memory[1] = 7
    holds = [gate.hold(), gate.hold()]
    assert [h.word for h in holds] == [0, 1] and all(h.token & 1 for h in holds) and holds[0].token != holds[1].token
    assert d.memory[0] == d.memory[1] == 0  # cleared before each launch
    launches = [c for c in d.calls if c[0] == "cuLaunchKernel"]
    assert [c[1:10] for c in launches] == [("gate", 1, 1, 1, 1, 1, 1, 0, ("stream", 0))] * 2
    assert [c[10] for c in launches] == [((1 << 40) + 8 * k, h.token, 500_000_000) for k, h in enumerate(holds)]
    assert [c[11] for c in launches] == [0, 0]
    gate.release(holds[1])
    assert (d.memory[0], d.memory[1]) == (0, holds[1].token)
    assert all(0 < gate.hold().token < 1 << 64 for _ in range(64))  # a 64-bit word's token, never 0
    gate._count = GATE_SLOTS - 1
    assert [gate.hold().word, gate.hold().word] == [GATE_SLOTS - 1, 0]  # round robin
    assert timing.StreamGate()._args[2].value == int(GATE_LIMIT_S * 1e9) and GATE_LIMIT_S == 0.2
    assert timing.StreamGate(limit_s=10.0)._args[2].value == 10_000_000_000


@pytest.mark.parametrize("call", ["cuInit", "cuModuleLoadData", "cuModuleGetFunction", "cuMemHostAlloc",
                                  "cuMemHostGetDevicePointer", "cuLaunchKernel"])
def test_the_gate_names_the_driver_call_that_failed(driver, call):
    driver(fail=call)
    with pytest.raises(launch.CudaError) as err:
        timing.StreamGate().hold()
    what = call if call == "cuInit" else f"{call}(gate)"
    assert (err.value.name, err.value.what) == ("CUDA_ERROR_ILLEGAL_ADDRESS", what)


@pytest.mark.parametrize("call", ["cuEventCreate", "cuEventRecord"])
def test_wait_idle_names_the_driver_call_that_failed(driver, clock, call):
    driver([CUresult.CUDA_SUCCESS], fail=call)
    with pytest.raises(launch.CudaError) as err:
        timing.wait_idle(1.0)
    assert err.value.what == call


def test_wait_idle_polls_with_a_growing_pause_until_the_gpu_is_idle(driver, clock):
    d = driver([CUresult.CUDA_ERROR_NOT_READY] * 12 + [CUresult.CUDA_SUCCESS])
    timing.wait_idle(30.0)
    assert d.calls[:2] == [("cuEventCreate", 2), ("cuEventRecord", "ev", ("stream", 0))]
    assert d.calls[-1] == ("cuEventDestroy", "ev")
    assert {c[1] for c in d.calls if c[0] == "cuEventQuery"} == {"ev"}
    expected = [min(2e-5 * 2 ** k, 5e-3) for k in range(12)]
    assert clock.sleeps == pytest.approx(expected, rel=1e-12) and clock.sleeps[-1] == 5e-3


def test_wait_idle_names_a_hang_and_a_failed_kernel(driver, clock):
    driver([CUresult.CUDA_ERROR_NOT_READY] * 10_000)
    with pytest.raises(timing.KernelTimeout, match="did not finish within 2 s"):
        timing.wait_idle(2.0)
    assert 2.0 < clock.host <= 2.0 + 5e-3  # the last pause past the deadline, no further
    clock.host, clock.sleeps = 0.0, []
    driver([CUresult.CUDA_ERROR_NOT_READY] * 3)
    with pytest.raises(timing.KernelTimeout, match="within 0 s"):
        timing.wait_idle(0.0)
    assert len(clock.sleeps) == 1  # at the deadline it polls once more; past it, the hang
    clock.host, clock.sleeps = 0.0, []
    d = driver([CUresult.CUDA_ERROR_NOT_READY] * 3 + [CUresult.CUDA_ERROR_ILLEGAL_ADDRESS])
    with pytest.raises(launch.CudaError) as err:
        timing.wait_idle(2.0)
    assert (err.value.name, err.value.what) == ("CUDA_ERROR_ILLEGAL_ADDRESS", "kernel execution")
    assert d.calls[-1] == ("cuEventDestroy", "ev") and len(clock.sleeps) == 3


def test_the_l2_flush_writes_at_least_twice_the_l2(monkeypatch):
    import torch

    made = []

    class Buffer:
        def zero_(self):
            made.append("zero")

    monkeypatch.setattr(torch, "empty", lambda n, dtype, device: made.append((n, dtype, device)) or Buffer())
    timing.L2Flusher(50 << 20)
    timing.L2Flusher(200 << 20).flush()
    assert made == [(256 << 20, torch.uint8, "cuda"), (400 << 20, torch.uint8, "cuda"), "zero"]
    assert timing.FLUSH_MIN_BYTES == 256 << 20
