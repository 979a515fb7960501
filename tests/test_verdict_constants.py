"""The constants a verdict, a speedup or a credit depends on that no other test pins, each with why
it has its value (issue 46 item 2: "constants that a verdict depends on are pinned by tests that say
why each value is what it is"). A changed value fails here first: change it on purpose, with the
measurement behind it, here and in docs/METHODOLOGY.md / docs/BENCHMARKS.md.

Pinned elsewhere (not repeated): the credit shares and caps (test_mutation_credit_rule.py), the exact
counts' tie, the same-run tie and the per-instruction FLOPs (test_mutation_credit_sums.py), sampled rows
per op type (test_mutation_worker.py), tolerances, FLOPs and splits (test_mutation_tolerances.py),
fast_p (test_mutation_report.py), the later-turn docs cap (test_mutation_nodes.py), TILE_ROWS
(test_mutation_evaluator.py).
"""
from __future__ import annotations

import inspect


def test_the_tie_band_is_the_other_timed_runs_range():
    """A counted run is tied to the range of its workload's other timed runs (the H200's power cap
    makes a 30 ms kernel bimodal by its place in the pair, 29 / 33 ms, in shares that change between
    evaluations: a tie to the median, then to the quartiles, refused honest runs in the slow mode;
    tools/credit.py, docs/METHODOLOGY.md), with at least 4 such runs, else the timed median."""
    from tools import credit

    assert credit.TIE_BAND == (0.0, 1.0) and credit.TIE_BAND_RUNS == 4
    assert credit.timed_band([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [4.0, 0.0], [5.0, 0.0]], 0, []) == [1.0, 5.0]


def test_the_counted_runs_bounds():
    """tools/counted.py: an instrumented (SASS-patched) pass's run may take 50x a plain run (49x was
    seen, attention backward at S=77); the counted runs of one evaluation stop within 30 s (the
    experts' take 0.5-1.3 s on the H200: a slow kernel's evaluation ends instead of running its
    instrumented pass for minutes); CUPTI's own push or pop costs 0.6-1.2 ms of host time on the H200
    (0.8 ms padded on the other runs so the counted ones look like the rest); 1-4 uncounted lead runs
    where nothing was timed, 1-8 runs before Nsight Compute's profiled one (drawn: a kernel cannot
    count its way to the counted run)."""
    from tools import counted

    assert counted.INSTRUMENTED_SLOWDOWN == 50.0
    assert counted.COUNTED_CAP_S == 30.0
    assert counted.PUSH_POP_S == 0.0008
    assert counted.CREDIT_LEAD_RUNS == (1, 4) and counted.CREDIT_RUNS == (1, 8)


def test_the_most_pairs_a_timed_phase_runs():
    """tools/counted.py's TIMED_PAIRS_MAX sizes CUPTI's ranges for a counted phase (a range a ranged
    run): 3 warm-ups at most (tools.timing draws 1-3), plan_pairs' 60 at most and up to half again
    (so no kernel knows which run is the last). Fewer, and a long phase's ranges would be dropped."""
    from tools import counted, timing

    hi = inspect.signature(timing.plan_pairs).parameters["hi"].default
    assert counted.TIMED_PAIRS_MAX == 3 + hi + hi // 2 == 93


def test_timing_constants():
    """tools/timing.py. 1 s of paired runs per workload (10-60 pairs) keeps a warm SIMT GEMM within
    1.5x its pre-integrity evaluation; the cap of 4 s stops a candidate far from the library; early
    stopping only outside 1.25x of the library (inside, the plan runs to its end: where the precision
    was measured) and only when the interval's half-width is 10% of |ln m|, after at least 4-6 pairs
    (drawn), with at least 3 pairs behind any interval; a first pair of 0.25 s or more is timed with no
    warm-up; the L2 flush writes at least 256 MiB (more than twice any L2 it runs on: H200 50 MiB, B200 126 MiB); the
    gate holds a stream at most 0.2 s."""
    from tools import timing

    assert timing.TIMING_BUDGET_S == 1.0 and timing.TIMING_CAP_S == 4.0
    params = inspect.signature(timing.plan_pairs).parameters
    assert (params["lo"].default, params["hi"].default) == (10, 60)
    assert (timing.NEAR_BAND, timing.STOP_K) == (1.25, 0.1)
    assert timing.MIN_STOP_PAIRS == (4, 6) and timing.MIN_CAP_PAIRS == 3 == timing.ALWAYS_RUN_PAIRS
    assert timing.SLOW_PAIR_S == 0.15
    assert timing.FLUSH_MIN_BYTES == 256 << 20
    assert timing.GATE_LIMIT_S == 0.2


