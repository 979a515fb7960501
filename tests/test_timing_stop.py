"""When the timed pairs stop (tools.timing.paired): a kernel far from the library stops once its
speedup's interval ranks it, or at the per-workload cap; one near the library runs every planned
pair. Synthetic timings on a virtual GPU clock: each side's run() advances the clock by the time
the test gives it, and the events read that clock, so the loop is tools.timing's own."""
from __future__ import annotations

import math
import random
import time

import pytest

from tools import timing
from tools.timing import NEAR_BAND, Side, far_from_one, median_ci, paired, stop_early


class _Clock:
    now = 0.0


class _Event:
    def __init__(self, clock: _Clock):
        self.clock = clock

    def record(self):
        self.t = self.clock.now

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class _VirtualGpu:
    """What paired() needs of the worker's State; events on a virtual clock."""

    def __init__(self):
        self.clock = _Clock()

        class flusher:  # noqa: N801 - stands in for State.flusher
            @staticmethod
            def flush():
                pass

        self.flusher = flusher

    def event(self):
        return _Event(self.clock)

    def wait(self, limit_s):
        pass


def _sides(gpu: _VirtualGpu, speedup: float, noise: float, seed: int = 7, library_ms: float = 1.0):
    """A candidate `speedup` times the library's speed, each run's time off by a log-normal factor
    of spread `noise` (per side), as paired() sees them."""
    g = random.Random(seed)

    def ran(ms: float):
        def run():
            gpu.clock.now += ms * math.exp(g.gauss(0.0, noise)) / 1e3
        return run

    return Side("candidate", ran(library_ms / speedup)), Side("baseline:lib", ran(library_ms))


def _time(speedup: float, noise: float, seed: int = 1, pair_s: float = 0.0, **kw):
    gpu = _VirtualGpu()
    cand, lib = _sides(gpu, speedup, noise, seed)
    judged = []

    def before(i, total):
        if pair_s:
            time.sleep(pair_s)

    return paired(cand, lib, gpu, random.Random(seed), before, lambda i, n: judged.append(i), **kw), judged


@pytest.mark.parametrize("seed", range(5))
def test_a_kernel_twenty_times_slower_stops_at_the_fewest_pairs(seed):
    times, judged = _time(0.05, 0.01, seed, budget_s=1.0)
    assert times.stop == "interval"
    assert timing.MIN_STOP_PAIRS[0] <= len(times.candidate_ms) <= timing.MIN_STOP_PAIRS[1]
    assert times.planned >= 10 and len(times.candidate_ms) < times.planned  # it would have run more
    assert judged == list(range(times.warmup + len(times.candidate_ms)))  # every run judged, none after the stop
    lo, hi = median_ci(times.ratios, random.Random(0))
    assert lo <= 0.05 * 1.03 and hi >= 0.05 / 1.03


@pytest.mark.parametrize("seed", range(5))
def test_a_kernel_near_the_library_runs_every_planned_pair(seed):
    """0.99x, and 0.9x: inside the band, however tight its interval, the plan runs to its end."""
    for speedup in (0.99, 0.9, 1.1):
        times, _ = _time(speedup, 0.002, seed, budget_s=1.0)
        assert times.stop == "planned" and len(times.candidate_ms) == times.planned >= 10, speedup


def test_the_cap_bounds_a_slow_noisy_kernel_and_reports_its_interval():
    """A kernel at 0.3x whose runs scatter by 40% never gets an interval tight enough; the cap
    stops it after cap_s of pairs (at least MIN_CAP_PAIRS timed), interval reported."""
    t0 = time.perf_counter()
    times, _ = _time(0.3, 0.4, seed=3, pair_s=0.02, budget_s=10.0, cap_s=0.15)
    wall = time.perf_counter() - t0
    assert times.stop == "cap"
    assert timing.MIN_CAP_PAIRS <= len(times.candidate_ms) < times.planned
    assert wall < 0.15 + 4 * 0.02 + 0.2  # the cap plus at most a pair or two
    lo, hi = median_ci(times.ratios, random.Random(0))
    assert hi < 1 / NEAR_BAND and lo < 0.3 < hi


