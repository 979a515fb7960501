"""The evaluator without a GPU: manifest planning, the worker's verdict logic (run on CPU
tensors with a stand-in for the CUDA side), timing statistics, the baseline cache, ncu and
compute-sanitizer output parsing, the watchdog (with a fake worker process), and the
Evaluator's CPU path (compile + inspect with the real ptxas, run skipped with a reason)."""
from __future__ import annotations

import io
import json
import sys
import threading
from pathlib import Path

import pytest
import torch

from tasks import get_task
from tasks.schema import Axis, Workload
from tools import worker, workspace
from tools.baseline_cache import BaselineCache, cache_key
from tools.correctness import CANARY, Guarded, compare, poison_, poison_mask
from tools.evaluator import Evaluator, WorkerHandle, WorkerStartError, detect_gpus
from tools.launch import NOMINAL_LIMITS, CudaError, ManifestError, plan_launches
from tools.credit import counts_from_rows, parse_instances
from tools.ncu import parse_raw_csv, parse_sanitizer
from tools.solution import LaunchManifest, Solution
from tasks.schema import Tolerance
from tools.timing import KernelTimeout, geo_spread, geomean, median_ci, plan_pairs, summarize

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "adversarial"
H100 = NOMINAL_LIMITS["sm_90a"]
TOL = Tolerance(rtol=1e-2, atol=1e-2)


def small_gemm():
    """The GEMM task shrunk to CPU size: N=64, K=32, M=128 visible and M=70 held out."""
    task = get_task("gemm_n7168_k5120")
    task.axes["N"] = Axis(type="const", value=64)
    task.axes["K"] = Axis(type="const", value=32)
    task.workloads = [Workload(name="M128", axes={"M": 128}), Workload(name="M70", axes={"M": 70}, split="held_out")]
    return task


def manifest(**launch) -> LaunchManifest:
    base = {"kernel": "gemm_simt", "grid": ["cdiv(N, 64)", "cdiv(M, 64)"], "block": [256],
            "args": ["A", "B", "C", "M", "N", "K"]}
    extra = {k: launch.pop(k) for k in ("buffers", "tensor_maps") if k in launch}
    return LaunchManifest.model_validate({"launches": [{**base, **launch}], **extra})


# ---------------------------------------------------------------- planning

def test_plan_evaluates_expressions():
    task = get_task("gemm")
    plan = plan_launches(manifest(grid=["min(num_sms, cdiv(M, 128) * (N // 256))"], block=[384],
                                  shared_bytes="200 * 1024"), task, {"M": 8192}, H100)
    lp = plan.launches[0]
    assert lp.grid == (132, 1, 1) and lp.block == (384, 1, 1) and lp.shared_bytes == 204800
    assert [a.kind for a in lp.args] == ["pointer", "pointer", "pointer", "i32", "i32", "i32"]
    assert [a.value for a in lp.args[3:]] == [8192, 7168, 5120]
    assert plan.tensors["C"] == ("bfloat16", (8192, 7168))


def test_plan_tensor_maps_and_buffers():
    task = get_task("gemm")
    m = manifest(buffers=[{"name": "ws", "dtype": "float32", "shape": ["M", 4]}],
                 tensor_maps=[{"name": "tmA", "tensor": "A", "box": [128, 64], "swizzle": "128B"},
                              {"name": "tmW", "tensor": "ws", "view": ["M * 4"], "box": [64]}],
                 args=["tmA", "ws", "tmW", {"type": "f32", "value": "1 / sqrt(K)"}, "num_sms"])
    plan = plan_launches(m, task, {"M": 256}, H100)
    assert plan.buffers[0].shape == (256, 4) and plan.buffers[0].nbytes == 4096
    assert plan.tensor_maps[0].view == (256, 5120) and plan.tensor_maps[0].box == (128, 64)
    assert plan.tensor_maps[1].view == (1024,)
    kinds = [(a.kind, a.nbytes) for a in plan.launches[0].args]
    assert kinds == [("tensor_map", 128), ("pointer", 8), ("tensor_map", 128), ("f32", 4), ("i32", 4)]
    assert abs(plan.launches[0].args[3].value - 5120 ** -0.5) < 1e-12


@pytest.mark.parametrize("launch, reason, needle", [
    ({"args": ["A", "B", "C", "MM"]}, "manifest_error", "launches[0] ('gemm_simt').args[3]: unknown name 'MM'"),
    ({"grid": ["cdiv(N, 64", 1]}, "manifest_error", "launches[0] ('gemm_simt').grid[0]"),
    ({"grid": ["M - M"]}, "manifest_error", "grid[0]: 'M - M' = 0, must be at least 1"),
    ({"grid": [1, 70000]}, "launch_error", "grid[1] = 70000 exceeds the device limit 65535"),
    ({"block": [2048]}, "launch_error", "block = [2048, 1, 1]"),
    ({"shared_bytes": 300000}, "launch_error", "shared_bytes = 300000 exceeds"),
    ({"cluster": [3]}, "launch_error", "cluster[0] = 3 does not divide grid[0] = 112"),
    ({"cluster": [4, 4, 2], "grid": [112, 128, 2]}, "launch_error", "at most 16 blocks per cluster"),
    ({"shared_bytes": "K / 3"}, "manifest_error", "is not an integer"),
])
def test_plan_errors_name_the_field(launch, reason, needle):
    with pytest.raises(ManifestError) as err:
        plan_launches(manifest(**launch), get_task("gemm"), {"M": 8192}, H100)
    assert err.value.reason == reason and needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("tmap, needle", [
    ({"name": "t", "tensor": "Q", "box": [64, 64]}, "unknown tensor 'Q'"),
    ({"name": "t", "tensor": "A", "box": [512, 64]}, "at most 256 elements"),
    ({"name": "t", "tensor": "A", "box": [64, 4]}, "not a multiple of 16 bytes"),
    ({"name": "t", "tensor": "A", "box": [64, 128], "swizzle": "128B"}, "swizzle 128B"),
    ({"name": "t", "tensor": "A", "view": ["M", "K", 2], "box": [1, 64, 2]}, "has 83886080 elements"),
    ({"name": "t", "tensor": "A", "box": [64]}, "1 dims but the tensor has 2"),
])
def test_plan_tensor_map_errors(tmap, needle):
    with pytest.raises(ManifestError) as err:
        plan_launches(manifest(tensor_maps=[tmap]), get_task("gemm"), {"M": 8192}, H100)
    assert needle in str(err.value) and "tensor_maps[0]" in str(err.value)


def test_buffer_name_clash_and_size():
    with pytest.raises(ManifestError, match="clashes with the task's tensor 'C'"):
        plan_launches(manifest(buffers=[{"name": "C", "dtype": "float32", "shape": [4]}]), get_task("gemm"),
                      {"M": 64}, H100)
    with pytest.raises(ManifestError, match="GiB is more than"):
        plan_launches(manifest(buffers=[{"name": "w", "dtype": "float32", "shape": ["M", "N", "K"]}]),
                      get_task("gemm"), {"M": 8192}, H100)


# ---------------------------------------------------------------- guards, poison, compare

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.int32])
def test_guard_and_poison(dtype):
    g = Guarded((5, 7), dtype, device="cpu")
    assert g.data_ptr() % 256 == 0 and g.guard_damage() == (0, 0)
    poison_(g.tensor)
    assert poison_mask(g.tensor).all()
    if dtype.is_floating_point:
        assert torch.isnan(g.tensor.float()).all()
    g.tensor.view(torch.uint8).fill_(0)  # writing the whole tensor touches no guard
    assert g.guard_damage() == (0, 0) and not poison_mask(g.tensor).any()
    g.raw[g.start - 1] = 0
    g.raw[g.end] = 0
    assert g.guard_damage() == (1, 1)
    g.reset_guards()
    assert g.guard_damage() == (0, 0) and int(g.raw[0]) == CANARY


