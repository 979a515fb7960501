"""Honest kernel timing (worker side).

Every timed run starts cold: fresh inputs loaded and outputs poisoned (so the kernel does
its whole job on data it has never seen), then L2 flushed by writing a buffer larger than
twice the L2, then device events around the timed work only (for a candidate: the reset of
its zero-initialised scratch, then its launches), issued while a gate kernel holds the
stream, so what is timed is GPU work, never the host issuing it. Candidate and baseline alternate run by
run (`paired`), because clocks drift as the card heats (FACTS.md): the speedup is the
median of the per-pair ratios, with a bootstrap interval.
"""
from __future__ import annotations

import ctypes
import math
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from tools.results import Timing

FLUSH_MIN_BYTES = 256 << 20
# Wall seconds of paired runs per workload (the pair count is then held within [10, 60]). 1 s keeps
# a warm evaluation of the SIMT GEMM within 1.5x its pre-integrity time (docs/BENCHMARKS.md);
# kernels under ~15 ms per pair reach the 60-pair cap anyway.
TIMING_BUDGET_S = 1.0

# When timing may stop before the planned count (`stop_early`): the speedup's interval is tight
# enough to rank the kernel, relative to its distance from 1. A kernel at 0.05x needs a few pairs
# to be known as "about 20 times slower"; one at 0.99x needs every planned pair to be told from
# 1.0. The rule, on the median ratio m and its bootstrap 95% interval [lo, hi]:
#   stop when the interval lies wholly outside NEAR_BAND (hi < 1/NEAR_BAND or lo > NEAR_BAND)
#   and its half-width in log space, (ln hi - ln lo) / 2, is at most STOP_K * |ln m|.
# Inside the band (the library's neighbourhood, where today's precision was measured: CV <= 0.3%,
# range <= 1% over evaluations) the plan runs to its end: the rule cannot loosen those kernels.
# Early stopping needs at least MIN_STOP_PAIRS timed pairs (drawn per evaluation, so a kernel
# cannot know which run is the last), and the per-workload cap (TIMING_CAP_S of wall time in the
# paired loop, outside the band too) stops a candidate so slow that even those are long; both are
# recorded in the result (`timing_stop`) with the interval they left.
NEAR_BAND = 1.25
STOP_K = 0.1
MIN_STOP_PAIRS = (4, 6)
MIN_CAP_PAIRS = 3  # the fewest timed pairs an interval is reported from
ALWAYS_RUN_PAIRS = MIN_CAP_PAIRS  # pairs every timed phase with a baseline runs (a slow first pair is timed)
TIMING_CAP_S = 4.0
# A first pair this long (inputs, both runs, judging) is timed, with no warm-up: 1-3 warm-up pairs
# of a kernel that runs for a second cost seconds and warm nothing. Both sides already ran in this
# process before it (the seeded checks ran the candidate's module, the library's set-up ran the
# library), what the events hold is GPU work only (the gate keeps host-side first-call costs out),
# and the speedup is a median over at least MIN_CAP_PAIRS pairs, which one pair cannot set alone.
# 0.15 s (issue 43; 0.25 before): the attention-backward expert's S=8192 pairs take about 0.2 s (two
# 31 ms runs, two bf16 forwards generating O and LSE, the judging), and its 1-3 warm-ups cost
# 0.2-0.6 s of a 12 s evaluation while its kernel had run in the seeded checks just before.
SLOW_PAIR_S = 0.15


