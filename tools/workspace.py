"""One workload in the worker: its tensors (Workspace) and the verdict on its runs.

The seeded checks (verify), the verdict every timed and counted run gets (judge_run, TimedJudge),
and what every stage of the worker shares: a run's failure (Failed), the worker's log (stderr:
stdout carries the protocol), NVTX ranges for Nsight, and the context restored after a candidate
(must_restart). Imports nothing beyond the standard library at load time, so the protocol's client
and the CPU tests can import it without CUDA; torch and tasks/ are imported where they are used.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

def log(*parts) -> None:
    print("[worker]", *parts, file=sys.stderr, flush=True)


@contextmanager
def nvtx_range(name: str):
    """NVTX range for Nsight: the nvtx package if present, else torch's binding, else nothing."""
    push = pop = None
    try:
        import nvtx

        push, pop = (lambda: nvtx.push_range(name)), nvtx.pop_range
    except ImportError:
        try:
            import torch

            if torch.cuda.is_available():
                push, pop = (lambda: torch.cuda.nvtx.range_push(name)), torch.cuda.nvtx.range_pop
        except Exception:  # noqa: BLE001 - no NVTX: ranges are only for profiling
            pass
    if push:
        push()
    try:
        yield
    finally:
        if pop:
            pop()



class Failed(Exception):
    def __init__(self, reason: str, detail: str, fatal: bool = False, outputs=None):
        super().__init__(detail)
        self.reason, self.detail, self.fatal, self.outputs = reason, detail, fatal, outputs or []



def must_restart(state, after: str) -> bool:
    """Restore what a candidate may have changed in the context; True where that is not enough
    (the worker must not serve another request)."""
    try:
        why = state.restore()
    except Exception as exc:  # noqa: BLE001 - a context that cannot be restored is not reused
        why = f"{type(exc).__name__}: {exc}"
    if why:
        log(f"restarting after {after}: {why}")
    return bool(why)


