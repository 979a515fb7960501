"""The executed check in the worker (tools.counted.defer_counted, tools.cupti), on CPU: where the
counted runs sit among the evaluation's own runs (one per CUPTI pass, user replay: right after the
timed runs, or after 1-4 uncounted runs where nothing was timed), that each one is on fresh
inputs, timed, judged and tied to the timed median, what happens where CUPTI cannot run or a
counted run hangs, and the verdict from hardware counters alone (no per-opcode SASS counts). The
host half of CUPTI (metric names, config image, passes) runs here with the real library; the
counters themselves are read in tests/gpu/test_credit_gpu.py, and the profiler's own pass loop
is tested without a GPU in tests/test_cupti_user_replay.py."""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
import torch
from test_evaluator_cpu import CpuState, corrupt, gemm, small_gemm

from tools import counted, credit as rules, cupti, ncu, worker, workspace
from tools.correctness import poison_mask
from tools.cupti import CuptiError, Launch
from tools.credit import Counting, TaskWork
from tools.solution import Solution
from tools.timing import KernelTimeout

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "adversarial"
NO_BULK = {"HGMMA", "UTMALDG"}  # a module SASS without plain bulk copies: TMA's bytes are tensor-map loads
WORK = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)
LIMIT_S = 5.0  # the request's kernel_timeout_s
PHASES = {"setup": 0.25, "runs": 0.01, "decode": 0.001, "disable": 0.002, "total": 0.263}


class ClockEvent:
    """An event of a counted run: reads the stand-in's clock, which counted launches advance."""

    def __init__(self, state):
        self.state = state

    def record(self):
        self.t = self.state.clock_ms

    def elapsed_time(self, end) -> float:
        return end.t - self.t


class FakeProfiler:
    """tools.cupti.RangeProfiler(replay="user") as tools.counted.defer_counted uses it: `passes`
    runs, one per pass, the last `instrumented_passes` SASS-patched. `fail`: (when, message), a
    CuptiError raised "before" any pass (set-up) or "after" them all (decode)."""

    def __init__(self, state, passes: int, instrumented: tuple[int, ...], fail: tuple[str, str] | None):
        self.state, self.passes, self.instrumented_passes, self.fail = state, passes, tuple(instrumented), fail
        self.metrics = list(rules.credit_metrics())
        self.last_phase_s: dict[str, float] = {}
        self.last_stops: list[list[int]] = []  # what CUPTI's Stop returned per pass, as on the H200 (recorded)
        self.names: list[str] = []  # the default range name of each profile_passes call
        self.ranges: list[tuple[int, str]] = []  # (pass, range name) of every range pushed

    def profile_passes(self, run_pass, name: str, max_ranges: int | None = None) -> list[Launch]:
        state = self.state
        self.names.append(name)
        self.max_ranges = max_ranges

        @contextlib.contextmanager
        def ranged(label=None):
            self.ranges.append((state.pass_index, label or name))
            state.inside, state.label = True, label or name
            try:
                yield
            finally:
                state.inside = False

        if self.fail and self.fail[0] == "before":
            raise CuptiError(self.fail[1])
        self.last_stops = []
        try:
            for i in range(self.passes):
                state.pass_index = i
                run_pass(i, ranged)
                last = i == self.passes - 1  # the pass index wraps to 0, every pass submitted
                self.last_stops.append([0 if last else i + 1, 1, int(last)])
        finally:
            state.pass_index = None
            self.last_phase_s = dict(PHASES)
        if self.fail:
            raise CuptiError(self.fail[1])
        labels = list(dict.fromkeys(label for _, label in self.ranges))  # one Launch per range name, as CUPTI
        return [Launch(label, state.metrics_of([c for c in state.counted if c.get("label", label) == label]))
                for label in labels if any(c.get("label", label) == label for c in state.counted)]


def prepared(output: torch.Tensor, previous: torch.Tensor | None) -> bool:
    """An output filled afresh for a run, as every run but the seeded checks' is (tools.correctness.fill_output_):
    the poison everywhere, or random bytes that hold almost none of the poison and none of what the previous
    run wrote."""
    if bool(poison_mask(output).all()):
        return True
    return (poison_mask(output).float().mean() < 0.01 and
            (previous is None or not bool((output.view(torch.int16) == previous.view(torch.int16)).float().mean() > 0.01)))


class CountedState(CpuState):
    """The CPU stand-in with in-process counters (FakeProfiler). Every launch is numbered; one
    made inside a counted range is recorded in `counted` (its number, pass, inputs, and whether
    whether its outputs were filled afresh when it started: `prepared`) and takes `ms_of(pass)` on the clock every event
    reads; any other launch takes `timed_ms` (1 ms). Every wait records (pass or None, its limit); `hang_at`: the wait of that pass hangs."""

    def __init__(self, kernel, metrics_of=None, fail: str | None = None, passes: int = 3,
                 instrumented: tuple[int, ...] = (2,), profile_fail: tuple[str, str] | None = None,
                 ms_of=None, hang_at: int | None = None):
        self.launches, self.counted, self.waits, self.asked = 0, [], [], []
        self.inside, self.pass_index, self.fail, self.hang_at = False, None, fail, hang_at
        self.clock_ms, self.ms_of, self.timed_ms = 0.0, ms_of or (lambda i: 1.0), 1.0
        self.metrics_of = metrics_of or (lambda counted: {m: 0.0 for m in rules.credit_metrics()})
        self.bound, self.label = None, None

        last: dict = {}  # the output the previous launch of each shape left

        def counting(ws, call):
            self.launches += 1
            c = ws.outputs["C"]
            if self.inside:
                self.counted.append({"launch": self.launches, "pass": self.pass_index, "A": ws.inputs["A"].clone(),
                                     "prepared": prepared(c, last.get(tuple(c.shape))), "label": self.label,
                                     "M": ws.inputs["A"].shape[0]})
                self.clock_ms += self.ms_of(self.pass_index)
            else:  # a timed run takes what an honest counted run does (the band the tie holds runs to)
                self.clock_ms += self.timed_ms
            out = kernel(ws, self.launches)
            last[tuple(c.shape)] = c.clone()
            return out

        super().__init__(counting)
        self.profiler = FakeProfiler(self, passes, instrumented, profile_fail)

    def bind(self, plan, cubin, symbols, ws):
        self.bound = super().bind(plan, cubin, symbols, ws)
        self.bound.plan = plan  # as the real Bound has it: the counted range is named after its kernels
        return self.bound

    def event(self):
        return ClockEvent(self)

    def wait(self, limit_s):
        self.waits.append((self.pass_index, limit_s))
        if self.hang_at is not None and self.pass_index == self.hang_at:
            raise KernelTimeout(f"the GPU did not finish within {limit_s:.0f} s")

    def counters(self, metrics):
        self.asked.append(metrics)
        if self.fail:
            raise CuptiError(self.fail)
        return self.profiler

    def passes_counted(self) -> list[int]:
        return [c["pass"] for c in self.counted]


def request(credit_seed: int, time: bool = True, timing_seed: int = 7, workload: int = 0,
            evaluation: str | None = None) -> dict:
    """A workload request with the in-process check (`evaluation`: the id the evaluator gives it)."""
    task = small_gemm()
    sol = Solution.from_dir(FIXTURES / "good")
    credit = {"seed": credit_seed, "metrics": list(rules.credit_metrics()), "evaluation": evaluation}
    return {"cubin": b"", "manifest": sol.manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
            "workload": task.workloads[workload].model_dump(mode="json"), "seeds": [11, 12], "time": time,
            "timing_seed": timing_seed, "timing_budget_s": 0.01, "kernel_timeout_s": LIMIT_S, "credit": credit}


