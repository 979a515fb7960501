"""The counted runs' pauses are the timed runs' (issue 42 item 3), checked as a distribution: over
many evaluations of the CPU stand-in worker (real timed phases and counted-run code, fake CUPTI
whose push and pop take CUPTI's own time, a host whose work between runs varies at random; the
harness's clock a virtual one that only waits advance, so the CPU's own noise decides nothing), the
gap before each counted run ranks uniformly among its workload's ordinary timed gaps
(tools.counted.launch_gaps `counted_rank`), and the pass boundaries' long pauses are reported apart
and never precede a counted run. The same check fails when counted runs get a pause of their own
(the padding of the other runs removed): it has the power to see what it guards."""
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
    global sleep
    sleep = clock.sleep
    yield clock


sleep = time.sleep  # the virtual clock's, while a test runs


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


def counted_gaps(evaluations: int = 8) -> list[dict]:
    """gaps_ms of `evaluations` evaluations (credit seeds 0..n-1), each checked to have counted four
    timed runs."""
    out = []
    for seed in range(evaluations):
        state = JitteredState(seed)
        result, fatal = with_counted_runs(state, request(seed, timing_seed=seed))
        assert result["status"] == "passed" and not fatal, result
        credit = result["credit"]
        assert credit["status"] == "ran" and len(credit["counted_pairs"]) == 4, credit
        out.append(credit["gaps_ms"])
    return out


def assert_ranked_as_timed(gaps: list[dict]) -> None:
    """The counted gaps' ranks among the ordinary timed gaps look uniform on [0, 1]: their mean
    within 0.35-0.65 (uniform: 0.5, standard error 0.05 for 32 ranks) and neither end holding half."""
    ranks = [r for g in gaps for r in g["counted_rank"]]
    assert len(ranks) == 4 * len(gaps) and all(r is not None for r in ranks), gaps
    mean = statistics.fmean(ranks)
    assert 0.35 <= mean <= 0.65, f"counted gaps rank {mean:.2f} on average among the timed ones: {ranks}"
    assert sum(r > 0.75 for r in ranks) < len(ranks) / 2 and sum(r < 0.25 for r in ranks) < len(ranks) / 2, ranks


def test_the_gap_before_a_counted_run_ranks_as_a_timed_runs_does():
    """Over 8 evaluations (32 counted runs), the counted gaps rank uniformly among their
    workloads' ordinary timed gaps; the three pass boundaries' gaps are reported apart, each longer
    than every ordinary gap, and none precedes a counted run (no counted gap beyond every timed gap)."""
    gaps = counted_gaps()
    assert_ranked_as_timed(gaps)
    for g in gaps:
        assert len(g["boundary"]) == 3 and min(g["boundary"]) >= BOUNDARY_S * 1e3, g
        assert g["counted_beyond_timed"] == 0 and max(g["counted"]) < min(g["boundary"]), g
        # 10-15 pairs: four counted, three after a boundary, the rest ordinary (as at S=8192 on the H200,
        # where the median of every timed gap sat among the boundaries' and whole checks')
        assert g["ordinary_runs"] >= 2 and g["ordinary_median"] < g["timed_median"], g


def test_the_check_sees_counted_runs_that_get_a_pause_of_their_own(monkeypatch):
    """Without the padding (the other runs no longer wait as long as CUPTI's push and pop do), a
    counted run's gap is longer than its neighbours' by CUPTI's own time: the same check fails."""
    cold_run = timing._cold_run

    def unpadded(side, state):
        side.pad = None
        return cold_run(side, state)

    monkeypatch.setattr(timing, "_cold_run", unpadded)
    monkeypatch.setattr(TimedCupti, "own_s", 0.003)  # (the H200's CUPTI: 0.6-1.2 ms; the jitter: 1-4 ms)
    gaps = counted_gaps(4)
    with pytest.raises(AssertionError, match="rank"):
        assert_ranked_as_timed(gaps)
    assert statistics.fmean(r for g in gaps for r in g["counted_rank"]) > 0.65


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


def test_whole_output_checks_are_drawn_over_the_pairs_the_counted_ones_are_drawn_from(monkeypatch):
    """With counted runs, the runs judged whole are drawn over pairs 1..the last counted pair
    (TimedPhase.hold_through), not among the first two: a whole check's long pause then precedes a
    counted pair as often as any pair (on the H200 the first stretch's counted gap followed one in 3
    of 10 workloads). Every draw lies in that range, at least one falls beyond pair 2 over 16
    evaluations, and every drawn pair was judged whole."""
    from tools import workspace

    judged_whole: list[int] = []
    after_pair = workspace.TimedJudge.after_pair

    def recording(judge, i, total):
        after_pair(judge, i, total)
        if i in (judge.full_at or ()):
            judged_whole.append(i)
    monkeypatch.setattr(workspace.TimedJudge, "after_pair", recording)
    beyond = 0
    for seed in range(16):
        judged_whole.clear()
        state = JitteredState(seed)
        state.whole_at = judged_whole
        result, fatal = with_counted_runs(state, request(seed, timing_seed=seed))
        assert result["status"] == "passed" and not fatal, result
        last = max(result["credit"]["counted_pairs"])
        whole = result["full_checks"]
        assert 1 <= whole <= 2, result
        beyond += any(p > 2 for p in state.whole_at)
        assert state.whole_at and all(1 <= p <= last for p in state.whole_at), (state.whole_at, last)
    assert beyond >= 4, beyond
