"""The evaluator's decisions (tools/evaluator.py), in process: an `Evaluator` whose one GPU worker is
a stand-in object answering as tools/worker.py does (no subprocess, no GPU), so each rule is checked
alone and fast (each test well under a second).

- which arch can run where (the worker's compute capability), and why not, in one line;
- what a candidate that cannot run still gets (the manifest's static check on every workload);
- the workload loop: a hang, a CUDA error or a crashed worker stops the rest (skipped, named), a
  worker failure is ours (harness_fault), each request secret-seeded and named by its evaluation;
- the credit op: each pending workload's credit back, a counted run that answered wrong fails its
  workload, a hang in it stops the evaluation, nothing credited where the op gave no answer, and
  what the op cost (its own time apart from the timed phases it ran);
- the executed check's verdict where it is known without counting (no requested opcode in the
  module's SASS), where nothing ran, and how the in-process credit is assembled;
- the work each workload asks for (rows rounded up to whole 128-row tiles for the overwork cap),
  the compile cache, the PTX entries of the launched kernels.

The worker's own process handling (WorkerHandle: start-up, the watchdog, a crash's note) is left to
tests/test_evaluator_cpu.py's fake worker and the GPU suite (seconds a test).
"""
from __future__ import annotations

import random

import pytest

from test_evaluator_cpu import FIXTURES, small_gemm
from tools import evaluator as E
from tools.credit import Counting, TaskWork
from tools.evaluator import Evaluator, WorkerCrash, WorkerStartError, WorkerTimeout
from tools.launch import NOMINAL_LIMITS
from tools.results import CompileResult, EvalResult, ExecutedCheck, InspectResult, KernelSass, Timing, WorkloadResult
from tools.solution import Solution

GOOD = Solution.from_dir(FIXTURES / "good")
PTX = ".visible .entry gemm_simt(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 m, .param .u32 n, .param .u32 k)\n{}"


def compiled(**kw) -> CompileResult:
    base = dict(status="ok", arch="sm_90a", language="cuda", ptx=PTX, cubin=b"cubin", kernels={"gemm_simt": {}})
    return CompileResult(**{**base, **kw})


def sass(*opcodes: str, status="ok") -> InspectResult:
    return InspectResult(status=status, arch="sm_90a",
                         kernels={"gemm_simt": KernelSass(opcodes={o: 1 for o in opcodes})} if opcodes else {})


class Worker:
    """Stands in for WorkerHandle: answers each request with `answer(msg)` (a dict, or an
    exception to raise), records what it was asked and how long it was given."""

    device = "3"
    env = env_without_device = {}

    def __init__(self, answer=None, info=None, start_error=None):
        self.answer = answer or (lambda msg: {"op": "result", "result": passed(msg)})
        self.info = {"gpu": "NVIDIA H200", "cc": "9.0"} if info is None else info
        self.start_error = start_error
        self.asked, self.timeouts, self.kills, self.starts = [], [], 0, 0

    def start(self):
        self.starts += 1
        if self.start_error:
            raise self.start_error
        return self.info

    def request(self, msg, timeout_s):
        self.asked.append(msg)
        self.timeouts.append(timeout_s)
        out = self.answer(msg)
        if isinstance(out, Exception):
            raise out
        return out

    def kill(self):
        self.kills += 1


def passed(msg, **kw) -> dict:
    wl = msg["workload"]
    return WorkloadResult(workload=wl["name"], split=wl["split"], axes=wl["axes"], status="passed",
                          seeds=msg["seeds"], **kw).model_dump(mode="json")


def evaluator(tmp_path, worker: Worker | None = None, **kw) -> Evaluator:
    ev = Evaluator(gpus=[], cache_dir=tmp_path, seed=1, **kw)
    if worker is not None:
        ev._workers = [worker]
        ev._free.put(worker)
    return ev


def result(task=None, comp=None, insp=None) -> EvalResult:
    task = task or small_gemm()
    return EvalResult(task=task.name, arch="sm_90a", compile=comp or compiled(), inspect=insp or sass(),
                      requested_features=task.features_for("sm_90a"))


# ---------------------------------------------------------------------------------------
# The evaluator's own settings
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("timeout,kernel", [(3.0, 5.0), (15.0, 5.0), (30.0, 10.0), (180.0, 60.0), (600.0, 60.0)])
def test_a_kernels_own_timeout_is_a_third_of_the_requests_within_5_to_60_s(tmp_path, timeout, kernel):
    """A third: a request runs the checks, the timed phase and the baseline; at least 5 s (a slow
    honest launch under load), at most 60 s (a hang is found within a minute)."""
    assert evaluator(tmp_path, timeout_s=timeout).kernel_timeout_s == kernel
    assert evaluator(tmp_path, timeout_s=timeout, kernel_timeout_s=7.5).kernel_timeout_s == 7.5


def test_the_evaluators_defaults(tmp_path, monkeypatch):
    ev = evaluator(tmp_path)
    assert (ev.timeout_s, ev.ncu_timeout_s) == (180.0, 600.0)
    assert (ev.timing_budget_s, ev.timing_cap_s) == (E.TIMING_BUDGET_S, E.TIMING_CAP_S)
    assert ev.cache_dir == tmp_path.resolve() and ev.profile_metrics == tuple(E.PROFILE_METRICS)
    assert evaluator(tmp_path, profile_metrics=()).profile_metrics == ()
    assert ev.in_process_credit  # CUPTI in the worker unless PTXBENCH_CREDIT=ncu
    monkeypatch.setenv("PTXBENCH_CREDIT", "ncu")
    assert not evaluator(tmp_path).in_process_credit
    monkeypatch.setenv("PTXBENCH_CREDIT", "cupti")
    assert evaluator(tmp_path).in_process_credit
    assert not ev.has_gpu and ev.no_gpu_reason == "no GPU given (gpus=[])"
    assert ev.gpu_name() is None and ev.gpu_info() is None


def test_seeds_are_drawn_below_2_to_the_31(tmp_path):
    ev = evaluator(tmp_path)
    rng = random.Random(1)
    assert [ev._seed() for _ in range(3)] == [rng.randrange(1, 2**31 - 1) for _ in range(3)]


def test_the_gpu_name_or_why_the_worker_cannot_start(tmp_path):
    assert evaluator(tmp_path, Worker()).gpu_name() == "NVIDIA H200"
    assert evaluator(tmp_path, Worker(info={})).gpu_name() is None
    w = Worker(start_error=WorkerStartError("no driver\nmore"))
    assert evaluator(tmp_path, w).gpu_name() == "unavailable: no driver"
    assert evaluator(tmp_path, Worker(start_error=WorkerStartError(""))).gpu_name() == "unavailable: WorkerStartError"
    assert evaluator(tmp_path, Worker()).has_gpu


# ---------------------------------------------------------------------------------------
# Where an arch can run
# ---------------------------------------------------------------------------------------
def test_an_arch_runs_only_on_its_compute_capability(tmp_path):
    assert evaluator(tmp_path)._cannot_run("sm_90a") == "no GPU: no GPU given (gpus=[])"
    ev = evaluator(tmp_path, Worker())
    assert ev._cannot_run("sm_90a") is None
    assert ev._cannot_run("sm_89") == "unknown arch 'sm_89'"
    assert ev._cannot_run("sm_100a") == ("sm_100a needs a B200/GB200 (compute capability 10.0); this machine has "
                                         "NVIDIA H200 (compute capability 9.0)")
    b200 = evaluator(tmp_path, Worker(info={"gpu": "NVIDIA B200", "cc": "10.0"}))
    assert b200._cannot_run("sm_100a") is None
    assert b200._cannot_run("sm_90a") == ("sm_90a needs an H100/H200 (compute capability 9.0); this machine has "
                                          "NVIDIA B200 (compute capability 10.0)")
    assert evaluator(tmp_path, Worker(info={}))._cannot_run("sm_90a").endswith("has None (compute capability None)")


def test_a_worker_that_cannot_start_says_why_and_its_wait_is_timed(tmp_path):
    ev = evaluator(tmp_path, Worker(start_error=WorkerStartError("GPU worker did not start: boom")))
    phase = {"queue_wait": 1.0}
    assert ev._cannot_run("sm_90a", phase) == "GPU worker did not start: boom"
    assert phase["queue_wait"] >= 1.0 and phase["queue_wait"] < 1.5 and 0 <= phase["worker_start"] < 0.5
    phase = {}
    assert evaluator(tmp_path, Worker())._cannot_run("sm_90a", phase) is None
    assert set(phase) == {"queue_wait", "worker_start"}


# ---------------------------------------------------------------------------------------
# A candidate that cannot run: the static check still judges its manifest
# ---------------------------------------------------------------------------------------
def test_the_static_check_names_a_kernel_missing_from_the_module():
    task = small_gemm()
    axes = task.axis_values(task.workloads[0])
    lim = NOMINAL_LIMITS["sm_90a"]
    assert E.static_check(GOOD, compiled(), task, axes, lim) is None
    err = E.static_check(GOOD, compiled(kernels={"other": {}, "b": {}}), task, axes, lim)
    assert str(err) == ("launches[0].kernel: 'gemm_simt' is not in the compiled module (kernels: b, other); declare "
                        "it extern \"C\" or use the name it has")
    err = E.static_check(GOOD, compiled(kernels={"_Z3fooPf": {}}, symbols={"foo": "_Z3fooPf"}), task, axes, lim)
    assert "(kernels: foo)" in str(err)  # named as the source names them
    # both an extern "C" kernel and a C++ kernel of that name: ambiguous, said
    amb = compiled(kernels={"gemm_simt": {}, "_Z9gemm_simtv": {}}, symbols={"gemm_simt": "_Z9gemm_simtv"})
    assert str(E.static_check(GOOD, amb, task, axes, lim)).startswith("launches[0].kernel: kernel name 'gemm_simt' is ambiguous")
    # no kernel list (ptxas -v said nothing): not checked
    assert E.static_check(GOOD, compiled(kernels={}), task, axes, lim) is None