def test_canonical_nan_is_not_poison():
    t = torch.empty(4, dtype=torch.bfloat16)
    poison_(t)
    t[1] = float("nan")  # what arithmetic writes
    assert poison_mask(t).tolist() == [True, False, True, True]


def test_compare_reports_first_mismatch_and_nan():
    e = torch.randn(6, 8)
    m = compare("C", e.bfloat16(), e, TOL)
    assert m.passed and m.mismatch_frac == 0 and m.first_mismatch is None
    got = e.clone()
    got[2, 5] += 3
    got[4, 1] = float("nan")
    m = compare("C", got, e, TOL)
    assert not m.passed and m.first_mismatch == [2, 5] and m.nan_count == 1
    assert m.mismatch_frac == pytest.approx(2 / 48) and m.max_abs_err == pytest.approx(3, rel=1e-5)
    assert compare("C", torch.full((2,), float("nan")), torch.full((2,), float("nan")), Tolerance(rtol=1, atol=1)).passed is False
    assert compare("C", torch.zeros(3), torch.zeros(4), Tolerance(rtol=1, atol=1)).passed is False


# ---------------------------------------------------------------- the worker's verdicts, on CPU

class FakeBound:
    def __init__(self, ws, kernel):
        self.ws, self.kernel, self.calls = ws, kernel, 0

    def launch(self):
        self.calls += 1
        self.kernel(self.ws, self.calls)


class CpuEvent:
    def record(self):
        import time
        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


class CpuState:
    """Stands in for tools.worker.State: CPU tensors, a Python 'kernel' instead of a cubin."""

    device = "cpu"
    limits = H100
    info = {"gpu": "cpu"}

    def __init__(self, kernel, wait=None):
        self.kernel, self._wait = kernel, wait
        self.flusher = type("Flusher", (), {"flush": lambda self: None})()
        self.restored = 0
        self.pending = []  # deferred workloads (tools.counted.Counted), as State keeps them
        self.kept = self.unloaded = 0  # modules handed to deferred workloads, and unloaded after their counted runs

    def bind(self, plan, cubin, symbols, ws):
        return FakeBound(ws, self.kernel)

    def keep_module(self):
        self.kept += 1
        state = self
        return type("KeptModule", (), {"unload": lambda self: setattr(state, "unloaded", state.unloaded + 1)})()

    def drop_pending(self):
        self.pending = []

    def event(self):
        return CpuEvent()

    def gpu_state(self):
        return {}

    def restore(self):
        self.restored += 1
        return None

    def wait(self, limit_s):
        if self._wait:
            self._wait()

    def sticky_error(self):
        return None


def gemm(ws, call):
    ws.outputs["C"].copy_((ws.inputs["A"].float() @ ws.inputs["B"].float().T).bfloat16())


def run(kernel, workload=0, wait=None, seeds=(11, 12), manifest_dict=None, task=None, time=False, timing_seed=7):
    task = task or small_gemm()
    sol = Solution.from_dir(FIXTURES / "good")
    req = {"cubin": b"", "manifest": manifest_dict or sol.manifest.model_dump(mode="json"),
           "task": task.model_dump(mode="json"), "workload": task.workloads[workload].model_dump(mode="json"),
           "seeds": list(seeds), "time": time, "timing_seed": timing_seed, "timing_budget_s": 0.01}
    result, fatal = worker.run_workload(CpuState(kernel, wait), req)
    return result, fatal


def corrupt(ws):
    g = ws.guarded["C"]
    g.raw[g.end + 10] = 0


@pytest.mark.parametrize("kernel, reason, needle", [
    (gemm, None, None),
    (lambda ws, c: (gemm(ws, c), corrupt(ws)), "out_of_bounds_write", "outside output 'C'"),
    (lambda ws, c: (gemm(ws, c), ws.inputs["B"].view(torch.int16)[0, 0].add_(1)), "input_modified", "input 'B'"),
    (lambda ws, c: ws.outputs["C"][:-1].copy_((ws.inputs["A"][:-1].float() @ ws.inputs["B"].float().T).bfloat16()),
     "unwritten_output", "64 of 8192 elements were never written"),
    (lambda ws, c: (gemm(ws, c), ws.outputs["C"].__setitem__((3, 3), float("nan"))), "nan_output", "1 NaN"),
    (lambda ws, c: (gemm(ws, c), ws.outputs["C"].mul_(1.05)), "incorrect", "first at"),
    (lambda ws, c: gemm(ws, c) if c == 1 else ws.outputs["C"].zero_(), "wrong_after_first_call", "call 2"),
    (lambda ws, c: None if c > 1 else gemm(ws, c), "wrong_after_first_call", "never written"),  # replays a cache
])
def test_worker_verdicts(kernel, reason, needle):
    result, fatal = run(kernel)
    assert result["reason"] == reason, result["detail"]
    assert result["status"] == ("passed" if reason is None else "failed") and not fatal
    if needle:
        assert needle in result["detail"]
    assert result["seeds"] == [11, 12]


def test_fresh_inputs_each_check():
    seen = []
    run(lambda ws, c: (seen.append(ws.inputs["A"].clone()), gemm(ws, c)))
    assert len(seen) == 2 and not torch.equal(seen[0], seen[1])


def test_zero_false_buffers_get_garbage_and_zero_true_get_zeros():
    """Each call sees zero=true scratch zeroed and zero=false scratch as random bytes new to that
    call (no NaN or constant a kernel could take for "unset")."""
    seen = {"z": [], "g": []}

    def kernel(ws, call):
        for k, (t, _) in ws.buffers.items():
            seen[k].append(t.clone())
        gemm(ws, call)

    m = manifest(buffers=[{"name": "z", "dtype": "float32", "shape": [8]},
                          {"name": "g", "dtype": "float32", "shape": [8], "zero": False}],
                 args=["A", "B", "C", "z", "g"]).model_dump(mode="json")
    result, _ = run(kernel, manifest_dict=m)
    assert result["status"] == "passed" and len(seen["g"]) >= 2
    assert all((z == 0).all() for z in seen["z"])
    assert not any(torch.isnan(g).all() for g in seen["g"])
    assert len({bytes(g.view(torch.uint8).tolist()) for g in seen["g"]}) == len(seen["g"])


@pytest.mark.parametrize("dtype, filled", [
    ("int32", lambda flag: int(flag[0]) == 0x5A5A5A5A),  # a counter that counts from the fill
    ("float32", lambda flag: bool(torch.isnan(flag[0]))),  # NaN as "unset"
], ids=["counts_from_the_fill", "nan_as_unset"])
def test_no_fill_value_is_a_sentinel(dtype, filled):
    """A kernel right only where a zero=false buffer holds the old constant fill fails (the
    CPU twin of tests/gpu/test_evaluator_gpu.py::test_no_fill_value_is_a_sentinel)."""
    def kernel(ws, call):
        gemm(ws, call)
        if not filled(ws.buffers["flag"][0]):
            ws.outputs["C"].zero_()

    m = manifest(buffers=[{"name": "flag", "dtype": dtype, "shape": [1], "zero": False}],
                 args=["A", "B", "C", "M", "N", "K", "flag"]).model_dump(mode="json")
    result, _ = run(kernel, manifest_dict=m)
    assert result["reason"] in ("incorrect", "wrong_after_first_call") and "output 'C'" in result["detail"], result


