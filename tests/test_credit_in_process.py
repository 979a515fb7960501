"""The executed check in the worker (tools.worker._credit_run, tools.cupti), on CPU: where the
counted run sits among the evaluation's own runs, that it is judged, what happens where CUPTI
cannot run, and the verdict from hardware counters alone (no per-opcode SASS counts). The host
half of CUPTI (metric names, config image, passes) runs here with the real library; the counters
themselves are read in tests/gpu/test_credit_gpu.py."""
from __future__ import annotations

import pytest

from test_evaluator_cpu import CpuState, gemm, small_gemm
from tools import cupti, ncu, worker
from tools.cupti import CuptiError, Launch
from tools.ncu import TaskWork
from tools.solution import Solution
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "adversarial"
WORK = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)


class CountedState(CpuState):
    """The CPU stand-in with in-process counters: `profile(run)` records which launch it saw
    and reports what `metrics_of(launch number)` says that launch did."""

    def __init__(self, kernel, metrics_of=None, fail: str | None = None):
        self.launches, self.counted = 0, []
        self.inside, self.fail = False, fail
        self.metrics_of = metrics_of or (lambda n: {m: 0.0 for m in ncu.CUPTI_METRICS})

        def counting(ws, call):
            self.launches += 1
            if self.inside:
                self.counted.append(self.launches)
            return kernel(ws, self.launches)

        super().__init__(counting)
        state = self

        class Profiler:
            passes = 5
            metrics = list(ncu.CUPTI_METRICS)

            def profile(self, run):
                state.inside = True
                try:
                    run()
                finally:
                    state.inside = False
                return [Launch("gemm", state.metrics_of(state.counted[-1]))]

        self.profiler = Profiler()

    def counters(self, metrics):
        if self.fail:
            raise CuptiError(self.fail)
        return self.profiler


def request(credit_seed: int, time: bool = True, timing_seed: int = 7) -> dict:
    task = small_gemm()
    sol = Solution.from_dir(FIXTURES / "good")
    return {"cubin": b"", "manifest": sol.manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
            "workload": task.workloads[0].model_dump(mode="json"), "seeds": [11, 12], "time": time,
            "timing_seed": timing_seed, "timing_budget_s": 0.01,
            "credit": {"seed": credit_seed, "metrics": list(ncu.CUPTI_METRICS)}}


def test_the_counted_run_comes_after_every_timed_run_at_a_secret_place():
    """Same worker, same module instance: the counted launch follows the checks and all the timed
    runs (never the module's first), at a place that moves with the secret seed."""
    places = set()
    for seed in range(30):
        state = CountedState(gemm)
        result, fatal = worker.run_workload(state, request(seed, timing_seed=seed))
        assert result["status"] == "passed" and not fatal, result
        credit = result["credit"]
        assert credit["status"] == "ran" and len(state.counted) == 1, credit
        before = 2 + result["warmup_runs"] + result["timed_runs"]  # the seeded checks, warm-ups, timed runs
        assert state.counted[0] > before, (state.counted, before)
        assert state.counted[0] == state.launches - credit["runs"] + credit["profiled_at"]
        assert credit["launches"][0]["name"] == "gemm" and credit["passes"] == 5
        places.add(state.counted[0])
    assert len(places) >= 10


def test_the_counted_run_is_judged():
    """A kernel that answers wrong only where it is counted fails the workload: credit is never
    taken on a wrong answer."""
    state = CountedState(lambda ws, n: gemm(ws, n) if not state.inside else ws.outputs["C"].zero_())
    result, _ = worker.run_workload(state, request(3))
    assert result["status"] == "failed" and result["reason"] == "wrong_in_timed_run", result
    assert "executed check's run" in result["detail"]


def test_a_wrong_kernel_is_still_counted_and_not_judged_again():
    """Wrong from the first check: the model still learns whether its instructions ran."""
    state = CountedState(lambda ws, n: ws.outputs["C"].zero_())
    result, _ = worker.run_workload(state, request(4))
    assert result["reason"] == "incorrect"
    assert result["credit"]["status"] == "ran" and len(state.counted) == 1


