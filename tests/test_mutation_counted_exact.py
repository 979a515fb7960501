"""tools.counted's exact counts and Nsight Compute's credit runs, each alone and in process (issue 46,
pass 5): `exact_counts` (one more counted run per workload under CUPTI's SASS metrics, its records
turned into per-opcode executions, or named as missing) on stand-ins with tools.cupti's real
interfaces (`SassCounter.collect(run) -> [SassRecord]`, `CuptiError`), and `run_credit` /
`_prepared_runs` (the runs Nsight Compute's process makes, one of them profiled) on the worker's CPU
stand-in. tests/test_exact_counts.py and tests/test_credit.py run the same code inside whole sessions
(seconds a test); here every rule is checked on its own, well under a second each, so mutation
testing (scripts/mutation.sh tools/counted.py) reaches them. The real API: tests/gpu/."""
from __future__ import annotations

import contextlib
import random
import time
from types import SimpleNamespace

import pytest
from test_evaluator_cpu import CpuState, FIXTURES, gemm, small_gemm

from tools import counted
from tools.cupti import SASS_INST_EXECUTED, CuptiError, SassRecord
from tools.solution import Solution
from tools.timing import KernelTimeout

SITES = {"gemm": {0x100: "UTMALDG.2D", 0x200: "UBLKCP.S.G"}, "reduce": {0x40: "UTMALDG.2D"}}


class Counter:
    """tools.cupti.SassCounter as exact_counts uses it: `collect(run)` calls `run()` with the SASS
    metrics on and returns the records of every patched instruction. `records`: what it returns for
    each call in turn; `fail`: a CuptiError raised at collect (CUPTI refused or dropped records)."""

    def __init__(self, records, fail: str | None = None):
        self.records, self.fail, self.inside = list(records), fail, False

    def collect(self, run):
        if self.fail:
            raise CuptiError(self.fail)
        self.inside = True
        try:
            run()
        finally:
            self.inside = False
        return self.records.pop(0)


class State:
    """The worker's state as exact_counts reads it: `sass_counter()` (set-up seconds `setup_s`)."""

    def __init__(self, counter=None, fail: str | None = None, setup_s: float = 0.0):
        self.counter, self.fail, self.setup_s, self.asked = counter, fail, setup_s, 0

    def sass_counter(self):
        self.asked += 1
        time.sleep(self.setup_s)
        if self.fail:
            raise CuptiError(self.fail)
        return self.counter


def entry(name: str, **out) -> SimpleNamespace:
    """A workload's side of the check as the hardware passes left it (tools.counted.Counted's `out`
    and `seconds`: exact_counts reads nothing else)."""
    return SimpleNamespace(workload=name, seconds=0.0, out={"status": "ran", "launches": [{"name": "gemm"}], **out})


def runner(counter: Counter, log: list, seconds: float = 0.0, fail: dict | None = None):
    """run_counted's `counted_run(e, k, patched, around, part)`: the run made inside `around`, whose
    answer it returns; logged, and each entry's own seconds grown as the real one grows them."""
    def counted_run(e, k, patched, around, part=None):
        log.append((e.workload, k, patched, part))
        if fail and e.workload in fail:
            raise fail[e.workload]
        e.seconds += seconds

        def run():
            assert counter.inside, "the run is made inside collect"
            log.append((e.workload, "run"))

        def wait():
            assert counter.inside, "and waited for there: its instructions are counted before collect returns"
            log.append((e.workload, "wait"))
        return around(run, wait)
    return counted_run


def rec(function: str, pc: int, n: int) -> SassRecord:
    return SassRecord(function, pc, {SASS_INST_EXECUTED: n})


def test_no_workload_to_count_sets_up_nothing():
    """Every workload failed or was not counted: no SASS metrics are set up (CUPTI's patching costs
    seconds), no run is made, nothing is charged."""
    state, log, spent = State(fail="must not be asked"), [], {"exact_count_run": 0.0}
    counted.exact_counts(state, [], SITES, runner(Counter([]), log), 3, spent)
    assert state.asked == 0 and log == [] and spent == {"exact_count_run": 0.0}