def test_the_cap_never_stops_a_kernel_near_the_library():
    times, _ = _time(0.99, 0.002, seed=2, pair_s=0.01, budget_s=0.1, cap_s=0.02)
    assert times.stop == "planned" and len(times.candidate_ms) == times.planned


def test_without_a_baseline_there_is_nothing_to_rank():
    gpu = _VirtualGpu()
    cand, _ = _sides(gpu, 0.01, 0.01)
    times = paired(cand, None, gpu, random.Random(1), lambda i, n: None, lambda i, n: None, budget_s=0.001)
    assert times.stop == "planned" and len(times.candidate_ms) == times.planned >= 10


def test_the_rule_never_stops_inside_the_band():
    """Whatever the ratios, a median inside [1/NEAR_BAND, NEAR_BAND] never stops early: the
    rule cannot loosen the precision measured for kernels near the library."""
    g = random.Random(5)
    for _ in range(300):
        m = math.exp(g.uniform(-math.log(NEAR_BAND), math.log(NEAR_BAND)))
        ratios = [m * math.exp(g.gauss(0, g.choice((1e-4, 1e-3, 1e-2)))) for _ in range(g.randint(2, 40))]
        assert not stop_early(ratios, 2)
    assert far_from_one(0.5, 0.7) and far_from_one(1.3, 2.0) and not far_from_one(0.5, 0.81)


def test_the_rule_scales_with_the_distance_from_one():
    """The same relative spread ranks a 0.05x kernel, not a 0.6x one."""
    spread = [math.exp(x) for x in (-0.06, -0.03, 0.0, 0.03, 0.06)]
    assert stop_early([0.05 * s for s in spread], 5)
    assert not stop_early([0.6 * s for s in spread], 5)


def test_a_phase_that_stops_early_still_judged_a_run_whole(monkeypatch):
    """TimedJudge draws one of its whole-output checks among the pairs every timed phase runs."""
    from tasks import get_task
    from tools import workspace

    task = get_task("gemm_n7168_k5120")
    whole = []
    monkeypatch.setattr(workspace, "judge_run", lambda *a, **k: whole.append(a[7]))
    for seed in range(200):
        judge = workspace.TimedJudge(task, {"M": 64}, None, random.Random(seed), "cpu")
        judge.seed = 1
        whole.clear()
        for i in range(timing.ALWAYS_RUN_PAIRS):
            judge.after_pair(i, 40 if i else -1)
        assert any(whole), seed
        assert not whole[0]  # never the first run


def test_a_slow_first_pair_is_timed(monkeypatch):
    """A first pair of SLOW_PAIR_S or more is timed (no warm-up); a fast one keeps the drawn 1-3."""
    monkeypatch.setattr(timing, "SLOW_PAIR_S", 0.02)
    slow = [_time(0.05, 0.01, seed, pair_s=0.02, budget_s=0.1)[0] for seed in range(3)]
    assert {t.warmup for t in slow} == {0}
    assert all(len(t.candidate_ms) == len(t.baseline_ms) >= timing.MIN_CAP_PAIRS for t in slow)
    assert {_time(0.99, 0.002, seed, budget_s=0.01)[0].warmup for seed in range(40)} == {1, 2, 3}


# ---------------------------------------------------------------- in stretches (every run counted)

def _steps(speedup: float, noise: float, seed: int = 1, pair_s: float = 0.0, halt_at: int | None = None, **kw):
    """paired_steps driven to its end, as tools.counted drives it: returns (PairedTimes, the totals it
    yielded, in order). `halt_at`: the caller's cost bound is reached before that pair."""
    gpu = _VirtualGpu()
    cand, lib = _sides(gpu, speedup, noise, seed)
    state = {"halt": False}

    def before(i, total):
        if pair_s:
            time.sleep(pair_s)

    steps = timing.paired_steps(cand, lib, gpu, random.Random(seed), before, lambda i, n: None,
                                halted=lambda: state["halt"], **kw)
    totals = []
    while True:
        try:
            i, total = next(steps)
        except StopIteration as done:
            return done.value, totals
        totals.append(total)
        state["halt"] = halt_at is not None and i >= halt_at