def with_counted_runs(state, req: dict) -> tuple[dict, bool]:
    """One workload's request, then the evaluation's credit op (tools.counted.run_pending), merged
    as tools.evaluator.Evaluator._counted_runs merges them: the workload's credit comes from the
    op, and a counted run that failed fails the workload."""
    result, fatal = worker.run_workload(state, req)
    if fatal or (result.get("credit") or {}).get("status") != "pending":
        return result, fatal
    reply, fatal = counted.run_pending(state)
    result = dict(reply["results"].get(result["workload"]) or result)  # timed at the op: its whole result
    result["credit"] = reply["credits"][result["workload"]]
    failed = reply["failed"].get(result["workload"])
    if failed:
        result.update(status="failed", reason=failed["reason"], detail=failed["detail"])
    return result, fatal


# ---------------------------------------------------------------- where the counted runs are

def test_every_timed_run_is_counted_in_its_stretchs_pass():
    """Issue 42 item 3, by construction: every candidate run of the timed sequence is counted. The
    pairs (the drawn count rounded up to a multiple of the hardware passes) split into one equal
    stretch per hardware pass, and every candidate run of stretch k is made inside a range of pass
    k, named for its place in the stretch (the same names each pass); the counts are the mean over
    a pass's ranges. Only the SASS-patched pass's run follows the timed runs, in the workload's
    range. Under names of ours."""
    totals = set()
    for seed in range(6):
        state = CountedState(gemm)
        req = request(seed, timing_seed=seed)
        result, fatal = with_counted_runs(state, req)
        assert result["status"] == "passed" and not fatal, result
        credit = result["credit"]
        assert credit["status"] == "ran" and credit["reason"] is None, credit
        pairs = result["warmup_runs"] + result["timed_runs"]
        m = pairs // 2
        assert pairs == 2 * m and credit["ranged_runs"] == m and credit["stretch_ends"] == [m, 2 * m], credit
        assert credit["lead_runs"] == 0 and credit["counted_from"] == 1 and credit["runs"] == pairs + 1
        # the checks' 2 launches, then one candidate launch per pair, every one counted; the instrumented run last
        assert [c["launch"] for c in state.counted] == list(range(3, 3 + pairs)) + [3 + pairs]
        assert state.launches == 2 + pairs + 1 and state.passes_counted() == [0] * m + [1] * m + [2]
        assert credit["run_ms"] == [1.0] * pairs and credit["pass_ms"] == [[1.0] * m] * 2
        assert len(credit["instrumented_ms"]) == 1
        name = f"{counted.COUNTED_RANGE}_0"  # ours, never a name the candidate chose
        assert state.profiler.names == [name]
        assert state.profiler.ranges == [(p, f"{name}{counted.RUN_SEP}{j}") for p in (0, 1) for j in range(m)] + [(2, name)]
        assert credit["launches"] == [{"name": name, "metrics": {m_: 0.0 for m_ in rules.credit_metrics()}}]
        assert state.asked == [tuple(req["credit"]["metrics"])]
        assert credit["profile_phase_s"] == PHASES and credit["profile_s"] >= 0 and credit["own_s"] >= 0
        assert credit["stops"] == [[1, 1, 0], [2, 1, 0], [0, 1, 1]]  # CUPTI's pass bookkeeping, recorded
        assert state.profiler.max_ranges >= m  # the counter data image holds every range of a pass
        totals.add(pairs)
    assert len(totals) >= 2, totals


def test_launch_gaps_summarise_the_spacing_a_kernel_sees():
    """launch_gaps (issue 42 item 3): the timed runs' gaps, the gap before each counted run (the
    first from the last timed run), and how many counted gaps exceed every timed one: exactly the
    runs a kernel that switches path after an unusually long pause would single out."""
    timed = [0.0, 0.010, 0.021, 0.030, 0.042]  # gaps 10, 11, 9, 12 ms
    gaps = counted.launch_gaps(timed, [0.300, 0.310, 0.321])
    assert gaps["timed_median"] == pytest.approx(10.5) and gaps["timed_max"] == pytest.approx(12.0)
    assert gaps["counted"] == pytest.approx([258.0, 10.0, 11.0])
    assert gaps["counted_beyond_timed"] == 1
    untimed = counted.launch_gaps([], [1.0, 1.01])
    assert untimed["timed_max"] is None and untimed["counted"] == pytest.approx([10.0]) \
        and untimed["counted_beyond_timed"] is None


def test_every_counted_run_records_the_gap_before_it():
    """The worker measures what it creates: each workload's credit carries `gaps_ms` from the host
    times at which its timed runs (every one counted) and its runs after them (here the SASS-patched
    pass's) were let go (tools.timing.Side.released)."""
    state = CountedState(gemm)
    result, _ = with_counted_runs(state, request(3))
    gaps = result["credit"]["gaps_ms"]
    assert result["status"] == "passed" and result["credit"]["status"] == "ran", result
    assert len(gaps["counted"]) == 1 and all(g > 0 for g in gaps["counted"])  # the one run after the timed ones
    assert gaps["timed_median"] > 0 and gaps["timed_max"] >= gaps["timed_median"] and len(gaps["boundary"]) == 1
    assert isinstance(gaps["counted_beyond_timed"], int)


class LoggingState(CountedState):
    """CountedState that logs the host-side operations a kernel's runs are made of, in order:
    each candidate launch ("launch", or "launch*" inside a counted range), every event made,
    every wait, every L2 flush, and the range push and pop."""

    def __init__(self):
        super().__init__(lambda ws, n: (self.ops.append("launch*" if self.inside else "launch"), gemm(ws, n)))
        self.ops: list[str] = []
        state = self
        self.flusher = type("Flusher", (), {"flush": lambda self: state.ops.append("flush")})()

    @property
    def inside(self) -> bool:
        return self.__dict__.get("_inside", False)

    @inside.setter
    def inside(self, value: bool) -> None:
        if value != self.__dict__.get("_inside", False) and hasattr(self, "ops"):
            self.ops.append("push" if value else "pop")
        self.__dict__["_inside"] = value

    def event(self):
        self.ops.append("event")
        return super().event()

    def wait(self, limit_s):
        self.ops.append("wait")
        return super().wait(limit_s)


def test_every_timed_launch_is_inside_a_range():
    """Issue 42 item 3, by construction: every candidate launch of the timed sequence is made inside
    a range (pushed before it, popped after it), so no timed run differs from a counted one; the
    only counted launch outside the timed sequence is the SASS-patched pass's, last. Checked for
    every credit seed of six."""
    for seed in range(6):
        state = LoggingState()
        result, _ = with_counted_runs(state, request(seed, timing_seed=seed))
        assert result["status"] == "passed" and result["credit"]["status"] == "ran", result
        launches = [op for op in state.ops if op.startswith("launch")]
        checks, pairs = 2, result["warmup_runs"] + result["timed_runs"]
        assert launches[:checks] == ["launch"] * checks  # the seeded checks: before the session
        assert launches[checks:] == ["launch*"] * (pairs + 1), (seed, launches)
        ranged = "".join("(" if op == "push" else ")" if op == "pop" else "L" if op.startswith("launch") else ""
                         for op in state.ops)
        assert ranged.count("(L)") == pairs + 1, ranged