class Workspace:
    """Every tensor of one workload, guarded, at fixed addresses (tensor maps point at them)."""

    def __init__(self, task, plan, device: str = "cuda"):
        from tools.correctness import TORCH_DTYPES, Guarded

        self.task, self.plan = task, plan
        self.guarded = {name: Guarded(shape, TORCH_DTYPES[dtype], device)
                        for name, (dtype, shape) in plan.tensors.items()}
        self.inputs = {n: self.guarded[n].tensor for n in task.inputs}
        self.outputs = {n: self.guarded[n].tensor for n in task.outputs}
        # No device copy of the inputs is kept: a kernel can write any address of the context, so
        # "inputs unchanged" is judged against the inputs generated again from the seed (verdict).
        self.buffers = {b.name: (self.guarded[b.name].tensor, b.zero) for b in plan.buffers}

    def pointers(self) -> dict[str, int]:
        return {name: g.data_ptr() for name, g in self.guarded.items()}

    def load_inputs(self, fresh: dict) -> None:
        for n, t in self.inputs.items():
            t.copy_(fresh[n])

    def prepare(self, checks: bool = False) -> None:
        """Before every run, not timed: outputs filled, zero=false scratch filled with garbage. An output
        is poisoned or filled with garbage by a coin the kernel cannot know before it reads the output
        (tools.correctness.fill_output_), on every run but the seeded checks' (`checks`, reset()), whose
        outputs are always poisoned so that elements a kernel never writes are named as such."""
        from tools.correctness import fill_output_, garbage_

        for t in self.outputs.values():
            fill_output_(t, secret=not checks)
        for t, zero in self.buffers.values():
            if not zero:
                garbage_(t)

    def zero_scratch(self) -> None:
        """The reset of zero=true scratch: a memset on the launch stream, timed as the
        candidate's work (the kernel relies on it, so it is part of what the kernel costs)."""
        for t, zero in self.buffers.values():
            if zero:
                t.zero_()

    def reset(self) -> None:
        """Everything a seeded check's run needs before its launches."""
        self.prepare(checks=True)
        self.zero_scratch()

    def verdict(self, expected: dict | None, tol, scales=None, samples: dict | None = None, *,
                inputs: dict | None = None, row_scales=None):
        """(reason or None, detail, mismatches) for the outputs as they are now: guards, inputs
        unchanged, every output element written and not NaN, then the values against
        `expected` (whole outputs) or against `samples` (tasks.sampled: random rows only).

        `scales`: the outputs' term scales (a dict), or a function that computes them, called only
        where the verdict needs them, with `row_scales` for just the failing rows
        (tools.correctness.judge_outputs; lazy_term_scales makes both, and lazy_sample_scales for
        `samples` drawn without their scales: then both work on the sampled rows).

        `inputs`: the run's inputs generated again from its seed after the run. "Unchanged" is
        judged against them, never against a device copy: nothing the candidate could reach
        while it ran decides the verdict."""
        if inputs is None:
            raise ValueError("verdict() needs the inputs generated again from the run's seed (inputs=...)")
        from tasks.sampled import view_rows
        from tools.correctness import compare, judge_outputs, scan

        found = scan(self.guarded, self.inputs, inputs, self.outputs)  # every whole-tensor check, one read back
        for name, (before, after) in found.guards.items():
            if before or after:
                kind = "output" if name in self.outputs else "input" if name in self.inputs else "buffer"
                where = " and ".join(s for s, n in (("before", before), ("after", after)) if n)
                return "out_of_bounds_write", (f"wrote outside {kind} {name!r}: {before + after} guard bytes changed "
                                               f"{where} it"), []
        for name, changed in found.changed.items():
            if changed:
                return "input_modified", f"input {name!r} changed during the run (inputs are read-only)", []
        for name, t in self.outputs.items():
            if found.unwritten[name]:
                return "unwritten_output", (f"output {name!r}: {found.unwritten[name]} of {t.numel()} elements were "
                                            f"never written (still the poison NaN)"), []
            if found.nans[name]:
                return "nan_output", f"output {name!r} has {found.nans[name]} NaN elements", []
        if samples is not None:
            written = {n: view_rows(self.outputs[n])[smp.rows] for n, smp in samples.items()}
            got, want, given, on = rows_to_judge(written, samples)
            if callable(scales):  # term scales of the sampled rows only where needed
                mismatches = judge_outputs(got, want, tol, lambda: on(scales()),
                                           None if row_scales is None else lambda rows: on(row_scales(rows)))
            else:
                mismatches = [compare(n, got[n], want[n], tol, given.get(n)) for n in got]
        elif callable(scales):
            mismatches = judge_outputs(dict(self.outputs), expected, tol, scales, row_scales)
        else:
            mismatches = [compare(n, self.outputs[n], expected[n], tol, (scales or {}).get(n)) for n in self.outputs]
        bad = [m for m in mismatches if not m.passed]
        if bad:
            return "incorrect", bad[0].describe() + (" (on randomly sampled rows)" if samples is not None else ""), \
                mismatches
        return None, None, mismatches


SAMPLED_ROWS = 64  # rows of each output judged on every timed run, for op types tasks.sampled.rows_for does not raise
# A sampled output of at most this many elements (attention: 256 rows of 128) is compared on the host: its
# ~45 small launches cost ~1.3 ms an output on the H200's host, most of a judged run's time at short
# sequences (scripts/bench_judge.py --timed-run, issue 43); a GEMM's 1,024 rows of C stay on the GPU.
HOST_COMPARE_ELEMENTS = 1 << 16


def rows_to_judge(got: dict, samples: dict, host: bool | None = None):
    """(got, expected, scales, on): each output's sampled rows (got, as written), their expected values
    and any term scales the samples carry, where compare() is to judge them: on the host, moved there in
    one transfer, where every output's sample is small (HOST_COMPARE_ELEMENTS), else where they are.
    `on(scales)` moves a dict of scales computed later (lazy_sample_scales) to the same place. The
    values are the same bits either way (the rows widened to fp32 first, exactly, as compare() does);
    the host sums the figures in another order (~1e-7 relative). `host`: move them or not whatever
    their size and device (tests)."""
    import torch

    want = {n: smp.expected for n, smp in samples.items()}
    given = {n: smp.scale for n, smp in samples.items() if smp.scale is not None}
    parts = [*got.values(), *want.values(), *given.values()]
    if host is None:
        host = bool(parts) and parts[0].is_cuda and all(t.numel() <= HOST_COMPARE_ELEMENTS for t in got.values())
    if not host or not parts:
        return got, want, given, lambda scales: scales
    flat = torch.cat([t.float().reshape(-1) for t in parts]).cpu()
    moved, at = [], 0
    for t in parts:
        moved.append(flat[at:at + t.numel()].view(t.shape))
        at += t.numel()
    it = iter(moved)
    got, want, given = ({n: next(it) for n in d} for d in (got, want, given))

    def on(scales):
        return {n: (s.cpu() if s is not None else None) for n, s in (scales or {}).items()}

    return got, want, given, on