def test_no_counters_is_unavailable_never_the_candidates_fault():
    state = CountedState(gemm, fail="libcupti not found")
    result, _ = worker.run_workload(state, request(5))
    assert result["status"] == "passed"
    assert result["credit"]["status"] == "unavailable" and "libcupti" in result["credit"]["reason"]
    plain, _ = worker.run_workload(CpuState(gemm), request(5))  # a worker with no counters at all
    assert plain["status"] == "passed" and plain["credit"]["status"] == "unavailable"


def _counters(**kw) -> dict[str, float]:
    out = {m: 0.0 for m in ncu.CUPTI_METRICS}
    out.update({k.replace("__dot__", "."): float(v) for k, v in kw.items()})
    return out


HONEST = _counters(smsp__inst_executed_pipe_tensor_op_gmma__dot__sum=4e6,
                   sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum=WORK.flops * 1.02,
                   smsp__inst_executed_op_tma_ld__dot__sum=3e5,
                   l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld__dot__sum=WORK.read_bytes * 3,
                   gpu__time_duration__dot__sum=1.0e6)
META = {"workload": "M8192", "split": "visible"}


def test_hardware_counters_alone_give_the_verdict():
    """No per-opcode counts in process: wgmma and TMA are counted by their own counters and the
    shares decide as before."""
    wc = ncu.credit_in_process(META, {"status": "ran", "runs": 3, "profiled_at": 2,
                                      "launches": [{"name": "k", "metrics": HONEST}]}, ["wgmma", "tma"], WORK, 1.0)
    assert wc.status == "ok" and wc.carries == {"wgmma": True, "tma": True}, wc
    assert wc.counts == {"wgmma": 4_000_000, "tma": 300_000}
    no_tma = dict(HONEST, **{"smsp__inst_executed_op_tma_ld.sum": 0.0})
    wc = ncu.credit_in_process(META, {"status": "ran", "launches": [{"name": "k", "metrics": no_tma}]},
                               ["wgmma", "tma"], WORK, 1.0)
    assert wc.executed["tma"] is False and wc.carries["tma"] is False
    simt = _counters(smsp__sass_thread_inst_executed_op_ffma_pred_on__dot__sum=WORK.flops / 2,
                     smsp__inst_executed_pipe_tensor_op_gmma__dot__sum=8,
                     sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum=WORK.flops * 0.001,
                     gpu__time_duration__dot__sum=1.0e6)
    wc = ncu.credit_in_process(META, {"status": "ran", "launches": [{"name": "k", "metrics": simt}]},
                               ["wgmma"], WORK, 1.0)
    assert wc.executed["wgmma"] and not wc.carries["wgmma"]


def test_the_in_process_run_is_tied_to_the_timed_median_both_ways():
    ran = {"status": "ran", "launches": [{"name": "k", "metrics": HONEST}]}  # 1.0 ms counted
    assert ncu.credit_in_process(META, ran, ["wgmma"], WORK, 0.5).carries["wgmma"] is False  # timed path faster
    assert ncu.credit_in_process(META, ran, ["wgmma"], WORK, 2.0).carries["wgmma"] is False  # timed path slower
    assert ncu.credit_in_process(META, ran, ["wgmma"], WORK, 1.0).carries["wgmma"] is True


def test_fp8_ops_count_as_wgmma_only_where_the_sass_has_no_warp_level_mma():
    """The fp8 ops counter does not tell QGMMA from mma.sync, and the HMMA-pipe instruction counter
    counts HGMMA and QGMMA too (CUPTI's description, below): an honest fp8 wgmma kernel reads it
    above 0. So the module's SASS decides: no warp-level MMA in it, every fp8 op was QGMMA's."""
    fp8 = _counters(smsp__inst_executed_pipe_tensor_op_gmma__dot__sum=1e6, sm__ops_path_tensor_src_fp8__dot__sum=1e12,
                    sm__inst_executed_pipe_tensor_op_hmma__dot__sum=1e6)  # the QGMMAs themselves
    row = lambda mma_sync: ncu.counter_rows([{"name": "k", "metrics": fp8}], mma_sync)  # noqa: E731
    assert ncu.work_metrics(row(False))["wgmma_flops"] == 1e12
    assert ncu.work_metrics(row(False))["other_flops"] == 0.0
    for unsure in (True, None):  # an mma.sync in the SASS, or SASS not read: not wgmma's
        assert ncu.work_metrics(row(unsure))["wgmma_flops"] == 0.0
        assert ncu.work_metrics(row(unsure))["other_flops"] == 1e12
    assert ncu.issues_mma_sync({"QGMMA", "UTMALDG"}) is False and ncu.issues_mma_sync(None) is None
    assert all(ncu.issues_mma_sync({op}) for op in ("HMMA", "IMMA", "QMMA", "DMMA"))