def test_untimed_the_counted_runs_follow_one_to_four_uncounted_runs():
    """Nothing timed: 1-4 uncounted runs (as many as the secret credit seed says) come between
    the seeded checks and the counted runs, so the first counted run is never the module's first
    launch nor one the kernel can count to."""
    leads = set()
    for seed in range(30):
        state = CountedState(gemm)
        result, fatal = with_counted_runs(state, request(seed, time=False))
        assert result["status"] == "passed" and not fatal, result
        credit = result["credit"]
        lead = credit["lead_runs"]
        assert 1 <= lead <= 4 and credit["counted_from"] == lead + 1 and credit["runs"] == lead + 3, credit
        assert [c["launch"] for c in state.counted] == [2 + lead + 1, 2 + lead + 2, 2 + lead + 3]
        assert state.launches == 2 + lead + 3 and state.counted[0]["launch"] > 3
        assert [w for w in state.waits if w[0] is None][-lead:] == [(None, LIMIT_S)] * lead  # the uncounted runs
        leads.add(lead)
    assert leads == {1, 2, 3, 4}


def test_each_counted_run_is_prepared_fresh_and_timed_in_its_own_list():
    """Each counted run gets inputs of its own (the hardware passes' runs are the timed runs: the
    timed sequence's fresh inputs; the SASS-patched pass's from the secret credit seed) and poisoned
    outputs, as a timed run does. The hardware passes' times go to run_ms (and by pass to pass_ms),
    the SASS-patched pass's to instrumented_ms; that pass may take INSTRUMENTED_SLOWDOWN times the
    slowest plain run beyond the kernel time limit."""
    ms = {0: 1.0, 1: 3.0, 2: 40.0}
    state = CountedState(gemm, ms_of=ms.__getitem__)
    result, _ = with_counted_runs(state, request(21))
    credit = result["credit"]
    assert result["status"] == "passed" and credit["status"] == "ran", result
    m = credit["ranged_runs"]
    assert credit["run_ms"] == [1.0] * m + [3.0] * m and credit["instrumented_ms"] == [40.0]
    assert credit["pass_ms"] == [[1.0] * m, [3.0] * m]
    assert all(c["prepared"] for c in state.counted)
    a = [c["A"] for c in state.counted]
    assert len(a) == 2 * m + 1 and not any(torch.equal(a[i], a[j]) for i in range(len(a)) for j in range(i + 1, len(a)))
    waits = {p: limit for p, limit in state.waits if p is not None}
    assert waits[0] == waits[1] == LIMIT_S
    assert waits[2] == pytest.approx(LIMIT_S + counted.INSTRUMENTED_SLOWDOWN * 3.0 / 1e3)
    # the hardware passes hold stretches of timed pairs (each waited for); the instrumented one run
    assert [p for p, _ in state.waits if p == 2] == [2] and {p for p, _ in state.waits if p is not None} == {0, 1, 2}
    other = CountedState(gemm)
    with_counted_runs(other, request(22, timing_seed=8))  # other timed runs, another credit seed
    assert not any(torch.equal(x, c["A"]) for x, c in zip(a, other.counted))


def test_the_instrumented_passes_come_from_the_profiler():
    """Six passes, the last one SASS-patched (credit_metrics(True) on GH100: 5 + 1): five run_ms,
    one instrumented_ms; the instrumented wait is the only long one."""
    state = CountedState(gemm, passes=6, instrumented=(5,), ms_of=lambda i: 2.0 if i < 5 else 90.0)
    result, _ = with_counted_runs(state, request(5, time=False))
    credit = result["credit"]
    assert credit["passes"] == 6 and credit["run_ms"] == [2.0] * 5 and credit["instrumented_ms"] == [90.0]
    assert credit["runs"] == credit["lead_runs"] + 6
    long = [p for p, limit in state.waits if limit > LIMIT_S]
    assert long == [5] and max(limit for _, limit in state.waits) == pytest.approx(LIMIT_S + 0.1)


class RecordingGate:
    """A stream gate (tools.timing.StreamGate) that records the pass of each hold."""

    def __init__(self, state):
        self.state, self.held = state, []

    def hold(self) -> int:
        self.held.append(self.state.pass_index)
        return len(self.held)

    def release(self, hold) -> None:
        pass


def test_the_instrumented_pass_runs_ungated():
    """CUPTI patches a kernel's SASS at its first launch in the instrumented pass and blocks the
    host there; a gate ahead of that launch would hold the stream to its limit (0.2 s a workload on
    the H200). The hardware passes' runs are gated as timed runs are; the instrumented one is not."""
    state = CountedState(gemm, passes=4, instrumented=(3,))
    state.gate = RecordingGate(state)
    result, _ = with_counted_runs(state, request(5))
    assert result["credit"]["status"] == "ran", result["credit"]
    held = [p for p in state.gate.held if p is not None]  # the timed pairs inside the hardware passes
    assert set(held) == {0, 1, 2} and 3 not in held, state.gate.held


# ---------------------------------------------------------------- every counted run judged

@pytest.mark.parametrize("k,time", [(0, True), (1, True), (2, True), (1, False)])
def test_every_counted_run_is_judged(k, time):
    """A kernel that answers wrong only inside a range of pass k (the instrumented one included)
    fails the workload as a wrong timed run would, and the detail names that run (timed: the
    hardware passes' runs are the timed runs, named by their place in the timed sequence: the first
    of pass k's stretch); no run is counted after it."""
    state = CountedState(lambda ws, n: ws.outputs["C"].zero_() if state.inside and state.pass_index == k
                         else gemm(ws, n))
    result, fatal = with_counted_runs(state, request(3, time=time))
    assert result["status"] == "failed" and result["reason"] == "wrong_in_timed_run" and not fatal, result
    credit = result["credit"]
    if time and k < 2:
        first = 0 if k == 0 else credit["stretch_ends"][k - 1]
        assert result["detail"].startswith(f"timed-phase run {first + 1} "), result["detail"]
        assert state.passes_counted() == [p for p in range(k) for _ in range(credit["ranged_runs"])] + [k]
    else:
        n = credit["lead_runs"] + k + 1
        assert f"the executed check's counted run {n} (after the timed runs)" in result["detail"], result["detail"]
        assert state.passes_counted()[-1] == k and state.passes_counted().count(k) == 1
    assert credit["status"] != "ran"


def test_a_counted_run_that_writes_out_of_bounds_fails_with_that_reason():
    state = CountedState(lambda ws, n: (gemm(ws, n), corrupt(ws) if state.pass_index == 1 else None))
    result, _ = with_counted_runs(state, request(3))
    assert result["reason"] == "out_of_bounds_write", result
    # wrong on every run of pass 1: the first timed pair of its stretch is the first to say so
    assert result["detail"].startswith("timed-phase run "), result["detail"]