class GpuMarks:
    """GPU seconds of the parts of a stage (CUDA events on the stream, read once the stage is over:
    no host sync is added), for the cost breakdown (scripts/bench_cost.py, issue 43). Nothing on a
    CPU stand-in."""

    def __init__(self, device: str):
        self.device = device
        self._marks: list = []
        self._last = None

    def mark(self, part: str | None) -> None:
        """An event on the stream now; the GPU time since the previous mark is `part`'s (None: a
        starting point only)."""
        if self.device != "cuda":
            return
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        if part is not None and self._last is not None:
            self._marks.append((part, self._last, ev))
        self._last = ev

    def parts(self, prefix: str) -> dict[str, float]:
        """GPU seconds per part so far, as {prefix + part: s}."""
        out: dict[str, float] = {}
        if self._marks:
            self._marks[-1][2].synchronize()
        for part, a, b in self._marks:
            out[part] = out.get(part, 0.0) + a.elapsed_time(b) / 1e3
        return {f"{prefix}{k}": round(v, 4) for k, v in out.items()}


class TimedJudge:
    """Fresh inputs for every timed (and warm-up) pair, and a verdict on every candidate run.

    Each pair gets inputs generated on the GPU from a new seed drawn from the evaluation's
    secret timing seed, never a transform of an earlier set, so a cache keyed on any part of
    the inputs never hits. Every run's output is scanned whole (guards, inputs unchanged,
    poison, NaN) and compared on random rows of each output (tasks.sampled.rows_for: 1024 for
    GEMMs, 256 for attention) against an fp32 reference of those rows; on one or two randomly chosen runs it is
    compared whole. Tasks without a sampler are compared whole on every run.

    The judge's copy of a pair's inputs is generated again from the pair's seed after the
    runs: while the candidate ran, nothing the reference is computed from existed in device
    memory, so a kernel that rewrote every copy of its inputs it could reach cannot steer the
    reference, and the rewrite itself is input_modified (inputs are judged against the same
    regeneration)."""

    def __init__(self, task, axes: dict, ws: Workspace, rng, device: str, rows: int | None = None):
        from tasks.sampled import has_sampler, rows_for

        self.task, self.axes, self.ws, self.rng, self.device = task, axes, ws, rng, device
        self.rows = rows or max(SAMPLED_ROWS, rows_for(task))
        self.sampled = has_sampler(task)
        self.seed: int | None = None
        self.full_at: set[int] | None = None
        self.full_checks = 0
        self._pair_inputs_used = False
        self.marks = GpuMarks(device)  # where a pair's GPU time goes (scripts/bench_cost.py, issue 43)
        self.mark = self.marks.mark

    def _inputs(self) -> dict:
        from tasks.generators import generate_inputs

        return generate_inputs(self.task, self.axes, self.seed, device=self.device, fast=True)

    def before_pair(self, i: int, total: int) -> None:
        self.mark(None)
        self.seed = self.rng.getrandbits(31)
        self._generated = self._inputs()  # kept until the pair is judged: the second side's copy
        self.ws.load_inputs(self._generated)
        self._pair_inputs_used = False
        self.mark("inputs")

    def inputs_for_run(self) -> None:
        """Before each side's run of a pair (untimed). The first side runs on the inputs
        before_pair loaded; the second gets them copied in again from the tensors before_pair
        generated, so no side reads a buffer the other wrote: a candidate that rewrites its inputs
        cannot steer the library's time in the same pair. A candidate that rewrote the generated
        tensors themselves (it can write any device address) is caught after the pair: judge_run
        holds them to the inputs generated again from the pair's seed (input_modified)."""
        if self._pair_inputs_used:
            self.ws.load_inputs(self._generated)
        self._pair_inputs_used = True

    def after_pair(self, i: int, total: int) -> None:
        if total > 1 and self.full_at is None:  # the count is known from pair 1 on: choose the runs judged whole
            from tools.timing import ALWAYS_RUN_PAIRS

            k = min(total - 1, self.rng.randint(1, 2))
            # one of them among the pairs every timed phase runs, so a phase that stops early
            # (tools.timing.stop_early, the cap) still judged a run whole
            first = self.rng.randrange(1, min(total, ALWAYS_RUN_PAIRS))
            self.full_at = {first} | set(self.rng.sample(range(1, total), k=k - 1))
        full = not self.sampled or i in (self.full_at or ())
        self.full_checks += full
        what = f"timed-phase run {i + 1}" + (f" of {total}" if total > 0 else "")
        self.mark("runs")  # both sides' cold runs (flush, poison, the runs) since the inputs
        try:
            marks = {"mark": self.mark} if self.device == "cuda" else {}  # (events exist on a GPU only)
            judge_run(self.task, self.axes, self.ws, self.seed, self.rng, self.device, self.rows, full, what,
                      copies=getattr(self, "_generated", None), **marks)
        finally:
            self._generated = None


