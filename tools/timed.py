"""The timed runs: the candidate and the library alternate run by run on fresh inputs, every
candidate run judged (tools.workspace.TimedJudge); the library baseline chosen, cached and scrubbed
between runs. The timing primitives (gate, flush, pairing, statistics) are tools.timing's."""
from __future__ import annotations

import time

from tools.workspace import Failed, TimedJudge, Workspace, log


def time_paired(state, req: dict, task, wl, axes: dict, ws: Workspace, bound, rng, result,
                limit: float) -> list[float]:
    """The timed phase in one go (TimedPhase, run). Returns the host times at which the
    candidate's runs were let go (tools.timing.Side.released)."""
    return TimedPhase(state, req, task, wl, axes, ws, bound, rng, result, limit).run()


class TimedPhase:
    """One workload's timed phase: candidate and baseline alternate run by run on fresh inputs,
    every candidate run judged; then the speedup (median of per-pair ratios, bootstrap interval),
    the throughput against the physical ceilings, and the GPU's state before and after.

    Built (the library chosen, the judge and both sides made) before it runs; `steps()` runs it
    pair by pair (tools.timing.paired_steps), so the executed check can hold it between two pairs
    (a pass boundary) and count its candidate runs (`candidate.pad`: every run in a range of the
    pass, tools.counted; `baseline.pad`: the library's matched pause); `finish(times)` fills the
    result. `run()` does all of it at once."""

    def __init__(self, state, req: dict, task, wl, axes: dict, ws: Workspace, bound, rng, result, limit: float):
        from tools.timing import Side

        self.state, self.req, self.task, self.wl, self.axes = state, req, task, wl, axes
        self.ws, self.rng, self.result, self.limit = ws, rng, result, limit
        t0 = time.perf_counter()
        free = _free_bytes(state)
        self.baseline, self.base_name, self.note = library_baseline(state, req, task, wl, ws.inputs, limit)
        # device memory the library took: a phase kept for the credit op holds it on purpose
        # (tools.worker.State.held_bytes), not memory the candidate lost
        self.held_bytes = max(0, free - _free_bytes(state)) if free else 0
        result.phase_s["baseline"] = time.perf_counter() - t0
        self.judge = judge = TimedJudge(task, axes, ws, rng, state.device)

        def candidate_run() -> None:
            ws.zero_scratch()
            bound.launch()

        def candidate_prepare() -> None:
            judge.inputs_for_run()
            ws.prepare()

        if self.baseline is not None:
            library_prepare = self.baseline.prepare
            self.baseline.prepare = lambda: (judge.inputs_for_run(), library_prepare())
        self.candidate = Side("candidate", candidate_run, candidate_prepare)
        self.seconds = 0.0  # wall time of its own pairs (not counting time it was held)
        self.stretches = 1  # count_every_pair: one equal stretch of pairs per hardware pass
        self.halted = False  # halt: an outside cost bound was reached (the executed check's COUNTED_CAP_S)

    def count_every_pair(self, passes: int) -> None:
        """The executed check counts every run of this phase (tools.counted: its pairs split into one
        equal stretch per hardware pass, every candidate run in a range of that pass): the drawn
        count is rounded up to a multiple of `passes`, and the stop is decided inside the first
        stretch, on its pairs; every later stretch then gets as many pairs as the first ran
        (tools.timing.paired_steps' `stretches`), so every pass holds the same count."""
        self.stretches = max(1, int(passes))

    def halt(self) -> None:
        """End the sequence before its next pair where the cap may end it (tools.timing.paired_steps'
        `halted`): the executed check's session ended at its cost bound, and the pairs left were
        there only to give later passes their runs. A kernel near the library runs on (uncounted)."""
        self.halted = True

    def steps(self):
        """The pairs, one at a time: yields (i, total) before pair i (tools.timing.paired_steps),
        returns the PairedTimes."""
        from tools.timing import TIMING_BUDGET_S, TIMING_CAP_S, paired_steps

        req, result = self.req, self.result
        result.timing_seed = int(req["timing_seed"])
        result.gpu_state["start"] = self.state.gpu_state()
        steps = paired_steps(self.candidate, self.baseline, self.state, self.rng, self.judge.before_pair,
                             self.judge.after_pair, limit_s=self.limit,
                             budget_s=float(req.get("timing_budget_s", TIMING_BUDGET_S)),
                             cap_s=float(req.get("timing_cap_s", TIMING_CAP_S)),
                             stretches=self.stretches, halted=lambda: self.halted)
        while True:
            t0 = time.perf_counter()
            try:
                at = next(steps)
            except StopIteration as done:
                self.seconds += time.perf_counter() - t0
                return done.value
            self.seconds += time.perf_counter() - t0
            yield at

    def run(self) -> list[float]:
        steps = self.steps()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                self.finish(done.value)
                return self.candidate.released

    def finish(self, times) -> None:
        """The result from the timed pairs (tools.timing.PairedTimes); raises Failed where the
        median is implausible."""
        import statistics

        from tools.ceilings import ceiling_for, implausible
        from tools.timing import median_ci, summarize

        state, req, task, wl, axes, rng, result = (self.state, self.req, self.task, self.wl, self.axes, self.rng,
                                                   self.result)
        baseline, base_name, note, judge = self.baseline, self.base_name, self.note, self.judge
        result.phase_s["timed"] = self.seconds
        result.phase_s["judge"] = times.judge_s  # inside "timed": judging each candidate run
        # where the pairs' time went (issue 43): host wall of the inputs and of the runs, GPU time by part
        result.phase_s["pair_inputs"], result.phase_s["pair_runs"] = times.inputs_s, times.runs_s
        result.phase_s.update(judge.marks.parts("gpu_"))
        result.timing_stop, result.planned_runs = times.stop, times.planned
        result.gpu_state["end"] = state.gpu_state()
        result.timed_runs, result.warmup_runs, result.full_checks = len(times.candidate_ms), times.warmup, judge.full_checks
        result.timing = summarize(times.candidate_ms)
        seconds = result.timing.median_ms * 1e-3
        flops, nbytes = task.flop_count(axes), task.min_bytes(axes)
        result.tflops = flops / seconds / 1e12 if flops > 0 and seconds > 0 else None
        result.gbps = nbytes / seconds / 1e9 if seconds > 0 else None
        broken = implausible(state.info.get("gpu"), task, axes, result.timing.median_ms)
        if broken:
            raise Failed("implausible", broken)
        notes = [f"{name} waited for the GPU inside its run: timed with its host time from then on"
                 for name in times.ungated]
        if getattr(state, "gate_error", None):
            notes.append(f"timed without the stream gate ({state.gate_error}): host issue time included")
        if baseline is not None and note:  # a timing reference, not an honest implementation of the task
            notes.append(f"the library ({base_name}) computes below the task's precision: {note}")
        if ceiling_for(state.info.get("gpu")) is None:
            notes.append(f"implausibility not checked: no physical ceiling known for {state.info.get('gpu')}")
        if notes:
            result.detail = "; ".join(notes)
        if baseline is not None and times.baseline_ms:
            result.baseline, result.baseline_name = summarize(times.baseline_ms), base_name
            result.speedup = statistics.median(times.ratios)
            result.speedup_ci = median_ci(times.ratios, rng)
            if req.get("baseline_cache"):
                from tools.baseline_cache import BaselineCache, cache_key

                BaselineCache(req["baseline_cache"]).update(
                    cache_key(task.name, wl.name, axes, state.info), best=base_name,
                    last={"median_ms": result.baseline.median_ms, "iqr_ms": result.baseline.iqr_ms,
                          "runs": result.baseline.runs})
        elif note:
            result.baseline_name = note