def test_the_counted_runs_are_judged_as_timed_runs_are(monkeypatch):
    """judge_run, the timed runs' verdict, on each counted run: the hardware passes' runs are the
    timed runs, judged as every timed run is (by the timed phase's judge, named as timed-phase runs);
    the SASS-patched pass's run, after the timed runs, on the seed its inputs came from, sampled rows
    (the task has a sampler), named by its place after the timed runs."""
    judged = []
    real = counted.judge_run

    def spy(task, axes, ws, seed, rng, device, rows, full, what, **kw):
        judged.append((what, full, rows, seed))
        real(task, axes, ws, seed, rng, device, rows, full, what, **kw)

    monkeypatch.setattr(workspace, "judge_run", spy)  # the timed runs' judge (TimedJudge)
    monkeypatch.setattr(counted, "judge_run", spy)  # the counted runs'
    state = CountedState(gemm)
    result, _ = with_counted_runs(state, request(9))
    assert result["status"] == "passed", result
    in_counted = [j for j in judged if "counted run" in j[0]]
    what = "the executed check's counted run {} (after the timed runs)"
    assert [j[0] for j in in_counted] == [what.format(3)]
    assert all(not full and rows == 1024 for _, full, rows, _ in in_counted)
    timed = [j for j in judged if j[0].startswith("timed-phase run")]
    assert len(timed) == result["warmup_runs"] + result["timed_runs"] and len(judged) == len(timed) + 1
    assert len(timed) == len(result["credit"]["run_ms"])  # every timed run judged, every one counted


def test_a_wrong_kernel_is_still_counted_and_not_judged_again(monkeypatch):
    """Wrong from the first check (a creditable verdict): the model still learns whether its
    instructions ran. Nothing was timed, so uncounted runs come first; no counted run is judged."""
    judged = []
    for module in (workspace, counted):
        monkeypatch.setattr(module, "judge_run", lambda *a, **k: judged.append(a[-1]))
    state = CountedState(lambda ws, n: ws.outputs["C"].zero_())
    result, _ = with_counted_runs(state, request(4))
    assert result["reason"] == "incorrect" and "counted run" not in result["detail"]
    credit = result["credit"]
    assert credit["status"] == "ran" and state.passes_counted() == [0, 1, 2] and judged == []
    assert 1 <= credit["lead_runs"] <= 4 and credit["counted_from"] == credit["lead_runs"] + 1
    assert state.counted[0]["launch"] == 1 + credit["lead_runs"] + 1  # after the one seeded check it failed


# ---------------------------------------------------------------- CUPTI failures, hangs

def test_no_counters_is_unavailable_never_the_candidates_fault():
    state = CountedState(gemm, fail="libcupti not found")
    result, _ = with_counted_runs(state, request(5))
    assert result["status"] == "passed"
    assert result["credit"]["status"] == "unavailable" and "libcupti" in result["credit"]["reason"]
    assert state.counted == []
    plain, _ = with_counted_runs(CpuState(gemm), request(5))  # a worker with no counters at all
    assert plain["status"] == "passed" and plain["credit"]["status"] == "unavailable"


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_profiler_error_is_recorded_and_the_workload_still_passes(when):
    """CUPTI failing in set-up (no counted run made) or after the runs (decode): the reason is in
    the credit, the workload keeps its verdict, the worker is not restarted."""
    state = CountedState(gemm, profile_fail=(when, "cuptiRangeProfilerDecodeData failed: CUPTI error 7"))
    result, fatal = with_counted_runs(state, request(6))
    assert result["status"] == "passed" and not fatal, result
    credit = result["credit"]
    assert credit["status"] == "failed" and "CUPTI error 7" in credit["reason"] and credit["launches"] == []
    # after: every timed run counted, then the SASS-patched pass's run
    assert len(state.counted) == (len(credit["run_ms"]) + 1 if when == "after" else 0) and credit["profile_s"] is not None
    assert when == "before" or len(credit["run_ms"]) == result["warmup_runs"] + result["timed_runs"]
    wc = rules.credit_in_process(META, credit, ["wgmma"], WORK, 1.0)
    assert wc.status == "skipped" and "CUPTI error 7" in wc.reason


@pytest.mark.parametrize("hang_at", [0, 2])
def test_a_hang_in_a_counted_run_is_a_timeout(hang_at):
    """A kernel that hangs on a counted run (a hardware pass or the instrumented one): the
    workload's verdict is the hang, and the worker is replaced (fatal: the context is not reused)."""
    state = CountedState(gemm, hang_at=hang_at)
    result, fatal = with_counted_runs(state, request(7))
    assert result["reason"] == "timeout" and fatal, result
    assert result["credit"]["status"] != "ran" and state.restored == 1  # after the checks; not after the hang
    # a hang in a hardware pass hits its stretch's first timed run (counted, as every timed run is)
    counted_passes = state.passes_counted()
    assert counted_passes[-1] == hang_at and counted_passes.count(hang_at) == 1 and sorted(counted_passes) == counted_passes


# ---------------------------------------------------------------- the tie to the timed median

def _counters(**kw) -> dict[str, float]:
    out = {m: 0.0 for m in rules.CUPTI_METRICS}
    out.update({k.replace("__dot__", "."): float(v) for k, v in kw.items()})
    return out


HONEST = _counters(smsp__inst_executed_pipe_tensor_op_gmma__dot__sum=4e6,
                   sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum=WORK.flops * 1.02,
                   sm__inst_executed_pipe_tma__dot__sum=3e5,
                   l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld__dot__sum=WORK.read_bytes * 3,
                   gpu__time_duration__dot__sum=1.0e6)
META = {"workload": "M8192", "split": "visible"}


def _counted(run_ms: list[float], counted_from: int = 1, instrumented_ms=(45.0,), metrics=None) -> dict:
    """An in-process credit as defer_counted reports it: counters without a kernel time, each
    hardware pass's run timed."""
    metrics = metrics or {m: v for m, v in HONEST.items() if m in rules.credit_metrics()}
    return {"status": "ran", "runs": counted_from - 1 + len(run_ms) + len(instrumented_ms),
            "counted_from": counted_from, "run_ms": list(run_ms), "instrumented_ms": list(instrumented_ms),
            "launches": [{"name": "k", "metrics": metrics}]}


def test_every_counted_run_is_tied_to_the_timed_median_both_ways():
    """Not their median: each hardware pass's run. One slow run among three (their median still
    1.0 ms) or one fast one withdraws the credit, and the note names that counted run. The
    instrumented run (45 ms here) is never tied."""
    wc = rules.credit_in_process(META, _counted([1.0, 1.02, 0.98], counted_from=2), ["wgmma", "tma"], WORK, 1.0,
                               module_opcodes=NO_BULK)
    assert wc.status == "ok" and wc.carries == {"wgmma": True, "tma": True}, wc
    assert wc.kernel_ms == 1.0 and wc.run_ms == [1.0, 1.02, 0.98] and wc.instrumented_ms == [45.0]
    assert wc.counted_from == 2 and wc.runs == 5 and wc.timed_ms == 1.0

    slow = rules.credit_in_process(META, _counted([1.0, 1.5, 1.0], counted_from=2), ["wgmma", "tma"], WORK, 1.0,
                                 module_opcodes=NO_BULK)
    assert slow.kernel_ms == 1.0 and slow.carries == {"wgmma": False, "tma": False}
    assert slow.notes["wgmma"].startswith("counted run 3's kernels took 1.5 ms, the timed runs 1 ms (median)")
    assert "not the one whose instructions were counted" in slow.notes["tma"]

    fast = rules.credit_in_process(META, _counted([1.0, 1.0, 0.5], counted_from=2), ["wgmma"], WORK, 1.0,
                                 module_opcodes=NO_BULK)
    assert fast.carries["wgmma"] is False and fast.notes["wgmma"].startswith("counted run 4's kernels took 0.5 ms")
    assert "the timed runs took a slower path" in fast.notes["wgmma"]

    untimed = rules.credit_in_process(META, _counted([1.0, 9.0, 0.1]), ["wgmma"], WORK, None, module_opcodes=NO_BULK)
    assert untimed.carries["wgmma"] is True  # nothing timed: no speed claimed, nothing tied