def judge_run(task, axes: dict, ws: Workspace, seed: int, rng, device: str, rows: int, full: bool,
              what: str, copies: dict | None = None, mark=lambda part: None) -> None:
    """The verdict on one run's output, as every timed run gets it; raises Failed naming `what`.
    The inputs are generated again from the run's `seed` (fast generator) now, after the run:
    while the candidate ran, nothing the reference is computed from existed in device memory, and
    the inputs are judged unchanged against this regeneration. `full`: compared whole against the
    reference; else on `rows` random rows of each output (drawn from `rng`), the whole output
    still scanned (guards, poison, NaN). `copies`: the harness's own copy of the run's inputs
    (TimedJudge's, which the pair's other side read), held to the same regeneration. `mark(part)`:
    called after each part (regenerate, reference, verdict), for the cost breakdown."""
    from tasks.generators import generate_inputs
    from tools.correctness import changed

    fresh = generate_inputs(task, axes, seed, device=device, fast=True)
    mark("regenerate")
    for name in changed(copies or {}, fresh)[:1]:
        raise Failed("input_modified", f"{what}: the harness's copy of input {name!r} (read by the pair's other "
                                       "side) changed during the pair (inputs are read-only)")

    def judged_whole():
        from tasks.reference import run_reference

        whole, rows_of = lazy_term_scales(task, fresh)
        expected = run_reference(task, fresh)
        mark("reference_whole")
        return ws.verdict(expected, task.tolerance, whole, inputs=fresh, row_scales=rows_of)

    if full:
        reason, detail, mism = judged_whole()
    else:
        import torch

        from tasks.sampled import draw_rows, rows_at

        gen = torch.Generator(device=device)
        gen.manual_seed(rng.getrandbits(63))
        drawn = draw_rows(task, fresh, gen, rows)
        # the rows' reference without their term scales: those cost as much again (attention) or a
        # second GEMM of the rows (the GEMMs), and the verdict needs them only on rows that fail
        # against |ref| (lazy_sample_scales; the same verdict, tools.correctness.judge_outputs)
        samples = rows_at(task, fresh, drawn, terms=False)
        mark("reference_rows")
        whole, rows_of = lazy_sample_scales(task, fresh, drawn)
        reason, detail, mism = ws.verdict(None, task.tolerance, whole, inputs=fresh, samples=samples,
                                          row_scales=rows_of)
        if reason == "incorrect" and aggregate_only(mism):
            # The aggregate bound (Tolerance.rel_l2) is a rule on the whole output; on a few hundred
            # sampled rows its estimate is noisy, so a sample may exceed it where the whole does not
            # (the attention-backward expert's dK: 0.00509 on the rows of one draw at S=8192, H200,
            # 2026-12-04). Where every element and every row passed and only the sampled aggregate
            # failed, the whole output decides: the sample never fails what the rule passes, and an
            # output whose whole exceeds the bound fails as before.
            mark("verdict")
            reason, detail, mism = judged_whole()
            if reason is not None:
                detail += " (the whole output, judged after its sampled rows exceeded the aggregate bound)"
    mark("verdict")
    if reason is None:
        return
    if reason in ("incorrect", "unwritten_output", "nan_output"):
        raise Failed("wrong_in_timed_run", f"{what} (fresh inputs, right in the checks before): {detail}",
                     outputs=mism)
    raise Failed(reason, f"{what}: {detail}", outputs=mism)