def test_an_fp8_wgmma_solution_is_credited_through_the_evaluator_path():
    """credit_in_process with the SASS fact the evaluator passes: an fp8 wgmma kernel carries the
    work; the same counters from a module that also holds HMMA do not."""
    fp8 = _counters(smsp__inst_executed_pipe_tensor_op_gmma__dot__sum=1e6,
                    sm__ops_path_tensor_src_fp8__dot__sum=WORK.flops, sm__inst_executed_pipe_tensor_op_hmma__dot__sum=1e6,
                    gpu__time_duration__dot__sum=1.0e6)
    ran = {"status": "ran", "launches": [{"name": "k", "metrics": fp8}]}
    assert ncu.credit_in_process(META, ran, ["wgmma"], WORK, 1.0, mma_sync=False).carries["wgmma"] is True
    assert ncu.credit_in_process(META, ran, ["wgmma"], WORK, 1.0, mma_sync=True).carries["wgmma"] is False
    assert ncu.credit_in_process(META, ran, ["wgmma"], WORK, 1.0).carries["wgmma"] is False


WARP_MMA = {  # an extra kernel in the module, never launched: what the module's SASS holds decides
    "qgmma": r"""
extern "C" __global__ void spare(float* out, unsigned long long da, unsigned long long db) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("wgmma.fence.sync.aligned;\n"
               "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, 0, 1, 1;\n"
               "wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db));
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
""",
    "hmma": r"""
extern "C" __global__ void spare(float* out, const unsigned* a) {
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  unsigned t = threadIdx.x;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};" : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
               : "r"(a[t]), "r"(a[t + 32]), "r"(a[t + 64]), "r"(a[t + 96]), "r"(a[t + 32]), "r"(a[t]));
  out[t] = d0 + d1 + d2 + d3;
}
""",
}


@pytest.mark.parametrize("spare,credited", [("qgmma", True), ("hmma", False)])
def test_the_evaluator_reads_the_fp8_rule_from_the_modules_sass(spare, credited, tmp_path, monkeypatch):
    """End to end on CPU (real NVRTC, ptxas and disassembler; a stand-in worker that reports an
    honest fp8 wgmma kernel's counters): the module's SASS reaches the in-process verdict. With no
    warp-level MMA anywhere in the module the fp8 ops are wgmma's; with an mma.sync beside them
    they may not be, and no credit is taken."""
    import json
    import sys

    from test_evaluator_cpu import ROOT
    from tools.evaluator import Evaluator

    mode = tmp_path / "mode"
    mode.write_text("fp8_wgmma")
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(mode))
    monkeypatch.delenv("PTXBENCH_CREDIT", raising=False)
    sol = tmp_path / "sol"
    sol.mkdir()
    (sol / "kernel.cu").write_text((FIXTURES / "good" / "kernel.cu").read_text() + WARP_MMA[spare])
    (sol / "launch.json").write_text((FIXTURES / "good" / "launch.json").read_text())
    with Evaluator(gpus=[0], worker_cmd=[sys.executable, str(ROOT / "tests" / "fake_worker.py")], timeout_s=30,
                   cache_dir=tmp_path) as ev:
        r = ev.evaluate(Solution.from_dir(sol), small_gemm(), "sm_90a", executed_check=True, time=False)
    assert r.compile.ok, r.compile.error
    assert ("QGMMA" if spare == "qgmma" else "HMMA") in {op for k in r.inspect.kernels.values() for op in k.opcodes}
    assert r.executed.status == "ok", json.dumps(r.executed.model_dump(mode="json"))[:800]
    assert all(c.carries["wgmma"] is credited for c in r.executed.workloads), r.executed.workloads