def test_the_withheld_credit_names_the_counted_runs():
    ok = rules.credit_in_process(META, _counted([1.0, 1.0]), ["wgmma"], WORK, 1.0, module_opcodes=NO_BULK)
    slow = rules.credit_in_process({"workload": "M70", "split": "held_out"}, _counted([1.0, 2.0], counted_from=3),
                                 ["wgmma"], WORK, 1.0, module_opcodes=NO_BULK)
    out = rules.combine(["wgmma"], [ok, slow])
    assert out.carries["wgmma"] is False
    assert out.notes["wgmma"].startswith("held-out workload #1 (counted runs 3-5): counted run 4's kernels took 2 ms")


def test_the_worker_reports_what_the_tie_needs():
    """End to end: the timed (counted) runs' times as the worker measured them, by pass, reach the
    tie; one hardware pass whose runs are 30% slower than the other's withdraws the credit, whatever
    the instrumented run took."""
    honest = {m: v for m, v in HONEST.items() if m in rules.credit_metrics()}
    for ms, carried in (({0: 1.0, 1: 1.0, 2: 30.0}, True), ({0: 1.0, 1: 1.3, 2: 1.0}, False)):
        state = CountedState(gemm, metrics_of=lambda counted: honest, ms_of=ms.__getitem__)
        result, _ = with_counted_runs(state, request(8))
        credit = result["credit"]
        # the other pass's runs made first in their pair: too few here for a band (then the timed median)
        assert credit["pass_band_ms"] == counted.pass_bands(rules.pass_tie_runs(credit["pass_ms"], credit["pass_first_ms"]))
        firsts = [c for i, (c, _) in enumerate(credit["pair_ms"]) if i % 2 == 0]  # the even pairs: candidate first
        assert [x for p in credit["pass_first_ms"] for x in p] == firsts
        wc = rules.credit_in_process(META, credit, ["wgmma"], WORK, 1.0, module_opcodes=NO_BULK)
        assert wc.status == "ok" and wc.carries["wgmma"] is carried, wc
        assert wc.pass_ms == [ms[0], ms[1]] and wc.pass_band_ms == credit["pass_band_ms"]
        if not carried:
            assert wc.notes["wgmma"].startswith("hardware pass 2's timed runs took (median) 1.3 ms, the timed runs 1 ms"), \
                wc.notes


def test_the_nsight_compute_run_is_tied_by_its_kernel_time_both_ways():
    ran = {"status": "ran", "launches": [{"name": "k", "metrics": HONEST}]}  # 1.0 ms counted (gpu__time_duration)
    assert rules.credit_in_process(META, ran, ["wgmma"], WORK, 0.5).carries["wgmma"] is False  # timed path faster
    assert rules.credit_in_process(META, ran, ["wgmma"], WORK, 2.0).carries["wgmma"] is False  # timed path slower
    assert rules.credit_in_process(META, ran, ["wgmma"], WORK, 1.0).carries["wgmma"] is True


# ---------------------------------------------------------------- what is counted

@pytest.mark.parametrize("metric,bad,why", [
    (rules.GMMA_METRIC, float("nan"), f"no executed-instruction counts for wgmma (CUPTI read no value for {rules.GMMA_METRIC})"),
    (rules.HGMMA_OPS_METRICS[0], float("inf"), "the share of the work wgmma carried could not be measured"),
    ("smsp__thread_inst_executed_pred_on.sum", float("nan"),
     "the math done outside wgmma (other tensor-pipe, thread, uniform and reduction instructions) could not be "
     "measured"),
    (rules.TMA_BYTES_METRIC, float("nan"), "the share of the work tma carried could not be measured"),
])
def test_a_counter_cupti_could_not_read_is_not_measured(metric, bad, why):
    """NaN or inf (a pass that was not collected) is left out of the rows, so the feature it
    decides is not measured and not credited; the other feature is decided as before."""
    counters = {m: HONEST.get(m, 0.0) for m in rules.credit_metrics()}
    counters[metric] = bad
    assert metric not in rules.counter_rows([{"name": "k", "metrics": counters}], NO_BULK)[0]
    wc = rules.credit_in_process(META, _counted([1.0], metrics=counters), ["wgmma", "tma"], WORK, 1.0, module_opcodes=NO_BULK)
    if metric == rules.GMMA_METRIC:
        assert wc.status == "skipped" and wc.reason == why and not any(wc.carries.values())
    else:
        lost = "tma" if metric == rules.TMA_BYTES_METRIC else "wgmma"
        assert wc.status == "ok" and wc.notes[lost] == why
        assert wc.carries == {"wgmma": lost != "wgmma", "tma": lost != "tma"}


def test_an_unread_counter_from_the_worker_is_not_measured():
    """The same, end to end: NaN from CUPTI comes back in the credit op's reply as NaN (pickled;
    None once a result went through JSON) and reaches the verdict as not measured, not as an
    error; the other feature is decided as before."""
    counters = {m: HONEST.get(m, 0.0) for m in rules.credit_metrics()}
    counters[rules.TMA_BYTES_METRIC] = float("nan")
    state = CountedState(gemm, metrics_of=lambda counted: counters)
    result, _ = with_counted_runs(state, request(3, time=False))
    reported = result["credit"]["launches"][0]["metrics"]
    assert math.isnan(reported[rules.TMA_BYTES_METRIC]) and reported[rules.GMMA_METRIC] == HONEST[rules.GMMA_METRIC]
    assert rules.TMA_BYTES_METRIC not in rules.counter_rows(result["credit"]["launches"], NO_BULK)[0]
    wc = rules.credit_in_process(META, result["credit"], ["wgmma", "tma"], WORK, None, module_opcodes=NO_BULK)
    assert wc.status == "ok" and wc.carries == {"wgmma": True, "tma": False}, wc
    assert wc.notes["tma"] == "the share of the work tma carried could not be measured"


def test_hardware_counters_alone_give_the_verdict():
    """No per-opcode counts in process: wgmma and TMA are counted by their own counters and the
    shares decide as before."""
    wc = rules.credit_in_process(META, {"status": "ran", "runs": 3, "profiled_at": 2,
                                      "launches": [{"name": "k", "metrics": HONEST}]}, ["wgmma", "tma"], WORK, 1.0,
                                 NO_BULK)
    assert wc.status == "ok" and wc.carries == {"wgmma": True, "tma": True}, wc
    assert wc.counts == {"wgmma": 4_000_000, "tma": 300_000}
    no_tma = dict(HONEST, **{"sm__inst_executed_pipe_tma.sum": 0.0})
    wc = rules.credit_in_process(META, {"status": "ran", "launches": [{"name": "k", "metrics": no_tma}]},
                               ["wgmma", "tma"], WORK, 1.0)
    assert wc.executed["tma"] is False and wc.carries["tma"] is False
    simt = _counters(smsp__thread_inst_executed_pred_on__dot__sum=WORK.flops / 2,
                     smsp__inst_executed_pipe_tensor_op_gmma__dot__sum=8,
                     sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum=WORK.flops * 0.001,
                     gpu__time_duration__dot__sum=1.0e6)
    wc = rules.credit_in_process(META, {"status": "ran", "launches": [{"name": "k", "metrics": simt}]},
                               ["wgmma"], WORK, 1.0)
    assert wc.executed["wgmma"] and not wc.carries["wgmma"]