@pytest.mark.parametrize("seed", range(5))
def test_in_stretches_the_stop_is_decided_in_the_first_and_every_stretch_runs_as_many(seed):
    """0.05x with 4 stretches: the first stretch stops at the rule's fewest pairs, the count becomes 4
    times what it ran (a multiple of 4), and the sequence runs on to that count (the later passes'
    runs); the stop is reported as `interval`, the drawn count as planned."""
    times, totals = _steps(0.05, 0.01, seed, budget_s=1.0, stretches=4)
    pairs = times.warmup + len(times.candidate_ms)
    m = pairs // 4
    assert times.stop == "interval" and pairs == 4 * m, times
    assert timing.MIN_STOP_PAIRS[0] <= m - times.warmup <= timing.MIN_STOP_PAIRS[1]
    planned_total = totals[1]  # the drawn count, yielded before pair 1
    assert planned_total % 4 == 0 and planned_total == times.warmup + times.planned and m < planned_total // 4
    assert totals[m:] == [4 * m] * (3 * m)  # from the stop on, every yield says the new count


@pytest.mark.parametrize("seed", range(3))
def test_in_stretches_a_kernel_near_the_library_runs_its_planned_pairs(seed):
    times, totals = _steps(0.99, 0.002, seed, budget_s=1.0, stretches=4)
    assert times.stop == "planned" and len(times.candidate_ms) == times.planned >= 10
    assert (times.warmup + times.planned) % 4 == 0 and set(totals[1:]) == {times.warmup + times.planned}


def test_in_stretches_the_cap_is_the_first_stretchs_share():
    """The cap, cap_s / stretches on the first stretch's own time: 4 stretches of as many pairs take
    about cap_s together, as one uncounted phase at its cap."""
    t0 = time.perf_counter()
    times, _ = _steps(0.3, 0.4, seed=3, pair_s=0.02, budget_s=10.0, cap_s=0.6, stretches=4)
    wall = time.perf_counter() - t0
    m = (times.warmup + len(times.candidate_ms)) // 4
    assert times.stop == "cap" and times.warmup + len(times.candidate_ms) == 4 * m
    assert m - times.warmup >= timing.MIN_CAP_PAIRS and m * 0.02 >= 0.6 / 4 - 0.02
    assert wall < 4 * (0.6 / 4 + 3 * 0.02) + 0.4  # about the cap, plus a pair or two a stretch


def test_past_the_first_stretch_nothing_stops_early():
    """A kernel that only gets far from 1 after the first stretch (1.0x, then 0.05x) runs the drawn
    count: the stop is the first stretch's to decide, on its pairs."""
    gpu = _VirtualGpu()
    n = {"runs": 0}

    def cand():
        n["runs"] += 1
        gpu.clock.now += (1.0 if n["runs"] <= 20 else 20.0) / 1e3

    def lib():
        gpu.clock.now += 1.0 / 1e3

    steps = timing.paired(Side("candidate", cand), Side("baseline:lib", lib), gpu, random.Random(4), lambda i, t: None,
                          lambda i, t: None, budget_s=1.0)
    assert steps.stop == "interval"  # (one stretch: it stops once far from 1)
    n["runs"] = 0
    times = _drain_steps(timing.paired_steps(Side("candidate", cand), Side("baseline:lib", lib), gpu, random.Random(4),
                                             lambda i, t: None, lambda i, t: None, budget_s=1.0, stretches=2))
    assert times.stop == "planned" and len(times.candidate_ms) == times.planned > 40


def _drain_steps(steps):
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def test_halted_ends_a_decided_or_far_sequence_and_never_one_near_the_library():
    """`halted` (the executed check's COUNTED_CAP_S): a sequence whose stop was decided ends before
    the next pair, keeping its stop's name; one far from 1 with MIN_CAP_PAIRS timed ends as `cap`;
    one near the library runs on to its planned end."""
    decided, _ = _steps(0.05, 0.01, seed=2, budget_s=1.0, stretches=4, halt_at=12)
    assert decided.stop == "interval" and decided.warmup + len(decided.candidate_ms) == 12
    far, _ = _steps(0.3, 0.4, seed=3, budget_s=1.0, stretches=4, halt_at=8)
    assert far.stop == "cap" and far.warmup + len(far.candidate_ms) == 8
    near, _ = _steps(0.99, 0.002, seed=2, budget_s=1.0, stretches=4, halt_at=8)
    assert near.stop == "planned" and len(near.candidate_ms) == near.planned
