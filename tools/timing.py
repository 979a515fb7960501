"""Honest kernel timing (worker side).

Every timed run starts cold: scratch re-zeroed and outputs poisoned (so the kernel does
its whole job), then L2 flushed by writing a buffer larger than twice the L2, then CUDA
events around the launches only. The candidate and its baseline are timed in the same
process, interleaved in alternating rounds, because clocks drift as the card heats
(FACTS.md): a speedup comes from one interleaved measurement, never from two moments.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from tools.results import Timing

FLUSH_MIN_BYTES = 256 << 20


class KernelTimeout(RuntimeError):
    """The GPU did not finish queued work in time (a hung kernel); the context is lost."""


def summarize(times_ms: list[float]) -> Timing:
    xs = sorted(times_ms)
    med = statistics.median(xs)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4, method="inclusive")
        iqr = q[2] - q[0]
    else:
        iqr = xs[-1] - xs[0]
    cv = statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 and statistics.fmean(xs) > 0 else 0.0
    return Timing(median_ms=med, iqr_ms=iqr, cv=cv, runs=len(xs))


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def geo_spread(xs: list[float]) -> float:
    """Geometric standard deviation factor (1.0 = all equal)."""
    if len(xs) < 2:
        return 1.0
    return math.exp(statistics.pstdev([math.log(x) for x in xs]))


def plan_runs(est_ms: float, rounds: int, min_runs: int = 10, max_runs: int = 100, target_ms: float = 200.0,
              budget_ms: float = 5000.0) -> int:
    """Runs per round per side: at least min_runs and ~target_ms in total, at most max_runs,
    and for very slow kernels no more than budget_ms (but never fewer than `rounds` runs)."""
    est = max(est_ms, 1e-3)
    n = min(max(min_runs, math.ceil(target_ms / est)), max_runs)
    n = max(rounds, min(n, math.floor(budget_ms / est)))
    return max(1, math.ceil(n / rounds))


def wait_idle(limit_s: float) -> None:
    """Wait for the default stream, polling so a hung kernel becomes KernelTimeout instead of
    a blocked process; a failed kernel raises launch.CudaError with the driver's error name."""
    from cuda.bindings import driver as d

    from tools.launch import CudaError, check

    ev = check(d.cuEventCreate(int(d.CUevent_flags.CU_EVENT_DISABLE_TIMING)), "cuEventCreate")
    try:
        check(d.cuEventRecord(ev, d.CUstream(0)), "cuEventRecord")
        deadline, pause = time.monotonic() + limit_s, 2e-5
        while True:
            res = d.cuEventQuery(ev)
            err = res[0] if isinstance(res, tuple) else res
            if err == d.CUresult.CUDA_SUCCESS:
                return
            if err != d.CUresult.CUDA_ERROR_NOT_READY:
                raise CudaError(err.name, "kernel execution")
            if time.monotonic() > deadline:
                raise KernelTimeout(f"the GPU did not finish within {limit_s:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 5e-3)
    finally:
        d.cuEventDestroy(ev)


class L2Flusher:
    def __init__(self, l2_bytes: int):
        import torch

        self.buffer = torch.empty(max(FLUSH_MIN_BYTES, 2 * l2_bytes), dtype=torch.uint8, device="cuda")

    def flush(self) -> None:
        self.buffer.zero_()


@dataclass
class Side:
    """One thing to time: prepare() (not timed: reset scratch, poison outputs) then run()."""

    name: str
    run: Callable[[], object]
    prepare: Callable[[], None] = lambda: None


def _timed(side: Side, flusher: L2Flusher, n: int) -> list:
    import torch

    events = []
    for _ in range(n):
        side.prepare()
        flusher.flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        side.run()
        end.record()
        events.append((start, end))
    return events


def measure(side: Side, flusher: L2Flusher, n: int, limit_s: float) -> list[float]:
    events = _timed(side, flusher, n)
    wait_idle(limit_s)
    return [s.elapsed_time(e) for s, e in events]


def interleaved(candidate: Side, baseline: Side | None, flusher: L2Flusher, rounds: int = 5, warmup: int = 2,
                limit_s: float = 60.0, **plan_kw) -> tuple[list[float], list[float]]:
    """Time the candidate (and baseline) in `rounds` alternating rounds; returns the per-run
    times in ms of each (baseline list empty without one)."""
    sides = [candidate] + ([baseline] if baseline else [])
    est = max(statistics.median(measure(s, flusher, max(1, warmup), limit_s)) for s in sides)
    k = plan_runs(est, rounds, **plan_kw)
    times: dict[str, list[float]] = {candidate.name: [], **({baseline.name: []} if baseline else {})}
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]  # ABBA: neither side always goes first
        for s in order:
            times[s.name] += measure(s, flusher, k, limit_s)
    return times[candidate.name], (times[baseline.name] if baseline else [])