def test_a_workload_whose_run_was_not_counted_withholds_credit():
    wc = rules.credit_in_process({"workload": "M70", "split": "held_out"}, {"status": "failed", "runs": 2,
                                                                          "reason": "CUPTI error 7"}, ["wgmma"], WORK, 1.0)
    assert wc.status == "skipped" and "CUPTI error 7" in wc.reason


# ---------------------------------------------------------------- CUPTI's host half, real library

def _host_library():
    try:
        return cupti.library()
    except CuptiError as exc:
        pytest.fail(f"libcupti is a dev dependency (nvidia-cuda-cupti): {exc}")


def test_an_unknown_metric_is_a_clear_error():
    _host_library()
    with pytest.raises(CuptiError, match="cuptiProfilerHostConfigAddMetrics"):
        cupti.passes("GH100", ["sm__no_such_counter.sum"])


def test_struct_sizes_follow_cuptis_rule():
    """CUPTI_PROFILER_STRUCT_SIZE is the end of the last field, not sizeof: a struct that ends
    in a byte (Stop) is smaller than its padded size."""
    assert cupti.Stop.size == cupti.Stop.isAllPassSubmitted.offset + 1 < __import__("ctypes").sizeof(cupti.Stop)
    assert cupti.Init.size == 16 and cupti.SetConfig.size == cupti.SetConfig.targetNestingLevel.offset + 2


def test_a_hang_under_kernel_replay_is_the_verdict_not_a_profiler_error(monkeypatch):
    """profile(run) (kernel replay, kept for the probe): a run that hangs is reported as the hang,
    even though CUPTI then fails to stop its range. (User replay: tests/test_cupti_user_replay.py.)"""
    from tools.timing import KernelTimeout

    calls = []

    def call(fn, params):
        calls.append(fn)
        if fn == "cuptiRangeProfilerStop":  # a range that cannot be stopped: the GPU is stuck
            raise CuptiError(f"{fn} failed")

    monkeypatch.setattr(cupti, "_call", call)
    prof = cupti.RangeProfiler.__new__(cupti.RangeProfiler)
    prof.keep_enabled, prof.replay, prof._obj, prof._data = False, "kernel", 1, (cupti.C.c_uint8 * 8)()
    prof.metrics, prof.host = [], type("H", (), {"config": (cupti.C.c_uint8 * 8)(), "_names": None})()

    def run():
        raise KernelTimeout("no result within 1 s")

    with pytest.raises(KernelTimeout):
        prof.profile(run)
    assert "cuptiRangeProfilerStop" in calls and calls[-1] == "cuptiRangeProfilerDisable"


def test_without_cupti_the_check_falls_back_to_nsight_compute_and_says_why(monkeypatch):
    """Where the worker's counters are unavailable the evaluator counts with a Nsight Compute
    process instead (tools.ncu.CreditProcess; here a stand-in), and the result names the reason."""
    from types import SimpleNamespace

    from tools.evaluator import Evaluator
    from tools.results import EvalResult, ExecutedCheck, WorkloadResult

    made = []

    class FakeCreditProcess:
        def __init__(self, features, env, timeout_s, extra_metrics=()):
            made.append(list(features))
            self.extra_metrics = tuple(extra_metrics)

        def finish(self, requests, device, works=None, timed_ms=None):
            assert [q["workload"]["name"] for q in requests] == ["M128"] and all("credit_seed" in q for q in requests)
            return ExecutedCheck(status="ok", executed={"wgmma": True}, carries={"wgmma": True})

        def close(self):
            pass

    monkeypatch.setattr(ncu, "CreditProcess", FakeCreditProcess)
    task = small_gemm()
    task.requested_features = {"sm_90a": ["wgmma"]}
    ev = Evaluator(gpus=[], seed=1)
    ev._workers = [SimpleNamespace(env_without_device={})]
    res = EvalResult.model_construct(
        compile=SimpleNamespace(cubin=b"", symbols={}), gpu="cpu", workloads=[
            WorkloadResult(workload="M128", split="visible", axes={"M": 128}, status="passed",
                           credit={"status": "unavailable", "reason": "no libcupti with a range profiler found"})])
    sol = Solution.from_dir(FIXTURES / "good")
    ex = ev._executed(res, sol, task, task.workloads[:1], None, Counting(mode="cupti"), "0", arch="sm_90a")
    assert made == [["wgmma"]] and ex.status == "ok" and ex.carries == {"wgmma": True}
    assert "in-process counters unavailable (no libcupti" in ex.reason and "Nsight Compute counted instead" in ex.reason
    assert ex.profile is not None and ex.profile.status == "skipped" and "not asked for" in ex.profile.reason


# ---------------------------------------------------------------- one profiler session per evaluation

def _deferred(state, time: bool = True, evaluation: str = "e1") -> tuple[list[dict], list[int]]:
    """Both workloads of the small GEMM, deferred: their results and the launch count after each."""
    results, after = [], []
    for k in (0, 1):
        result, fatal = worker.run_workload(state, request(3 + k, time=time, workload=k, evaluation=evaluation))
        assert not fatal, result
        results.append(result)
        after.append(state.launches)
    return results, after


def test_deferred_workloads_are_counted_in_one_session_after_the_last_timed_run():
    """Deferred: each workload is judged (the seeded checks) and its module and workspace kept
    ("pending"); the credit op then times every workload, every timed run counted, in one profiler
    session (one profile_passes call: CUPTI's start and its SASS patching paid once), each pass one
    stretch of each workload in order, each run in a range of its own workload's. Each workload gets
    its own counts (the mean over its ranges), run times and its whole result (timing) back."""
    state = CountedState(gemm, metrics_of=lambda counted: {"n": float(len(counted)), "M": float(counted[0]["M"])})
    results, after = _deferred(state)
    assert [r["credit"]["status"] for r in results] == ["pending", "pending"] and not state.counted
    assert state.kept == 2 and [e.workload for e in state.pending] == ["M128", "M70"]
    reply, fatal = counted.run_pending(state)
    assert not fatal and reply["op"] == "credits" and not reply["failed"] and state.pending == []
    assert state.profiler.names and len(state.profiler.names) == 1  # one session for the evaluation
    m0, m1 = (reply["credits"][w]["ranged_runs"] for w in ("M128", "M70"))
    a, b = f"{counted.COUNTED_RANGE}_0", f"{counted.COUNTED_RANGE}_1"
    per_pass = [f"{a}#{j}" for j in range(m0)] + [f"{b}#{j}" for j in range(m1)]
    assert [e for _, e in state.profiler.ranges] == per_pass * 2 + [a, b]  # per pass: each workload's stretch in turn
    assert [c["M"] for c in state.counted] == ([128] * m0 + [70] * m1) * 2 + [128, 70]
    assert min(c["launch"] for c in state.counted) > after[-1]
    for name, m in (("M128", 128.0), ("M70", 70.0)):
        credit = reply["credits"][name]
        assert credit["status"] == "ran" and credit["reason"] is None and credit["workloads_counted"] == 2
        assert credit["launches"][0]["metrics"] == {"n": 2.0, "M": m}  # its own ranges (a run each pass), its counts
        assert len(credit["run_ms"]) == 2 * credit["ranged_runs"] and len(credit["instrumented_ms"]) == 1
        assert credit["own_s"] >= 0 and len(credit["pass_s"]) == 1 and min(credit["pass_s"][0]) >= 0  # (the patched run)
        assert credit["stops"] == [[1, 1, 0], [2, 1, 0], [0, 1, 1]]
    assert state.restored == 3  # after each workload, and after the counted runs
    assert state.unloaded == 2  # the kept module instances go once their counted runs are made
    assert all(r["timing"] and r["timed_runs"] > 0 and r["status"] == "passed" for r in reply["results"].values())
    assert [r["timing"] for r in results] == [None, None]  # timed at the op, not before