def _free_bytes(state) -> int:
    """Free device memory now (0 on a CPU stand-in)."""
    if getattr(state, "device", "cpu") != "cuda":
        return 0
    import torch

    return int(torch.cuda.mem_get_info()[0])


def library_side(name: str, baseline, inputs: dict):
    """The library as a timed Side whose outputs are zeroed right after each run (untimed, on
    the same stream). In a pair where the library runs first, its answer for exactly these
    inputs would otherwise sit in device memory while the candidate runs, at an address the
    caching allocator reuses run after run: a kernel could copy it instead of computing. An
    output that shares storage with an input (a library updating state in place) is left alone:
    the library reads the workspace's input tensors, which the candidate reads too."""
    from tools.timing import Side

    shared = {t.untyped_storage().data_ptr() for t in inputs.values() if hasattr(t, "untyped_storage")}
    last: dict = {}

    def run() -> None:
        last["out"] = baseline.run()

    def finish() -> None:
        out = last.pop("out", None)
        for t in (out.values() if isinstance(out, dict) else ()):
            try:
                if t.untyped_storage().data_ptr() not in shared:
                    t.zero_()
            except (AttributeError, RuntimeError) as exc:  # not a plain tensor (an expanded view): say so
                log(f"could not scrub the library's output: {type(exc).__name__}: {exc}")

    return Side(f"baseline:{name}", run, baseline.prepare, finish)


def library_baseline(state, req: dict, task, wl, inputs: dict, limit: float):
    """(Side for the best library backend or None, its name, a note: why there is none, or, for a
    backend that computes below the task's precision (Baseline.below_task), that label).

    The library reads the workspace's own input tensors, so in each pair it runs on the same
    fresh inputs as the candidate. The backend is chosen once per (task, workload, GPU,
    library versions): each backend timed cold, the fastest kept in the cache; later
    evaluations time only it."""
    from tasks.families.baselines import BaselineUnavailable, list_backends, make_baseline
    from tools.timing import measure, summarize

    names = list_backends(task)
    if not names:
        return None, None, f"none: task {task.name} has no library baseline"
    cache, key, best = None, None, None
    if req.get("baseline_cache"):
        from tools.baseline_cache import BaselineCache, cache_key

        cache = BaselineCache(req["baseline_cache"])
        key = cache_key(task.name, wl.name, task.axis_values(wl), state.info)
        best = (cache.get(key) or {}).get("best")
        best = best if best in names else None

    below: dict[str, str] = {}

    def make(candidates: list[str]) -> tuple[dict, list[str]]:
        made, refused = {}, []
        for name in candidates:
            try:
                lib = make_baseline(task, inputs, name)
                below[name] = getattr(lib, "below_task", "") or ""
                made[name] = library_side(name, lib, inputs)
            except BaselineUnavailable as exc:
                refused.append(str(exc))
            except Exception as exc:  # noqa: BLE001 - a library failure is not the candidate's fault
                refused.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        return made, refused

    backends, refused = make([best]) if best else ({}, [])
    if not backends:  # nothing cached (or the cached backend now refuses): time every backend once
        backends, refused = make(names)
        if not backends:
            return None, None, "none: " + "; ".join(refused)
        medians = {}
        for name, side in backends.items():
            try:
                medians[name] = summarize(measure(side, state, 5, limit)).median_ms
            except Exception as exc:  # noqa: BLE001 - e.g. a backend that rejects this shape late
                log(f"baseline backend {name} failed: {type(exc).__name__}: {exc}")
        if not medians:
            return None, None, "none: every library backend failed on this workload"
        best = min(medians, key=medians.get)
        if cache is not None:
            cache.update(key, best=best, backends=medians)
    return backends[best], best, below.get(best) or None