def test_each_workload_gets_one_instrumented_run_and_its_counts_per_opcode():
    """One run per workload, in order, as the last pass after the hardware ones (k = the passes, so
    the run is named as the next counted run), SASS-patched (ungated, timed, never tied), its seconds
    charged to the exact-count part; each workload's counts are its own run's records per full opcode,
    summed over the sites of every function, every site's opcode present (0 where it never ran)."""
    counter = Counter([[rec("gemm", 0x100, 40), rec("gemm", 0x200, 0), rec("reduce", 0x40, 2)],
                       [rec("gemm", 0x100, 7), rec("gemm", 0x200, 3), rec("reduce", 0x40, 0)]])
    a, b = entry("M128", runs=3, exact_runs=1), entry("M70")
    a.seconds, b.seconds = 1.0, 2.0
    log: list = []
    counted.exact_counts(State(counter), [a, b], SITES, runner(counter, log, seconds=0.123456), 3)
    assert log == [("M128", 3, True, "exact_count_run"), ("M128", "run"), ("M128", "wait"),
                   ("M70", 3, True, "exact_count_run"), ("M70", "run"), ("M70", "wait")]
    assert a.out["launches"][0]["opcodes"] == {"UTMALDG.2D": 42, "UBLKCP.S.G": 0}
    assert b.out["launches"][0]["opcodes"] == {"UTMALDG.2D": 7, "UBLKCP.S.G": 3}
    assert "opcodes_missing" not in a.out["launches"][0] and "opcodes_missing" not in b.out["launches"][0]
    # one more run of each, counted in `runs` beside the passes' (exact_runs from none or from what was there)
    assert (a.out["exact_runs"], a.out["runs"]) == (2, 4)
    assert (b.out["exact_runs"], b.out["runs"]) == (1, 1)
    # its share of the counted runs, this run included, to 4 places (the record's precision elsewhere)
    assert a.out["own_s"] == 1.1235 and b.out["own_s"] == 2.1235


def test_the_counters_set_up_is_charged_to_the_exact_count_part():
    """CUPTI's SASS-metrics set-up (patching configuration, seconds on the H200) is the check's cost,
    added to what the counted runs put there, also when CUPTI refuses it."""
    counter = Counter([[rec("gemm", 0x100, 1)]])
    spent = {"exact_count_run": 5.0}
    counted.exact_counts(State(counter, setup_s=0.05), [entry("M128")], {"gemm": {0x100: "UTMALDG.2D"}},
                         runner(counter, []), 2, spent)
    assert 5.05 <= spent["exact_count_run"] < 5.5
    spent = {"exact_count_run": 5.0}
    counted.exact_counts(State(fail="CUPTI_ERROR_NOT_SUPPORTED", setup_s=0.05), [entry("M128")], SITES,
                         runner(counter, []), 2, spent)
    assert 5.05 <= spent["exact_count_run"] < 5.5


def test_a_counter_cupti_will_not_set_up_leaves_every_workload_to_the_modules_sass():
    """No SASS metrics (an old driver, a device CUPTI does not support): no run is made, and every
    workload's launch says why its per-opcode counts are missing (tools.credit then lets the module's
    SASS decide: it holds a bulk load, so TMA is refused, never credited on a guess)."""
    log: list = []
    a, b = entry("M128", runs=3), entry("M70", runs=3)
    refused = State(fail="CUPTI_ERROR_NOT_SUPPORTED: " + "x" * 400)
    counted.exact_counts(refused, [a, b], SITES, runner(Counter([]), log), 3)
    assert log == []
    for e in (a, b):
        missing = e.out["launches"][0]["opcodes_missing"]
        assert len(missing) == 1 and missing[0].startswith("CUPTI: CUPTI_ERROR_NOT_SUPPORTED: x")
        assert len(missing[0]) == 300  # cut, so a long CUPTI message cannot swell every reply
        assert "opcodes" not in e.out["launches"][0] and e.out["runs"] == 3 and "exact_runs" not in e.out