def test_the_static_check_holds_the_arguments_to_the_ptx_signature():
    task = small_gemm()
    axes = task.axis_values(task.workloads[0])
    lim = NOMINAL_LIMITS["sm_90a"]
    five = compiled(ptx=PTX.replace(", .param .u32 k", ""))
    err = E.static_check(GOOD, five, task, axes, lim)
    assert err.reason == "launch_error" and str(err) == (
        "launches[0] ('gemm_simt').args: kernel takes 5 parameters, the manifest gives 6")
    assert E.static_check(GOOD, compiled(ptx=".visible .entry other() {}"), task, axes, lim) is None  # signature unknown
    assert E.static_check(GOOD, compiled(ptx=None), task, axes, lim) is None
    bad = GOOD.model_copy(deep=True)
    bad.manifest.launches[0].args[3] = "MM"
    assert E.static_check(bad, compiled(), task, axes, lim).reason == "manifest_error"


def test_the_static_check_names_every_launchs_kernel_but_holds_only_the_planned_ones_to_their_signature():
    """A launch this workload skips (`when`) still needs its kernel in the module (another workload
    runs it); its arguments are checked where it runs, against its own entry's signature."""
    task = small_gemm()
    lim = NOMINAL_LIMITS["sm_90a"]
    two = GOOD.model_copy(deep=True)
    small = two.manifest.launches[0].model_copy(update={"kernel": "gemm_small", "args": ["A", "B", "C", "M"]})
    two.manifest.launches[0].when, small.when = "M > 100", "M <= 100"
    two.manifest.launches.append(small)
    ptx = PTX + "\n.visible .entry gemm_small(.param .u64 a, .param .u64 b, .param .u64 c)\n{}"  # 3, not 4
    both = compiled(ptx=ptx, kernels={"gemm_simt": {}, "gemm_small": {}})
    m128, m70 = (task.axis_values(w) for w in task.workloads)
    assert E.static_check(two, both, task, m128, lim) is None  # gemm_small does not run at M = 128
    err = E.static_check(two, both, task, m70, lim)
    assert err.reason == "launch_error" and str(err) == (
        "launches[1] ('gemm_small').args: kernel takes 3 parameters, the manifest gives 4")
    err = E.static_check(two, compiled(ptx=ptx), task, m128, lim)
    assert err.reason == "manifest_error" and str(err) == (
        "launches[1].kernel: 'gemm_small' is not in the compiled module (kernels: gemm_simt); declare it extern \"C\" "
        "or use the name it has")


def test_without_a_run_each_workload_gets_its_static_verdict(tmp_path):
    task = small_gemm()
    ev = evaluator(tmp_path)
    res = result(task)
    ev._static_only(res, GOOD, task, task.workloads, "sm_90a", "no GPU: none")
    assert (res.run_status, res.run_reason) == ("skipped", "no GPU: none")
    assert [(w.workload, w.split, w.status, w.detail) for w in res.workloads] == [
        ("M128", "visible", "skipped", "no GPU: none"), ("M70", "held_out", "skipped", "no GPU: none")]
    assert res.workloads[0].axes == {"M": 128, "N": 64, "K": 32}
    res = result(task, comp=compiled(kernels={"x": {}}))
    ev._static_only(res, GOOD, task, task.workloads, "sm_100a", "no GPU: none")
    assert res.run_status == "failed" and [w.status for w in res.workloads] == ["failed", "failed"]
    assert res.workloads[0].reason == "manifest_error"
    assert res.run_reason == f"no GPU: none; the manifest is wrong without running: {res.workloads[0].detail}"