def test_a_workload_whose_run_was_not_counted_withholds_credit():
    wc = ncu.credit_in_process({"workload": "M70", "split": "held_out"}, {"status": "failed", "runs": 2,
                                                                          "reason": "CUPTI error 7"}, ["wgmma"], WORK, 1.0)
    assert wc.status == "skipped" and "CUPTI error 7" in wc.reason


# ---------------------------------------------------------------- CUPTI's host half, real library

def _host_library():
    try:
        return cupti.library()
    except CuptiError as exc:
        pytest.fail(f"libcupti is a dev dependency (nvidia-cuda-cupti): {exc}")


def test_the_check_reads_its_counters_in_six_passes_on_gh100():
    """The metric names exist on the H100/H200 chip, and the count of kernel replays they cost
    is known (docs/BENCHMARKS.md measures that cost)."""
    _host_library()
    assert cupti.passes("GH100", list(ncu.CUPTI_METRICS)) == 6
    assert cupti.passes("GH100", [ncu.GMMA_METRIC, ncu.DURATION_METRIC]) == 1


def test_the_hmma_pipe_counter_counts_warpgroup_mmas_too():
    """Why the fp8 rule reads the SASS and not this counter: CUPTI describes it, on GH100, as
    counting the tensor pipe's HGMMA and QGMMA instructions beside HMMA."""
    import ctypes as C

    _host_library()
    props = cupti._struct("MetricProperties", [("pHostObject", cupti.P), ("pMetricName", C.c_char_p),
                                               ("pDescription", C.c_char_p), ("pHwUnit", C.c_char_p),
                                               ("pDimUnit", C.c_char_p), ("metricType", C.c_int)])
    host = cupti._Host("GH100", None, [ncu.DURATION_METRIC])
    try:
        p = props(pHostObject=host.obj, pMetricName=ncu.HMMA_INST_METRIC.removesuffix(".sum").encode())
        cupti._call("cuptiProfilerHostGetMetricProperties", p)
    finally:
        host.close()
    assert b"HGMMA" in p.pDescription and b"QGMMA" in p.pDescription, p.pDescription


def test_an_unknown_metric_is_a_clear_error():
    _host_library()
    with pytest.raises(CuptiError, match="cuptiProfilerHostConfigAddMetrics"):
        cupti.passes("GH100", ["sm__no_such_counter.sum"])


def test_struct_sizes_follow_cuptis_rule():
    """CUPTI_PROFILER_STRUCT_SIZE is the end of the last field, not sizeof: a struct that ends
    in a byte (Stop) is smaller than its padded size."""
    assert cupti.Stop.size == cupti.Stop.isAllPassSubmitted.offset + 1 < __import__("ctypes").sizeof(cupti.Stop)
    assert cupti.Init.size == 16 and cupti.SetConfig.size == cupti.SetConfig.targetNestingLevel.offset + 2


def test_a_hang_in_the_counted_run_is_the_verdict_not_a_profiler_error(monkeypatch):
    """A kernel that hangs only where it is counted: the worker reports the hang (and restarts),
    even though CUPTI then fails to stop its range."""
    from tools.timing import KernelTimeout

    calls = []

    def call(fn, params):
        calls.append(fn)
        if fn == "cuptiRangeProfilerStop":  # a range that cannot be stopped: the GPU is stuck
            raise CuptiError(f"{fn} failed")

    monkeypatch.setattr(cupti, "_call", call)
    prof = cupti.RangeProfiler.__new__(cupti.RangeProfiler)
    prof.keep_enabled, prof._obj, prof._data = False, 1, (cupti.C.c_uint8 * 8)()
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
    ex = ev._executed(res, sol, task, task.workloads[:1], None, None, "0", in_process=True, arch="sm_90a")
    assert made == [["wgmma"]] and ex.status == "ok" and ex.carries == {"wgmma": True}
    assert "in-process counters unavailable (no libcupti" in ex.reason and "Nsight Compute counted instead" in ex.reason
    assert ex.profile is not None and ex.profile.status == "skipped" and "not asked for" in ex.profile.reason