def aggregate_only(mismatches: list) -> bool:
    """Whether every failing output failed the aggregate bound alone: each of its elements and
    rows within tolerance, only ||out - ref|| / ||ref|| over the compared rows above rel_l2."""
    failing = [m for m in mismatches if not m.passed]
    return bool(failing) and all(
        m.first_mismatch is None and not m.bad_rows and not m.nan_count and m.rel_l2_bound is not None
        and m.rel_l2 is not None and m.rel_l2 > m.rel_l2_bound for m in failing)


def term_scales(task, fresh: dict) -> dict | None:
    """Term scales for tasks judged with tolerance.scale == "terms", else None."""
    if getattr(task.tolerance, "scale", "ref") != "terms":
        return None
    from tasks.reference import term_scales as of_terms

    return of_terms(task, fresh)


def lazy_term_scales(task, fresh: dict):
    """(whole, rows) for Workspace.verdict: functions that compute the term scales of the whole
    outputs, and of given rows of them (tasks.sampled.rows_at, where the task has a sampler), only
    when called; (None, None) for tasks judged against |ref|. For attention the whole outputs'
    term scales cost as much as the reference again, and most runs never need them
    (tools.correctness.judge_outputs)."""
    if getattr(task.tolerance, "scale", "ref") != "terms":
        return None, None
    from tasks.sampled import has_sampler, rows_at

    def rows(wanted: dict) -> dict:
        return {n: smp.scale for n, smp in rows_at(task, fresh, wanted).items()}

    return (lambda: term_scales(task, fresh)), (rows if has_sampler(task) else None)


def lazy_sample_scales(task, fresh: dict, drawn: dict):
    """lazy_term_scales for a sampled verdict: (all, some) functions that compute the term scales of
    every sampled row (`drawn`: tasks.sampled.draw_rows' indices, per output), or of the sampled rows
    at given positions of the sample, only when called; (None, None) for tasks judged against |ref|.
    What the verdict needs them for, it gets from the same computation as a sample drawn with its
    scales (tasks.sampled.rows_at), so the verdict is that sample's (tools.correctness.judge_outputs)."""
    if getattr(task.tolerance, "scale", "ref") != "terms":
        return None, None
    from tasks.sampled import rows_at

    def every() -> dict:
        return {n: smp.scale for n, smp in rows_at(task, fresh, drawn, terms=True).items()}

    def some(wanted: dict) -> dict:
        return {n: smp.scale for n, smp in rows_at(task, fresh, {n: drawn[n][pos.to(drawn[n].device)]
                                                                 for n, pos in wanted.items()}, terms=True).items()
                if n in wanted}

    return every, some


def verify(state, req: dict, task, axes: dict, ws: Workspace, bound, result, limit: float) -> None:
    """The seeded checks: each seed's inputs, one whole run, the whole output judged."""
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference

    marks = GpuMarks(getattr(state, "device", "cpu"))
    with nvtx_range("verify"):
        for call, seed in enumerate(req["seeds"], 1):
            # fast: the timed runs' generator (attention backward's O and LSE from a bf16 forward,
            # not the fp32 reference: 2 x 0.3 s a check at S=8192; the backward's reference takes
            # them as given, so the judging is exact for whatever was generated)
            marks.mark(None)
            ws.load_inputs(generate_inputs(task, axes, seed, device=state.device, fast=True))
            marks.mark("inputs")
            ws.reset()
            bound.launch()
            marks.mark("run")
            state.wait(limit)
            # The reference's inputs are generated again from the seed, and the answer computed,
            # only now: while the candidate ran, neither was anywhere in device memory.
            fresh = generate_inputs(task, axes, seed, device=state.device, fast=True)
            marks.mark("regenerate")
            whole, rows_of = lazy_term_scales(task, fresh)
            expected = run_reference(task, fresh)
            marks.mark("reference_whole")
            reason, detail, mism = ws.verdict(expected, task.tolerance, whole, inputs=fresh, row_scales=rows_of)
            marks.mark("verdict")
            result.phase_s.update(marks.parts("verify_gpu_"))
            result.outputs = mism
            if reason is None:
                continue
            if call > 1 and reason in ("incorrect", "unwritten_output", "nan_output"):
                raise Failed("wrong_after_first_call", f"right on the first call, wrong on call {call} (fresh "
                                                       f"inputs, seed {seed}): {detail}", outputs=mism)
            raise Failed(reason, detail, outputs=mism)