def test_the_static_check_uses_the_arch_limits_and_falls_back_to_hopper(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(E, "static_check", lambda sol, comp, task, axes, limits: seen.append(limits))
    task = small_gemm()
    for arch in ("sm_100a", "sm_75"):
        evaluator(tmp_path)._static_only(result(task), GOOD, task, task.workloads[:1], arch, "x")
    assert seen == [NOMINAL_LIMITS["sm_100a"], NOMINAL_LIMITS["sm_90a"]]


def test_judging_without_a_gpu_without_a_compile_or_without_workloads(tmp_path):
    task = small_gemm()
    ev = evaluator(tmp_path)
    res = result(task, comp=compiled(status="failed"))
    ev._judge(res, GOOD, task, "sm_90a", "all", False, True, Counting(mode="off"))
    assert res.run_reason == "did not compile" and res.executed.status == "skipped" and not res.workloads
    assert res.executed.reason == "did not compile"
    res = result(task)
    task.workloads = [w for w in task.workloads if w.split == "visible"]
    ev._judge(res, GOOD, task, "sm_90a", "held_out", False, True)
    assert res.run_reason == "task gemm_n7168_k5120 has no held_out workloads" and not res.workloads
    task = small_gemm()
    res = result(task)
    ev._judge(res, GOOD, task, "sm_90a", "all", True, True, Counting(mode="cupti"))
    assert res.run_reason == "no GPU: no GPU given (gpus=[])" and res.harness_fault is None
    assert (res.executed.status, res.executed.reason) == ("skipped", "no GPU: no GPU given (gpus=[])")
    assert (res.sanitize.status, res.sanitize.reason) == ("skipped", "no GPU: no GPU given (gpus=[])")
    res = result(task)
    ev._judge(res, GOOD, task, "sm_90a", "visible", False, True)
    assert res.executed.status == "skipped" and res.executed.reason != "no GPU: no GPU given (gpus=[])"  # not asked
    assert res.sanitize.reason != "no GPU: no GPU given (gpus=[])"
    assert [w.workload for w in res.workloads] == ["M128"]


def test_visible_workloads_are_judged_first(tmp_path):
    task = small_gemm()
    task.workloads = task.workloads[::-1]
    res = result(task)
    evaluator(tmp_path)._judge(res, GOOD, task, "sm_90a", "all", False, True)
    assert [w.split for w in res.workloads] == ["visible", "held_out"]


def test_a_gpu_machine_whose_worker_cannot_start_is_a_harness_fault(tmp_path):
    task = small_gemm()
    ev = evaluator(tmp_path, Worker(start_error=WorkerStartError("GPU worker did not start: no libcuda")))
    res = result(task)
    ev._judge(res, GOOD, task, "sm_90a", "all", False, True)
    assert res.harness_fault == "GPU worker did not start: no libcuda" and res.run_status == "skipped"
    res = result(task)
    evaluator(tmp_path, Worker())._judge(res, GOOD, task, "sm_100a", "all", False, True)  # the wrong GPU: not ours
    assert res.harness_fault is None and res.run_status == "skipped"


# ---------------------------------------------------------------------------------------
# One workload's request and answer
# ---------------------------------------------------------------------------------------
def test_a_request_carries_everything_the_worker_needs_and_secret_seeds(tmp_path):
    task = small_gemm()
    ev = evaluator(tmp_path, timing_budget_s=0.5, timing_cap_s=9.0, kernel_timeout_s=7.0)
    req = ev._request(GOOD, compiled(symbols={"a": "b"}), task, task.workloads[1], seeds=[5, 6], time=False)
    rng = random.Random(1)
    assert req == {"op": "run", "cubin": b"cubin", "symbols": {"a": "b"}, "manifest": GOOD.manifest.model_dump(mode="json"),
                   "task": task.model_dump(mode="json"), "workload": task.workloads[1].model_dump(mode="json"),
                   "seeds": [5, 6], "time": False, "timing_seed": rng.getrandbits(62), "timing_budget_s": 0.5,
                   "timing_cap_s": 9.0, "kernel_timeout_s": 7.0,
                   "baseline_cache": str(tmp_path.resolve() / "baselines.json")}
    assert ev._request(GOOD, compiled(symbols=None) if False else compiled(), task, task.workloads[0], [1], True)["symbols"] == {}


@pytest.mark.parametrize("answer,status,reason,detail", [
    (WorkerTimeout("x"), "failed", "timeout", "no result within 42 s; the worker was killed (a hang?)"),
    (WorkerCrash("exit -11"), "failed", "worker_crash", "exit -11"),
    (WorkerStartError("GPU worker did not start: x"), "skipped", None, "GPU worker did not start: x"),
    ({"op": "error", "error": "Traceback"}, "failed", "harness_error", "the worker failed on this candidate: Traceback"),
])
def test_a_workload_the_worker_did_not_answer(tmp_path, answer, status, reason, detail):
    task = small_gemm()
    w = Worker(lambda msg: answer)
    ev = evaluator(tmp_path, w, timeout_s=42.0)
    req = {"seeds": [1, 2]}
    wr = ev._ask(w, req, task.workloads[1], {"M": 70})
    assert (wr.workload, wr.split, wr.axes, wr.status, wr.reason, wr.detail) == ("M70", "held_out", {"M": 70}, status,
                                                                                 reason, detail)
    assert wr.seeds == ([1, 2] if status == "failed" else [])
    assert w.timeouts == [42.0] and w.kills == 0


def test_a_fatal_answer_kills_the_worker_before_the_next_request(tmp_path):
    task = small_gemm()
    msg = {"workload": task.workloads[0].model_dump(mode="json"), "seeds": [1]}
    w = Worker(lambda m: {"op": "result", "result": passed(msg), "fatal": True})
    wr = evaluator(tmp_path, w)._ask(w, msg, task.workloads[0], {"M": 128})
    assert wr.status == "passed" and w.kills == 1
    w = Worker(lambda m: {"op": "result", "result": passed(msg)})
    evaluator(tmp_path, w)._ask(w, msg, task.workloads[0], {"M": 128})
    assert w.kills == 0


# ---------------------------------------------------------------------------------------
# The workload loop, through evaluate() with the compile given
# ---------------------------------------------------------------------------------------
def run(tmp_path, worker, task=None, insp=None, comp=None, **kw) -> EvalResult:
    task = task or small_gemm()
    return evaluator(tmp_path, worker).evaluate(GOOD, task, "sm_90a", workloads="all",
                                                compiled=(comp or compiled(), insp or sass("FFMA")), **kw)


def test_every_workload_runs_in_order_with_its_own_seeds_and_the_evaluation_named(tmp_path):
    w = Worker()
    res = run(tmp_path, w)
    assert [m["workload"]["name"] for m in w.asked] == ["M128", "M70"]
    assert res.run_status == "ok" and [x.status for x in res.workloads] == ["passed", "passed"]
    runs = w.asked
    # timed: one seeded call each (the timed runs judge the later calls, Evaluator._seeds), its own seed
    assert len({s for m in runs for s in m["seeds"]}) == 2 and all(len(m["seeds"]) == 1 for m in runs)
    assert runs[0]["evaluation"] == runs[1]["evaluation"] and len(runs[0]["evaluation"]) == 16
    assert all(m["time"] for m in runs) and "credit" not in runs[0]
    assert (res.gpu, res.device) == ("NVIDIA H200", "3")
    assert {"queue_wait", "workloads"} <= set(res.phase_s)
    assert res.executed.status == "skipped"  # not asked
    w = Worker()
    res = run(tmp_path, w, time=False)
    assert res.workloads[0].status == "passed"
    # untimed: two seeded calls on fresh inputs each, so a kernel right on its first call only fails there
    assert all(len(m["seeds"]) == 2 and m["seeds"][0] != m["seeds"][1] and not m["time"] for m in w.asked)


@pytest.mark.parametrize("reason", ["timeout", "cuda_error", "worker_crash"])
def test_a_hang_a_cuda_error_or_a_crash_stops_the_rest(tmp_path, reason):
    def answer(msg):
        if msg["workload"]["name"] == "M128":
            wl = msg["workload"]
            return {"op": "result", "result": WorkloadResult(workload="M128", split="visible", axes=wl["axes"],
                                                             status="failed", reason=reason, detail="d").model_dump()}
        return {"op": "result", "result": passed(msg)}

    w = Worker(answer)
    res = run(tmp_path, w, executed_check=True)
    assert [m["workload"]["name"] for m in w.asked].count("M70") == 0
    assert (res.workloads[1].status, res.workloads[1].detail) == ("skipped", f"not run: workload M128 ended with {reason}")
    assert (res.executed.status, res.executed.reason) == ("skipped", f"workload M128 ended with {reason}")


def test_a_wrong_answer_does_not_stop_the_rest(tmp_path):
    def answer(msg):
        wl = msg["workload"]
        return {"op": "result", "result": WorkloadResult(workload=wl["name"], split=wl["split"], axes=wl["axes"],
                                                         status="failed", reason="incorrect").model_dump()}

    res = run(tmp_path, Worker(answer))
    assert [x.reason for x in res.workloads] == ["incorrect", "incorrect"]


def test_a_worker_failure_is_ours_and_named_by_its_first_workload(tmp_path):
    res = run(tmp_path, Worker(lambda msg: {"op": "error", "error": "KeyError"}))
    assert res.harness_fault == "workload M128: the worker failed on this candidate: KeyError"

    def start_fails(msg):
        return WorkerStartError("GPU worker did not start: cuInit 999")

    res = run(tmp_path, Worker(start_fails))
    assert res.harness_fault == "workload M128: GPU worker did not start: cuInit 999"
    res = run(tmp_path, Worker(lambda msg: WorkerStartError("something else")))
    assert res.harness_fault is None and res.workloads[0].status == "skipped"


def test_a_workload_whose_manifest_fails_its_static_check_is_not_sent(tmp_path):
    w = Worker()
    res = run(tmp_path, w, comp=compiled(kernels={"other": {}}))
    assert [x.reason for x in res.workloads] == ["manifest_error", "manifest_error"]
    assert w.asked == []
    assert res.workloads[0].detail.startswith("launches[0].kernel: 'gemm_simt' is not in the compiled module")


def test_the_worker_reports_its_own_limits(tmp_path, monkeypatch):
    seen = []
    real = E.static_check
    monkeypatch.setattr(E, "static_check", lambda s, c, t, a, limits: seen.append(limits) or real(s, c, t, a, limits))
    lim = NOMINAL_LIMITS["sm_100a"]
    run(tmp_path, Worker(info={"gpu": "g", "cc": "9.0", "limits": lim}))
    assert seen == [lim, lim]
    seen.clear()
    run(tmp_path, Worker())
    assert seen == [NOMINAL_LIMITS["sm_90a"]] * 2


def test_a_roofline_that_cannot_be_computed_is_said_never_a_verdict(tmp_path, monkeypatch):
    def boom(res, task):
        raise ZeroDivisionError("x")

    monkeypatch.setattr(E, "apply_roofline", boom)
    res = run(tmp_path, Worker())
    assert res.run_status == "ok" and res.run_reason == "roofline not computed: ZeroDivisionError: x"


# ---------------------------------------------------------------------------------------
# Counted runs: asked for in process, each workload's credit from the credit op
# ---------------------------------------------------------------------------------------
def credit_worker(credit_reply=None, result_extra=None):
    def answer(msg):
        if msg.get("op") == "credit":
            return credit_reply(msg) if callable(credit_reply) else credit_reply
        kw = {"credit": {"status": "pending"}} if "credit" in msg else {}
        return {"op": "result", "result": passed(msg, **kw, **(result_extra or {}))}
    return Worker(answer)


def test_counted_runs_are_asked_with_a_secret_seed_and_every_pipes_metrics(tmp_path):
    credits = {"op": "credits", "credits": {"M128": {"status": "ran", "own_s": 0.25}, "M70": {"status": "ran"}},
               "timed_s": 0.0, "seconds": 0.0}
    w = credit_worker(credits)
    res = run(tmp_path, w, insp=sass("HGMMA", "UTMALDG"), executed_check=True)
    runs = [m for m in w.asked if m.get("op") == "run" and "credit" in m]
    assert len(runs) == 2
    c = runs[0]["credit"]
    assert c["metrics"] == list(E.credit_metrics()) and c["evaluation"] == runs[0]["evaluation"]
    assert runs[0]["credit"]["seed"] != runs[1]["credit"]["seed"] and 0 <= c["seed"] < 2**62
    op = next(m for m in w.asked if m.get("op") == "credit")
    assert op == {"op": "credit"}  # no plain bulk load beside the tensor-map loads: no exact counts
    assert [x.credit["status"] for x in res.workloads] == ["ran", "ran"]
    assert res.workloads[0].phase_s["credit"] == 0.25 and res.workloads[1].phase_s["credit"] == 0.0


def test_a_module_without_the_requested_opcodes_is_never_counted(tmp_path):
    w = credit_worker({"op": "credits"})
    res = run(tmp_path, w, insp=sass("FFMA", "LDG"), executed_check=True)
    assert not any("credit" in m for m in w.asked) and not any(m.get("op") == "credit" for m in w.asked)
    assert res.executed.status == "ok" and res.executed.reason == E.NO_REQUESTED_SASS
    assert res.executed.executed == {"wgmma": False, "tma": False} and res.executed.carries == {"wgmma": False, "tma": False}
    assert res.executed.counts == {"wgmma": 0, "tma": 0} and res.executed.shares == {"wgmma": None, "tma": None}


def test_exact_counts_are_asked_where_a_plain_bulk_load_runs_beside_tensor_map_loads(tmp_path):
    w = credit_worker({"op": "credits", "credits": {}})
    insp = InspectResult(status="ok", arch="sm_90a", kernels={"gemm_simt": KernelSass(
        opcodes={"HGMMA": 1, "UTMALDG": 1, "UBLKCP": 1}, tma_sites={16: "UTMALDG.2D", 32: "UBLKCP.S.G"})})
    run(tmp_path, w, insp=insp, executed_check=True)
    op = next(m for m in w.asked if m.get("op") == "credit")
    assert op["sass_sites"] == {"gemm_simt": {"16": "UTMALDG.2D", "32": "UBLKCP.S.G"}}


def test_the_credit_op_fails_its_workloads_when_it_gives_no_answer(tmp_path):
    """Every kept workload fails with why; what the worker wrote (its last words, its error) may be
    held-out M70's run's, so the held-out workload keeps it and visible M128 says what happened."""
    kept = " (what the worker wrote is kept with the held-out workloads it also ran)"
    for reply, why, told in (
            (WorkerTimeout("t"), "the counted runs gave no answer: t", "the counted runs gave no answer: t"),
            (WorkerCrash("c; its last words: rows 70"), "the counted runs gave no answer: c; its last words: rows 70",
             "the counted runs gave no answer: c"),
            ({"op": "error", "error": "E"}, "the counted runs failed in the worker: E",
             "the counted runs failed in the worker")):
        res = run(tmp_path, credit_worker(reply), insp=sass("HGMMA", "UTMALDG"), executed_check=True)
        assert [(x.split, x.credit["status"], x.credit["reason"]) for x in res.workloads] == [
            ("visible", "failed", told + kept), ("held_out", "failed", why)]


def test_a_workload_the_op_did_not_credit_is_not_credited(tmp_path):
    res = run(tmp_path, credit_worker({"op": "credits", "credits": {"M128": {"status": "ran"}}}),
              insp=sass("HGMMA", "UTMALDG"), executed_check=True)
    assert res.workloads[0].credit == {"status": "ran"}
    assert res.workloads[1].credit == {"status": "failed", "reason": (
        "not counted: the worker that kept this workload restarted before the counted runs")}


def test_the_credit_op_is_given_a_request_timeout_per_kept_workload(tmp_path):
    w = credit_worker({"op": "credits", "credits": {}})
    evaluator(tmp_path, w, timeout_s=10.0).evaluate(GOOD, small_gemm(), "sm_90a", workloads="all",
                                                    compiled=(compiled(), sass("HGMMA")), executed_check=True)
    at = [m.get("op") for m in w.asked].index("credit")
    assert w.timeouts[at] == 20.0


@pytest.mark.parametrize("reason,stops", [("timeout", True), ("cuda_error", True), ("wrong_in_timed_run", False)])
def test_a_counted_run_that_answered_wrong_or_hung_fails_its_workload(tmp_path, reason, stops):
    reply = {"op": "credits", "credits": {"M128": {"status": "ran"}, "M70": {"status": "ran"}}, "fatal": stops,
             "failed": {"M70": {"reason": reason, "detail": "run 3", "outputs": [
                 {"output": "C", "passed": False, "max_abs_err": 1.0, "max_rel_err": 1.0, "mismatch_frac": 0.25}]}}}
    w = credit_worker(reply)
    res = run(tmp_path, w, insp=sass("HGMMA", "UTMALDG"), executed_check=True)
    m70 = res.workloads[1]
    assert (m70.status, m70.reason, m70.detail) == ("failed", reason, "run 3")
    assert res.harness_fault is None, res.workloads[-1].detail
    assert m70.outputs[0].mismatch_frac == 0.25
    assert res.workloads[0].status == "passed"
    assert w.kills == (1 if stops else 0)
    if stops:
        assert res.executed.reason == f"workload M70 ended with {reason} in its counted runs"


@pytest.mark.parametrize("wall,reply,want", [
    # wall 10 s, of which 4 s the timed phases'; `other` gets the round trip beyond the worker's 9 s
    (10.0, {"timed_s": 4.0, "seconds": 9.0, "cost_parts": {"profiler": 2.0, "other": 1.0}},
     {"counted_runs": 6.0, "counted_runs.profiler": 2.0, "counted_runs.other": 2.0}),
    (0.5, {"timed_s": 0.25, "seconds": 0.25, "cost_parts": {"other": 0.0}},  # under a second: as measured
     {"counted_runs": 0.25, "counted_runs.other": 0.25}),
    (0.5, {"cost_parts": {"other": 0.125}}, {"counted_runs": 0.5, "counted_runs.other": 0.125}),  # no figures sent
    (3.0, {"timed_s": 5.0, "seconds": 4.0}, {"counted_runs": 0.0}),  # never below 0
])
def test_what_the_credit_op_cost_apart_from_the_timed_phases_it_ran(tmp_path, monkeypatch, wall, reply, want):
    clock = iter([100.0, 100.0 + wall])
    ev = evaluator(tmp_path, credit_worker({"op": "credits", "credits": {}, **reply}))
    res = result()
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed",
                                    credit={"status": "pending", "k": 1})]
    import time as T
    monkeypatch.setattr(T, "perf_counter", lambda: next(clock))
    ev._counted_runs(ev._workers[0], res)
    assert res.phase_s == want
    # not credited by the op: what the workload had is kept beside the reason
    assert res.workloads[0].credit["k"] == 1 and res.workloads[0].credit["status"] == "failed"
    assert ev._workers[0].timeouts == [180.0]  # one kept workload: one request's time


