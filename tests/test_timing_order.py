"""The speedup under an order effect (tools.timing.order_blocks, PairedTimes.speedup; issue 44).

On the H200 at its power cap, whichever side runs second in a pair runs slower (a 30 ms attention
backward: up to 15%, docs/BENCHMARKS.md 2026-12-04), so the per-pair ratios are two modes, r*s
(candidate first) and r/s (candidate second). The median of per-pair ratios lands on a mode or
between them by the count's parity and the warm-up's; the median of blocks of two adjacent pairs'
geometric means is r. These run tools.timing.paired itself on a virtual GPU clock: each side's run
advances the clock by its time, times s when it is the pair's second run."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from tools import timing
from tools.timing import PairedTimes, Side, candidate_first, order_blocks, paired, stop_early


class _Event:
    def __init__(self, gpu):
        self.gpu = gpu

    def record(self):
        self.t = self.gpu.now

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class _PowerCappedGpu:
    """What paired() needs of the worker's State. A run that follows the other side's run in the
    same pair takes `second` (candidate) or `second_lib` (library) times as long."""

    def __init__(self, speedup: float, second: float, second_lib: float | None = None, noise: float = 0.0,
                 seed: int = 0, library_ms: float = 28.0):
        self.now, self.in_pair = 0.0, False
        g = random.Random(seed)

        def side(name: str, ms: float, s: float) -> Side:
            def run():
                factor = s if self.in_pair else 1.0
                self.now += ms * factor * math.exp(g.gauss(0.0, noise)) / 1e3
                self.in_pair = True
            return Side(name, run)

        self.candidate = side("candidate", library_ms / speedup, second)
        self.library = side("baseline:lib", library_ms, second if second_lib is None else second_lib)

        class flusher:  # noqa: N801 - stands in for State.flusher
            @staticmethod
            def flush():
                pass

        self.flusher = flusher

    def event(self):
        return _Event(self)

    def wait(self, limit_s):
        pass

    def time(self, seed: int, **kw) -> PairedTimes:
        def before(i, total):
            self.in_pair = False  # a new pair: its first run is not a second run
        return paired(self.candidate, self.library, self, random.Random(seed), before, lambda i, n: None, **kw)


SECOND_RUN_PENALTY = [1.0, 1.03, 1.07, 1.1, 1.15, 1.2]


@pytest.mark.parametrize("s", SECOND_RUN_PENALTY)
@pytest.mark.parametrize("r", [0.93, 1.0, 1.12])
def test_the_speedup_is_recovered_whatever_the_second_run_penalty_and_the_warmup(r, s):
    """Every warm-up count (0-3: both parities), every drawn count (odd too): within 0.2% of r
    (the runs scatter by 0.05% each), where the median of per-pair ratios is off by up to s."""
    old_errors, warmups, counts = [], set(), set()
    for seed in range(24):
        gpu = _PowerCappedGpu(r, s, noise=5e-4, seed=seed)
        times = gpu.time(seed, budget_s=0.2 if seed % 3 else 1e-3)  # 0.2 s: 10-15 pairs; 1 ms: up to 90
        warmups.add(times.warmup % 2)
        counts.add(len(times.candidate_ms) % 2)
        est = times.speedup(random.Random(seed))
        assert est is not None and est.blocks == len(times.candidate_ms) // 2
        assert abs(est.value / r - 1) < 2e-3, (seed, times.warmup, len(times.candidate_ms), est)
        assert est.ci[0] <= r * 1.002 and est.ci[1] >= r / 1.002
        old_errors.append(abs(statistics.median(times.ratios) / r - 1))
    assert warmups == {0, 1} and counts == {0, 1}
    if s >= 1.07:  # the old estimator: on a mode (odd counts) or at their arithmetic middle
        assert max(old_errors) > 0.02


def test_a_slow_first_pair_timed_with_no_warmup_is_recovered(monkeypatch):
    """SLOW_PAIR_S: the first pair timed (warm-up 0, the candidate first in timed pair 0)."""
    monkeypatch.setattr(timing, "SLOW_PAIR_S", 0.0)
    for seed in range(6):
        times = _PowerCappedGpu(0.9, 1.15, seed=seed).time(seed, budget_s=0.01)
        assert times.warmup == 0
        assert times.speedup(random.Random(0)).value == pytest.approx(0.9, rel=1e-9)


def test_an_unequal_penalty_gives_the_same_estimate_in_every_evaluation():
    """When the two sides suffer differently from running second (s_c for the candidate, s_l for the
    library), the blocks give r * sqrt(s_l / s_c): the mean of both orders, the same whatever the
    warm-up's parity or the count's. The median of per-pair ratios moves by up to ~15% between
    evaluations (the spread seen at S=8192: 0.907-0.965)."""
    new, old = [], []
    for seed in range(30):
        times = _PowerCappedGpu(0.95, 1.14, 1.06, seed=seed).time(seed, budget_s=0.2)
        new.append(times.speedup(random.Random(0)).value)
        old.append(statistics.median(times.ratios))
    assert max(new) / min(new) - 1 < 1e-9 and new[0] == pytest.approx(0.95 * math.sqrt(1.06 / 1.14), rel=1e-9)
    assert max(old) / min(old) - 1 > 0.1


def test_blocks_pair_opposite_orders_and_drop_the_odd_last_pair():
    """Each block is a candidate-first pair with a candidate-second one, adjacent in time, whatever
    the parity of the first timed pair; a pair without a partner is not used (alone it is one
    order's mode)."""
    assert [candidate_first(i) for i in range(4)] == [True, False, True, False]
    assert order_blocks([4.0, 1.0, 9.0, 1.0, 100.0], [True, False, True, False, True]) == [2.0, 3.0]
    assert order_blocks([1.0, 4.0, 1.0, 9.0, 100.0], [False, True, False, True, False]) == [2.0, 3.0]
    for warmup in range(4):
        t = PairedTimes([1.0] * 5, [1.21, 1.0, 1.21, 1.0, 7.0], warmup)  # the 7.0: the odd last pair
        firsts = [candidate_first(warmup + j) for j in range(5)]
        assert t.blocks == order_blocks(t.ratios, firsts) and len(t.blocks) == 2 and 7.0 not in t.blocks
    assert PairedTimes([1.0], [2.0], 1).speedup(random.Random(0)) is None  # one pair: no block, no speedup
    assert PairedTimes([1.0] * 4, [], 1).speedup(random.Random(0)) is None  # no baseline


@pytest.mark.parametrize("s", [1.0, 1.2])
def test_the_rules_stop_on_whole_blocks_and_never_near_the_library(s):
    """stop_early and the cap look at the speedup's blocks: a stop leaves an even count of timed pairs
    (none unused); a kernel at 0.05x stops within MIN_STOP_PAIRS (rounded up to a block); one at 0.9x
    with a 20% two-mode order effect runs every planned pair (its blocks sit inside NEAR_BAND)."""
    for seed in range(12):
        times = _PowerCappedGpu(0.05, s, noise=0.01, seed=seed).time(seed, budget_s=1.0)
        assert times.stop == "interval" and len(times.candidate_ms) % 2 == 0, seed
        assert timing.MIN_STOP_PAIRS[0] <= len(times.candidate_ms) <= timing.MIN_STOP_PAIRS[1], seed
        near = _PowerCappedGpu(0.9, s, noise=0.002, seed=seed).time(seed, budget_s=0.3)
        assert near.stop == "planned" and len(near.candidate_ms) == near.planned


def test_the_stop_rule_needs_two_blocks_and_min_pairs_behind_them():
    far = [0.05, 0.05 * 1.01, 0.05 / 1.01]
    assert not stop_early(far[:1], 2)  # one block: no interval
    assert stop_early(far[:2], 4) and not stop_early(far[:2], 5)  # 4 pairs behind 2 blocks, 5 need a third
    assert stop_early(far, 5)