def test_a_refused_collection_names_that_workload_and_the_next_is_still_counted():
    """CUPTI refusing one workload's collection (dropped records) costs that workload its exact counts,
    not the others'; the refused run is no exact run."""
    counter = Counter([[rec("gemm", 0x100, 9), rec("gemm", 0x200, 0), rec("reduce", 0x40, 0)]])
    a, b = entry("M128", runs=3), entry("M70", runs=3)
    counted.exact_counts(State(counter), [a, b], SITES,
                         runner(counter, [], fail={"M128": CuptiError("CUPTI_ERROR_OUT_OF_MEMORY " + "y" * 400)}), 3)
    missing = a.out["launches"][0]["opcodes_missing"]
    assert missing[0].startswith("CUPTI: CUPTI_ERROR_OUT_OF_MEMORY y") and len(missing[0]) == 300 and len(missing) == 1
    assert "opcodes" not in a.out["launches"][0] and "exact_runs" not in a.out and a.out["runs"] == 3
    assert b.out["launches"][0]["opcodes"] == {"UTMALDG.2D": 9, "UBLKCP.S.G": 0} and b.out["exact_runs"] == 1


def test_a_hang_in_the_exact_run_ends_the_session():
    """A hang or a dead context is fatal, as in the hardware passes (run_pending names the workload):
    it propagates, and no later workload is run on the dead context."""
    log: list = []
    with pytest.raises(KernelTimeout):
        counted.exact_counts(State(Counter([])), [entry("M128"), entry("M70")], SITES,
                             runner(Counter([]), log, fail={"M128": KernelTimeout("hung")}), 3)
    assert [x for x in log if x[0] == "M70"] == []


def test_sites_without_a_record_are_named_at_most_twenty():
    """A site CUPTI returned no record for (its function was not patched) has unknown executions:
    named as `function+0xpc`, so the credit refuses what they might have been; the list is cut at 20
    (a module may hold hundreds of TMA sites; one is enough to refuse)."""
    sites = {"gemm": {0x10 * i: "UTMALDG.2D" for i in range(1, 26)}}
    counter = Counter([[rec("gemm", 0x10, 5)]])
    e = entry("M128")
    counted.exact_counts(State(counter), [e], sites, runner(counter, []), 3)
    launch = e.out["launches"][0]
    assert launch["opcodes"] == {"UTMALDG.2D": 5}
    assert launch["opcodes_missing"] == [f"gemm+0x{0x10 * i:x}" for i in range(2, 22)]
    assert e.out["exact_runs"] == 1  # the run was made; what it could not count is named


# ---------------------------------------------------------------------------------------------
# run_credit and _prepared_runs: Nsight Compute's process (the fallback where CUPTI cannot run)
# ---------------------------------------------------------------------------------------------

class Recorded(CpuState):
    """The CPU stand-in with a profiler window (Nsight Compute's --profile-from-start off range):
    every launch numbered with its inputs and whether the window was open; every wait's limit."""

    def __init__(self, kernel=gemm, restore_fails: bool = False):
        self.runs: list[dict] = []
        self.waits: list[float] = []
        self.inside, self.windows, self.restore_fails = False, 0, restore_fails

        def launch(ws, call):
            self.runs.append({"A": ws.inputs["A"].clone(), "profiled": self.inside})
            return kernel(ws, call)

        super().__init__(launch)

    @contextlib.contextmanager
    def profiler_window(self):
        self.windows += 1
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def wait(self, limit_s):
        self.waits.append(limit_s)

    def bind(self, plan, cubin, symbols, ws):
        self.bound_with = (plan, cubin, symbols, ws)
        return super().bind(plan, cubin, symbols, ws)

    def restore(self):
        self.restored += 1
        if self.restore_fails:
            raise RuntimeError("context lost")


def request(seed: int, **extra) -> dict:
    task = small_gemm()
    sol = Solution.from_dir(FIXTURES / "good")
    return {"cubin": b"", "manifest": sol.manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
            "workload": task.workloads[1].model_dump(mode="json"), "seeds": [11, 12], "credit_seed": seed, **extra}


def drawn(seed: int) -> tuple[int, int, list[int]]:
    """What the request's secret seed draws, in the order run_credit draws it: how many credit runs
    (CREDIT_RUNS, both ends reachable), which one is profiled, then each credit run's input seed."""
    rng = random.Random(seed)
    runs = rng.randint(*counted.CREDIT_RUNS)
    at = rng.randrange(runs)
    return runs, at, [rng.getrandbits(31) for _ in range(runs)]