def test_the_timed_phases_run_at_the_credit_op_take_their_whole_result_from_it():
    old = WorkloadResult(workload="M128", split="visible", axes={}, status="passed", credit={"status": "pending"})
    other = WorkloadResult(workload="M70", split="held_out", axes={}, status="passed", detail="kept")
    fresh = WorkloadResult(workload="M128", split="visible", axes={"M": 1}, status="failed", reason="wrong_in_timed_run",
                           detail="run 4", speedup=2.0, credit={"status": "other"})
    E._timed_in_the_op([old, other], {"results": {"M128": fresh.model_dump(mode="json")}})
    assert (old.status, old.reason, old.detail, old.speedup, old.axes) == ("failed", "wrong_in_timed_run", "run 4", 2.0,
                                                                            {"M": 1})
    assert old.credit == {"status": "pending"}  # merged by the caller
    assert other.detail == "kept"
    E._timed_in_the_op([other], {})
    assert other.detail == "kept"


def test_counted_runs_made_needless_by_the_sass_are_dropped(tmp_path):
    w = credit_worker({"op": "credits", "results": {}})
    ev = evaluator(tmp_path, w, timeout_s=5.0)
    res = result()
    res.workloads = [WorkloadResult(workload=n, split="visible", axes={}, status="passed", credit={"status": "pending", "k": 1})
                     for n in ("a", "b")] + [WorkloadResult(workload="c", split="visible", axes={}, status="passed")]
    ev._drop_counted_runs(w, res)
    assert w.asked == [{"op": "credit", "drop": True}] and w.timeouts == [10.0]
    one = result()
    one.workloads = [WorkloadResult(workload="a", split="visible", axes={}, status="passed", credit={"status": "pending"}),
                     WorkloadResult(workload="b", split="visible", axes={}, status="passed", credit={"status": "ran"})]
    fresh = WorkloadResult(workload="a", split="visible", axes={}, status="failed", reason="wrong_in_timed_run")
    w1 = Worker(lambda m: {"op": "credits", "results": {"a": fresh.model_dump(mode="json"), "b": fresh.model_dump(mode="json")}})
    ev._drop_counted_runs(w1, one)
    assert w1.timeouts == [5.0] and one.workloads[0].reason == "wrong_in_timed_run"  # its timed phase ran at the op
    assert one.workloads[1].status == "passed"  # not kept: not taken from the op
    assert [x.credit for x in res.workloads] == [{"status": "skipped", "reason": E.NO_REQUESTED_SASS, "k": 1}] * 2 + [None]
    for exc in (WorkerTimeout("t"), WorkerCrash("c"), WorkerStartError("s")):  # the next evaluation drops them
        res.workloads[0].credit = {"status": "pending"}
        ev._drop_counted_runs(Worker(lambda m: exc), res)
        assert res.workloads[0].credit["status"] == "skipped"


def test_the_sass_that_arrives_late_still_drops_the_counted_runs(tmp_path):
    """The inspection overlaps the runs: workloads sent before it ended were kept for counting;
    once it says no requested opcode is in the module, they are dropped, never counted."""
    w = credit_worker({"op": "credits"})
    calls = []

    def module_sass(wait=True):
        calls.append(wait)
        return None if not wait else sass("FFMA")

    ev = evaluator(tmp_path, w)
    task = small_gemm()
    res = result(task)
    ev._run(res, GOOD, task, task.workloads, "sm_90a", False, True, Counting(mode="cupti"), module_sass)
    assert [m.get("drop") for m in w.asked if m.get("op") == "credit"] == [True]
    assert [x.credit["status"] for x in res.workloads] == ["skipped", "skipped"]
    assert res.executed.reason == E.NO_REQUESTED_SASS


def test_kept_workloads_whose_worker_is_gone_are_not_counted(tmp_path):
    def answer(msg):
        wl = msg["workload"]
        if wl["name"] == "M70":
            return {"op": "result", "result": WorkloadResult(workload="M70", split="held_out", axes=wl["axes"],
                                                             status="failed", reason="timeout").model_dump()}
        return {"op": "result", "result": passed(msg, credit={"status": "pending"})}

    w = Worker(answer)
    res = run(tmp_path, w, insp=sass("HGMMA"), executed_check=True)
    assert not any(m.get("op") == "credit" for m in w.asked)
    assert res.workloads[0].credit == {"status": "failed", "reason": "not counted: not run: workload M70 ended with timeout"}


# ---------------------------------------------------------------------------------------
# The executed check's verdict
# ---------------------------------------------------------------------------------------
def test_the_executed_check_where_its_verdict_is_known_without_counting(tmp_path):
    task = small_gemm()
    ev = evaluator(tmp_path)
    res = result(task)
    x = ev._executed(res, GOOD, task, task.workloads, "not run: workload M128 ended with timeout", Counting(mode="cupti"), "0")
    assert (x.status, x.reason) == ("skipped", "workload M128 ended with timeout")
    x = ev._executed(res, GOOD, task, task.workloads, None, None, "0")
    assert (x.status, x.reason) == ("skipped", "the task requests no features for this arch")
    x = ev._executed(res, GOOD, task, task.workloads, None, Counting(mode="off", reason="not here"), "0")
    assert (x.status, x.reason) == ("skipped", "not here")
    # nothing ran to a verdict of its own: the first failure named
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="failed", reason="launch_error",
                                    detail="grid")]
    x = ev._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "0", sass=sass("HGMMA"))
    assert (x.status, x.reason) == ("skipped", "not profiled: no workload ran to a verdict (launch_error: grid)")
    res.workloads = []
    x = ev._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "0", sass=sass("HGMMA"))
    assert x.reason == "not profiled: no workload ran to a verdict (no workload ran)"
    # ran, but no requested opcode in the module: nothing executed, nothing credited, without a run
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed")]
    x = ev._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "0", sass=sass("FFMA"))
    assert x.status == "ok" and x.notes == {"wgmma": E.NO_REQUESTED_SASS, "tma": E.NO_REQUESTED_SASS}


class _Ncu:
    def __init__(self, extra=()):
        self.extra_metrics, self.closed, self.finished = extra, 0, []

    def finish(self, requests, device, works, timed_ms):
        self.finished.append((requests, device, works, timed_ms))
        return ExecutedCheck(status="ok", reason=None, kernel_metrics={"k": {"m": 1.0}} if self.extra_metrics else {})

    def close(self):
        self.closed += 1


def test_the_in_process_credit_of_every_workload_that_ran_to_a_verdict(tmp_path, monkeypatch):
    task = small_gemm()
    seen = []
    monkeypatch.setattr(E, "credit_in_process", lambda meta, credit, features, work, timed, opcodes:
                        seen.append((meta, credit, features, work, timed, opcodes)) or meta["workload"])
    monkeypatch.setattr(E, "combine", lambda features, credits: ExecutedCheck(status="ok", reason=",".join(credits)))
    from tools.results import Timing

    res = result(task)
    res.phase_s = {"counted_runs": 1.23456, "counted_runs.profiler": 0.123456, "workloads": 9.0}
    t = Timing(median_ms=2.5, iqr_ms=0.1, cv=0.01, runs=3)
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed", timing=t,
                                    credit={"status": "ran", "n": 1}),
                     WorkloadResult(workload="M70", split="held_out", axes={}, status="failed", reason="wrong_in_timed_run",
                                    credit={"status": "ran", "n": 2})]
    x = E.Evaluator._executed(evaluator(tmp_path), res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "0",
                              sass=sass("HGMMA", "UTMALDG"))
    assert x.reason == "M128,M70"  # a wrong answer in a timed run still ran: creditable
    assert seen[0] == ({"workload": "M128", "split": "visible"}, {"status": "ran", "n": 1}, ["wgmma", "tma"],
                       E._task_work(task, task.workloads[0]), 2.5, {"HGMMA", "UTMALDG"})
    assert seen[1][4] is None  # untimed
    assert x.phase_s == {"counted_runs": 1.235, "counted_runs.profiler": 0.1235}
    assert x.profile.status == "skipped" and "not asked for" in x.profile.reason
    res.phase_s = {}
    x = E.Evaluator._executed(evaluator(tmp_path), res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "0",
                              sass=sass("HGMMA"))
    assert x.phase_s == {"counted_runs": 0.0}


def test_where_cupti_cannot_count_nsight_compute_counts_and_says_why(tmp_path, monkeypatch):
    task = small_gemm()
    made = []
    monkeypatch.setattr("tools.ncu.CreditProcess", lambda features, env, timeout: made.append(_Ncu()) or made[-1])
    ev = evaluator(tmp_path, Worker())
    res = result(task)
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed",
                                    credit={"status": "unavailable", "reason": "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"})]
    x = ev._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "7", sass=sass("HGMMA"))
    assert x.reason == "in-process counters unavailable (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES), Nsight Compute counted instead"
    (requests, device, works, timed), = made[0].finished
    assert device == "7" and len(requests) == 1 and "credit_seed" in requests[0] and requests[0]["time"] is False
    assert made[0].closed == 1