def test_a_deferred_workload_that_answers_wrong_on_a_counted_run_fails_alone():
    """A kernel wrong only on the held-out workload's counted runs: that workload fails
    (wrong_in_timed_run, naming the counted run), the other keeps its counts."""
    state = CountedState(lambda ws, n: ws.outputs["C"].zero_() if state.inside and ws.inputs["A"].shape[0] == 70
                         else gemm(ws, n))
    _deferred(state)
    reply, fatal = counted.run_pending(state)
    assert not fatal and set(reply["failed"]) == {"M70"}
    assert reply["failed"]["M70"]["reason"] == "wrong_in_timed_run"
    assert reply["failed"]["M70"]["detail"].startswith("timed-phase run "), reply["failed"]["M70"]["detail"]
    assert reply["credits"]["M128"]["status"] == "ran"


def test_a_hang_in_the_counted_runs_is_fatal_and_names_its_workload():
    state = CountedState(gemm, hang_at=1)
    _deferred(state)
    reply, fatal = counted.run_pending(state)
    assert fatal and reply["failed"]["M128"]["reason"] == "timeout" and "M70" not in reply["failed"]
    assert "timed-phase run" in reply["failed"]["M128"]["detail"]  # pass 1 holds timed pairs: the first hangs
    assert reply["credits"]["M70"]["status"] == "failed"
    assert "M128's run ended the session" in reply["credits"]["M70"]["reason"]


def test_another_evaluations_deferred_workloads_are_dropped():
    """An evaluation that never sent its credit op leaves nothing behind for the next one."""
    state = CountedState(gemm)
    _deferred(state, evaluation="first")
    worker.run_workload(state, request(9, workload=0, evaluation="second"))
    assert [(e.workload, e.evaluation) for e in state.pending] == [("M128", "second")]
    reply, _ = counted.run_pending(state)
    assert set(reply["credits"]) == {"M128"}


def test_a_later_uncounted_workload_of_the_same_evaluation_keeps_the_deferred_ones():
    """The SASS, read while the first workloads ran, showed no requested instruction: the later
    workloads are sent without counted runs, and the deferred ones, which carry their timed phases,
    stay until the evaluation's credit op times them (H200, issue 43: dropped here, the simple
    attention-backward solution's first three workloads went untimed)."""
    state = CountedState(gemm)
    _deferred(state, evaluation="same")
    req = {**request(9, workload=0), "evaluation": "same"}
    del req["credit"]
    result, fatal = worker.run_workload(state, req)
    assert not fatal and result["timing"] is not None  # timed where it ran: nothing deferred
    assert [e.workload for e in state.pending] == ["M128", "M70"]
    reply, _ = counted.run_pending(state, count=False)
    assert set(reply["results"]) == {"M128", "M70"}
    assert all(r["timing"] and r["timed_runs"] > 0 for r in reply["results"].values())
    other = {**req, "evaluation": "another"}
    _deferred(state, evaluation="same")
    worker.run_workload(state, other)  # another evaluation's request: the kept ones go
    assert state.pending == []


def test_the_deferred_workspaces_are_memory_kept_on_purpose():
    """State.restore's lost-memory check leaves out what deferred workspaces hold."""
    from types import SimpleNamespace

    state = CountedState(gemm)
    _deferred(state)
    held = worker.State.held_bytes(SimpleNamespace(pending=state.pending))
    expected = sum(g.raw.numel() for e in state.pending for g in e.ws.guarded.values())
    assert held == expected > 2 * 128 * 64



# An extra kernel in the module, never launched: an fp8 wgmma (QGMMA) in the module's SASS, so the
# module holds a requested instruction and its counted runs happen (tests/test_credit_skip.py)
SPARE_QGMMA = r"""
extern "C" __global__ void spare(float* out, unsigned long long da, unsigned long long db) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("wgmma.fence.sync.aligned;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, 0, 1, 1;\n"
               "wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db));
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
"""
WARP_MMA = {"qgmma": SPARE_QGMMA}  # by the MMA class it puts in the module's SASS (tests/test_credit_skip.py)

def _through_the_evaluator(mode_name: str, tmp_path, monkeypatch, timeout_s: float = 30, time: bool = False):
    import sys

    from test_evaluator_cpu import ROOT

    from tools.evaluator import Evaluator

    mode = tmp_path / "mode"
    mode.write_text(mode_name)
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(mode))
    monkeypatch.delenv("PTXBENCH_CREDIT", raising=False)
    # the SIMT GEMM with a QGMMA in the module: a module whose SASS holds no requested instruction
    # gets no counted runs at all (tests/test_credit_skip.py)
    sol = tmp_path / "sol"
    sol.mkdir(exist_ok=True)
    (sol / "kernel.cu").write_text((FIXTURES / "good" / "kernel.cu").read_text() + SPARE_QGMMA)
    (sol / "launch.json").write_text((FIXTURES / "good" / "launch.json").read_text())
    with Evaluator(gpus=[0], worker_cmd=[sys.executable, str(ROOT / "tests" / "fake_worker.py")], timeout_s=timeout_s,
                   cache_dir=tmp_path) as ev:
        return ev.evaluate(Solution.from_dir(sol), small_gemm(), "sm_90a", executed_check=True,
                           time=time, workloads="all")


def test_the_evaluator_asks_for_the_counted_runs_once_after_the_last_workload(tmp_path, monkeypatch):
    r = _through_the_evaluator("fp8_wgmma", tmp_path, monkeypatch)
    assert [w.status for w in r.workloads] == ["passed", "passed"]
    assert all(w.credit["status"] == "ran" and w.phase_s["credit"] == 0.02 for w in r.workloads)
    assert r.executed.status == "ok" and "counted_runs" in r.phase_s


def test_a_counted_run_answered_wrong_fails_its_workload_through_the_evaluator(tmp_path, monkeypatch):
    r = _through_the_evaluator("counted_wrong", tmp_path, monkeypatch)
    first = r.workloads[0]
    assert first.status == "failed" and first.reason == "wrong_in_timed_run" and "counted run 2" in first.detail
    assert r.workloads[1].status == "passed" and r.correct is False