def test_the_credit_runs_are_drawn_from_the_secret_seed_and_one_is_profiled():
    """After the seeded checks (their own seeds, first, as in the evaluation), 1-8 credit runs on fresh
    inputs from the credit seed; exactly the drawn one inside the profiler's window, never a seeded
    check (so never the module's first launch). The reply says where (1-based) and how many launches
    Nsight Compute will find in the window."""
    from tasks.generators import generate_inputs

    assert counted.CREDIT_RUNS == (1, 8)
    seen = set()
    for seed in (1, 2, 3, 5, 8, 13):
        runs, at, seeds = drawn(seed)
        state = Recorded()
        out = counted.run_credit(state, request(seed))
        assert out == {"workload": "M70", "split": "held_out", "status": "ran", "reason": None, "detail": None,
                       "runs": runs, "profiled_at": at + 1, "launches": 1}, (seed, out)
        assert len(state.runs) == 2 + runs and state.windows == 1
        assert [r["profiled"] for r in state.runs] == [i == 2 + at for i in range(2 + runs)]
        task, wl = small_gemm(), small_gemm().workloads[1]
        for r, s in zip(state.runs, [11, 12] + seeds):  # each run on its own seed's inputs, the fast generator
            want = generate_inputs(task, task.axis_values(wl), s, device="cpu", fast=True)["A"]
            assert r["A"].shape == want.shape and bool((r["A"] == want).all()), (seed, s)
        assert state.restored == 1
        seen.add(runs)
    assert len(seen) >= 3  # the number of runs moves with the seed


def test_every_run_waits_for_the_requests_kernel_limit_or_thirty_seconds():
    state = Recorded()
    out = counted.run_credit(state, request(3, kernel_timeout_s=7))
    assert state.waits == [7.0] * (2 + out["runs"])
    state = Recorded()
    out = counted.run_credit(state, request(3))
    assert state.waits == [30.0] * (2 + out["runs"])


def test_a_run_that_fails_is_reported_with_its_error_and_the_context_restored():
    """The candidate's fault is data, never raised: `run_failed` with the exception's type and its
    first 300 characters; the profiled run not reached is None; the context restored even so."""
    def faults(ws, call):
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS " + "z" * 400)

    state = Recorded(faults)
    out = counted.run_credit(state, request(3))
    assert out["status"] == "failed" and out["reason"] == "run_failed"
    message = "CUDA_ERROR_ILLEGAL_ADDRESS " + "z" * 400
    assert out["detail"] == "RuntimeError: " + message[:300]
    assert out["profiled_at"] is None and out["launches"] == 0 and out["runs"] == drawn(3)[0]
    assert state.restored == 1


def test_a_context_that_cannot_be_restored_does_not_hide_the_answer():
    state = Recorded(restore_fails=True)
    out = counted.run_credit(state, request(3))
    assert out["status"] == "ran" and state.restored == 1


def test_a_fault_in_the_profiled_run_leaves_it_unreached():
    """The launch count and place are recorded only once the profiled run returned."""
    runs, at, _ = drawn(5)

    def faults_when_profiled(ws, call):
        if state.inside:
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")
        return gemm(ws, call)

    state = Recorded(faults_when_profiled)
    out = counted.run_credit(state, request(5))
    assert out["status"] == "failed" and out["profiled_at"] is None and out["launches"] == 0
    assert len(state.runs) == 2 + at + 1  # nothing after the fault