def split_k_from_the_poison(ws, call):
    """C in two K halves, the first stored where C still reads NaN (the poison) and added elsewhere:
    right only where the output was poisoned, i.e. it takes the poison for zeroing C."""
    a, b, c = ws.inputs["A"].float(), ws.inputs["B"].float(), ws.outputs["C"]
    k0 = a.shape[1] // 2
    first = a[:, :k0] @ b[:, :k0].T
    c.copy_(torch.where(torch.isnan(c.float()), first, c.float() + first).bfloat16())
    c.copy_((c.float() + a[:, k0:] @ b[:, k0:].T).bfloat16())


class Alternating:
    """tools.correctness' secrets, made to alternate poison (0) and random bytes (1) run by run."""

    def __init__(self):
        self.n = 0

    def randbits(self, _: int) -> int:
        self.n += 1
        return self.n % 2


def test_the_output_poison_is_no_sentinel_on_the_timed_runs(monkeypatch):
    """A kernel that takes the output's poison for initialisation passes the seeded checks (they keep
    the poison, for the unwritten_output diagnosis) and fails on the timed runs, whose outputs hold
    random bytes on a secret half of the runs (tools.correctness.fill_output_; the coin alternates here)."""
    import tools.correctness as C

    monkeypatch.setattr(C, "secrets", Alternating())
    assert run(split_k_from_the_poison)[0]["status"] == "passed"
    result, fatal = run(split_k_from_the_poison, time=True)
    assert result["reason"] == "wrong_in_timed_run" and "output 'C'" in result["detail"] and not fatal, result
    # the control: the same split with C zeroed first, as real use needs, passes the timed runs
    result, _ = run(lambda ws, call: (ws.outputs["C"].zero_(), split_k_from_the_poison(ws, call)), time=True)
    assert result["status"] == "passed", result["detail"]


def test_held_out_workload_and_timeout_and_cuda_error():
    result, _ = run(gemm, workload=1)
    assert result["status"] == "passed" and result["split"] == "held_out" and result["axes"]["M"] == 70

    def hang():
        raise KernelTimeout("the GPU did not finish within 15 s")
    result, fatal = run(gemm, wait=hang)
    assert result["reason"] == "timeout" and fatal

    def illegal():
        raise CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "kernel execution")
    result, fatal = run(gemm, wait=illegal)
    assert result["reason"] == "cuda_error" and "CUDA_ERROR_ILLEGAL_ADDRESS" in result["detail"] and fatal


def test_manifest_error_in_worker_is_a_result():
    m = manifest(args=["A", "B", "C", "nope"]).model_dump(mode="json")
    result, fatal = run(gemm, manifest_dict=m)
    assert result["reason"] == "manifest_error" and "unknown name 'nope'" in result["detail"] and not fatal


# ---------------------------------------------------------------- protocol framing

def test_framing_roundtrip():
    msgs = [{"op": "run", "cubin": bytes(range(256)) * 100}, {"op": "exit"}]
    stream = io.BytesIO(b"".join(worker.encode(m) for m in msgs))
    assert worker.read_msg(stream) == msgs[0]
    assert worker.read_msg(stream) == msgs[1]
    assert worker.read_msg(stream) is None  # clean end
    with pytest.raises(EOFError):
        worker.read_msg(io.BytesIO(worker.encode(msgs[0])[:-5]))


# ---------------------------------------------------------------- timing statistics

def test_summarize_and_plan_pairs():
    import random

    t = summarize([1.0, 1.1, 0.9, 1.0, 5.0])
    assert t.median_ms == 1.0 and t.runs == 5 and t.iqr_ms == pytest.approx(0.1) and t.cv > 0.5
    counts = {plan_pairs(0.001, random.Random(s)) for s in range(200)}
    assert min(counts) >= 60 and max(counts) <= 90 and len(counts) > 10  # capped, and unpredictable
    counts = {plan_pairs(5.0, random.Random(s)) for s in range(200)}
    assert min(counts) >= 10 and max(counts) <= 15  # slow: at least 10 pairs
    lo, hi = median_ci([1.0, 1.01, 0.99, 1.0, 1.02, 0.98] * 5, random.Random(0))
    assert 0.98 <= lo <= 1.0 <= hi <= 1.02
    assert geomean([1.0, 4.0]) == pytest.approx(2.0) and geo_spread([2.0, 2.0]) == pytest.approx(1.0)


# ---------------------------------------------------------------- baseline cache