def test_a_profile_never_changes_the_in_process_credit(tmp_path, monkeypatch):
    task = small_gemm()
    monkeypatch.setattr(E, "credit_in_process", lambda *a: "c")
    monkeypatch.setattr(E, "combine", lambda features, credits: ExecutedCheck(status="ok", reason="in process"))
    monkeypatch.setattr(E, "build_profile", lambda metrics, gpu, flops, bytes_, fp8: ("profile", metrics))
    ncu = _Ncu(extra=("sm__throughput",))
    res = result(task)
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed", credit={"status": "ran"})]
    x = evaluator(tmp_path)._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti", process=ncu), "0",
                                      sass=sass("FFMA"))  # a profile is wanted: counted even without the opcodes
    assert x.reason == "in process" and x.kernel_metrics == {"k": {"m": 1.0}} and x.profile == ("profile", {"k": {"m": 1.0}})
    assert ncu.closed == 1


# ---------------------------------------------------------------------------------------
# Small pure pieces
# ---------------------------------------------------------------------------------------
def test_the_requested_sass_is_absent_only_when_the_sass_was_read():
    assert E._no_requested_sass(sass("FFMA", "LDG"), ["wgmma", "tma"])
    assert not E._no_requested_sass(sass("FFMA", "HGMMA"), ["wgmma", "tma"])
    assert not E._no_requested_sass(sass("UTMALDG"), ["wgmma", "tma"])
    assert not E._no_requested_sass(sass("FFMA"), [])
    assert not E._no_requested_sass(None, ["wgmma"])
    assert not E._no_requested_sass(sass("FFMA", status="skipped"), ["wgmma"])
    assert not E._no_requested_sass(InspectResult(status="ok", arch="sm_90a"), ["wgmma"])  # no kernel read
    bad = sass("FFMA")
    bad.infra_error = "nvdisasm failed"
    assert not E._no_requested_sass(bad, ["wgmma"])


def test_the_module_opcodes_are_every_kernels_launched_or_not():
    insp = InspectResult(status="ok", arch="sm_90a", kernels={"a": KernelSass(opcodes={"FFMA": 2}),
                                                              "b": KernelSass(opcodes={"HGMMA": 1, "FFMA": 1})})
    assert E._module_opcodes(insp) == {"FFMA", "HGMMA"}


@pytest.mark.parametrize("m,padded_m", [(128, 128), (70, 128), (129, 256), (1, 128), (256, 256)])
def test_a_workloads_work_and_its_rows_padded_to_whole_tiles(m, padded_m):
    """The wgmma overwork cap allows an honest tiled kernel its last partial 128-row tile: the
    task's first var axis (M here) rounded up; the constant axes as they are."""
    task = small_gemm()
    from tasks.schema import Workload

    work = E._task_work(task, Workload(name="w", axes={"M": m}))
    assert work == TaskWork(flops=2.0 * m * 64 * 32, read_bytes=task.input_bytes({"M": m, "N": 64, "K": 32}),
                            padded_flops=2.0 * padded_m * 64 * 32)
    assert E.TILE_ROWS == 128  # wgmma's M is 64 per warpgroup; an honest CTA tile is 128 rows


def test_the_ptx_entries_of_the_launched_kernels_once_each():
    sol = GOOD.model_copy(deep=True)
    sol.manifest.launches.append(sol.manifest.launches[0].model_copy())
    sol.manifest.launches.append(sol.manifest.launches[0].model_copy(update={"kernel": "second"}))
    comp = compiled(kernels={"_Z9gemm_simtv": {}, "second": {}}, symbols={"gemm_simt": "_Z9gemm_simtv"})
    assert E._entries(comp, sol) == ["_Z9gemm_simtv", "second"]
    assert E._entries(compiled(kernels={}), sol) == ["gemm_simt", "second"]  # unresolved: as named
    amb = compiled(kernels={"gemm_simt": {}, "_Z9gemm_simtv": {}}, symbols={"gemm_simt": "_Z9gemm_simtv"})
    assert E._entries(amb, sol)[0] == "gemm_simt"


def test_a_toolchain_failure_is_a_failed_compile_that_names_it():
    c = E._harness_compile_failure(GOOD, "sm_90a", OSError("ptxas: not found"))
    assert (c.status, c.arch, c.language) == ("failed", "sm_90a", "cuda")
    assert c.error == c.infra_error == "harness_error: compile/inspect failed: OSError: ptxas: not found"
    kept = E._harness_compile_failure(GOOD, "sm_90a", ValueError("x" * 400), compiled())
    assert kept.cubin == b"cubin" and kept.status == "failed" and kept.infra_error == kept.error
    assert kept.error == "harness_error: compile/inspect failed: ValueError: " + "x" * 300


def test_only_successful_compiles_are_cached_and_each_caller_gets_its_own_copy(monkeypatch):
    import tools.compile as C

    calls = []
    monkeypatch.setattr(E, "_COMPILED", E.collections.OrderedDict())
    monkeypatch.setattr(C, "compile_solution", lambda sol, arch: calls.append((sol.source, arch)) or (
        compiled(arch=arch) if "ok" in sol.source else compiled(status="failed")))
    good, bad = GOOD.model_copy(update={"source": "ok 1"}), GOOD.model_copy(update={"source": "bad"})
    a = E._compile(good, "sm_90a")
    a.status = "failed"  # a caller's change never reaches the cache
    assert E._compile(good, "sm_90a").ok and calls == [("ok 1", "sm_90a")]
    E._compile(good, "sm_100a")
    E._compile(bad, "sm_90a")
    E._compile(bad, "sm_90a")
    assert calls == [("ok 1", "sm_90a"), ("ok 1", "sm_100a"), ("bad", "sm_90a"), ("bad", "sm_90a")]
    monkeypatch.setattr(E, "_COMPILED_MAX", 2)
    E._compile(GOOD.model_copy(update={"source": "ok 2"}), "sm_90a")
    E._compile(good, "sm_90a")  # the oldest is sm_100a's now: evicted first
    E._compile(GOOD.model_copy(update={"source": "ok 3"}), "sm_90a")
    assert [k[2] for k in E._COMPILED] == ["sm_90a"] * 2 and len(E._COMPILED) == 2
    n = len(calls)
    E._compile(good, "sm_90a")
    assert len(calls) == n


def test_the_inspection_reads_the_kernels_the_manifest_launches(monkeypatch):
    import tools.sass as S

    monkeypatch.setattr(S, "inspect", lambda comp, kernels: (comp, kernels))
    c = compiled()
    assert E._inspect(c, GOOD, "sm_90a") == (c, ["gemm_simt"])
    skipped = E._inspect(compiled(status="failed"), GOOD, "sm_100a")
    assert (skipped.status, skipped.reason, skipped.arch) == ("skipped", "did not compile", "sm_100a")


# ---------------------------------------------------------------------------------------
# evaluate(): the compile, the overlapping inspection, a harness failure as a verdict
# ---------------------------------------------------------------------------------------
def test_evaluate_refuses_an_unknown_workload_set_and_takes_a_task_by_name(tmp_path):
    ev = evaluator(tmp_path)
    with pytest.raises(ValueError, match="workloads must be visible, held_out or all, not 'some'"):
        ev.evaluate(GOOD, small_gemm(), "sm_90a", workloads="some", compiled=(compiled(), sass()))
    res = ev.evaluate(GOOD, "gemm_n7168_k5120", "sm_90a", compiled=(compiled(), sass()))
    assert res.task == "gemm_n7168_k5120" and res.requested_features == ["wgmma", "tma"]
    assert [w.split for w in res.workloads] == ["visible"]  # the default: visible only
    assert "compile" not in res.phase_s and "inspect_wait" not in res.phase_s  # the caller compiled
    assert res.seconds > 0


def test_evaluate_compiles_and_inspects_meanwhile(tmp_path, monkeypatch):
    monkeypatch.setattr(E, "_compile", lambda sol, arch: compiled(arch=arch))
    monkeypatch.setattr(E, "_inspect", lambda comp, sol, arch: sass("HGMMA"))
    res = evaluator(tmp_path).evaluate(GOOD, small_gemm(), "sm_90a")
    assert res.compile.ok and res.inspect.kernels["gemm_simt"].opcodes == {"HGMMA": 1}
    assert {"compile", "inspect_wait"} <= set(res.phase_s)
    assert E.Evaluator.compile_and_inspect(GOOD, "sm_90a") == (compiled(), sass("HGMMA"))


def test_a_toolchain_that_fails_is_a_failed_compile_never_a_crash(tmp_path, monkeypatch):
    def boom(*a):
        raise OSError("nvrtc missing")

    monkeypatch.setattr(E, "_compile", boom)
    res = evaluator(tmp_path).evaluate(GOOD, small_gemm(), "sm_90a", executed_check=True)
    assert res.compile.infra_error == "harness_error: compile/inspect failed: OSError: nvrtc missing"
    assert (res.inspect.status, res.inspect.reason) == ("skipped", "did not compile")
    assert res.run_reason == "did not compile" and res.executed.reason == "did not compile"
    monkeypatch.setattr(E, "_compile", lambda sol, arch: compiled())
    monkeypatch.setattr(E, "_inspect", boom)
    res = evaluator(tmp_path).evaluate(GOOD, small_gemm(), "sm_90a")
    assert res.compile.status == "failed" and res.compile.cubin == b"cubin"  # the compile kept, marked ours
    assert res.compile.infra_error.endswith("OSError: nvrtc missing") and res.inspect.reason == "did not compile"