def test_prepared_runs_make_the_counted_one_through_the_profiler_and_zero_scratch_outside_it():
    """_prepared_runs: one run per seed, each on its own seed's inputs, prepared as a timed run is
    (inputs loaded, poison and garbage, L2 flushed, zeroed scratch reset before it, outside what the
    profiler measures); run `at` alone through `counted`, every run waited for."""
    from tools.launch import plan_launches
    from tools.workspace import Workspace

    task = small_gemm()
    axes = task.axis_values(task.workloads[0])
    plan = plan_launches(Solution.from_dir(FIXTURES / "good").manifest, task, axes, CpuState.limits)
    ws = Workspace(task, plan, "cpu")
    log: list = []
    state = SimpleNamespace(device="cpu", flusher=SimpleNamespace(flush=lambda: log.append("flush")),
                            wait=lambda limit: log.append(("wait", limit)))
    orig_load, orig_prepare, orig_zero = ws.load_inputs, ws.prepare, ws.zero_scratch
    ws.load_inputs = lambda inputs: (log.append(("load", int(inputs["A"].flatten()[0].float().item() * 1e6))),
                                     orig_load(inputs))
    ws.prepare = lambda: (log.append("prepare"), orig_prepare())
    ws.zero_scratch = lambda: (log.append("zero"), orig_zero())
    bound = SimpleNamespace(launch=lambda: log.append("launch"))

    def profiled(run):
        log.append("window")
        run()
        log.append("closed")

    counted._prepared_runs(state, task, axes, ws, bound, [11, 12, 13], 9.0, 1, profiled)
    loads = [x for x in log if isinstance(x, tuple) and x[0] == "load"]
    assert len(loads) == 3 and len({x[1] for x in loads}) == 3  # three seeds, three inputs
    # each seed's inputs from the fast generator, as the seeded checks and timed runs draw theirs
    from tasks.generators import generate_inputs
    assert [x[1] for x in loads] == [
        int(generate_inputs(task, axes, s, device="cpu", fast=True)["A"].flatten()[0].float().item() * 1e6)
        for s in (11, 12, 13)]
    steps = [x if not isinstance(x, tuple) or x[0] != "load" else "load" for x in log]
    one = ["load", "prepare", "flush", "zero"]
    assert steps == (one + ["launch", ("wait", 9.0)] + one + ["window", "launch", ("wait", 9.0), "closed"]
                     + one + ["launch", ("wait", 9.0)])


def test_the_module_is_bound_to_the_requests_cubin_symbols_and_plan():
    """The credit process loads the cubin the evaluation compiled, resolves its kernels through the
    request's symbols (a C++ kernel's mangled name), and launches them as the manifest's plan says, on
    the workspace the runs are prepared in."""
    from tools.launch import plan_launches

    req = request(3, cubin=b"\x7fELF cubin", symbols={"gemm_simt": "_Z9gemm_simtPK13__nv_bfloat16"})
    state = Recorded()
    out = counted.run_credit(state, req)
    assert out["status"] == "ran", out
    plan, cubin, symbols, ws = state.bound_with
    task = small_gemm()
    want = plan_launches(Solution.from_dir(FIXTURES / "good").manifest, task, task.axis_values(task.workloads[1]),
                         CpuState.limits)
    assert plan == want and cubin == b"\x7fELF cubin" and symbols == req["symbols"]
    assert ws.task.name == task.name and set(ws.inputs) == set(task.inputs)


def test_a_worker_without_a_profiler_window_still_makes_every_run():
    """Outside Nsight Compute (no profiler range to open) the runs are made all the same."""
    state = CpuState(gemm)
    out = counted.run_credit(state, request(3))
    assert out["status"] == "ran" and out["profiled_at"] == drawn(3)[1] + 1, out


# Found by mutation pass 6 (2026-12-04, issue 46): where the credit runs' tensors live
def test_the_credit_runs_inputs_and_workspace_are_on_the_workers_device(monkeypatch):
    """Every credit run's inputs are generated on the worker's device with the fast generator (the
    timed runs' own: attention backward's O and LSE from a bf16 forward), and the workspace the module
    is bound to is allocated there: on a GPU worker, a CPU default would hand the kernel host memory.
    Recorded on the way through (the CPU stand-in cannot tell "cpu" from a default)."""
    import tasks.generators as G

    generated, workspaces = [], []
    real_generate, real_workspace = G.generate_inputs, counted.Workspace

    def generate(task, axes, seed, **kw):
        generated.append(kw)
        return real_generate(task, axes, seed, **kw)

    def workspace(task, plan, *args):
        workspaces.append(args)
        return real_workspace(task, plan, *args)

    monkeypatch.setattr(G, "generate_inputs", generate)
    monkeypatch.setattr(counted, "Workspace", workspace)
    import torch

    state = Recorded()
    state.device = torch.device("cpu")  # the worker's own device object, handed on as it is
    out = counted.run_credit(state, request(3))
    assert out["status"] == "ran" and len(workspaces) == 1 and workspaces[0][0] is state.device
    assert len(generated) == 2 + out["runs"]
    assert all(kw["device"] is state.device and kw["fast"] is True for kw in generated)
