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