# The gate holds the stream while the host issues one side's timed work. Without it the start
# event fires as soon as the L2 flush ends, and a side whose launches take the host longer than
# that is timed partly as host time: a library's Python wrapper around a few microseconds of
# GPU work (fla's GDN decode measured 0.151 ms in one session and 0.358 ms in the next, CV 3.4%
# between two evaluations). Each hold has its own word in mapped pinned memory and a fresh
# random 64-bit token: the kernel spins until the host writes that token into that word (the
# release), or until GATE_LIMIT_S has passed. A gate can only delay a start event, never
# advance one, and opening another side's gate early takes its token, which no kernel sees
# before the host has already released it; so a candidate that writes into host memory cannot
# get the baseline timed with its host time. PTX so that the driver builds it for whatever GPU
# the worker has.
GATE_LIMIT_S = 0.2
GATE_SLOTS = 512  # words, used round robin; far more than gates in flight (2 per pair)
GATE_PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry ptxbench_gate(.param .u64 word, .param .u64 token, .param .u64 limit_ns)
{
    .reg .pred %p<3>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [word];
    ld.param.u64 %rd2, [token];
    ld.param.u64 %rd3, [limit_ns];
    mov.u64 %rd4, %globaltimer;
WAIT:
    ld.volatile.global.u64 %rd5, [%rd1];
    setp.eq.u64 %p1, %rd5, %rd2;
    @%p1 bra OPEN;
    nanosleep.u32 500;
    mov.u64 %rd6, %globaltimer;
    sub.u64 %rd7, %rd6, %rd4;
    setp.lt.u64 %p2, %rd7, %rd3;
    @%p2 bra WAIT;
OPEN:
    ret;
}
"""


@dataclass(frozen=True)
class Hold:
    word: int  # index into the gate's words
    token: int


class StreamGate:
    """Holds the default stream until the host has issued a side's timed work (see GATE_PTX)."""

    def __init__(self, limit_s: float = GATE_LIMIT_S):
        from cuda.bindings import driver as d

        from tools.launch import check

        self._d, self._check = d, check
        check(d.cuInit(0), "cuInit")  # idempotent; the primary context must already be current (torch's)
        self._module = check(d.cuModuleLoadData(GATE_PTX.encode() + b"\0"), "cuModuleLoadData(gate)")
        self._fn = check(d.cuModuleGetFunction(self._module, b"ptxbench_gate"), "cuModuleGetFunction(gate)")
        self._host = int(check(d.cuMemHostAlloc(8 * GATE_SLOTS, d.CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc(gate)"))
        self._words = (ctypes.c_uint64 * GATE_SLOTS).from_address(self._host)
        self._dev = int(check(d.cuMemHostGetDevicePointer(self._host, 0), "cuMemHostGetDevicePointer(gate)"))
        self._args = (ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint64(int(limit_s * 1e9)))
        self._params = (ctypes.c_void_p * 3)(*(ctypes.addressof(a) for a in self._args))
        self._count = 0

    def hold(self) -> Hold:
        """Enqueue a gate on the default stream."""
        hold = Hold(self._count % GATE_SLOTS, secrets.randbits(64) | 1)  # never 0, the cleared word
        self._count += 1
        self._words[hold.word] = 0
        self._args[0].value = self._dev + 8 * hold.word  # the driver copies parameters at launch
        self._args[1].value = hold.token
        d = self._d
        self._check(d.cuLaunchKernel(self._fn, 1, 1, 1, 1, 1, 1, 0, d.CUstream(0), ctypes.addressof(self._params), 0),
                    "cuLaunchKernel(gate)")
        return hold

    def release(self, hold: Hold) -> None:
        self._words[hold.word] = hold.token


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
    """One thing to time: prepare() (not timed: poison outputs, garbage in scratch) then
    run() (timed: for a candidate, the zeroing of its zero-initialised scratch and every
    launch of its manifest)."""

    name: str
    run: Callable[[], object]
    prepare: Callable[[], None] = lambda: None
    finish: Callable[[], None] = lambda: None  # untimed, right after run() (the library: scrub its outputs)
    gated: bool = True  # False once its run() was seen to wait for the GPU: then it cannot be gated
    stalls: int = 0  # consecutive gated runs whose run() took the host the gate's whole limit
    # host clock (perf_counter) when each run's launches were let go (the gate released, or run()
    # returned where ungated): the spacing a kernel sees between its launches, measured
    released: list[float] = field(default_factory=list)
    # for the next cold run only: a context its gated run is made in (a counted run's profiler
    # range, tools.counted), then cleared; and the (start, end) events of the last cold run
    around: Callable[[], object] | None = None
    pad: Callable[[], object] | None = None  # the context of every other cold run, while set (its host cost matched)
    last: tuple | None = None

    def issued(self, host_s: float) -> None:
        """A gated run() took the host `host_s`. One that took the gate's whole limit either
        waited for the GPU (a synchronising library call: it waited for its own gate, which gave
        up) or was slow on the host once (a first call that compiles); two in a row mean the
        former, and the side is issued ungated from then on instead of stalling every run."""
        self.stalls = self.stalls + 1 if host_s >= 0.9 * GATE_LIMIT_S else 0
        if self.stalls >= 2:
            self.gated = False


def gated_run(side: Side, state) -> tuple:
    """run() behind the stream gate, with events around it only (no prepare, no flush, no
    finish): the timed part of a cold run, and all of an executed-check counted run, which
    prepares outside its profiler range. Returns the (start, end) events."""
    gate = getattr(state, "gate", None) if side.gated else None  # None: CPU stand-ins, or no gate on this GPU
    hold = gate.hold() if gate else None
    start, end = state.event(), state.event()
    start.record()
    t0 = time.perf_counter()
    side.run()
    host_s = time.perf_counter() - t0
    end.record()
    if gate:
        gate.release(hold)
        side.issued(host_s)
    side.released.append(time.perf_counter())
    return start, end


def _cold_run(side: Side, state) -> tuple:
    """One cold run: prepare, flush L2, then, behind the gate, events around run() only, then
    finish() (not timed). Returns the (start, end) events."""
    side.prepare()
    state.flusher.flush()
    around, side.around = side.around, None
    around = around or side.pad
    if around is None:
        events = gated_run(side, state)
    else:
        with around():
            events = gated_run(side, state)
    side.finish()
    side.last = events
    return events


def measure(side: Side, state, n: int, limit_s: float) -> list[float]:
    """n cold runs of one side (choosing a baseline backend; no candidate is timed this way)."""
    events = [_cold_run(side, state) for _ in range(n)]
    state.wait(limit_s)
    return [s.elapsed_time(e) for s, e in events]


@dataclass
class PairedTimes:
    candidate_ms: list[float]  # timed pairs only (warm-ups dropped)
    baseline_ms: list[float]  # empty without a baseline
    warmup: int  # pairs run before the timed ones (judged, not timed)
    ungated: tuple[str, ...] = ()  # sides timed with their host time from some run on (their run() waited for the GPU)
    # why the timed pairs ended: "planned" (the drawn count), "interval" (stop_early: tight enough
    # to rank, far from 1) or "cap" (TIMING_CAP_S reached, far from 1); planned is what was drawn
    stop: str = "planned"
    planned: int = 0
    judge_s: float = 0.0  # wall seconds of after_pair (judging each candidate run), inside the loop
    inputs_s: float = 0.0  # wall seconds of before_pair (the pair's fresh inputs generated and loaded)
    runs_s: float = 0.0  # wall seconds of both sides' cold runs, until the GPU was idle (flush, runs, finish)

    @property
    def ratios(self) -> list[float]:
        return [b / c for c, b in zip(self.candidate_ms, self.baseline_ms) if c > 0]


def plan_pairs(pair_wall_s: float, rng, budget_s: float = TIMING_BUDGET_S, lo: int = 10, hi: int = 60) -> int:
    """How many timed pairs: about `budget_s` of wall time, within [lo, hi], plus a random
    extra of up to half that, so no kernel can know which run is the last."""
    n = int(min(hi, max(lo, budget_s / max(pair_wall_s, 1e-4))))
    return n + rng.randint(0, n // 2)


def far_from_one(lo: float, hi: float, band: float = NEAR_BAND) -> bool:
    """The whole interval lies outside [1/band, band]: the kernel is not near the library."""
    return hi < 1 / band or lo > band


def stop_early(ratios: list[float], min_pairs: int, k: float = STOP_K, band: float = NEAR_BAND) -> bool:
    """Whether the timed pairs so far rank the kernel well enough to stop (the rule above
    NEAR_BAND): at least `min_pairs` ratios, the interval outside the band, and its log
    half-width at most k * |ln median|. The interval is bootstrapped with a fixed seed: what the
    rule decides must not depend on the secret draws, only on the times."""
    if len(ratios) < max(2, min_pairs) or not far_from_one(*[statistics.median(ratios)] * 2, band):
        return False  # a median inside the band: so is part of its interval (and no bootstrap is paid)
    lo, hi = median_ci(ratios, _STOP_RNG)
    if not (lo > 0 and far_from_one(lo, hi, band)):
        return False
    return (math.log(hi) - math.log(lo)) / 2 <= k * abs(math.log(statistics.median(ratios)))


class _FixedRandom:
    """median_ci's random source for the stopping rule: the same resamples every time."""

    @staticmethod
    def getrandbits(_: int) -> int:
        return 20261203


_STOP_RNG = _FixedRandom()


def paired(candidate: Side, baseline: Side | None, state, rng, before_pair: Callable[[int, int], None],
           after_pair: Callable[[int, int], None], limit_s: float = 60.0, budget_s: float = TIMING_BUDGET_S,
           cap_s: float = TIMING_CAP_S) -> PairedTimes:
    """paired_steps run to its end in one go (see there)."""
    steps = paired_steps(candidate, baseline, state, rng, before_pair, after_pair, limit_s, budget_s, cap_s)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def paired_steps(candidate: Side, baseline: Side | None, state, rng, before_pair: Callable[[int, int], None],
                 after_pair: Callable[[int, int], None], limit_s: float = 60.0, budget_s: float = TIMING_BUDGET_S,
                 cap_s: float = TIMING_CAP_S, stretches: int = 1, halted: Callable[[], bool] = lambda: False):
    """One pair at a time (a generator: it yields (i, total) before pair i runs, and returns the
    PairedTimes), so a caller can hold the sequence between two pairs and make other runs meanwhile
    (tools.counted: each workload's counted runs inside its timed sequence); time held is not the
    phase's own (the cap). Otherwise as follows.

    `stretches` n (tools.counted: one equal stretch of pairs per hardware pass, every candidate run
    counted in its stretch's pass): the drawn count (warm-ups included) is rounded up to a multiple of
    n, and the stop is decided inside the first stretch only, by the same rule on its own pairs, with
    the cap at cap_s / n (n stretches of as many pairs take about n times the first one's time). A
    stop there after i pairs does not end the sequence: the count becomes n * i, so every stretch
    holds as many pairs as the first ran (the yielded total says so); past the first stretch nothing
    stops early. n = 1: the stop ends the sequence, as it always did.

    `halted()`, asked before each pair: an outside cost bound was reached (tools.counted:
    COUNTED_CAP_S). The sequence then ends there where the cap may end it (a stop already decided,
    or at least MIN_CAP_PAIRS timed pairs far from 1: `cap`); a kernel near the library runs on to
    its planned end, with its precision.

    Time candidate and baseline alternating run by run, each run cold, the order flipped
    every pair, so both sides see the same clocks and temperature (FACTS.md: the A/A noise
    of this estimator is 0.01-0.07%, against 1-1.5% for separately taken medians).

    The drawn count is the most pairs timed; a kernel far from the library stops earlier, once
    its interval ranks it (stop_early) or once the loop has run `cap_s` (at least MIN_CAP_PAIRS
    timed): see NEAR_BAND. With a baseline only: without one there is no speedup to rank.

    before_pair(i, total) loads that pair's fresh inputs (not timed, before any flush);
    after_pair(i, total) judges the candidate's output of pair i (raises to stop). The
    number of warm-up pairs (1-3; none where the first pair is slow, SLOW_PAIR_S) and of timed pairs
    are drawn from `rng`; total is -1 while the count is still unknown (during the first pair)."""
    warmup = rng.randint(1, 3)
    min_stop = rng.randint(*MIN_STOP_PAIRS)
    total = -1
    cand: list[float] = []
    base: list[float] = []
    gated = {s.name for s in (candidate, baseline) if s and s.gated}
    stop, judge_s, inputs_s, runs_s = "planned", 0.0, 0.0, 0.0
    stretches = max(1, int(stretches))
    start = time.perf_counter()
    i = planned = 0
    paused = 0.0  # seconds the caller held the sequence between two pairs: not this phase's time (the cap)
    while total < 0 or i < total:
        t_yield = time.perf_counter()
        yield i, total  # the pair about to run, and the count (-1 until pair 0 has run): the caller may pause here
        paused += time.perf_counter() - t_yield
        if baseline and halted() and (stop != "planned" or _cap_may_stop(_ratios(cand, base))):
            stop = "cap" if stop == "planned" else stop  # pairs 0..i-1 ran; a decided stop keeps its name
            break
        t0 = time.perf_counter()
        before_pair(i, total)
        t_runs = time.perf_counter()
        inputs_s += t_runs - t0
        sides = [candidate] + ([baseline] if baseline else [])
        if i % 2:
            sides.reverse()
        events = {s.name: _cold_run(s, state) for s in sides}
        state.wait(limit_s)
        t1 = time.perf_counter()
        runs_s += t1 - t_runs
        after_pair(i, total)
        judge_s += time.perf_counter() - t1
        if total < 0 and time.perf_counter() - t0 >= SLOW_PAIR_S:
            warmup = 0  # a slow first pair is timed (SLOW_PAIR_S)
        if i >= warmup:
            c = events[candidate.name]
            cand.append(c[0].elapsed_time(c[1]))
            if baseline:
                b = events[baseline.name]
                base.append(b[0].elapsed_time(b[1]))
        if total < 0:
            pair_s = time.perf_counter() - t0
            total = warmup + plan_pairs(pair_s, rng, budget_s)
            total += -total % stretches
            planned = total - warmup
        i += 1
        if baseline and stop == "planned" and i < total // stretches:  # inside the first stretch, before its end
            ratios = _ratios(cand, base)
            if stop_early(ratios, min_stop):
                stop = "interval"
            elif time.perf_counter() - start - paused >= cap_s / stretches and _cap_may_stop(ratios):
                stop = "cap"
            if stop != "planned":
                total = stretches * i  # n = 1: the sequence ends here; else every stretch as many pairs as this one
    ungated = tuple(sorted(s.name for s in (candidate, baseline) if s and s.name in gated and not s.gated))
    return PairedTimes(cand, base, warmup, ungated, stop=stop, planned=planned, judge_s=judge_s, inputs_s=inputs_s,
                       runs_s=runs_s)


def _ratios(cand: list[float], base: list[float]) -> list[float]:
    return [b / c for c, b in zip(cand, base) if c > 0]


def _cap_may_stop(ratios: list[float]) -> bool:
    """Whether a cap may end the timed pairs here: MIN_CAP_PAIRS of them at least, their median and
    its interval outside NEAR_BAND (a kernel near the library is never cut short)."""
    return (len(ratios) >= MIN_CAP_PAIRS and far_from_one(*[statistics.median(ratios)] * 2)
            and far_from_one(*median_ci(ratios, _STOP_RNG)))


def median_ci(ratios: list[float], rng, resamples: int = 2000, level: float = 0.95) -> tuple[float, float]:
    """Bootstrap interval of the median of the per-pair ratios."""
    import numpy as np

    x = np.asarray(ratios, dtype=np.float64)
    if len(x) < 2:
        return (float(x[0]), float(x[0])) if len(x) else (math.nan, math.nan)
    g = np.random.default_rng(rng.getrandbits(63))
    meds = np.median(x[g.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)
