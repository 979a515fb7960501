"""The pauses a kernel sees (issue 42 item 3), checked as distributions over evaluations of the CPU
stand-in worker (real timed phases and counted-run code, fake CUPTI whose push and pop take CUPTI's
own time, a pause at each pass boundary, a host whose work between runs varies at random; the
harness's clock a virtual one that only waits advance, so the CPU's own noise decides nothing).
Every timed candidate run is counted (a range of its stretch's pass), so no counted run has a pause
of its own to rank; what is left to check is the pair: the library's run beside each ranged run
waits as long as the range's push (the matched pause), and the same check fails once that pause is
removed. The pass boundaries' long pauses are reported apart (tools.counted.launch_gaps)."""
from __future__ import annotations

import contextlib
import random
import statistics
import time

import pytest
from types import SimpleNamespace
from test_credit_in_process import CountedState, FakeProfiler, request, with_counted_runs
from test_evaluator_cpu import gemm

from tools import counted, timed, timing

CUPTI_OWN_S = counted.PUSH_POP_S  # what CUPTI's push (and its pop) takes once the GPU has drained
BOUNDARY_S = 0.02  # a pass boundary: CUPTI's Stop and Start and the other workloads' stretches


class VirtualClock:
    """perf_counter/monotonic that advance by what `sleep` is asked for, plus 1 us a reading (so a
    loop that polls the clock, tools.counted's spin, still ends)."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now

    monotonic = perf_counter

    def sleep(self, s: float) -> None:
        self.now += max(0.0, s)


@pytest.fixture(autouse=True)
def virtual_clock(monkeypatch):
    clock = VirtualClock()
    fake = SimpleNamespace(perf_counter=clock.perf_counter, monotonic=clock.monotonic, sleep=clock.sleep)
    for module in (timing, counted, timed):
        monkeypatch.setattr(module, "time", fake)
    global sleep, time_now
    sleep, time_now = clock.sleep, clock.perf_counter
    yield clock


sleep, time_now = time.sleep, time.perf_counter  # the virtual clock's, while a test runs


class TimedCupti(FakeProfiler):
    """The fake profiler, with CUPTI's own host time at each push and pop (`own_s`) and a pause
    at each pass boundary."""

    own_s = CUPTI_OWN_S

    def profile_passes(self, run_pass, name, max_ranges=None):
        def slow_pass(i, ranged):
            if i:
                sleep(BOUNDARY_S)

            @contextlib.contextmanager
            def timed_range(label=None):
                sleep(self.own_s)
                with ranged(label):
                    yield
                sleep(self.own_s)
            run_pass(i, timed_range)
        return super().profile_passes(slow_pass, name, max_ranges)


class JitteredState(CountedState):
    """The stand-in whose host work after each run takes 1-4 ms at random (the judge, the inputs)."""

    def __init__(self, seed: int):
        super().__init__(gemm, passes=4, instrumented=())
        self.profiler = TimedCupti(self, 4, (), None)
        self.jitter = random.Random(seed)

    def wait(self, limit_s):
        super().wait(limit_s)
        sleep(self.jitter.uniform(0.001, 0.004))


def with_library(monkeypatch) -> None:
    """Timed phases with a library side (the CPU stand-in has none): each run 1 ms on the stand-in's clock."""
    from tools.timing import Side

    def library_baseline(state, req, task, wl, inputs, limit):
        def run():
            state.clock_ms += 1.0
        return Side("baseline:fake", run), "fake", None
    monkeypatch.setattr(timed, "library_baseline", library_baseline)


def pair_gaps(evaluations: int = 6) -> list[tuple[list[float], list[float], dict]]:
    """Per evaluation (credit seeds 0..n-1): the pause before each candidate run and before each library
    run (ms, from the other side's run before it, within a pair: the host work, the drain and the
    range's push or the library's matched pause), pairs after the first of each stretch, and gaps_ms."""
    out = []
    for seed in range(evaluations):
        state = JitteredState(seed)
        seen: dict[str, list[float]] = {}
        cold_run = timing._cold_run

        def recording(side, st, seen=seen):
            t0 = time_now()
            events = cold_run(side, st)
            seen.setdefault(side.name, []).append(side.released[-1] - t0)  # from the run's start to its release
            return events
        timing._cold_run = recording
        try:
            result, fatal = with_counted_runs(state, request(seed, timing_seed=seed))
        finally:
            timing._cold_run = cold_run
        assert result["status"] == "passed" and not fatal, result
        credit = result["credit"]
        assert credit["status"] == "ran" and credit.get("padded_runs", 0) in (0, len(credit["run_ms"])), credit
        out.append((seen["candidate"], seen["baseline:fake"], credit["gaps_ms"]))
    return out


def lag_ms(got) -> float:
    """How much longer (ms) the candidate's runs wait than the library's, median over evaluations."""
    return statistics.median((statistics.median(c) - statistics.median(lib)) * 1e3 for c, lib, _ in got)


def test_both_sides_of_a_pair_wait_alike_before_their_run(monkeypatch):
    """Every candidate run is ranged (CUPTI's push and pop, each after a drain); the library's run
    beside it waits as long (the matched pause): the time from the start of a cold run to the
    release of its launches is the same on both sides within 0.1 ms (CUPTI's own part: 0.8 ms here),
    so neither kernel gets a pause the other does not; every library run of the session is paused."""
    with_library(monkeypatch)
    got = pair_gaps()
    assert abs(lag_ms(got)) < 0.1, lag_ms(got)
    for _, _, g in got:  # every timed run counted: nothing runs after the timed ones, the boundaries apart
        assert g["counted"] == [] and g["counted_beyond_timed"] == 0 and len(g["boundary"]) == 3, g
        assert min(g["boundary"]) >= BOUNDARY_S * 1e3 > g["ordinary_median"], g


def test_the_check_sees_a_library_run_without_its_pause(monkeypatch):
    """Without the library's matched pause, the candidate's runs wait longer than the library's by
    CUPTI's own time: the same check fails (it has the power to see what it guards)."""
    with_library(monkeypatch)
    cold_run = timing._cold_run

    def unmatched(side, state):
        if side.name != "candidate":
            side.pad = None
        return cold_run(side, state)
    monkeypatch.setattr(timing, "_cold_run", unmatched)
    got = pair_gaps(2)
    assert lag_ms(got) > 0.5, lag_ms(got)
    with pytest.raises(AssertionError):
        assert abs(lag_ms(got)) < 0.1


def test_launch_gaps_rank_each_counted_gap_among_the_ordinary_ones():
    """launch_gaps: boundary runs' gaps apart, the ordinary pool without them, mid-ranks in [0, 1]."""
    timed = [0.0, 0.010, 0.021, 0.030, 0.530, 0.542, 0.550]  # gaps 10, 11, 9, 500 (boundary), 12, 8 ms
    g = counted.launch_gaps(timed, [0.021, 0.542], boundary=[0.530])
    assert g["boundary"] == pytest.approx([500.0]) and g["ordinary_runs"] == 3  # 10, 9, 8
    assert g["counted"] == pytest.approx([11.0, 12.0])
    assert g["ordinary_median"] == pytest.approx(9.0) and g["timed_median"] == pytest.approx(9.5)  # (10, 9, 500, 8)
    assert g["counted_rank"] == pytest.approx([1.0, 1.0]) and g["counted_beyond_timed"] == 0
    assert counted.launch_gaps(timed, [0.010], boundary=[0.530])["counted_rank"] == pytest.approx([0.5])  # 8 9 | 11 12
    assert counted.launch_gaps([], [1.0, 1.01])["counted_rank"] == [None]