def test_a_harness_failure_while_judging_is_a_verdict_of_its_own(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise KeyError("limits")

    ev = evaluator(tmp_path, Worker())
    monkeypatch.setattr(ev, "_judge", boom)
    res = ev.evaluate(GOOD, small_gemm(), "sm_90a", compiled=(compiled(), sass()))
    assert (res.run_status, res.run_reason) == ("failed", "harness_error: KeyError: 'limits'")
    assert res.harness_fault == res.run_reason
    (w,) = res.workloads
    assert (w.workload, w.split, w.status, w.reason) == ("*", "visible", "failed", "harness_error")
    assert "KeyError" in w.detail


def test_how_the_executed_check_counts_follows_from_the_machine(tmp_path, monkeypatch):
    seen = []

    def judge(res, solution, task, arch, workloads, sanitize, time, counting, module_sass):
        seen.append(counting)

    for workers, executed, arch, comp, mode in (
            (True, True, "sm_90a", compiled(), "cupti"), (True, False, "sm_90a", compiled(), None),
            (False, True, "sm_90a", compiled(), "off"), (True, True, "sm_90a", compiled(status="failed"), "off"),
            (True, True, "sm_89", compiled(), "off")):
        ev = evaluator(tmp_path, Worker() if workers else None)
        monkeypatch.setattr(ev, "_judge", judge)
        ev.evaluate(GOOD, small_gemm(), arch, compiled=(comp, sass()), executed_check=executed)
        assert (seen[-1].mode if seen[-1] else None) == mode
    ev = evaluator(tmp_path, Worker())
    ev.in_process_credit = False
    made = []
    monkeypatch.setattr("tools.ncu.CreditProcess", lambda features, env, timeout, extra_metrics=(): made.append(
        (features, timeout, extra_metrics)) or _Ncu(extra_metrics))
    monkeypatch.setattr(ev, "_judge", judge)
    ev.evaluate(GOOD, small_gemm(), "sm_90a", compiled=(compiled(), sass()), executed_check=True)
    assert seen[-1].mode == "ncu" and made == [(["wgmma", "tma"], 600.0, ())]
    ev = evaluator(tmp_path, Worker())
    monkeypatch.setattr(ev, "_judge", judge)
    ev.evaluate(GOOD, small_gemm(), "sm_90a", compiled=(compiled(), sass()), executed_check=True, profile=True)
    assert seen[-1].mode == "cupti" and made[-1][2] == tuple(E.PROFILE_METRICS)  # a profile: ncu beside CUPTI
    assert seen[-1].process.closed == 1  # closed when the evaluation ends


# ---------------------------------------------------------------------------------------
# Finding the GPUs without creating a CUDA context
# ---------------------------------------------------------------------------------------
class _Proc:
    def __init__(self, stdout="", stderr="", returncode=0):
        self.stdout, self.stderr, self.returncode = stdout, stderr, returncode


def _smi(monkeypatch, proc=None, which="/usr/bin/nvidia-smi"):
    monkeypatch.setattr(E.shutil, "which", lambda name: which if name == "nvidia-smi" else None)
    monkeypatch.setattr(E.subprocess, "run", lambda *a, **k: proc if not isinstance(proc, Exception) else (_ for _ in ()).throw(proc))


def test_detect_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _smi(monkeypatch, _Proc("0, GPU-aaaa\n1, GPU-bbbb\n\n"))
    assert E.detect_gpus() == (["0", "1"], None)
    for visible, want in (("1", ["1"]), ("GPU-bb", ["GPU-bb"]), ("0, 1", ["0", "1"]), ("7", [])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        ids, why = E.detect_gpus()
        assert ids == want and (why is None) == bool(want)
    assert why == "CUDA_VISIBLE_DEVICES='7' matches no GPU nvidia-smi lists"
    for hidden in ("", " -1 "):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert E.detect_gpus() == ([], f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _smi(monkeypatch, which=None)
    assert E.detect_gpus() == ([], "nvidia-smi not found (no NVIDIA driver on this machine)")
    _smi(monkeypatch, OSError("denied"))
    assert E.detect_gpus() == ([], "nvidia-smi failed: denied")
    _smi(monkeypatch, _Proc("", "NVIDIA-SMI has failed", 9))
    assert E.detect_gpus() == ([], "nvidia-smi lists no GPU (NVIDIA-SMI has failed)")
    _smi(monkeypatch, _Proc("0, GPU-a", "", 9))
    assert E.detect_gpus() == ([], "nvidia-smi lists no GPU (0, GPU-a)")
    _smi(monkeypatch, _Proc())
    assert E.detect_gpus() == ([], "nvidia-smi lists no GPU (no output)")


def test_a_gpu_only_script_says_so_in_one_line_and_exits_3(monkeypatch, capsys):
    monkeypatch.setattr(E, "detect_gpus", lambda: ([], "no driver"))
    with pytest.raises(SystemExit) as out:
        E.require_gpu("bench_credit")
    assert out.value.code == 3 and capsys.readouterr().err == "bench_credit needs an NVIDIA GPU: no driver\n"
    monkeypatch.setattr(E, "detect_gpus", lambda: (["0"], None))
    E.require_gpu("x")


# ---------------------------------------------------------------------------------------
# Found by the first mutation run (2026-12-03 evening): the sanitizer's run, each phase's
# seconds, the Nsight Compute fallback's arguments, the compile cache's copies
# ---------------------------------------------------------------------------------------
class _San:
    def __init__(self):
        self.calls = []

    def __call__(self, req, names, env, timeout):
        from tools.results import SanitizeResult

        self.calls.append((req, names, env, timeout))
        return SanitizeResult(status="ok", reason="0 errors")


def test_memcheck_runs_the_first_visible_workload_untimed_with_the_launched_entries(tmp_path, monkeypatch):
    san = _San()
    monkeypatch.setattr("tools.ncu.sanitize_check", san)
    w = Worker()
    w.env = {"CUDA_VISIBLE_DEVICES": "3"}
    ev = evaluator(tmp_path, w, ncu_timeout_s=77.0)
    task = small_gemm()
    res = result(task)
    ev._run(res, GOOD, task, task.workloads[::-1], "sm_90a", True, True)  # held-out listed first
    ((req, names, env, timeout),) = san.calls
    assert req["workload"]["name"] == "M128" and len(req["seeds"]) == 1 and req["time"] is False
    assert req["manifest"] == GOOD.manifest.model_dump(mode="json") and req["op"] == "run"
    assert names == ["gemm_simt"] and env == {"CUDA_VISIBLE_DEVICES": "3"} and timeout == 77.0
    assert (res.sanitize.status, res.sanitize.reason) == ("ok", "0 errors") and 0 <= res.phase_s["sanitize"] < 5
    res = result(task)
    task.workloads = task.workloads[1:]  # held-out only: the first one
    ev._run(res, GOOD, task, task.workloads, "sm_90a", True, True)
    assert san.calls[-1][0]["workload"]["name"] == "M70"


@pytest.mark.parametrize("reason,sanitized", [("timeout", False), ("cuda_error", True), ("worker_crash", True)])
def test_a_hang_is_not_sanitized_a_crash_is(tmp_path, monkeypatch, reason, sanitized):
    san = _San()
    monkeypatch.setattr("tools.ncu.sanitize_check", san)

    def answer(msg):
        wl = msg["workload"]
        return {"op": "result", "result": WorkloadResult(workload=wl["name"], split=wl["split"], axes=wl["axes"],
                                                         status="failed", reason=reason).model_dump()}

    res = run(tmp_path, Worker(answer), sanitize=True)
    assert bool(san.calls) == sanitized
    if not sanitized:
        assert (res.sanitize.status, res.sanitize.reason) == ("skipped", "workload M128 ended with timeout")


def test_each_phase_of_a_run_is_timed_apart(tmp_path, monkeypatch):
    monkeypatch.setattr("tools.ncu.sanitize_check", _San())
    ev = evaluator(tmp_path, Worker())
    task = small_gemm()
    res = result(task)
    res.phase_s = {"queue_wait": 10.0}
    ev._run(res, GOOD, task, task.workloads, "sm_90a", True, True, Counting(mode="cupti"), lambda wait=True: sass("FFMA"))
    assert 10.0 < res.phase_s["queue_wait"] < 10.5
    for k in ("workloads", "executed", "sanitize"):
        assert 0 <= res.phase_s[k] < 5, k
    res = result(task)
    ev._run(res, GOOD, task, task.workloads, "sm_90a", False, True)
    assert 0 <= res.phase_s["queue_wait"] < 0.5 and "executed" not in res.phase_s and "sanitize" not in res.phase_s
    phase = {}
    ev._cannot_run("sm_90a", phase)
    assert 0 <= phase["queue_wait"] < 0.5
    # judged without a run (the wrong GPU): its wait is in the evaluation too
    res = result(task)
    evaluator(tmp_path, Worker(info={"gpu": "g", "cc": "8.0"}))._judge(res, GOOD, task, "sm_90a", "all", False, True)
    assert {"queue_wait", "worker_start"} <= set(res.phase_s)


def test_the_roofline_of_each_timed_workload(tmp_path):
    t = Timing(median_ms=2.0, iqr_ms=0.1, cv=0.01, runs=9)
    b = Timing(median_ms=1.0, iqr_ms=0.1, cv=0.01, runs=9)

    def answer(msg):
        return {"op": "result", "result": passed(msg, timing=t.model_dump(), baseline=b.model_dump(), speedup=0.5)}

    res = run(tmp_path, Worker(answer))
    assert res.run_reason is None and res.workloads[0].sol_ms is not None and res.workloads[0].sol_score is not None


def test_a_static_failure_of_one_workload_does_not_skip_the_next(tmp_path, monkeypatch):
    from tools.launch import ManifestError

    real = E.static_check
    monkeypatch.setattr(E, "static_check", lambda s, c, t, axes, lim: ManifestError("grid too big", "launch_error")
                        if axes["M"] == 128 else real(s, c, t, axes, lim))
    w = Worker()
    res = run(tmp_path, w)
    assert [x.reason for x in res.workloads] == ["launch_error", None] and [m["workload"]["name"] for m in w.asked] == ["M70"]
    assert res.workloads[0].detail == "grid too big"


def test_without_a_run_the_first_static_failure_is_the_reason(tmp_path, monkeypatch):
    from tools.launch import ManifestError

    monkeypatch.setattr(E, "static_check", lambda s, c, t, axes, lim: ManifestError(f"bad at M={axes['M']}"))
    task = small_gemm()
    res = result(task)
    evaluator(tmp_path)._static_only(res, GOOD, task, task.workloads, "sm_90a", "no GPU")
    assert [w.detail for w in res.workloads] == ["bad at M=128", "bad at M=70"]
    assert res.run_reason == "no GPU; the manifest is wrong without running: bad at M=128"
    # a held-out workload's detail holds its sizes: the evaluation's own reason names it, never quotes it
    monkeypatch.setattr(E, "static_check", lambda s, c, t, axes, lim: ManifestError(f"bad at M={axes['M']}")
                        if axes["M"] == 70 else None)
    res = result(task)
    evaluator(tmp_path)._static_only(res, GOOD, task, task.workloads, "sm_90a", "no GPU")
    assert res.workloads[1].detail == "bad at M=70" and res.run_reason == (
        "no GPU; the manifest is wrong without running: held-out workload M70 (its detail stays in its own result)")
    x = evaluator(tmp_path)._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "0",
                                      sass=sass("HGMMA"))
    assert x.reason == ("not profiled: no workload ran to a verdict (manifest_error: held-out workload M70 "
                        "(its detail stays in its own result))")


def test_a_harness_fault_quotes_a_visible_workloads_detail_and_names_a_held_out_one():
    bad = {split: WorkloadResult(workload=name, split=split, axes={}, status="failed", reason="harness_error",
                                 detail=f"shape ({name[1:]}, 64)") for name, split in (("M128", "visible"), ("M70", "held_out"))}
    assert E._quotable(bad["visible"], named=True) == "workload M128: shape (128, 64)"
    assert E._quotable(bad["visible"]) == "shape (128, 64)"
    assert E._quotable(bad["held_out"], named=True) == E._quotable(bad["held_out"]) == (
        "held-out workload M70 (its detail stays in its own result)")
    assert E._quotable(bad["visible"].model_copy(update={"detail": None})) == ""


def test_the_static_check_without_a_run_uses_the_runs_arch(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(E, "static_check", lambda s, c, t, a, limits: seen.append(limits))
    task = small_gemm()
    evaluator(tmp_path, Worker())._judge(result(task), GOOD, task, "sm_100a", "visible", False, True)
    assert seen == [NOMINAL_LIMITS["sm_100a"]]


def test_a_profile_beside_cupti_keeps_counting_a_module_without_the_opcodes(tmp_path, monkeypatch):
    """A profile is measured on every candidate alike: the counted runs are kept even where the
    SASS holds no requested opcode (never dropped), and the credit stays the in-process one."""
    monkeypatch.setattr("tools.ncu.CreditProcess", lambda features, env, timeout, extra_metrics=(): _Ncu(extra_metrics))
    w = credit_worker({"op": "credits", "credits": {}})
    run(tmp_path, w, insp=sass("FFMA"), executed_check=True, profile=True)
    ops = [m for m in w.asked if m.get("op") == "credit"]
    assert ops == [{"op": "credit"}]


def test_exact_counts_wait_for_the_overlapping_inspection(tmp_path, monkeypatch):
    insp = InspectResult(status="ok", arch="sm_90a", kernels={"gemm_simt": KernelSass(
        opcodes={"HGMMA": 1, "UTMALDG": 1, "UBLKCP": 1}, tma_sites={16: "UTMALDG.2D", 32: "UBLKCP.S.G"})})
    monkeypatch.setattr(E, "_compile", lambda sol, arch: compiled())
    monkeypatch.setattr(E, "_inspect", lambda comp, sol, arch: insp)
    w = credit_worker({"op": "credits", "credits": {}})
    evaluator(tmp_path, w).evaluate(GOOD, small_gemm(), "sm_90a", workloads="all", executed_check=True)
    assert next(m for m in w.asked if m.get("op") == "credit")["sass_sites"] == {
        "gemm_simt": {"16": "UTMALDG.2D", "32": "UBLKCP.S.G"}}
    # a task that does not ask for TMA: no exact counts, whatever the SASS holds
    task = small_gemm()
    task.requested_features = {"sm_90a": ["wgmma"]}
    w = credit_worker({"op": "credits", "credits": {}})
    evaluator(tmp_path, w).evaluate(GOOD, task, "sm_90a", workloads="all", executed_check=True)
    assert next(m for m in w.asked if m.get("op") == "credit") == {"op": "credit"}


def test_credit_seeds_are_62_bits(tmp_path):
    w = credit_worker({"op": "credits", "credits": {}})
    ev = evaluator(tmp_path, w)
    for _ in range(10):
        ev.evaluate(GOOD, small_gemm(), "sm_90a", workloads="all", compiled=(compiled(), sass("HGMMA")),
                    executed_check=True)
    seeds = [m["credit"]["seed"] for m in w.asked if "credit" in m]
    assert len(seeds) == 20 and all(0 <= s < 2**62 for s in seeds) and max(seeds) >= 2**58


def test_the_nsight_compute_fallback_gets_the_features_env_work_and_timed_medians(tmp_path, monkeypatch):
    task = small_gemm()
    made = []

    class Ncu(_Ncu):
        def finish(self, requests, device, works, timed_ms):
            self.finished.append((requests, device, works, timed_ms))
            return ExecutedCheck(status="failed", reason="ncu: ERR_NVGPUCTRPERM")

    monkeypatch.setattr("tools.ncu.CreditProcess", lambda features, env, timeout: made.append(
        (features, env, timeout)) or Ncu())
    w = Worker()
    w.env_without_device = {"PATH": "/x"}
    ev = evaluator(tmp_path, w, ncu_timeout_s=55.0)
    from tools.results import Timing as T

    res = result(task)
    res.gpu = "NVIDIA H200"
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed",
                                    timing=T(median_ms=3.0, iqr_ms=0, cv=0, runs=3),
                                    credit={"status": "unavailable", "reason": "no counters"})]
    x = ev._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "7", sass=sass("HGMMA"))
    assert made == [(["wgmma", "tma"], {"PATH": "/x"}, 55.0)]
    assert x.reason == "in-process counters unavailable (no counters), and Nsight Compute could not count; ncu: ERR_NVGPUCTRPERM"
    assert x.profile.status == "skipped" and x.profile.gpu == "NVIDIA H200"
    assert "not asked for (evaluate(profile=True), --profile-feedback on)" == x.profile.reason