def test_baseline_cache(tmp_path):
    cache = BaselineCache(tmp_path / "b.json")
    env = {"gpu": "NVIDIA H200", "driver": "13.0", "torch": "2.11", "cuda": "13.0", "cudnn": 91900}
    key = cache_key("gemm_n7168_k5120", "M8192", {"M": 8192, "N": 7168, "K": 5120}, env)
    assert cache.get(key) is None
    threads = [threading.Thread(target=cache.update, args=(key,), kwargs={f"b{i}": i}) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    entry = cache.get(key)
    assert all(entry[f"b{i}"] == i for i in range(8)) and "NVIDIA H200" in key
    (tmp_path / "b.json").write_text("{broken")
    assert cache.get(key) is None  # a damaged cache is only a cache


# ---------------------------------------------------------------- ncu / compute-sanitizer parsing

NCU_CSV = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","sass__inst_executed_per_opcode","smsp__inst_executed_pipe_tensor_op_gmma.sum"
"","","","","","","","","","","","inst","inst"
"0","42","python3","h","gemm","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","1500 (HGMMA: 300; IMAD: 1000; UTMALDG.2D: 200)","300"
"1","42","python3","h","gemm","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","1200 (IMAD: 1000; UTMALDG: 200)","0"
'''


def test_ncu_parsing():
    assert parse_instances("1500 (HGMMA: 300; IMAD: 1,000)") == {"HGMMA": 300, "IMAD": 1000}
    rows = parse_raw_csv("==PROF== Disconnected\n" + NCU_CSV)
    assert len(rows) == 2 and rows[0]["Kernel Name"] == "gemm"
    counts, uncounted = counts_from_rows(rows, ["wgmma", "tma", "mbarrier"])
    assert counts == {"wgmma": 300, "tma": 400, "mbarrier": 0} and not uncounted
    counts, uncounted = counts_from_rows([{"ID": "0", "sass__inst_executed_per_opcode": "n/a"}], ["tma"])
    assert uncounted == ["tma"]


def test_sanitizer_parsing():
    out = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at gemm_simt+0x1f0
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x40 is out of bounds
========= ERROR SUMMARY: 1 error"""
    assert parse_sanitizer(out, ["gemm_simt"]) == ["Invalid __global__ write of size 4 bytes at gemm_simt+0x1f0"]


# ---------------------------------------------------------------- watchdog, with a fake worker

@pytest.fixture
def fake(tmp_path, monkeypatch):
    mode = tmp_path / "mode"
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(mode))

    def set_mode(m):
        mode.write_text(m)
    set_mode("pass")
    return set_mode, [sys.executable, str(ROOT / "tests" / "fake_worker.py")]


def test_watchdog_kills_a_hung_worker_and_restarts(fake, tmp_path):
    set_mode, cmd = fake
    sol = Solution.from_dir(FIXTURES / "good")
    with Evaluator(gpus=[0], worker_cmd=cmd, timeout_s=2, cache_dir=tmp_path) as ev:
        set_mode("hang")
        r = ev.evaluate(sol, small_gemm(), "sm_90a", workloads="all")
        first, second = r.workloads
        assert first.reason == "timeout" and first.status == "failed" and "killed" in first.detail
        assert second.status == "skipped" and "ended with timeout" in second.detail
        assert r.correct is False and r.speedup is None and r.gpu == "Fake H200"
        set_mode("pass")
        r = ev.evaluate(sol, small_gemm(), "sm_90a")
        assert r.correct is True and ev._workers[0].starts == 2, (r.run_reason, r.workloads)


def test_a_crash_is_quoted_by_its_own_last_words_never_an_earlier_evaluations(fake, tmp_path):
    """The worker serves evaluation after evaluation; a crash's note quotes its last lines of
    stderr, where a kernel's debug printf lands. A candidate that crashed before writing anything
    was quoted by the lines the one before it wrote last: its held-out workload's ("rows 70", M70),
    or another client's kernel on a service."""
    set_mode, cmd = fake
    sol = Solution.from_dir(FIXTURES / "good")
    with Evaluator(gpus=[0], worker_cmd=cmd, timeout_s=20, cache_dir=tmp_path) as ev:
        set_mode("prints")
        assert ev.evaluate(sol, small_gemm(), "sm_90a", workloads="all").correct is True
        set_mode("crash")
        crashed = ev.evaluate(sol, small_gemm(), "sm_90a").workloads[0]
    assert crashed.reason == "worker_crash" and "SIGSEGV" in crashed.detail and "rows" not in crashed.detail


def test_a_harness_fault_on_a_held_out_workload_is_not_quoted_in_the_evaluations_own_words(fake, tmp_path):
    """The worker's own failure on a workload is a harness fault, which the evaluation names as a
    whole (`harness_fault`, its infra_error) and a client of the service reads; on a held-out
    workload it quoted the exception, and the exception its tensor's size ("(70)": M70)."""
    from agent.feedback import redact_held_out

    set_mode, cmd = fake
    set_mode("held_out_harness_error")
    with Evaluator(gpus=[0], worker_cmd=cmd, timeout_s=20, cache_dir=tmp_path) as ev:
        r = ev.evaluate(Solution.from_dir(FIXTURES / "good"), small_gemm(), "sm_90a", workloads="all")
    held = r.workloads[1]
    assert held.reason == "harness_error" and "(70)" in held.detail  # kept for the researcher
    assert r.infra_error and "(70)" not in r.harness_fault and "(70)" not in redact_held_out(r).model_dump_json()


def test_crash_and_fatal_error_restart(fake, tmp_path):
    set_mode, cmd = fake
    sol = Solution.from_dir(FIXTURES / "good")
    with Evaluator(gpus=[0], worker_cmd=cmd, timeout_s=20, cache_dir=tmp_path) as ev:
        set_mode("crash")
        r = ev.evaluate(sol, small_gemm(), "sm_90a")
        assert r.workloads[0].reason == "worker_crash" and "SIGSEGV" in r.workloads[0].detail
        set_mode("fatal")
        r = ev.evaluate(sol, small_gemm(), "sm_90a")
        assert r.workloads[0].reason == "cuda_error" and "ILLEGAL_ADDRESS" in r.workloads[0].detail
        set_mode("pass")
        r = ev.evaluate(sol, small_gemm(), "sm_90a")
        assert r.correct is True and ev._workers[0].starts == 3


def test_worker_that_cannot_start_skips_the_run(fake, tmp_path):
    set_mode, cmd = fake
    set_mode("nostart")
    with Evaluator(gpus=[0], worker_cmd=cmd, cache_dir=tmp_path) as ev:
        r = ev.evaluate(Solution.from_dir(FIXTURES / "good"), small_gemm(), "sm_90a")
    assert r.run_status == "skipped" and "did not start" in r.run_reason and r.correct is None
    with pytest.raises(WorkerStartError, match="torch sees no CUDA device"):
        WorkerHandle("0", cmd).start()


def test_arch_mismatch_is_skipped(fake, tmp_path):
    _, cmd = fake
    with Evaluator(gpus=[0], worker_cmd=cmd, cache_dir=tmp_path) as ev:
        r = ev.evaluate(Solution.from_dir(FIXTURES / "good"), small_gemm(), "sm_100a")
    # the SIMT fixture compiles for sm_100a too; the run needs a B200
    assert r.run_status == "skipped" and "sm_100a needs a B200" in r.run_reason and "Fake H200" in r.run_reason


# ---------------------------------------------------------------- the CPU path of Evaluator

def test_detect_gpus_without_driver(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_gpus() == ([], "CUDA_VISIBLE_DEVICES='' hides every GPU")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")
    ids, reason = detect_gpus()
    assert ids == [] and "nvidia-smi not found" in reason


def test_evaluator_on_cpu_compiles_inspects_and_skips(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with Evaluator() as ev:
        r = ev.evaluate(Solution.from_dir(FIXTURES / "unreachable_wgmma"), "gemm", "sm_90a", workloads="all")
    assert r.compiled and r.inspect.status == "ok" and r.inspect.feature_present("wgmma")
    assert r.run_status == "skipped" and r.run_reason.startswith("no GPU:")
    assert [w.status for w in r.workloads] == ["skipped"] * 5 and r.workloads[0].split == "visible"
    v = r.verdicts()
    assert v["correct"] is None and v["correct_with_arch"] is None and v["speedup"] is None
    assert v["arch_sass"] is False  # tma is requested too and absent
    assert r.executed.status == "skipped"
    json.loads(r.model_dump_json())  # serialisable as is


def test_evaluator_on_cpu_reports_manifest_errors(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    sol = Solution.from_dir(FIXTURES / "too_much_smem")
    with Evaluator() as ev:
        r = ev.evaluate(sol, "gemm", "sm_90a")
        assert r.run_status == "failed" and "shared_bytes = 300000" in r.run_reason
        assert r.workloads[0].reason == "launch_error" and r.correct is None
        sol.manifest.launches[0].shared_bytes = 0
        sol.manifest.launches[0].kernel = "gemm"
        r = ev.evaluate(sol, "gemm", "sm_90a")
        assert r.workloads[0].reason == "manifest_error" and "'gemm' is not in the compiled module" in r.workloads[0].detail
        assert "gemm_simt" in r.workloads[0].detail


def test_evaluator_compile_failure(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    sol = Solution.from_dir(FIXTURES / "good")
    sol.source = sol.source.replace("float acc[4][4] = {};", "float acc[4][4] = {}")
    with Evaluator() as ev:
        r = ev.evaluate(sol, "gemm", "sm_90a")
    assert not r.compiled and r.run_status == "skipped" and r.run_reason == "did not compile"
    assert r.inspect.status == "skipped" and r.correct is None


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if (p / "expect.json").exists()))
def test_fixtures_compile_with_expected_static_features(name):
    from tools.compile import compile_solution
    from tools.sass import inspect

    exp = json.loads((FIXTURES / name / "expect.json").read_text())
    sol = Solution.from_dir(FIXTURES / name)
    comp = compile_solution(sol, exp["arch"])
    assert comp.ok, comp.error
    insp = inspect(comp)
    assert insp.status == "ok", insp.reason
    for feature, present in exp.get("static", {}).items():
        assert insp.feature_present(feature) is present
    assert exp["visible"]["status"] in ("passed", "failed") and get_task(exp["task"])


def test_real_worker_without_gpu_says_why(monkeypatch):
    """The real `python -m tools.worker` on a CPU machine: a clean hello with the reason."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(WorkerStartError, match="GPU worker did not start: RuntimeError: torch sees no CUDA device"):
        WorkerHandle("").start()


# ---------------------------------------------------------------- driver calls, against a recording fake

class FakeDriver:
    """Replaces the cuda.bindings.driver functions Bound and encode_tensor_map call (types and
    enums stay the real ones) and records what they were given."""

    def __init__(self, d, param_sizes, static_smem=0):
        self.d, self.param_sizes, self.static_smem = d, param_sizes, static_smem
        self.encoded, self.launches, self.attrs = [], [], {}
        self.maps = []

    def install(self, monkeypatch):
        for name in ("cuModuleLoadData", "cuModuleGetFunction", "cuFuncGetParamCount", "cuFuncGetParamInfo",
                     "cuFuncGetAttribute", "cuFuncSetAttribute", "cuLaunchKernelEx", "cuTensorMapEncodeTiled"):
            monkeypatch.setattr(self.d, name, getattr(self, name))

    ok = property(lambda self: self.d.CUresult.CUDA_SUCCESS)

    def cuModuleLoadData(self, image):
        return self.ok, "module"

    def cuModuleGetFunction(self, module, name):
        return (self.ok, name.decode()) if name.decode() in self.param_sizes else \
            (self.d.CUresult.CUDA_ERROR_NOT_FOUND, None)

    def cuFuncGetParamCount(self, fn):
        return self.ok, len(self.param_sizes[fn])

    def cuFuncGetParamInfo(self, fn, i):
        offsets = [sum(self.param_sizes[fn][:j]) for j in range(len(self.param_sizes[fn]))]
        return self.ok, offsets[i], self.param_sizes[fn][i]

    def cuFuncGetAttribute(self, attr, fn):
        return self.ok, self.static_smem

    def cuFuncSetAttribute(self, fn, attr, value):
        self.attrs[(fn, attr.name)] = value
        return (self.ok,)

    def cuTensorMapEncodeTiled(self, dtype, rank, address, dims, strides, box, estrides, interleave, swizzle, l2, oob):
        import ctypes

        assert isinstance(rank, self.d.cuuint32_t)  # plain ints raise TypeError there (FACTS.md)
        assert all(isinstance(x, self.d.cuuint64_t) for x in dims + strides)
        assert all(isinstance(x, self.d.cuuint32_t) for x in box + estrides)
        self.encoded.append({"dtype": dtype.name, "rank": int(rank), "address": address, "dims": [int(x) for x in dims],
                             "strides": [int(x) for x in strides], "box": [int(x) for x in box],
                             "estrides": [int(x) for x in estrides], "swizzle": swizzle.name, "l2": l2.name,
                             "oob": oob.name})
        raw = ctypes.create_string_buffer(bytes([len(self.encoded)] * 128), 128)
        self.maps.append(raw)
        return self.ok, type("Map", (), {"getPtr": lambda _self, r=raw: ctypes.addressof(r)})()

    def cuLaunchKernelEx(self, cfg, fn, params, extra):
        import ctypes

        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        blobs = [ctypes.string_at(ptrs[i], size) for i, size in enumerate(self.param_sizes[fn])]
        cluster = None
        if cfg.numAttrs:
            a = cfg.attrs[0]
            cluster = (a.id.name, a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z)
        self.launches.append({"fn": fn, "grid": (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                              "block": (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ), "smem": cfg.sharedMemBytes,
                              "cluster": cluster, "params": blobs})
        return (self.ok,)


def test_bound_packs_parameters_and_tensor_maps(monkeypatch):
    import struct

    from cuda.bindings import driver as d

    from tools.launch import Bound, Module

    fake = FakeDriver(d, {"gemm": [128, 128, 8, 4, 4, 4], "fix": [8, 4]})
    fake.install(monkeypatch)
    m = manifest(kernel="gemm", grid=["min(num_sms, 64)", 2], block=[384], cluster=[2, 1, 1], shared_bytes=200000,
                 args=["tmA", "tmW", "C", "M", {"type": "f32", "value": "1 / sqrt(K)"}, {"type": "u32", "value": 7}],
                 buffers=[{"name": "ws", "dtype": "float32", "shape": ["M", 8]}],
                 tensor_maps=[{"name": "tmA", "tensor": "A", "box": [128, 64], "swizzle": "128B",
                               "l2_promotion": "256B"},
                              {"name": "tmW", "tensor": "ws", "view": [2, "M // 2", 8], "box": [1, 32, 8],
                               "oob_fill": "nan"}])
    m.launches.append(m.launches[0].model_copy(update={"kernel": "fix", "cluster": None, "shared_bytes": 1024,
                                                       "args": ["ws", "N"]}))
    plan = plan_launches(m, get_task("gemm"), {"M": 256}, H100)
    pointers = {"A": 0x10000, "B": 0x20000, "C": 0x30000, "ws": 0x40000}
    bound = Bound(plan, Module(b"cubin"), pointers)
    bound.launch()
    a, w = fake.encoded
    assert a == {"dtype": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "rank": 2, "address": 0x10000, "dims": [5120, 256],
                 "strides": [10240], "box": [64, 128], "estrides": [1, 1], "swizzle": "CU_TENSOR_MAP_SWIZZLE_128B",
                 "l2": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", "oob": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"}
    assert w["dims"] == [8, 128, 2] and w["strides"] == [32, 4096] and w["box"] == [8, 32, 1]
    assert w["dtype"] == "CU_TENSOR_MAP_DATA_TYPE_FLOAT32" and w["oob"].endswith("NAN_REQUEST_ZERO_FMA")
    first, second = fake.launches
    assert first["grid"] == (64, 2, 1) and first["block"] == (384, 1, 1) and first["smem"] == 200000
    assert first["cluster"] == ("CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", 2, 1, 1) and second["cluster"] is None
    p = first["params"]
    assert p[0] == bytes([1] * 128) and p[1] == bytes([2] * 128)  # the descriptors, by value
    assert struct.unpack("<Q", p[2])[0] == 0x30000 and struct.unpack("<i", p[3])[0] == 256
    assert struct.unpack("<f", p[4])[0] == pytest.approx(5120 ** -0.5) and struct.unpack("<I", p[5])[0] == 7
    assert struct.unpack("<Q", second["params"][0])[0] == 0x40000 and struct.unpack("<i", second["params"][1])[0] == 7168
    assert fake.attrs[("gemm", "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")] == 200000


def test_bound_rejects_mismatched_parameters(monkeypatch):
    from cuda.bindings import driver as d

    from tools.launch import Bound, Module

    fake = FakeDriver(d, {"gemm_simt": [8, 8, 8, 4, 4, 8]})
    fake.install(monkeypatch)
    plan = plan_launches(manifest(), get_task("gemm"), {"M": 256}, H100)
    with pytest.raises(ManifestError, match=r"args\[5\] 'K' is passed as i32 \(4 bytes\) but kernel parameter 5 is 8 "
                                            r"bytes \(give it as \{\"type\": \"i64\", \"value\": \"K\"\}\)"):
        Bound(plan, Module(b""), {"A": 1, "B": 2, "C": 3})
    fake.param_sizes["gemm_simt"] = [8, 8, 8, 4, 4]
    with pytest.raises(ManifestError, match="kernel takes 5 parameters, the manifest gives 6"):
        Bound(plan, Module(b""), {"A": 1, "B": 2, "C": 3})
    plan.launches[0].kernel = "gemm"
    with pytest.raises(ManifestError, match="kernel 'gemm' is not in the compiled module"):
        Bound(plan, Module(b""), {"A": 1, "B": 2, "C": 3})


def test_compare_with_term_scales():
    e = torch.tensor([0.001, 10.0])
    got = torch.tensor([0.05, 10.0])
    assert not compare("O", got, e, TOL).passed  # |0.049| > 0.01 + 0.01 * 0.001
    assert compare("O", got, e, TOL, scale=torch.tensor([5.0, 1.0])).passed  # 0.049 <= 0.01 + 0.01 * 5


def test_worker_judges_term_scaled_tasks():
    task = small_gemm()
    if "scale" not in type(task.tolerance).model_fields:
        pytest.skip("this task schema has no tolerance.scale")
    task.tolerance.scale = "terms"
    assert run(gemm, task=task)[0]["status"] == "passed"
    bad, _ = run(lambda ws, c: (gemm(ws, c), ws.outputs["C"].add_(1.0)), task=task)
    assert bad["reason"] == "incorrect"


def test_wgmma_in_a_kernel_never_launched_does_not_count():
    """Dead code must not pass the static arch check: a module whose launched kernel is the
    SIMT GEMM and which also carries a wgmma kernel nobody launches (real NVRTC, ptxas,
    cuobjdump)."""
    simple = Solution.from_dir(ROOT / "tasks" / "gemm_n7168_k5120" / "simple")
    decoy = (ROOT / "tests" / "corpus" / "sm_90a" / "wgmma_pos.cu").read_text()
    sol = simple.model_copy(update={"source": simple.source + "\n" + decoy})
    with Evaluator(gpus=[]) as ev:
        res = ev.evaluate(sol, get_task("gemm"), "sm_90a")
    assert res.compiled and res.inspect.status == "ok"
    assert "wgmma_pos" in res.inspect.kernels and res.inspect.uncounted_kernels == ["wgmma_pos"]
    assert not res.inspect.feature_present("wgmma") and not res.arch_ok
    # Without a manifest (agent inspect) the module as a whole does carry wgmma.
    from tools.compile import compile_solution
    from tools.sass import inspect
    assert inspect(compile_solution(sol, "sm_90a")).feature_present("wgmma")


# ---------------------------------------------------------------- the timed phase cannot be gamed

def lazy_after(n):
    """Does the work on its first n launches only (it counts them in 'device memory')."""
    def kernel(ws, call):
        if call <= n:
            gemm(ws, call)
    return kernel


def replaying(ws, call, cache={}):  # noqa: B006 - the cache is the attack
    """Fingerprints a few input elements and replays the output it cached for them."""
    key = tuple(ws.inputs["A"].reshape(-1)[:4].tolist())
    if key in cache:
        ws.outputs["C"].copy_(cache[key])
    else:
        gemm(ws, call)
        cache[key] = ws.outputs["C"].clone()


def counting_control(ws, call, seen=[]):  # noqa: B006
    """Counts its launches harmlessly and always does the work."""
    seen.append(call)
    gemm(ws, call)


def test_every_timed_run_is_judged_so_a_launch_counter_fails():
    for n in (2, 3, 5, 8):  # whatever it predicts, the first run it skips is caught
        result, fatal = run(lazy_after(n), time=True)
        assert result["reason"] in ("wrong_in_timed_run", "wrong_after_first_call"), result
        if n >= 2:
            assert result["reason"] == "wrong_in_timed_run" and f"run {n - 1}" in result["detail"], result["detail"]


def test_with_one_seeded_call_a_kernel_right_on_its_first_call_only_fails_in_its_first_timed_run():
    """Where a timed phase follows, the evaluator sends one seeded call (Evaluator._seeds): the
    timed runs are the later calls, each judged, so the class the second seeded call caught
    (state kept across calls, a cached output) fails there, on the first run after the check."""
    for kernel in (lazy_after(1), lambda ws, c: gemm(ws, c) if c == 1 else ws.outputs["C"].zero_()):
        result, fatal = run(kernel, seeds=(11,), time=True)
        assert result["reason"] == "wrong_in_timed_run" and "run 1 " in result["detail"], result
        assert result["seeds"] == [11] and not fatal


def test_fresh_inputs_every_timed_run_so_a_cache_never_hits():
    result, _ = run(replaying, time=True)
    assert result["status"] == "passed", result  # it never sees the same inputs twice: no replay happens
    seen = []

    def recorder(ws, call):
        seen.append(ws.inputs["A"].clone())
        gemm(ws, call)

    run(recorder, time=True)
    assert len(seen) >= 12
    assert all(not torch.equal(seen[i], seen[j]) for i in range(len(seen)) for j in range(i))


def test_replaying_on_a_stale_input_fails_in_timed_run():
    def stale(ws, call, kept={}):  # noqa: B006 - replays the output of the call before
        if call >= 4 and "C" in kept:
            ws.outputs["C"].copy_(kept["C"])
        else:
            gemm(ws, call)
        kept["C"] = ws.outputs["C"].clone()

    result, _ = run(stale, time=True)
    assert result["reason"] == "wrong_in_timed_run", result


def test_counting_control_passes_and_run_counts_vary():
    counts = set()
    for timing_seed in range(6):
        result, _ = run(counting_control, time=True, timing_seed=timing_seed)
        assert result["status"] == "passed", result
        assert result["timed_runs"] >= 10 and result["full_checks"] >= 1 and result["timing"]["runs"] == result["timed_runs"]
        counts.add((result["timed_runs"], result["warmup_runs"]))
    assert len(counts) > 1  # the number of runs is not predictable from one evaluation to the next


def test_zero_true_scratch_is_reset_inside_the_timed_run():
    """A kernel that relies on zeroed scratch pays for the zeroing: it happens in run(), not prepare()."""
    order = []
    m = manifest(buffers=[{"name": "z", "dtype": "float32", "shape": [8]}], args=["A", "B", "C", "z"])
    task = small_gemm()
    ws = workspace.Workspace(task, plan_launches(m, task, task.axis_values(task.workloads[0]), H100), "cpu")
    z = ws.buffers["z"][0]
    z.fill_(3.0)
    ws.prepare()
    order.append(float(z[0]))
    ws.zero_scratch()
    order.append(float(z[0]))
    assert order == [3.0, 0.0]


def test_rel_l2_bound_catches_small_errors_the_elementwise_rule_lets_through():
    torch.manual_seed(0)
    e = torch.randn(4096) * 0.025  # attention-like magnitudes
    tol = Tolerance(rel_l2={"O": 0.05})
    assert compare("O", e.bfloat16(), e, tol).passed
    bias = e + 0.0099
    noise = e + (torch.rand_like(e) * 2 - 1) * 0.0099
    zeros = torch.where(e.abs() < 0.0095, torch.zeros_like(e), e)  # about a third of the elements
    for wrong in (bias, noise, zeros):
        assert compare("O", wrong, e, TOL).passed  # the seed's elementwise rule alone passes them
        m = compare("O", wrong, e, tol)
        assert not m.passed and "relative L2" in m.describe()


def test_implausible_throughput():
    from tools.ceilings import implausible

    task = get_task("gemm_n7168_k5120")
    axes = task.axis_values({"M": 8192})
    assert implausible("NVIDIA H200", task, axes, 0.85) is None  # cuBLAS-like
    assert "tensor peak" in implausible("NVIDIA H200", task, axes, 0.3)  # ~2000 TFLOP/s
    assert implausible("Some GPU", task, axes, 0.3) is None


def test_harness_error_is_a_verdict(monkeypatch):
    def boom(*a, **k):
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(worker, "time_paired", boom)
    result, fatal = run(gemm, time=True)
    assert result["reason"] == "harness_error" and "NaN" in result["detail"] and not fatal


def test_a_kernel_name_with_two_meanings_is_a_manifest_error(monkeypatch):
    """extern "C" gemm_simt (SIMT) beside a C++ hopper::gemm_simt: inspection, launch and the
    executed check would each pick their own; the one mapping refuses the name instead."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    good = Solution.from_dir(FIXTURES / "good")
    decoy = (ROOT / "tests" / "corpus" / "sm_90a" / "wgmma_pos.cu").read_text()
    decoy = decoy.replace('extern "C" __global__ void wgmma_pos(', 'namespace hopper { __global__ void gemm_simt(')
    sol = good.model_copy(update={"source": good.source + "\n" + decoy + "\n}\n"})
    with Evaluator() as ev:
        r = ev.evaluate(sol, "gemm", "sm_90a")
    assert r.compiled and not r.arch_ok  # the wgmma of the other gemm_simt is not credited
    assert r.run_status == "failed" and "ambiguous" in r.run_reason, r.run_reason


def _ncu_row(kernel: str, opcodes: str = "0", **values: float) -> dict[str, str]:
    """One profiled launch as `ncu --page raw --csv` gives it: every work metric (0 unless
    given; keys are metric names with '.' written as '__dot__'); per-opcode counts as given
    (by default none: no plain bulk copy among the TMA loads)."""
    from tools.credit import OPCODE_METRIC, WORK_METRICS

    row = {"ID": "0", "Kernel Name": kernel, OPCODE_METRIC: opcodes}
    row.update({m: "0" for m in WORK_METRICS})
    row.update({k.replace("__dot__", "."): str(v) for k, v in values.items()})
    return row


def test_instruction_credit_needs_the_work():
    """Figures measured by ncu on the H200 (scripts/probe_device.py, 2026-11-30), then the attacks
    that would inflate them."""
    from tools.credit import TaskWork, verdict, work_metrics

    hgmma = "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum"
    tma = "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld__dot__sum"
    ffma = "smsp__thread_inst_executed_pred_on__dot__sum"
    ldg = "l1tex__t_bytes_pipe_lsu_mem_global_op_ld__dot__sum"
    work = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)
    simt = _ncu_row("gemm_simt", **{ffma: 3.006e11, ldg: 1.879e10})
    counts = {"wgmma": 8, "tma": 1}

    def check(*rows):
        return verdict(["wgmma", "tma"], counts, {}, work_metrics(list(rows)), work)

    expert = check(_ncu_row("gemm_bf16_tn_sm90", **{hgmma: 6.013e11, tma: 7.046e9}))
    assert expert.carries == {"wgmma": True, "tma": True} and expert.shares["tma"] == 1.0, expert.notes
    # a one-block decoy beside a SIMT GEMM (tests/fixtures/adversarial/decoy_wgmma_tma)
    decoy = check(simt, _ncu_row("decoy", **{hgmma: 3.277e4, tma: 8192}))
    assert decoy.executed == {"wgmma": True, "tma": True} and decoy.carries == {"wgmma": False, "tma": False}
    # the decoy inflated: wgmma on garbage for the task's FLOPs, TMA re-loading one tile from L2
    # as many bytes as the SIMT kernel reads
    inflated = check(simt, _ncu_row("decoy", **{hgmma: 6.1e11, tma: 2e10}))
    assert inflated.carries == {"wgmma": False, "tma": False}
    assert "thread instructions of any pipe" in inflated.notes["wgmma"] and "outside tensor-map loads" in inflated.notes["tma"]
    # ... and ten times over: more wgmma than the task needs is not the task's work either
    assert not check(simt, _ncu_row("decoy", **{hgmma: 6.1e12})).carries["wgmma"]
    # an attention-style kernel whose softmax runs on FFMA still carries (expert fwd: 1.3e10 vs 1.6e12)
    attn = check(_ncu_row("attn", **{hgmma: work.flops, ffma: 0.005 * work.flops, tma: 3e9, ldg: 0.3e9}))
    assert attn.carries == {"wgmma": True, "tma": True}
    # fp8 ops are wgmma's only where no warp-level MMA ran: read from the tensor pipe's instruction
    # classes of the same run (CUPTI's HMMA class counts QGMMA too; a warp-level QMMA/HMMA is in it
    # without being a GMMA)
    fp8 = "sm__ops_path_tensor_src_fp8__dot__sum"
    gmma, hmma_class = "smsp__inst_executed_pipe_tensor_op_gmma__dot__sum", "sm__inst_executed_pipe_tensor_op_hmma__dot__sum"
    tensor = "sm__inst_executed_pipe_tensor__dot__sum"
    q = check(_ncu_row("fp8", opcodes="1 (QGMMA: 1)", **{fp8: work.flops, tma: 3e9, gmma: 1, hmma_class: 1, tensor: 1}))
    h = check(_ncu_row("fp8", opcodes="1 (HMMA: 1)", **{fp8: work.flops, tma: 3e9, hmma_class: 1, tensor: 1}))
    assert q.carries["wgmma"] and not h.carries["wgmma"]
    # a memory-bound task (TMA requested alone): the bulk of the input must come through TMA
    reads = work_metrics([_ncu_row("decode", **{tma: 0.6 * work.read_bytes, ldg: 0.9 * work.read_bytes})])
    assert verdict(["wgmma", "tma"], counts, {}, reads, work).notes.get("tma") is None
    assert not verdict(["tma"], {"tma": 1}, {}, reads, work).carries["tma"]
    unmeasured = verdict(["wgmma"], counts, {}, {}, work)
    assert unmeasured.executed["wgmma"] and not unmeasured.carries["wgmma"]
    assert "could not be measured" in unmeasured.notes["wgmma"]


def test_credit_goes_to_the_kernel_that_was_timed():
    """A kernel that runs wgmma where it guesses it is profiled and a faster generic path in the
    timed runs keeps `executed` but loses `carries`: the profiled run's kernel time must match
    the timed median of its workload (tools.ncu._credit, the path every workload takes)."""
    from tools.credit import DURATION_METRIC, SAME_RUN_RATIO, TaskWork, _credit

    hgmma = "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum"
    tma = "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld__dot__sum"
    dur = "gpu__time_duration__dot__sum"
    work = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)
    run = {"workload": "M8192", "split": "visible", "runs": 4, "profiled_at": 2, "launches": 1}

    def profiled(ns: float, timed_ms: float | None):
        row = _ncu_row("gemm", "12 (HGMMA: 8; UTMALDG: 4)", **{hgmma: 6.013e11, tma: 7.046e9, dur: ns})
        return _credit(run, [row], ["wgmma", "tma"], work, timed_ms)

    honest = profiled(0.760e6, 0.753)  # the expert GEMM: ncu 0.760 ms at 791 TFLOP/s, timed 0.753 ms
    assert honest.carries == {"wgmma": True, "tma": True} and honest.timed_ms == 0.753
    assert honest.kernel_ms == pytest.approx(0.760)
    borrowed = profiled(0.760e6, 0.760 / (SAME_RUN_RATIO + 0.05))  # the timed path is faster than the credited one
    assert borrowed.executed == {"wgmma": True, "tma": True} and borrowed.carries == {"wgmma": False, "tma": False}
    assert "not the one whose instructions were counted" in borrowed.notes["wgmma"]
    assert profiled(0.760e6, None).carries["wgmma"]  # not timed: no speed is claimed, nothing to tie
    row = _ncu_row("gemm", "8 (HGMMA: 8)", **{hgmma: 6.013e11})
    row.pop(DURATION_METRIC)  # the profiled run's time was not measured
    unmeasured = _credit(run, [row], ["wgmma"], work, 0.75)
    assert not unmeasured.carries["wgmma"] and "not measured" in unmeasured.notes["wgmma"]


def test_agent_eval_says_why_credit_was_withheld():
    """`agent eval` prints the note of a feature that executed without carrying the work, and each
    workload's counted runs' times beside its timed median: the tie behind the note."""
    from agent.commands.common import console
    from agent.commands.evaluate import render
    from tools.results import CompileResult, EvalResult, ExecutedCheck, InspectResult

    from tools.results import WorkloadCredit

    slow = WorkloadCredit(workload="M8192", status="ok", counted_from=1, runs=3, run_ms=[0.761, 20.7],
                          instrumented_ms=[2.0], timed_ms=0.76)
    ex = ExecutedCheck(status="ok", executed={"wgmma": True}, carries={"wgmma": False}, workloads=[slow],
                       notes={"wgmma": "the kernel that was timed is not the one whose instructions were counted"},
                       timed_ms=0.76)
    r = EvalResult(task="gemm_n7168_k5120", arch="sm_90a", requested_features=["wgmma"], executed=ex,
                   compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                   inspect=InspectResult(status="ok", arch="sm_90a"))
    with console.capture() as cap:
        render(r)
    text = " ".join(cap.get().split())
    assert "wgmma does not carry the work: the kernel that was timed is not the one" in text
    assert "workload M8192: counted runs 1-3 0.761, 20.7 ms, timed median 0.76 ms" in text


def test_a_nan_outside_the_sampled_rows_still_fails_a_timed_run():
    def nan_late(ws, call):
        gemm(ws, call)
        if call >= 4:
            ws.outputs["C"][-1, -1] = float("nan")  # one element, almost never among the sampled rows

    result, _ = run(nan_late, time=True)
    assert result["reason"] == "wrong_in_timed_run" and "NaN" in result["detail"], result


def test_worker_environment_carries_no_credentials(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-SECRET")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-SECRET")
    env = WorkerHandle("3").env
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and str(ROOT) in env["PYTHONPATH"]
    assert not any("SECRET" in v for v in env.values()), [k for k, v in env.items() if "SECRET" in v]


class _ClockEvent:
    def record(self):
        import time as _t

        self.t = _t.perf_counter()

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class _CpuTimingState:
    """What tools.timing.paired needs of the worker's State, on the CPU."""

    class flusher:  # noqa: N801 - stands in for State.flusher
        @staticmethod
        def flush():
            pass

    event = staticmethod(_ClockEvent)

    @staticmethod
    def wait(limit_s):
        pass


def test_the_library_answer_is_gone_before_the_candidate_runs():
    """In a pair where the library runs first, its outputs are zeroed before the candidate's
    run, so a kernel that finds the library's output buffer finds nothing to copy; an output
    that is one of the inputs (a library updating state in place) is left as it is."""
    import random

    import torch

    from tasks.families.baselines import Baseline
    from tools.timing import MIN_STOP_PAIRS, Side, paired
    from tools.timed import library_side

    inputs = {"A": torch.ones(4, 4), "state": torch.ones(2)}
    answer = torch.zeros(4, 4)
    library = Baseline("lib", lambda: {"C": answer.fill_(7.0), "new_state": inputs["state"]}, "test")
    seen = []

    def candidate():
        seen.append(float(answer.abs().sum()))

    times = paired(Side("candidate", candidate), library_side("lib", library, inputs), _CpuTimingState(),
                   random.Random(1), lambda i, n: None, lambda i, n: None, budget_s=0.001)
    # at least the fewest pairs an early stop leaves (a loaded CPU's timings can rank the two apart)
    assert len(seen) == len(times.candidate_ms) + times.warmup >= 1 + MIN_STOP_PAIRS[0]
    assert seen == [0.0] * len(seen)  # library-first pairs included: never the library's 7s
    assert float(inputs["state"].sum()) == 2.0  # an input the library returned is not scrubbed


def test_feedback_says_why_an_instruction_did_not_carry_the_work():
    """The model reads the measured reason (decoy beside a SIMT GEMM, H200 figures)."""
    from agent.feedback import arch_section
    from tools.credit import TaskWork, verdict, work_metrics
    from tools.results import CompileResult, EvalResult, InspectResult

    work = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)
    rows = [_ncu_row("gemm_simt", **{"smsp__thread_inst_executed_pred_on__dot__sum": 3.006e11,
                                     "l1tex__t_bytes_pipe_lsu_mem_global_op_ld__dot__sum": 1.879e10}),
            _ncu_row("decoy", **{"sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32__dot__sum": 6.1e11,
                                 "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld__dot__sum": 2e10})]
    ex = verdict(["wgmma", "tma"], {"wgmma": 8, "tma": 1}, {}, work_metrics(rows), work)
    ev = EvalResult(task="gemm_n7168_k5120", arch="sm_90a", requested_features=["wgmma", "tma"], executed=ex,
                    compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                    inspect=InspectResult(status="ok", arch="sm_90a"))
    text = arch_section(ev)
    assert "`wgmma`: executed, but did not carry the task's work: wgmma did 50.4% of the math the kernels did" in text
    assert "read from global memory outside tensor-map loads" in text


def test_rewriting_every_reachable_copy_of_the_inputs_does_not_steer_the_judge():
    """A kernel that can write anywhere (as a GPU kernel scanning device memory could) does no
    work on the timed runs: it writes zeros, then zeroes its inputs and every tensor the judge
    holds, so that a reference computed from them would be zeros too. The judge's inputs are
    generated again from the pair's seed after the run: the rewrite itself is seen
    (input_modified), and the answer is judged against the regenerated reference."""
    import gc

    def tamper(ws, call):
        if call <= 2:  # the seeded checks: honest
            return gemm(ws, call)
        ws.outputs["C"].zero_()
        for t in ws.inputs.values():
            t.zero_()
        for judge in (o for o in gc.get_objects() if type(o) is workspace.TimedJudge):
            for v in vars(judge).values():
                for t in (v.values() if isinstance(v, dict) else [v]):
                    if isinstance(t, torch.Tensor):
                        t.zero_()

    result, _ = run(tamper, time=True)
    assert result["reason"] == "input_modified", result["detail"]


def test_failing_samples_of_a_large_output_stay_in_bounds():
    """25,574,500 failing elements (the visible-only fixture on GEMM M=4096, H200 2026-12-01):
    spreading the samples in float32 named index n, one past the end."""
    from tools.correctness import _failing_samples

    n = 25574500
    bad = torch.ones(n + 7, dtype=torch.bool)
    bad[:7] = False
    g, e = torch.zeros(n + 7), torch.ones(n + 7)
    samples = _failing_samples(bad, (g - e).abs(), g, e)
    assert 2 <= len(samples) <= 4 and samples[0].index == [7] and samples[-1].index == [n + 6]


def test_rewriting_the_pairs_kept_inputs_is_input_modified():
    """The side that runs second in a pair gets the pair's inputs copied in from the tensors generated
    for the pair (TimedJudge keeps them until the pair is judged, issue 43). A kernel that rewrites
    those, and not its own inputs, could steer the library's run: the judge holds them to the inputs
    generated again from the pair's seed, and the rewrite is input_modified, named."""
    import gc

    def tamper(ws, call):
        gemm(ws, call)
        if call > 2:  # the timed runs
            for judge in (o for o in gc.get_objects() if type(o) is workspace.TimedJudge):
                for t in (getattr(judge, "_generated", None) or {}).values():
                    t.zero_()

    result, _ = run(tamper, time=True)
    assert result["reason"] == "input_modified", result["detail"]
    assert "the harness's copy of input" in result["detail"] and "read by the pair's other side" in result["detail"]