def test_no_counted_runs_are_asked_for_once_a_workload_killed_the_worker(tmp_path, monkeypatch):
    """The second workload kills the context: the evaluation stops, and the first workload's kept
    counted runs died with that worker; none are asked of the next one, and the credit says why."""
    r = _through_the_evaluator("fp8_then_fatal", tmp_path, monkeypatch)
    assert [(w.status, w.reason) for w in r.workloads] == [("passed", None), ("failed", "cuda_error")]
    first = r.workloads[0].credit
    assert first["status"] == "failed" and "ended with cuda_error" in first["reason"], first
    assert "counted_runs" not in r.phase_s and r.correct_with_arch is not True


def test_counted_runs_that_never_answer_credit_nothing(tmp_path, monkeypatch):
    r = _through_the_evaluator("counted_hang", tmp_path, monkeypatch, timeout_s=8)  # 3 s failed a loaded 2-core machine
    assert [w.status for w in r.workloads] == ["passed", "passed"]
    assert all(w.credit["status"] == "failed" and "gave no answer" in w.credit["reason"] for w in r.workloads)
    assert r.executed.status != "ok" or not any(r.executed.carries.values())


def test_a_worker_that_dies_in_the_counted_runs_quotes_held_out_output_to_no_visible_workload(tmp_path, monkeypatch):
    """The credit op runs every kept workload, held-out ones too, in the one worker; a worker that
    dies there is quoted by its last words, and a kernel's debug printf lands in them ("rows 70":
    held-out M70). Every visible workload's credit said why it was not counted with those words,
    and a visible workload's credit reaches a model and a client: now it says what happened, and
    the held-out workloads keep the words (eval.json, for the researcher)."""
    from agent.commands.evaluate import eval_json
    from agent.feedback import redact_held_out

    r = _through_the_evaluator("counted_crash", tmp_path, monkeypatch)
    seen, held = r.workloads
    assert held.split == "held_out" and "rows 70" in held.credit["reason"] and "SIGSEGV" in held.credit["reason"]
    assert "SIGSEGV" in seen.credit["reason"] and "rows" not in seen.credit["reason"]
    assert "kept with the held-out workloads" in seen.credit["reason"]
    assert "rows 70" not in json.dumps(eval_json(redact_held_out(r)))


# ---------------------------------------------------------------- the instrumented run

def test_a_kernel_that_answers_wrong_only_on_the_instrumented_run_fails():
    """The SASS-patched pass's run is not tied by time (it runs 2.6-100x slower) but it is
    judged: a kernel that senses instrumentation and drops its SIMT math there must still answer
    right there, so what it counts there is a path that does the work. Dropping it is
    wrong_in_timed_run, naming the counted run (3 of 3: the instrumented pass is CUPTI's last)."""
    state = CountedState(lambda ws, n: ws.outputs["C"].zero_() if state.inside and state.pass_index == 2
                         else gemm(ws, n))
    _deferred(state)
    reply, fatal = counted.run_pending(state)
    assert not fatal and set(reply["failed"]) == {"M128", "M70"}
    assert all(f["reason"] == "wrong_in_timed_run" and "counted run 3 (after the timed runs)" in f["detail"]
               for f in reply["failed"].values())


def test_counted_runs_that_could_pass_their_cap_are_skipped_never_credited(monkeypatch):
    """A kernel slow enough that its SASS-patched pass could run for minutes (issue 43): before that
    pass's first run, the time spent plus what the run may take (INSTRUMENTED_SLOWDOWN x its timed
    median) passes COUNTED_CAP_S, so the counted runs stop there: every workload's credit is
    skipped with the figures (the executed check never passes on it), no workload fails, nothing is
    fatal, and the workloads' modules are unloaded as after any counted runs."""
    state = CountedState(gemm)
    _deferred(state)
    monkeypatch.setattr(counted, "INSTRUMENTED_SLOWDOWN", 1e9)  # any timed median: hours
    reply, fatal = counted.run_pending(state)
    assert not fatal and not reply["failed"]
    assert set(state.passes_counted()) == {0, 1}  # both hardware passes ran; the patched one never started
    for credit in reply["credits"].values():
        assert credit["status"] == "skipped"
        assert credit["reason"].startswith("not counted: the counted runs would pass their 30 s cap")
        assert "M128's run of pass 3" in credit["reason"] and "SASS-patched" in credit["reason"]
    assert state.unloaded == 2
    meta = {"workload": "M128", "split": "visible"}
    assert rules.credit_in_process(meta, reply["credits"]["M128"], ["wgmma"], WORK, 1.0, NO_BULK).status == "skipped"


@pytest.mark.parametrize("timed", [False, True])
def test_the_cap_counts_what_the_counted_runs_already_took(monkeypatch, timed):
    """A cap already spent stops the counted runs: untimed, before the first one; timed, after the
    first pass's stretch (where the stop is decided), before the second pass's (it may take what the
    first took: tools.counted.stretch_over_cap). Either way nothing is credited (skipped), and a
    timed workload keeps its timing (the pairs left run uncounted; tests/test_counted_stop.py: a
    phase whose stop was decided ends there)."""
    state = CountedState(gemm)
    _deferred(state, time=timed)
    monkeypatch.setattr(counted, "COUNTED_CAP_S", 0.0)
    reply, fatal = counted.run_pending(state)
    assert not fatal and not reply["failed"]
    assert {c["status"] for c in reply["credits"].values()} == {"skipped"}
    if timed:
        assert set(state.passes_counted()) == {0}  # the first pass's timed pairs; pass 2 never started
        assert all("timed pairs of pass 2 may take" in c["reason"] for c in reply["credits"].values()), reply["credits"]
        assert all(r["timing"] for r in reply["results"].values())
    else:
        assert state.counted == []


# ---------------------------------------------------------------- the tie to the other timed runs' band

def test_the_worker_ties_each_pass_to_the_band_of_the_other_passes_runs():
    """End to end through the timed pairs (tests/test_credit_tie.py has the rule): every pair's
    candidate time (`pair_ms`, warm-up pairs included), every ranged run's by pass (`pass_ms`) and
    each pass's band (`pass_band_ms`: the range of the other passes' runs) reach the credit; all
    runs slower alike are the timed kernel (credited), one pass 20% off the others loses it."""
    honest = {m: v for m, v in HONEST.items() if m in rules.credit_metrics()}
    for ms_of, carried in ((lambda i: 1.2, True), (lambda i: 1.2 if i == 2 else 1.0, False)):
        state = CountedState(gemm, metrics_of=lambda counted: honest, ms_of=ms_of, passes=4, instrumented=())
        result, _ = with_counted_runs(state, request(8, timing_seed=8))
        credit = result["credit"]
        m = credit["ranged_runs"]
        assert len(credit["pair_ms"]) == result["warmup_runs"] + result["timed_runs"] == 4 * m
        assert [p[0] for p in credit["pair_ms"]] == credit["run_ms"] == [x for runs in credit["pass_ms"] for x in runs]
        assert credit["pass_ms"] == [[ms_of(k)] * m for k in range(4)]
        assert "tie_band_ms" not in credit and "counted_pairs" not in credit  # no run is chosen
        wc = rules.credit_in_process(META, credit, ["wgmma"], WORK, result["timing"]["median_ms"], module_opcodes=NO_BULK)
        assert wc.carries["wgmma"] is carried, wc.notes
        if not carried:
            assert wc.notes["wgmma"].startswith("hardware pass 3's timed runs took (median) 1.2 ms, the other passes' "
                                                "runs 1-1 ms (their range)"), wc.notes
