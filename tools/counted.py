"""The counted runs: the executed-instruction check's side of the worker. In process
(tools.cupti): every timed run of the same module instance, each in a CUPTI range of its
stretch's pass (defer_counted, then run_pending's run_counted at the evaluation's credit op); or,
where CUPTI cannot run, in a process of its own under Nsight Compute with --profile-from-start off
(run_credit). The rules that turn the counts into credit are tools.credit's."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from tools.credit import pass_tie_runs, timed_band
from tools.workspace import SAMPLED_ROWS, Failed, Workspace, judge_run, must_restart

CREDIT_RUNS = (1, 8)  # Nsight Compute's process: runs after the seeded checks; one of them, drawn at random, is profiled
CREDIT_LEAD_RUNS = (1, 4)  # in process, where nothing was timed: uncounted runs before the counted ones
COUNTED_RANGE = "counted_run"  # each workload's counted runs are made in the user range counted_run_<k>
RUN_SEP = "#"  # a timed run's range: counted_run_<k>#<its place in its pass's stretch>
# The most pairs a timed phase runs (tools.timing: 1-3 warm-ups, plan_pairs' at most 60 plus up to half
# again): a pass's ranges per workload are at most this over the passes (+2); the profiler is sized so
TIMED_PAIRS_MAX = 3 + 60 + 30
PUSH_POP_S = 0.0008  # CUPTI's own part of a range push, and of its pop, once the GPU has drained: host seconds (H200: 0.6-1.2 ms)
INSTRUMENTED_SLOWDOWN = 50.0  # a SASS-patched pass's run may take this many times a plain run (49x seen: bwd S77)
# The counted runs' wall-time bound per evaluation (issue 43). Before each counted run, the time they
# have taken so far plus what that run may take (its workload's timed median; on a SASS-patched pass
# INSTRUMENTED_SLOWDOWN times that), and before each later stretch of a timed phase the time its first
# stretch took (stretch_over_cap), must stay within it; else no workload is counted, and the
# executed check is skipped with the figures (never passed): a slow kernel's evaluation ends instead of
# running its instrumented pass for minutes. The experts' counted runs take 0.5-1.3 s on the H200.
COUNTED_CAP_S = 30.0
# Where the counted runs' cost goes (run_pending's `cost_parts`, seconds per evaluation; the evaluation's
# ExecutedCheck.phase_s and scripts/bench_cost.py report them): the padding of the timed runs (the GPU idle
# through CUPTI's push and pop around every candidate run, one range a run, and through the library run's
# matched pause: ~2.5 ms a pair with the check's metrics, 1.06 of the GEMM expert's 1.53 s on the H200),
# CUPTI's set-up, decode and disable, its Start and Stop at each pass boundary (the session's first Start,
# ~0.28 s, before the first pair, is most of it), counted runs made outside a timed phase (lead runs, a
# hardware pass whose phase ended early), the SASS-patched pass's runs, the exact-count runs (SASS metrics,
# counter set-up included), the timed phases' results computed at the op (TimedPhase.finish), the kept
# modules and workspaces let go (unload, restore), the host work between a stretch's pairs outside the
# phases' own time, and the rest. A range never spans two runs: the harness's work between them (the
# judge's reference, fresh inputs, the flush) would be counted as the candidate's (docs/METHODOLOGY.md,
# "What a range holds").
COST_PARTS = ("padding", "cupti", "pass_boundaries", "untimed_runs", "instrumented_run", "exact_count_run",
              "phase_finish", "between_pairs", "release", "other")


@dataclass
class Counted:
    """One workload's side of the executed check: what its counted runs need (its module
    instance and workspace, as its timed runs left them: the same code, __device__ state and
    addresses) and what they found (`out`, the WorkloadResult's `credit`)."""
    label: str  # its user range: ours, never a name the candidate chose
    workload: str
    task: object
    axes: dict
    ws: Workspace
    bound: object
    limit: float
    judge: bool
    rng: object  # random.Random from the request's secret credit seed
    lead: int
    out: dict
    profiler: object = None  # tools.cupti.RangeProfiler(replay="user"), the evaluation's metric set
    evaluation: str | None = None
    module: object = None  # kept loaded until the counted runs (deferred), then unloaded
    seconds: float = 0.0  # this workload's own share of the counted runs (prepare, run, judge)
    failed: Failed | None = None  # a counted run answered wrong: the workload fails with it
    timed_ms: float | None = None  # the workload's timed median (None: not timed): what a counted run may take
    released: list = field(default_factory=list)  # host times its counted (and lead) runs were let go
    # Timed at the credit op, its counted runs inside (tools.timed.TimedPhase): the phase, its
    # result (tools.results.WorkloadResult, sent back whole), the paused pair sequence, the pair it
    # holds at ((i, total), None once over) and its PairedTimes
    phase: object = None
    result: object = None
    steps: object = None
    at: tuple | None = None
    times: object = None
    stretch_ends: list | None = None  # the first pair of each next stretch (the pass boundary before it)
    per_pass: int = 0  # ranged runs (pairs) in each hardware pass's stretch: every pass holds as many
    stretch_s: list = field(default_factory=list)  # wall seconds of each stretch it ran (pairs and pauses)
    stretch: int = 0  # the hardware pass whose stretch runs now (its index among the hardware passes)
    slot: int = 0  # the next ranged run's place in that stretch (its range is label#slot)
    pass_ranged: object = None  # that pass's `ranged` while its stretch runs (None outside)
    phase_ran: bool = False  # its phase ran in the session (its candidate runs ranged)
    timed_s: float = 0.0  # its timed phase's own seconds
    pad_s: float = 0.0  # of which the pauses the check adds (ranges' push and pop, the library's match) the GPU waited for
    pad_hidden_s: float = 0.0  # and the padding it did not wait for: spent while it ran earlier work (no one's cost)
    finish_s: float = 0.0  # its phase's result computed at the op (TimedPhase.finish): the check's cost


def defer_counted(state, req: dict, task, axes: dict, ws: Workspace, bound, result, limit: float,
                  judge: bool, phase=None) -> bool:
    """The executed check for this workload, in this worker and module instance: counted runs
    made at the evaluation's credit op (run_pending, run_counted), inside the workload's timed
    sequence where it carries one (`phase`), else after its runs. The workload's module and
    workspace are kept until then, and every
    workload's counted runs run in one profiler session (CUPTI's first start and its SASS patching
    paid once per evaluation, not per workload). Fills result.credit ("pending" until the credit
    op); a CUPTI failure is reported there ("unavailable" or a reason), never as the candidate's
    fault.

    `phase` (tools.timed.TimedPhase, not yet run): the workload's timed runs wait for the credit op
    too, and its hardware passes' counted runs are timed runs of it (run_counted). Returns whether
    the workload was kept (False where the counters are unavailable: then time it now)."""
    import random

    from tools.cupti import CuptiError

    spec = req["credit"]
    rng = random.Random(int(spec["seed"]))
    # where the workload is timed and judged, its counted runs are timed runs (their places are
    # drawn at the credit op); where not, 1-4 uncounted runs come first, so the counted ones never
    # start at a place the kernel can count to
    lead = 0 if (judge and req.get("time")) else rng.randint(*CREDIT_LEAD_RUNS)
    out: dict = {"status": "failed", "reason": None, "runs": 0, "lead_runs": lead, "passes": None,
                 "counted_from": None, "run_ms": [], "instrumented_ms": [], "profile_s": None, "launches": []}
    result.credit = out
    try:
        if not hasattr(state, "counters"):
            raise CuptiError("this worker has no hardware counters")
        profiler = state.counters(tuple(spec["metrics"]))
    except CuptiError as exc:
        out["status"], out["reason"] = "unavailable", str(exc)
        return False
    out["passes"], out["runs"], out["counted_from"] = profiler.passes, lead + profiler.passes, lead + 1
    entry = Counted(label=f"{COUNTED_RANGE}_{len(state.pending)}", workload=req["workload"]["name"], task=task,
                    axes=axes, ws=ws, bound=bound, limit=limit, judge=judge, rng=rng, lead=lead, out=out,
                    profiler=profiler, evaluation=spec.get("evaluation"), module=state.keep_module(),
                    phase=phase, result=result if phase else None,
                    timed_ms=result.timing.median_ms if result.timing else None)
    out["status"], out["reason"] = "pending", "its counted runs wait for the evaluation's credit op"
    state.pending.append(entry)
    return True


def launch_gaps(timed: list[float], counted: list[float], boundary: list[float] = ()) -> dict:
    """The spacing a kernel sees between its launches (host seconds at which each run was let go,
    tools.timing.Side.released), timed runs against runs counted outside the timed sequence, in ms.
    Every timed run of a counted phase is itself counted (run_counted), so `counted` holds the runs
    after the timed ones only (an exact-count run, a SASS-patched pass's, an untimed workload's).

    `boundary`: the timed runs that follow a pass boundary (the first pair of each later stretch:
    CUPTI's Stop and Start and the other workloads' stretches lie before them): their gaps are
    reported apart and left out of the `ordinary` pool a counted gap is compared with. At S=8192 a
    phase has 10-14 pairs and three boundaries, so the median of every timed gap (`timed_median`)
    sits among the long ones; the ordinary median is the one to compare.

    Returns: `timed_median`, `timed_max` (every timed gap), `ordinary_median`, `boundary` (those
    gaps), `counted` (the gap before each counted run, from the run before it, timed or counted),
    `counted_rank` (each counted gap's mid-rank among the ordinary gaps, in [0, 1]) and
    `counted_beyond_timed` (counted gaps longer than every timed gap: the runs a kernel that
    switches path after an unusually long pause would single out). Empty lists (None) where a side
    has no runs (untimed evaluations: no timed gaps)."""
    import statistics

    counted_set, boundary_set = set(counted), set(boundary)
    runs = sorted(set(timed) | counted_set)  # counted runs may sit among the timed ones, or after them
    gap_before = {b: (b - a) * 1e3 for a, b in zip(runs, runs[1:])}
    timed_gaps = [g for t, g in gap_before.items() if t not in counted_set]
    ordinary = sorted(g for t, g in gap_before.items() if t not in counted_set and t not in boundary_set)
    counted_gaps = [gap_before[c] for c in sorted(counted_set) if c in gap_before]
    top = max(timed_gaps, default=None)

    def rank(g: float) -> float | None:
        if not ordinary:
            return None
        below = sum(x < g for x in ordinary)
        return round((below + 0.5 * sum(x == g for x in ordinary)) / len(ordinary), 4)

    return {"timed_median": round(statistics.median(timed_gaps), 3) if timed_gaps else None,
            "timed_max": round(top, 3) if top is not None else None,
            "ordinary_median": round(statistics.median(ordinary), 3) if ordinary else None,
            "ordinary_runs": len(ordinary),
            "boundary": [round(gap_before[t], 3) for t in sorted(boundary_set) if t in gap_before and t not in counted_set],
            "counted": [round(g, 3) for g in counted_gaps],
            "counted_rank": [rank(g) for g in counted_gaps],
            "counted_beyond_timed": sum(g > top for g in counted_gaps) if top is not None else None}


def over_cap(workload: str, i: int, timed_ms: float | None, run_ms: list[float], spent_s: float,
             instrumented: bool) -> str | None:
    """Why the counted run of pass `i` (0-based) may not start: it could end past COUNTED_CAP_S, with
    `spent_s` gone already and the run taking its workload's timed median (where not timed: the
    slowest counted run so far), INSTRUMENTED_SLOWDOWN times that on a SASS-patched pass. None: it fits."""
    plain_ms = timed_ms if timed_ms is not None else max(run_ms, default=0.0)
    may_s = plain_ms / 1e3 * (INSTRUMENTED_SLOWDOWN if instrumented else 1.0)
    if spent_s + may_s <= COUNTED_CAP_S:
        return None
    return (f"not counted: the counted runs would pass their {COUNTED_CAP_S:.0f} s cap ({spent_s:.1f} s "
            f"spent; {workload}'s run of pass {i + 1} may take {may_s:.1f} s"
            + (f", {INSTRUMENTED_SLOWDOWN:.0f}x its {plain_ms:.1f} ms, SASS-patched)" if instrumented else ")"))


def stretch_over_cap(workload: str, i: int, pairs: int, first_s: float, spent_s: float) -> str | None:
    """Why the timed stretch of pass `i` (0-based, a later one) may not start: it could end past
    COUNTED_CAP_S, with `spent_s` gone already and the stretch taking what the first pass's stretch of
    as many `pairs` took (`first_s`). None: it fits."""
    if spent_s + first_s <= COUNTED_CAP_S:
        return None
    return (f"not counted: the counted runs would pass their {COUNTED_CAP_S:.0f} s cap ({spent_s:.1f} s spent; "
            f"{workload}'s {pairs} timed pairs of pass {i + 1} may take {first_s:.1f} s, as its first pass's did)")


def workload_ranges(launches: list, label: str, timed: bool) -> list:
    """The ranges CUPTI returned for one workload: its timed runs' `label#j` (one per place j in a
    pass's stretch: `timed`), else its counted runs' range `label` (counted after its runs)."""
    return [x for x in launches if (x.name.startswith(label + RUN_SEP) if timed else x.name == label)]


def _finite(v) -> bool:
    import math

    return isinstance(v, (int, float)) and math.isfinite(v)


def mean_counts(ranges: list) -> dict[str, float]:
    """Each metric's mean over a workload's ranges: every pass holds the same ranges, one run each,
    so a metric (read in one pass) is the sum over that pass's runs divided by their number: the
    counts of the average timed run, every one of them in the sum. A metric some range has no
    finite value for is NaN (not measured: it never passes a share test)."""
    import math

    out: dict[str, float] = {}
    for m in dict.fromkeys(k for x in ranges for k in x.metrics):
        vals = [x.metrics.get(m) for x in ranges]
        ok = all(_finite(v) for v in vals)
        out[m] = sum(vals) / len(vals) if ok else math.nan
    return out


def pass_bands(pass_ms: list[list[float]]) -> list[list[float]]:
    """For each hardware pass, the band its runs are tied to (tools.credit.tie_to_timed_run): the
    range of the other passes' runs (tools.credit.timed_band), [] where they are too few. Given the
    runs the tie uses (tools.credit.pass_tie_runs: those first in their pair)."""
    flat = [[ms, None] for runs in pass_ms for ms in runs]
    out, start = [], 0
    for runs in pass_ms:
        band = timed_band(flat, 0, list(range(start, start + len(runs))))
        out.append(band or [])
        start += len(runs)
    return out


def cupti_ranges() -> int:
    from tools.cupti import MAX_RANGES

    return MAX_RANGES


def stretch_boundaries(e: "Counted") -> list[float]:
    """The release times of e's timed runs that follow a pass boundary (see launch_gaps): the first
    pair of each stretch after the first (the candidate side makes one run a pair, so a pair's
    index is its run's index in `released`)."""
    if e.phase is None or not e.stretch_ends:
        return []
    released = e.phase.candidate.released
    return [released[j] for j in e.stretch_ends[:-1] if j < len(released)]


class _NothingLeft(Exception):
    """Every workload of the counted runs has answered wrong: the passes stop."""


class _OverCap(Exception):
    """The next counted run could end past COUNTED_CAP_S: the passes stop, nothing is counted."""


def run_counted(state, entries: list[Counted], sites: dict[str, dict[int, str]] | None = None) -> dict[str, float]:
    """The counted runs of `entries`, all in one session of CUPTI's user replay.

    A workload that carries its timed phase (`phase`) is timed here, inside the session, and EVERY
    candidate run of it is counted: its pairs are split into one equal stretch per hardware pass
    (the pair count rounded up to a multiple of the passes; a stop is decided inside stretch 0, on its
    pairs, and every later stretch then gets as many: timed_stretch),
    and every candidate run of stretch k is made in a range of pass k's counter configuration, one
    range per place in the stretch (`label#j`, the same names each pass). A metric is read in one
    pass, so its count is the sum over that pass's runs; divided by their number (mean_counts) it is
    the average timed run's. The counted runs are the timed runs: no run is chosen, padded or set
    apart, and nothing a kernel sees (the pause before a run, its place, the time of day) can make
    the counts describe other runs than those whose median is reported. The library's run of each
    pair gets the same pause as a ranged run (matched_pause), so both sides of a pair see the same
    host gap. Each pass's runs are then tied, by their median, to the range of the other passes'
    runs (`pass_ms`, `pass_band_ms`; tools.credit.tie_to_timed_run): a kernel that took another path
    in one pass (it can count the pass boundaries' long pauses) must take it at the other path's
    speed. Only a SASS-patched pass (none in the check's metric set) runs after the timed runs.

    A workload not timed here (`phase` None): one counted run per pass after its 1-4 lead runs, in
    its range `label`, prepared, timed and judged as a timed run is (fresh inputs from the secret
    credit seed, outputs poisoned, L2 flushed, scratch zeroed, behind the stream gate); the hardware
    passes' times (`run_ms`) tied to the timed median where there is one; the SASS-patched pass's
    recorded (`instrumented_ms`), never tied. Every run is judged (`judge`): credit is only taken on
    right answers, and a wrong one is the workload's failure (`failed`). `sites`: instructions whose
    executions are counted one by one after the passes (exact_counts). A hang or a dead context
    raises (fatal); a CUPTI failure is every entry's `reason`; a counted run that could pass
    COUNTED_CAP_S skips the check (never passed).

    Returns where the check's own time went (COST_PARTS, seconds; run_pending adds release and other)."""
    from tasks.generators import generate_inputs
    from tasks.sampled import has_sampler, rows_for
    from tools.cupti import CuptiError
    from tools.launch import CudaError
    from tools.timing import KernelTimeout, Side, gated_run

    profiler = entries[0].profiler  # one evaluation, one metric set
    for e in entries:
        e.out["status"], e.out["reason"] = "failed", None  # "ran" once CUPTI's counts are in
    instrumented = set(getattr(profiler, "instrumented_passes", ()))
    clock = time.perf_counter
    spent = dict.fromkeys(COST_PARTS, 0.0)

    def prepare(e: Counted, seed: int) -> None:
        e.ws.load_inputs(generate_inputs(e.task, e.axes, seed, device=state.device, fast=True))
        e.ws.prepare()
        state.flusher.flush()

    def side(e: Counted, gated: bool = True) -> Side:
        return Side("candidate", lambda: (e.ws.zero_scratch(), e.bound.launch()), gated=gated,
                    released=e.released)  # the counted runs' spacing, recorded as the timed runs' is

    began = clock()

    def within_cap(e: Counted, i: int) -> None:
        """Raises _OverCap where e's run of pass i could end past COUNTED_CAP_S."""
        why = over_cap(e.workload, i, e.timed_ms, e.out["run_ms"], clock() - began, i in instrumented)
        if why:
            raise _OverCap(why)

    for e in entries:  # uncounted runs first, where the workload was not timed and judged
        t0 = clock()
        for _ in range(e.lead):
            prepare(e, e.rng.getrandbits(31))
            gated_run(side(e), state)
            state.wait(e.limit)
        spent["untimed_runs"] += clock() - t0

    hardware = [i for i in range(profiler.passes) if i not in instrumented]
    # CUPTI's range push and pop each first wait for the GPU to run everything queued (H200,
    # 2026-12-03: push 0.7-68 ms, pop 0.7-38 ms, growing with what was queued before them), then do
    # CUPTI's own work (0.6-1 ms with the check's metric set, and as much with any one of its instruction
    # counters alone: scripts/probe_range_cost.py --each, 2026-12-04). Every
    # candidate run of a counted timed phase is ranged (ranged_run); the library's run beside it
    # waits as long (matched_pause: a drain, then CUPTI's own part as last measured on a ranged run,
    # the H200's until the first), so both sides of every pair see the same pause before and after
    # their run, and the speedup compares kernels, not a pause one side got alone.
    cost = {"push": PUSH_POP_S, "pop": PUSH_POP_S}

    def busy() -> bool:
        """Whether the GPU still has work queued on the runs' stream (a host query, no stream op)."""
        query = getattr(state, "stream_busy", None)
        return bool(query()) if query is not None else False

    def spin(seconds: float) -> float:
        """Wait `seconds` on the host; returns how much of it the GPU sat idle (the check's cost): a
        wait that ends while the GPU still runs what came before it (the inputs and the L2 flush
        before the launch, the run itself after it) delays neither the run nor the next host step,
        which would have waited for the GPU anyway (up to the tens of µs the host takes to issue)."""
        t0 = clock()
        end, idle_from = t0 + seconds, None
        while (now := clock()) < end:
            if idle_from is None and not busy():  # a host query: the kernel cannot see it
                idle_from = now
        return 0.0 if idle_from is None else end - idle_from

    def drain(e: Counted) -> None:
        """Wait until the GPU has run everything queued (a host query, polled: nothing is
        enqueued), as CUPTI's push and pop do first; KernelTimeout past the workload's limit."""
        end = clock() + e.limit
        while busy():
            if clock() > end:
                raise KernelTimeout(f"the GPU did not finish within {e.limit:.0f} s")

    def ranged_run(e: Counted):
        """e's candidate side's context for every run of its timed phase in the session: the run in a
        range of the current pass, named for its place in the pass's stretch (`#j`: the same names in
        every pass, so CUPTI matches each range across the passes), the drain before push and pop."""
        @contextlib.contextmanager
        def ranged():
            name = f"{e.label}{RUN_SEP}{e.slot}"
            e.slot += 1
            drain(e)
            t0 = clock()
            with e.pass_ranged(name):
                cost["push"] = clock() - t0
                yield
                drain(e)
                t1 = clock()
            cost["pop"] = clock() - t1
            e.pad_s += cost["push"] + cost["pop"]  # the GPU sat idle through both: the check's cost
            pp = e.out.setdefault("push_pop_ms", [])
            pp.append([round(cost["push"] * 1e3, 4), round(cost["pop"] * 1e3, 4)])
        return ranged

    def matched_pause(e: Counted):
        """The library side's context for every run of e's phase in the session: the pause a ranged
        candidate run gets (a drain, then CUPTI's own push; the run; a drain, CUPTI's own pop)."""
        @contextlib.contextmanager
        def padded():
            push, pop = cost["push"], cost["pop"]
            drain(e)
            idle = spin(push)
            yield
            drain(e)
            idle += spin(pop)
            e.pad_s += idle  # only what the GPU waited for is the check's cost (`pad_s`)
            e.pad_hidden_s += push + pop - idle
            e.out["padded_runs"] = e.out.get("padded_runs", 0) + 1
        return padded

    def counted_run(e: Counted, k: int, patched: bool, around, part: str | None = None) -> object:
        """e's counted run k (0-based, after its lead runs): prepared, run inside `around` (a function
        that calls its argument under the profiler and returns what the profiler gives back), timed
        and judged; its seconds go to `part` of the cost (by default the instrumented or an untimed
        hardware pass's). Returns what `around` returned."""
        t0 = clock()
        seed = e.rng.getrandbits(31)
        prepare(e, seed)
        t1 = clock()
        slow = INSTRUMENTED_SLOWDOWN * max(e.out["run_ms"], default=0.0) / 1e3 if patched else 0.0
        times: list = []
        try:
            # A SASS-patched run is ungated: CUPTI patches a kernel at its first launch there,
            # blocking the host until the stream drains, while the gate holds the stream until its
            # limit (0.2 s a workload, measured on the GEMM expert). Its time is recorded, never
            # tied, so the gate buys it nothing.
            got = around(lambda: times.append(gated_run(side(e, gated=not patched), state)),
                         lambda: state.wait(e.limit + slow))
        except (KernelTimeout, CudaError) as exc:  # fatal: the workload whose run it was is named
            why = f"{exc.name} ({exc.what})" if isinstance(exc, CudaError) else str(exc)
            e.failed = Failed("timeout" if isinstance(exc, KernelTimeout) else "cuda_error",
                              f"the executed check's counted run {e.lead + k + 1}: {why}", fatal=True)
            raise
        t2 = clock()
        start, end = times[0]
        (e.out["instrumented_ms"] if patched else e.out["run_ms"]).append(round(start.elapsed_time(end), 5))
        if e.judge and e.failed is None:
            rows = max(SAMPLED_ROWS, rows_for(e.task))
            try:
                judge_run(e.task, e.axes, e.ws, seed, e.rng, state.device, rows, not has_sampler(e.task), what=(
                    f"the executed check's counted run {e.lead + k + 1} (after the timed runs)"))
            except Failed as f:  # the workload fails; the passes go on while another one is counted
                e.failed = f
        e.seconds += clock() - t0
        spent[part or ("instrumented_run" if patched else "untimed_runs")] += clock() - t0
        # where a counted run's cost goes: prepare (inputs, poison, flush), run (range, gate, wait), judge
        e.out.setdefault("pass_s", []).append([round(t1 - t0, 4), round(t2 - t1, 4), round(clock() - t2, 4)])
        return got

    def run_pass(i: int, ranged) -> None:
        for e in entries:
            if e.phase is not None and i in hardware:
                k = hardware.index(i)
                if k > 0 and e.stretch_s and e.at is not None:  # a later stretch: as long as the first one
                    why = stretch_over_cap(e.workload, i, e.per_pass, e.stretch_s[0], clock() - began)
                    if why:
                        raise _OverCap(why)
                t0, own = clock(), e.phase.seconds
                timed_stretch(e, k, len(hardware), ranged)
                e.stretch_s.append(clock() - t0)
                # the stretch's wall time outside its phase's own (the pairs, the pauses included)
                spent["between_pairs"] += max(0.0, clock() - t0 - (e.phase.seconds - own))
                if all(x.failed is not None for x in entries):
                    raise _NothingLeft
                continue
            if e.phase is not None and e.failed is not None:
                continue  # (an instrumented pass after a failed phase: nothing to count)
            within_cap(e, i)

            def around(run, wait, e=e):
                with ranged(e.label):
                    run()
                wait()
            counted_run(e, i, i in instrumented, around)
            if all(x.failed is not None for x in entries):
                raise _NothingLeft

    def ran_pair(e: Counted) -> None:
        """Each pair's candidate and library times (ms), in pair order (`pair_ms`; warm-up pairs
        included), and in the session each candidate run's time by pass (`pass_ms`): every one a
        ranged run, tied pass by pass to the runs of the other passes (tools.credit)."""
        def ms(events):
            return round(events[0].elapsed_time(events[1]), 5) if events else None
        if len(e.out.get("pair_ms", ())) >= len(e.phase.candidate.released):
            return  # no pair ran since the last one recorded (a halted phase ends before its next pair)
        library = e.phase.baseline
        cand = ms(e.phase.candidate.last)
        e.out.setdefault("pair_ms", []).append([cand, ms(library.last) if library else None])
        if e.pass_ranged is not None and cand is not None:
            e.out["pass_ms"][e.stretch].append(cand)
            e.out["run_ms"].append(cand)
            if (len(e.out["pair_ms"]) - 1) % 2 == 0:  # the candidate ran first in this pair (paired_steps' order)
                e.out["pass_first_ms"][e.stretch].append(cand)

    def advance(e: Counted) -> None:
        """Run the pair the phase holds at, then hold at the next (None once the phase is over)."""
        try:
            e.at = next(e.steps)
            ran_pair(e)
        except StopIteration as done:
            e.times, e.at = done.value, None
            ran_pair(e)
        except (KernelTimeout, CudaError) as exc:  # fatal: the workload whose run it was is named
            why = f"{exc.name} ({exc.what})" if isinstance(exc, CudaError) else str(exc)
            e.failed = Failed("timeout" if isinstance(exc, KernelTimeout) else "cuda_error",
                              f"timed-phase run (in the executed check's session): {why}", fatal=True)
            e.at = None
            raise
        except Failed as f:  # wrong in a timed run (or implausible): the workload fails
            e.failed, e.at = f, None

    def plan_stretches(e: Counted, n: int) -> None:
        """Each stretch's length from the pair count the phase holds at (e.at's total, a multiple of n)."""
        e.per_pass = e.at[1] // n
        e.stretch_ends = [e.per_pass * (j + 1) for j in range(n)]
        e.out["stretch_ends"] = list(e.stretch_ends)

    def timed_stretch(e: Counted, k: int, n: int, ranged) -> None:
        """Stretch k of n of e's timed pairs, every candidate run in a range of this pass (the
        stretches ARE the hardware passes): pair 0 starts stretch 0; once it has run, the pair count
        (drawn, rounded up to a multiple of n: count_every_pair) sets each stretch's length. The stop
        (interval or cap) is decided inside stretch 0, on its pairs: where it stops after m pairs, the
        count becomes n * m, and every later stretch gets m pairs too (tools.timing.paired_steps'
        `stretches`). Where the phase ended early (a wrong or failed run) the stretch's remaining
        ranges are pushed empty, so every pass holds the same ranges (the workload fails; its counts
        are never read)."""
        e.pass_ranged, e.slot, e.stretch, e.phase_ran = ranged, 0, k, True
        if e.steps is None:
            e.out["pass_ms"], e.out["pass_first_ms"] = [[] for _ in range(n)], [[] for _ in range(n)]
            e.phase.count_every_pair(n)
            e.phase.candidate.pad = ranged_run(e)
            if e.phase.baseline is not None:
                e.phase.baseline.pad = matched_pause(e)
            e.steps = e.phase.steps()
            e.at = next(e.steps)  # (0, -1): held before pair 0, which follows the seeded checks
            advance(e)
            if e.at is not None:
                plan_stretches(e, n)
            else:
                e.per_pass = e.slot
        while e.at is not None and e.at[0] < e.stretch_ends[k]:
            advance(e)
            if k == 0 and e.at is not None and e.at[1] != e.per_pass * n:  # the stop, decided in this stretch
                plan_stretches(e, n)
        if n == 1 and e.times is not None:  # one pass: a stop ended the sequence inside it
            e.per_pass, e.stretch_ends = e.slot, [e.slot]
            e.out["stretch_ends"] = [e.slot]
        while e.slot < e.per_pass:  # the phase ended early: the pass's other ranges, empty
            with ranged(f"{e.label}{RUN_SEP}{e.slot}"):
                pass
            e.slot += 1
        e.pass_ranged = None
        e.out["ranged_runs"] = e.per_pass

    def finish(e: Counted, halt: bool = False) -> None:
        """The phase's pairs not run yet, uncounted (the session ended early), then its result.
        `halt` (the session ended at COUNTED_CAP_S): a phase it had started ends before its next pair
        where the cap may end it (TimedPhase.halt: its stop decided, or far from 1), so the bound
        holds the timed pairs too; a kernel near the library runs on to its planned end."""
        if e.phase is None or e.failed is not None and e.failed.fatal:
            return
        e.phase.candidate.pad = None  # the session is over: nothing ranged, nothing to match
        if e.phase.baseline is not None:
            e.phase.baseline.pad = None
        if halt and e.steps is not None:
            e.phase.halt()
        if e.steps is None:
            e.steps = e.phase.steps()
            e.at = next(e.steps)
        while e.at is not None:
            advance(e)
        if e.failed is None and e.times is not None:
            t0 = clock()
            try:
                e.phase.finish(e.times)
            except Failed as f:
                e.failed = f
            e.finish_s += clock() - t0

    t0 = clock()
    try:
        capacity = sum(1 if e.phase is None else TIMED_PAIRS_MAX // max(1, len(hardware)) + 2 for e in entries)
        launches = profiler.profile_passes(run_pass, entries[0].label, max_ranges=max(cupti_ranges(), capacity))
    except CuptiError as exc:
        for e in entries:
            e.out["reason"] = str(exc)[:400]
            finish(e)
        return spent
    except _NothingLeft:
        for e in entries:
            e.out["reason"] = "not counted: its counted run answered wrong"
            finish(e)
        return spent
    except _OverCap as exc:  # a cost bound, not the candidate's fault: skipped, never passed
        for e in entries:
            e.out["status"], e.out["reason"] = "skipped", str(exc)
            finish(e, halt=True)
        return spent
    finally:
        total = round(clock() - t0, 4)
        parts = {k: round(v, 4) for k, v in (getattr(profiler, "last_phase_s", None) or {}).items()}
        stops = list(getattr(profiler, "last_stops", None) or [])  # CUPTI's own pass bookkeeping, recorded
        bounds = [list(x) for x in (getattr(profiler, "last_pass_s", None) or [])]  # each pass's Start, Stop
        spent["cupti"] += sum(parts.get(k, 0.0) for k in ("setup", "decode", "disable"))
        spent["pass_boundaries"] += sum(sum(x) for x in bounds)
        for e in entries:
            e.out.update(profile_s=total, profile_phase_s=parts, stops=stops, workloads_counted=len(entries),
                         pass_start_stop_s=[[round(a, 4), round(b, 4)] for a, b in bounds],
                         own_s=round(e.seconds, 4),
                         gaps_ms=launch_gaps(e.phase.candidate.released if e.phase else [], e.released,
                                             stretch_boundaries(e)))
    for e in entries:
        finish(e)
        runs = workload_ranges(launches, e.label, e.phase_ran)
        want = e.per_pass if e.phase_ran else 1
        if not runs or len(runs) != want:
            e.out["reason"] = (f"CUPTI returned {len(runs)} ranges of {e.label!r} where {want} were pushed a pass "
                               f"(it returned {sorted({x.name for x in launches})[:8]})")[:400]
            continue
        e.out["status"] = "ran"
        metrics = mean_counts(runs)
        if e.phase_ran:  # a SASS-patched pass's metrics (its one run after the timed ones, range `label`)
            for x in workload_ranges(launches, e.label, False):
                metrics.update({m: v for m, v in x.metrics.items() if not _finite(metrics.get(m))})
        e.out["launches"] = [{"name": e.label, "metrics": metrics}]
        if e.phase_ran:  # every timed run counted: the runs are the ranged ones (and any SASS-patched one)
            e.out["runs"] = len(e.out["run_ms"]) + len(e.out["instrumented_ms"])
    if sites:
        exact_counts(state, [e for e in entries if e.out["status"] == "ran" and e.failed is None], sites, counted_run,
                     int(getattr(profiler, "passes", 0)), spent)
    return spent


def exact_counts(state, entries: list[Counted], sites: dict[str, dict[int, str]], counted_run, k: int,
                 spent: dict[str, float] | None = None) -> None:
    """Issue 42, item 4: the executions of each instruction at `sites` (tools.credit.exact_count_sites:
    every TMA-pipe instruction of the launched kernels, where a plain bulk load may run beside
    tensor-map loads, which no hardware counter tells apart), on one more counted run per workload
    under CUPTI's SASS metrics (tools.cupti.SassCounter: instrumented code, like the SASS-patched
    pass: ungated, timed and never tied, judged). Each workload's launch gets `opcodes` (full opcode
    -> warp-level executions) or, where a site had no record or CUPTI refused, `opcodes_missing`:
    then the module's SASS decides, and it holds a bulk load (refused). tools.credit ties the sum
    to the hardware passes' TMA instruction count. `spent`: the cost parts (counted_run adds each
    run; the counter's set-up is added here)."""
    from tools.cupti import CuptiError, opcode_counts

    if not entries:
        return
    t0 = time.perf_counter()
    try:
        counter = state.sass_counter()
    except CuptiError as exc:
        for e in entries:
            e.out["launches"][0]["opcodes_missing"] = [f"CUPTI: {exc}"[:300]]
        return
    finally:
        if spent is not None:
            spent["exact_count_run"] += time.perf_counter() - t0
    for e in entries:
        def around(run, wait):
            return counter.collect(lambda: (run(), wait()))
        try:
            records = counted_run(e, k, True, around, "exact_count_run")
        except CuptiError as exc:  # (a hang or a dead context propagates: fatal, as in the passes)
            e.out["launches"][0]["opcodes_missing"] = [f"CUPTI: {exc}"[:300]]
            continue
        counts, missing = opcode_counts(records, sites)
        e.out["launches"][0]["opcodes"] = counts
        if missing:
            e.out["launches"][0]["opcodes_missing"] = missing[:20]
        e.out["exact_runs"] = e.out.get("exact_runs", 0) + 1
        e.out["runs"] = e.out.get("runs", 0) + 1
        e.out["own_s"] = round(e.seconds, 4)  # its share of the counted runs, this run included


def run_pending(state, sites: dict | None = None, count: bool = True) -> tuple[dict, bool]:
    """The evaluation's credit op: every deferred workload's counted runs (run_counted) in one
    profiler session, the timed phases they carry with them. Returns (reply, fatal): reply has
    `credits` (workload -> its credit dict), `failed` (workload -> reason, detail, outputs: a
    counted or timed run answered wrong, or hung), `results` (workload -> its whole
    WorkloadResult, for the workloads timed here), `timed_s` (the timed phases' own seconds) and
    `seconds`, and `cost_parts` (COST_PARTS: where the op's time beyond `timed_s` went; `other` is
    what no part names). `sites` (the op's sass_sites, pc offsets as strings in JSON): the
    instructions counted one by one (exact_counts). count=False (the SASS made the counts needless):
    the timed phases only, nothing counted."""
    from tools.launch import CudaError
    from tools.timing import KernelTimeout

    entries, state.pending = state.pending, []
    reply: dict = {"op": "credits", "credits": {}, "failed": {}, "results": {}}
    fatal = False
    t0 = time.perf_counter()
    spent = dict.fromkeys(COST_PARTS, 0.0)
    try:
        if entries and count:
            spent = run_counted(state, entries, {fn: {int(off): op for off, op in at.items()}
                                                 for fn, at in sites.items()} if sites else None) or spent
        elif entries:
            time_uncounted(state, entries)
    except (KernelTimeout, CudaError):  # run_counted named the workload whose run it was
        fatal = True
        culprit = next((e.workload for e in entries if e.failed is not None and e.failed.fatal), "a workload")
        for e in entries:
            e.out["status"] = "failed"
            e.out["reason"] = e.out["reason"] or f"not counted: {culprit}'s run ended the session"
    finally:
        t1 = time.perf_counter()
        for e in entries:  # the kept modules and workspaces go now (the context may be dead: best effort)
            if e.module is not None and not fatal:
                with contextlib.suppress(Exception):
                    e.module.unload()
            e.module = e.ws = e.bound = None
            if e.phase is not None:  # its library goes too (the results are taken from e.result)
                e.timed_s, e.phase = e.phase.seconds - e.pad_s, None
            if e.out.get("padded_runs"):
                e.out["padding_s"] = [round(e.pad_s, 4), round(e.pad_hidden_s, 4)]  # waited for, hidden
        spent["release"] += time.perf_counter() - t1
    for e in entries:
        if e.out.get("pass_ms") and e.times is not None:  # each pass's runs, tied to the other passes' (tools.credit)
            e.out["pass_band_ms"] = pass_bands(pass_tie_runs(e.out["pass_ms"], e.out.get("pass_first_ms")))
        reply["credits"][e.workload] = e.out
        if e.failed is not None:
            reply["failed"][e.workload] = {"reason": e.failed.reason, "detail": e.failed.detail, "outputs": [
                m.model_dump(mode="json") for m in e.failed.outputs]}
        if e.result is not None:
            if e.failed is not None:
                e.result.status, e.result.reason, e.result.detail = "failed", e.failed.reason, e.failed.detail
                e.result.outputs = e.failed.outputs or e.result.outputs
            elif e.times is None:  # the phase never ran to its end (the session ended it)
                e.result.status, e.result.reason = "failed", "harness_error"
                e.result.detail = f"the timed runs did not finish in the executed check's session: {e.out.get('reason')}"
            e.result.credit = e.out
            reply["results"][e.workload] = e.result.model_dump(mode="json")
    for e in entries:
        spent["padding"] += e.pad_s
        spent["phase_finish"] += e.finish_s
    reply["timed_s"] = sum(e.timed_s for e in entries)
    t1 = time.perf_counter()
    fatal = fatal or must_restart(state, "the counted runs")
    spent["release"] += time.perf_counter() - t1
    reply["seconds"] = time.perf_counter() - t0
    reply["cost_parts"] = cost_parts(spent, reply["seconds"], reply["timed_s"])
    return reply, fatal


def cost_parts(spent: dict[str, float], seconds: float, timed_s: float) -> dict[str, float]:
    """The credit op's `cost_parts`: each part's seconds (COST_PARTS), and as `other` what the op's
    `seconds` hold beyond the timed phases' own `timed_s` and every named part (never below 0)."""
    other = max(0.0, seconds - timed_s - sum(v for k, v in spent.items() if k != "other"))
    return {k: round(v, 4) for k, v in {**spent, "other": other}.items()}


def time_uncounted(state, entries: list[Counted]) -> None:
    """The timed phases the entries carry, run to their end with nothing counted (the credit op
    where the SASS already decided the check); a wrong or implausible run fails its workload."""
    from tools.launch import CudaError
    from tools.timing import KernelTimeout

    for e in entries:
        e.out["status"], e.out["reason"] = "skipped", "not counted: the SASS decided the check"
        if e.phase is None:
            continue
        try:
            e.times = _drain(e.phase.steps())
            e.phase.finish(e.times)
        except Failed as f:
            e.failed = f
        except (KernelTimeout, CudaError) as exc:
            why = f"{exc.name} ({exc.what})" if isinstance(exc, CudaError) else str(exc)
            e.failed = Failed("timeout" if isinstance(exc, KernelTimeout) else "cuda_error", f"timed-phase run: {why}",
                              fatal=True)
            raise


def _drain(steps):
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _prepared_runs(state, task, axes: dict, ws: Workspace, bound, seeds: list[int], limit: float, at: int,
                   counted) -> None:
    """One run per seed, on inputs generated from it and prepared as a timed run's are (outputs
    poisoned or filled with garbage by a secret coin, garbage scratch, L2 flushed, zeroed scratch
    reset on the stream before the launches); run `at` is made through `counted(run)` (under a profiler, and whatever it checks
    before the next run overwrites the outputs). Every seed uses the fast generator, as the
    seeded checks and the timed runs do."""
    from tasks.generators import generate_inputs

    def run() -> None:
        bound.launch()
        state.wait(limit)

    for i, seed in enumerate(seeds):
        ws.load_inputs(generate_inputs(task, axes, seed, device=state.device, fast=True))
        ws.prepare()
        state.flusher.flush()
        ws.zero_scratch()  # outside what `counted` measures
        if i == at:
            counted(run)
        else:
            run()


def run_credit(state, req: dict) -> dict:
    """One workload as the executed check sees it: a fresh module, the seeded check launches,
    then CREDIT_RUNS runs on fresh inputs drawn as the timed runs' are, each prepared as a timed
    run is (outputs poisoned, scratch reset, L2 flushed), one of them at a position drawn from
    the request's secret `credit_seed` inside the profiler's window. The kernel cannot single
    that run out by its place in the sequence: it is never the module's first launch, and which
    one it is changes with every evaluation. Nothing is judged here (the evaluation judged every
    run; a reference would only cost time): what a kernel sees of a run, its launches and its
    inputs, is what it sees of a timed one.
    Returns {workload, split, status ("ran" or "failed"), reason, detail, runs, profiled_at (1-based run of the
    credit phase, None when it was not reached), launches (per profiled run)}."""
    import random

    from tasks.schema import Task, Workload
    from tools.launch import plan_launches
    from tools.solution import LaunchManifest

    task, wl = Task.model_validate(req["task"]), Workload.model_validate(req["workload"])
    out: dict = {"workload": wl.name, "split": wl.split, "status": "failed", "reason": None, "detail": None,
                 "runs": 0, "profiled_at": None, "launches": 0}
    rng = random.Random(int(req["credit_seed"]))
    runs = rng.randint(*CREDIT_RUNS)
    at = rng.randrange(runs)
    out["runs"] = runs
    try:
        limit = float(req.get("kernel_timeout_s", 30.0))
        axes = task.axis_values(wl)
        plan = plan_launches(LaunchManifest.model_validate(req["manifest"]), task, axes, state.limits)
        ws = Workspace(task, plan, state.device)
        bound = state.bind(plan, req["cubin"], req.get("symbols"), ws)
        window = getattr(state, "profiler_window", None) or contextlib.nullcontext

        def profiled(run) -> None:
            with window():
                run()
            out["profiled_at"], out["launches"] = at + 1, len(plan.launches)

        checks = len(req["seeds"])  # the seeded check launches first, as in the evaluation
        _prepared_runs(state, task, axes, ws, bound, list(req["seeds"]) + [rng.getrandbits(31) for _ in range(runs)],
                       limit, checks + at, profiled)
        out["status"] = "ran"  # not "passed": nothing is judged here
    except Exception as exc:  # noqa: BLE001 - a candidate's fault here is reported, never raised
        out["reason"], out["detail"] = "run_failed", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        with contextlib.suppress(Exception):
            state.restore()
    return out