def test_the_fallback_is_handed_each_workloads_work_and_timed_median(tmp_path, monkeypatch):
    task = small_gemm()
    ncu = _Ncu()
    monkeypatch.setattr("tools.ncu.CreditProcess", lambda features, env, timeout: ncu)
    from tools.results import Timing as T

    res = result(task)
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed",
                                    timing=T(median_ms=3.0, iqr_ms=0, cv=0, runs=3),
                                    credit={"status": "unavailable", "reason": "x"})]
    evaluator(tmp_path, Worker())._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "7",
                                            sass=sass("HGMMA"))
    ((requests, device, works, timed),) = ncu.finished
    assert works == [E._task_work(task, task.workloads[0])] and timed == {"M128": 3.0}
    assert len(requests[0]["seeds"]) == 2 and requests[0]["workload"]["name"] == "M128"


def test_a_profile_is_built_from_the_first_workloads_figures(tmp_path, monkeypatch):
    task = small_gemm()
    seen = []
    monkeypatch.setattr(E, "credit_in_process", lambda *a: "c")
    monkeypatch.setattr(E, "combine", lambda features, credits: ExecutedCheck(status="ok", reason=None))
    monkeypatch.setattr(E, "build_profile", lambda metrics, gpu, flops, nbytes, fp8: seen.append((gpu, flops, nbytes, fp8)))
    res = result(task)
    res.gpu = "NVIDIA H200"
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed", credit={"status": "ran"})]
    evaluator(tmp_path)._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti", process=_Ncu(extra=("m",))),
                                  "0", sass=sass("HGMMA"))
    axes = task.axis_values(task.workloads[0])
    assert seen == [("NVIDIA H200", task.flop_count(axes), task.min_bytes(axes), False)]
    # a profile wanted but none collected: ncu's reason, or that it collected none
    monkeypatch.setattr(E, "combine", lambda features, credits: ExecutedCheck(status="ok", reason="why"))

    class Empty(_Ncu):
        def finish(self, *a, **k):
            return ExecutedCheck(status="ok")

    x = evaluator(tmp_path)._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti", process=Empty(("m",))),
                                      "0", sass=sass("HGMMA"))
    assert x.profile.reason == "why" and x.profile.gpu == "NVIDIA H200"
    monkeypatch.setattr(E, "combine", lambda features, credits: ExecutedCheck(status="ok", reason=None))
    x = evaluator(tmp_path)._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti", process=Empty(("m",))),
                                      "0", sass=sass("HGMMA"))
    assert x.profile.reason == "ncu collected no profile"


def test_the_in_process_credit_is_combined_over_the_tasks_features(tmp_path, monkeypatch):
    task = small_gemm()
    seen = []
    monkeypatch.setattr(E, "credit_in_process", lambda *a: "c")
    monkeypatch.setattr(E, "combine", lambda features, credits: seen.append(features) or ExecutedCheck(status="ok"))
    res = result(task)
    res.workloads = [WorkloadResult(workload="M128", split="visible", axes={}, status="passed", credit={"status": "ran"})]
    evaluator(tmp_path)._executed(res, GOOD, task, task.workloads, None, Counting(mode="cupti"), "0", sass=sass("HGMMA"))
    assert seen == [["wgmma", "tma"]]
    # the ncu mode (not in process) with a process: that process counts, no fallback made
    ncu = _Ncu()
    monkeypatch.setattr("tools.ncu.CreditProcess", lambda *a, **k: pytest.fail("no second process"))
    evaluator(tmp_path)._executed(res, GOOD, task, task.workloads, None, Counting(mode="ncu", process=ncu), "0",
                                  sass=sass("HGMMA"))
    assert len(ncu.finished) == 1 and ncu.closed == 1


def test_compile_and_inspect_hand_on_what_they_were_given(monkeypatch):
    seen = []
    monkeypatch.setattr(E, "_compile", lambda sol, arch: seen.append(("c", sol, arch)) or "COMP")
    monkeypatch.setattr(E, "_inspect", lambda comp, sol, arch: seen.append(("i", comp, sol, arch)) or "INSP")
    assert E.Evaluator.compile_and_inspect(GOOD, "sm_100a") == ("COMP", "INSP")
    assert seen == [("c", GOOD, "sm_100a"), ("i", "COMP", GOOD, "sm_100a")]