def test_a_throughput_over_the_ceiling_by_more_than_5_percent_is_implausible():
    """tools/ceilings.py: the dense bf16/fp8 peaks and HBM bandwidth per GPU; MARGIN absorbs clock
    boost and timer granularity only (the best kernels measured reach 82-88% of them)."""
    from tools import ceilings

    assert ceilings.MARGIN == 1.05
    h200 = ceilings.CEILINGS["H200"]
    assert (h200.tflops_16, h200.tflops_8, h200.hbm_tbps) == (989.0, 1979.0, 4.8)


def test_the_guards_and_their_canary():
    """tools/correctness.py: 64 KiB of canary on each side of every tensor (a write off by a tile's
    row or a few thousand elements lands in it), 0xA5 (neither 0, NaN's bytes, nor a small integer a
    kernel writes by accident). Row scales: a thousandth low (the row sum and the whole-output sum
    differ by ~1e-6 relative), for at most 8192 failing rows (beyond, the whole output's scales are
    cheaper: 0.56 s against ~50 us a row on the H200)."""
    from tools import correctness

    assert correctness.GUARD_BYTES == 64 * 1024 and correctness.CANARY == 0xA5
    assert correctness.ROW_SCALE_MARGIN == 1e-3 and correctness.ROW_SCALES_MAX_ROWS == 8192


def test_every_tensor_starts_256_byte_aligned():
    """tools/correctness.py's _ALIGN: every workspace tensor starts on 256 bytes, as cudaMalloc's
    allocations do (TMA needs 16; a kernel may rely on a vector load's or a tensor map's alignment
    of what cudaMalloc would give it). The guard before it grows by what the alignment takes."""
    import torch

    from tools import correctness

    assert correctness._ALIGN == 256
    g = correctness.Guarded((3, 5), torch.bfloat16, "cpu")
    assert g.data_ptr() % 256 == 0 and correctness.GUARD_BYTES <= g.start < correctness.GUARD_BYTES + 256


def test_the_stress_distribution():
    """tasks/stress.py: N(0,1) + N(0,100) * Bernoulli(0.001): one element in a thousand ten times the
    rest's spread, so a kernel that loses precision on large values (a bf16 scale, a missing max
    subtraction) fails, and no input set repeats (DESIGN.md, "A verdict cannot be bought")."""
    from tasks import stress

    assert (stress.OUTLIER_PROB, stress.OUTLIER_STD) == (1e-3, 10.0)


def test_the_default_sampled_rows():
    """64 rows for an op type without its own count (tasks/sampled.py), and the timed judge never
    fewer (tools/workspace.py)."""
    from tasks import sampled
    from tools import workspace

    assert sampled.DEFAULT_ROWS == 64 == workspace.SAMPLED_ROWS


def test_small_samples_are_compared_on_the_host():
    """tools/workspace.py's HOST_COMPARE_ELEMENTS: a sampled output of at most 65,536 elements
    (attention's 256 rows of 128 fit twice) is judged on the host after one transfer: its ~45 small
    launches cost ~1.3 ms an output on the H200's host, most of a judged run at short sequences
    (scripts/bench_judge.py --timed-run, issue 43); a GEMM's 1,024 rows of 7,168 stay on the GPU."""
    from tools import workspace

    assert workspace.HOST_COMPARE_ELEMENTS == 1 << 16
    assert 256 * 128 <= workspace.HOST_COMPARE_ELEMENTS < 1024 * 7168


def test_a_worker_that_lost_2_gib_restarts():
    """tools/worker.py: more device memory than 2 GiB missing after a candidate (a leak the context
    cannot give back) and the worker restarts, so the next candidate's workspace fits."""
    from tools import worker

    assert worker.RESTART_LOST_BYTES == 2 << 30


def test_replays_count_a_speedup_change_under_10_percent_as_noise():
    """agent/replay.py: two speedups of one kernel within 10% are the same (evaluations of a kernel
    differ by 1-1.5% on the H200 for ratios of separately taken medians; 10% leaves room for another GPU)."""
    from agent import replay

    assert replay.SPEEDUP_NOISE == 0.10