def test_the_cache_hands_out_deep_copies_and_marks_the_compile_for_nsight(monkeypatch):
    import tools.compile as C

    monkeypatch.setattr(E, "_COMPILED", E.collections.OrderedDict())
    monkeypatch.setattr(C, "compile_solution", lambda sol, arch: compiled(kernels={"k": {"registers": 32}}))
    ranges = []
    import contextlib

    @contextlib.contextmanager
    def nvtx(name):
        ranges.append(name)
        yield

    monkeypatch.setattr(E, "_has_nvtx", lambda: True)
    monkeypatch.setattr(E.protocol, "nvtx_range", nvtx)
    sol = GOOD.model_copy(update={"source": "deep"})
    first = E._compile(sol, "sm_90a")
    first.kernels["k"].registers = 255  # a nested change by the first caller
    second = E._compile(sol, "sm_90a")
    assert second.kernels["k"].registers == 32
    second.kernels["k"].registers = 1
    assert E._compile(sol, "sm_90a").kernels["k"].registers == 32
    assert ranges == ["compile"]


def test_a_toolchain_failure_keeps_the_solutions_language():
    ptx = GOOD.model_copy(update={"language": "ptx"})
    assert E._harness_compile_failure(ptx, "sm_90a", OSError("x")).language == "ptx"
    assert E._harness_compile_failure(object(), "sm_90a", OSError("x")).language == "cuda"


def test_detect_gpus_asks_nvidia_smi_for_index_and_uuid_with_a_timeout(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls = []
    monkeypatch.setattr(E.shutil, "which", lambda name: "/bin/nvidia-smi")
    monkeypatch.setattr(E.subprocess, "run", lambda *a, **k: calls.append((a, k)) or _Proc("0, GPU-a\n"))
    E.detect_gpus()
    assert calls == [((["/bin/nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],),
                      {"capture_output": True, "text": True, "timeout": 30})]
    # an older nvidia-smi that lists indices only: matched by index, never by a uuid it did not give
    monkeypatch.setattr(E.subprocess, "run", lambda *a, **k: _Proc("0\n1\n"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert E.detect_gpus() == (["1"], None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a")
    assert E.detect_gpus()[0] == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(E.subprocess, "run", lambda *a, **k: _Proc("", "e" * 300, 1))
    assert E.detect_gpus() == ([], f"nvidia-smi lists no GPU ({'e' * 200})")


def test_one_worker_per_gpu_made_but_not_started(tmp_path, monkeypatch):
    cache = tmp_path / "deep" / "cache"
    ev = Evaluator(gpus=[0, "2"], cache_dir=cache, worker_cmd=["python", "-m", "x"], startup_timeout_s=12.0)
    assert [w.device for w in ev._workers] == ["0", "2"] and ev.no_gpu_reason is None and ev.has_gpu
    w = ev._workers[1]
    assert (w.cmd, w.startup_timeout_s, w.log_path, w.proc) == (["python", "-m", "x"], 12.0,
                                                                cache.resolve() / "worker-gpu2.log", None)
    assert cache.is_dir()  # made (with its parents) where a worker will write its log
    Evaluator(gpus=["1"], cache_dir=cache)  # made again: fine
    assert {ev._free.get_nowait().device, ev._free.get_nowait().device} == {"0", "2"}
    import secrets as S

    assert isinstance(Evaluator(gpus=[])._rng, S.SystemRandom) and not isinstance(evaluator(tmp_path)._rng, S.SystemRandom)
    monkeypatch.chdir(tmp_path)
    none = Evaluator(gpus=[])
    assert none.cache_dir == (tmp_path / "runs" / ".cache").resolve() and not none.cache_dir.exists()
    monkeypatch.setattr(E, "detect_gpus", lambda: (["5"], None))
    assert [w.device for w in Evaluator()._workers] == ["5"]
    monkeypatch.setattr(E, "detect_gpus", lambda: ([], "nvidia-smi not found"))
    assert Evaluator().no_gpu_reason == "nvidia-smi not found"


class _Judged:
    """Stands in for Evaluator._judge: records what evaluate() handed it, calls module_sass."""

    def __init__(self, before=None):
        self.seen, self.before = {}, before

    def __call__(self, res, solution, task, arch, workloads, sanitize, time, counting, module_sass):
        if self.before:
            self.before()
        self.seen.update(inspect_then=res.inspect, workloads=workloads, sanitize=sanitize, time=time,
                         early=module_sass(wait=False), late=module_sass(), default=module_sass)


def test_the_inspection_overlaps_the_runs_and_is_waited_for_only_when_needed(tmp_path, monkeypatch):
    import threading

    go = threading.Event()
    seen = []
    monkeypatch.setattr(E, "_compile", lambda sol, arch: seen.append(("c", sol, arch)) or compiled(arch=arch))
    monkeypatch.setattr(E, "_inspect", lambda comp, sol, arch: (go.wait(5), seen.append(("i", comp.arch, sol, arch)),
                                                                sass("HGMMA"))[2])
    ev = evaluator(tmp_path)
    judged = _Judged()
    monkeypatch.setattr(ev, "_judge", judged)
    real = judged.__call__

    def judge(*a):
        a[0]  # the result, unused here
        module_sass = a[-1]
        judged.seen["running"] = module_sass(wait=False)  # still running: None, never a guess
        go.set()
        judged.seen["waited"] = module_sass()  # waited for
        real(*a)

    monkeypatch.setattr(ev, "_judge", judge)
    res = ev.evaluate(GOOD, small_gemm(), "sm_100a", workloads="held_out")
    assert judged.seen["running"] is None and judged.seen["waited"].kernels["gemm_simt"].opcodes == {"HGMMA": 1}
    assert (judged.seen["inspect_then"].status, judged.seen["inspect_then"].reason) == ("skipped", "inspection still running")
    assert judged.seen["workloads"] == "held_out" and judged.seen["sanitize"] is False and judged.seen["time"] is True
    assert seen == [("c", GOOD, "sm_100a"), ("i", "sm_100a", GOOD, "sm_100a")]
    assert 0 <= res.phase_s["compile"] < 5 and 0 <= res.phase_s["inspect_wait"] < 5 and 0 < res.seconds < 10
    assert res.inspect.kernels["gemm_simt"].opcodes == {"HGMMA": 1}


def test_an_inspection_that_fails_is_said_where_the_runs_ask_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(E, "_compile", lambda sol, arch: compiled(arch=arch))

    def boom(comp, sol, arch):
        raise RuntimeError("cuobjdump " + "x" * 300)

    monkeypatch.setattr(E, "_inspect", boom)
    ev = evaluator(tmp_path)
    judged = _Judged()
    monkeypatch.setattr(ev, "_judge", judged)
    ev.evaluate(GOOD, small_gemm(), "sm_100a", sanitize=True, time=False)
    late = judged.seen["late"]
    assert (late.status, late.arch) == ("skipped", "sm_100a") and late.reason == ("inspection failed: cuobjdump " + "x" * 300)[:200]
    assert judged.seen["sanitize"] is True and judged.seen["time"] is False


def test_a_harness_failure_is_cut_to_a_line_and_its_traceback_kept_short(tmp_path, monkeypatch):
    ev = evaluator(tmp_path)

    def boom(*a):
        raise ValueError("y" * 3000)

    monkeypatch.setattr(ev, "_judge", boom)
    res = ev.evaluate(GOOD, small_gemm(), "sm_90a", compiled=(compiled(), sass()))
    assert res.run_reason == "harness_error: ValueError: " + "y" * 300
    assert len(res.workloads[0].detail) == 2000


def test_the_ncu_process_gets_the_workers_environment_without_a_device(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr("tools.ncu.CreditProcess", lambda features, env, timeout, extra_metrics=(): made.append(env) or _Ncu())
    w = Worker()
    w.env_without_device = {"PATH": "/only"}
    ev = evaluator(tmp_path, w)
    ev.in_process_credit = False
    monkeypatch.setattr(ev, "_judge", lambda *a: None)
    ev.evaluate(GOOD, small_gemm(), "sm_90a", compiled=(compiled(), sass()), executed_check=True)
    assert made == [{"PATH": "/only"}]


def test_a_stop_skips_every_workload_after_it(tmp_path):
    from tasks.schema import Workload

    task = small_gemm()
    task.workloads = [Workload(name=f"M{m}", axes={"M": m}) for m in (128, 64, 32)]

    def answer(msg):
        wl = msg["workload"]
        return {"op": "result", "result": WorkloadResult(workload=wl["name"], split="visible", axes=wl["axes"],
                                                         status="failed", reason="cuda_error").model_dump()}

    res = evaluator(tmp_path, Worker(answer)).evaluate(GOOD, task, "sm_90a", compiled=(compiled(), sass()))
    assert [(x.workload, x.status) for x in res.workloads] == [("M128", "failed"), ("M64", "skipped"), ("M32", "skipped")]


def test_the_ncu_mode_counts_with_the_solution_on_the_workers_device(tmp_path, monkeypatch):
    ncu = _Ncu()
    monkeypatch.setattr("tools.ncu.CreditProcess", lambda features, env, timeout, extra_metrics=(): ncu)
    ev = evaluator(tmp_path, Worker())
    ev.in_process_credit = False
    ev.evaluate(GOOD, small_gemm(), "sm_90a", workloads="all", compiled=(compiled(), sass("HGMMA")), executed_check=True)
    ((requests, device, works, timed),) = ncu.finished
    assert device == "3" and requests[0]["manifest"] == GOOD.manifest.model_dump(mode="json")


def test_without_an_overlapping_inspection_the_check_reads_the_results_own(tmp_path):
    task = small_gemm()
    res = result(task, insp=sass("FFMA"))
    evaluator(tmp_path, Worker())._run(res, GOOD, task, task.workloads, "sm_90a", False, True, Counting(mode="cupti"))
    assert res.executed.reason == E.NO_REQUESTED_SASS


def test_a_ptx_solutions_toolchain_failure_is_a_ptx_compile(tmp_path, monkeypatch):
    def boom(*a):
        raise OSError("ptxas missing")

    monkeypatch.setattr(E, "_compile", boom)
    ptx = GOOD.model_copy(update={"language": "ptx"})
    assert evaluator(tmp_path).evaluate(ptx, small_gemm(), "sm_90a").compile.language == "ptx"


def test_a_workers_start_up_may_take_5_minutes(tmp_path):
    """The first start imports torch, makes the CUDA context and loads the library (cuBLAS, cuDNN)."""
    assert Evaluator(gpus=["0"], cache_dir=tmp_path)._workers[0].startup_timeout_s == 300.0
