"""The worker's dispatch on CPU (tools/worker.py; issue 46's mutation entry): the message framing the
client and worker share, which verdict each failure of a workload becomes and whether the worker must
restart after it, which phases a request runs (checks, timed runs, deferred counted runs), `--once`'s
reply, and State's parts that decide a result without a GPU (remembered set-up failures, the deferred
workloads it keeps or drops, the context's sticky error). The CUDA side is the stand-in of
test_evaluator_cpu; the driver calls State makes are replaced where a test names them."""
from __future__ import annotations

import io
import json
import pickle
import random
import struct
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from cuda.bindings import driver as d

import tools.cupti
import tools.timing
from test_evaluator_cpu import FIXTURES, CpuState, gemm, small_gemm
from tools import worker
from tools.cupti import CuptiError
from tasks.schema import Task
from tools.launch import CudaError, ManifestError
from tools.results import WorkloadResult
from tools.solution import Solution
from tools.timing import KernelTimeout
from tools.workspace import Failed, Workspace

# ---------------------------------------------------------------- framing


class Chunky(io.BytesIO):
    """A pipe that hands over at most `size` bytes a read, as a pipe may, and counts flushes."""

    def __init__(self, data: bytes = b"", size: int = 3):
        super().__init__(data)
        self.size, self.flushes = size, 0

    def read(self, n: int = -1) -> bytes:
        return super().read(min(n, self.size))

    def flush(self) -> None:
        self.flushes += 1


def test_a_message_is_its_pickle_after_its_little_endian_length():
    msg = {"op": "run", "cubin": b"\x00\xff" * 10}
    data = worker.encode(msg)
    (n,) = struct.unpack("<Q", data[:8])
    assert n == len(data) - 8 and pickle.loads(data[8:]) == msg


def test_a_written_message_is_flushed_and_read_back_across_short_reads():
    pipe = Chunky()
    worker.write_msg(pipe, {"op": "hello", "info": {"gpu": "x"}})
    worker.write_msg(pipe, {"op": "exit"})
    assert pipe.flushes == 2
    pipe.seek(0)
    assert worker.read_msg(pipe) == {"op": "hello", "info": {"gpu": "x"}}
    assert worker.read_msg(pipe) == {"op": "exit"}
    assert worker.read_msg(pipe) is None


@pytest.mark.parametrize("cut", [3, 8, 12])
def test_a_stream_cut_inside_a_message_is_an_error_not_an_end(cut):
    with pytest.raises(EOFError, match="^stream ended inside a message$"):
        worker.read_msg(Chunky(worker.encode({"op": "exit"})[:cut]))


def test_a_message_over_the_limit_is_refused_before_its_body_is_read():
    with pytest.raises(ValueError, match=f"{worker.MAX_MESSAGE + 1} bytes is too large"):
        worker.read_msg(io.BytesIO(struct.pack("<Q", worker.MAX_MESSAGE + 1)))
    with pytest.raises(EOFError):  # the limit itself is allowed: its body is then awaited
        worker.read_msg(io.BytesIO(struct.pack("<Q", worker.MAX_MESSAGE)))


# ---------------------------------------------------------------- run_workload: failure -> verdict


def _request(**extra) -> dict:
    task = small_gemm()
    sol = Solution.from_dir(FIXTURES / "good")
    return {"cubin": b"cubin", "manifest": sol.manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
            "workload": task.workloads[1].model_dump(mode="json"), "seeds": [11, 12], "time": False,
            "timing_seed": 7, **extra}


class State(CpuState):
    """The stand-in with a chosen sticky error and restore answer."""

    def __init__(self, sticky=None, restart=None):
        super().__init__(gemm)
        self.sticky, self.restart, self.dropped = sticky, restart, 0

    def sticky_error(self):
        return self.sticky

    def restore(self):
        return self.restart

    def drop_pending(self):
        self.dropped += 1
        self.pending = []


def _raising(monkeypatch, exc: BaseException, state=None, **extra) -> tuple[dict, bool]:
    def run_checked(*args):
        raise exc
    monkeypatch.setattr(worker, "_run_checked", run_checked)
    return worker.run_workload(state or State(), _request(**extra))


MISMATCH = {"output": "C", "max_abs_err": 1.0, "max_rel_err": 0.5, "mismatch_frac": 0.25, "passed": False}


def test_a_passing_workload_says_which_it_was_and_keeps_the_worker():
    result, fatal = worker.run_workload(State(), _request())
    assert (result["status"], result["reason"], result["workload"], result["split"]) == (
        "passed", None, "M70", "held_out"), result
    assert result["axes"]["M"] == 70 and result["seeds"] == [11, 12] and not fatal


def test_a_failed_check_carries_its_reason_detail_outputs_and_fatality(monkeypatch):
    result, fatal = _raising(monkeypatch, Failed("incorrect", "first at (1, 2)", outputs=[MISMATCH]))
    assert (result["status"], result["reason"], result["detail"], fatal) == ("failed", "incorrect", "first at (1, 2)",
                                                                            False)
    assert result["outputs"][0]["max_rel_err"] == 0.5
    result, fatal = _raising(monkeypatch, Failed("timeout", "hung", fatal=True))
    assert result["reason"] == "timeout" and result["outputs"] == [] and fatal


def test_a_manifest_or_launch_error_is_its_own_reason_and_not_fatal(monkeypatch):
    result, fatal = _raising(monkeypatch, ManifestError("grid too large", reason="launch_error"))
    assert (result["reason"], result["detail"], fatal) == ("launch_error", "grid too large", False)


def test_a_hung_kernel_is_a_fatal_timeout(monkeypatch):
    result, fatal = _raising(monkeypatch, KernelTimeout("no finish in 15 s"))
    assert (result["reason"], result["detail"], fatal) == ("timeout", "no finish in 15 s", True)


def test_a_sticky_cuda_error_is_fatal_without_asking_the_context(monkeypatch):
    result, fatal = _raising(monkeypatch, CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "kernel execution"))
    assert (result["reason"], result["detail"], fatal) == (
        "cuda_error", "CUDA_ERROR_ILLEGAL_ADDRESS (kernel execution)", True)


@pytest.mark.parametrize("sticky", [None, "CUDA_ERROR_LAUNCH_FAILED"])
def test_a_non_sticky_cuda_error_is_fatal_only_where_the_context_broke(monkeypatch, sticky):
    result, fatal = _raising(monkeypatch, CudaError("CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel"), State(sticky))
    assert (result["reason"], result["detail"]) == ("cuda_error", "CUDA_ERROR_INVALID_VALUE (cuLaunchKernel)")
    assert fatal == (sticky is not None)


def test_out_of_memory_is_its_first_line_and_not_fatal(monkeypatch):
    result, fatal = _raising(monkeypatch, torch.cuda.OutOfMemoryError("CUDA out of memory.\nTried to allocate 2 GiB"))
    assert (result["reason"], result["detail"], fatal) == ("oom", "CUDA out of memory.", False)


def test_an_unexpected_exception_is_a_harness_error_on_a_healthy_context(monkeypatch):
    result, fatal = _raising(monkeypatch, ValueError("x" * 600))
    assert (result["reason"], result["detail"], fatal) == ("harness_error", "ValueError: " + "x" * 500, False)


def test_an_unexpected_exception_on_a_dead_context_is_a_fatal_cuda_error(monkeypatch):
    result, fatal = _raising(monkeypatch, ValueError("bad"), State("CUDA_ERROR_ILLEGAL_ADDRESS"))
    assert (result["reason"], result["detail"], fatal) == (
        "cuda_error", "CUDA_ERROR_ILLEGAL_ADDRESS (seen as ValueError: bad)", True)


def test_a_context_that_cannot_be_restored_ends_the_worker_even_after_a_pass(capsys):
    result, fatal = worker.run_workload(State(restart="3.0 GiB lost"), _request())
    assert result["status"] == "passed" and fatal
    assert "restarting after M70: 3.0 GiB lost" in capsys.readouterr().err


def test_a_harness_error_logs_its_traceback(monkeypatch, capsys):
    _raising(monkeypatch, ValueError("bad"))
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_timed_result_is_plain_json(monkeypatch):
    """The reply is stored as JSON in the run's records: a tuple (speedup_ci) would come back a list."""
    import tasks.families.baselines as B

    monkeypatch.setattr(B, "list_backends", lambda task: ["lib"])
    monkeypatch.setattr(B, "make_baseline", lambda task, inputs, name=None: B.Baseline(name, lambda: {}, "lib"))
    result, _ = worker.run_workload(State(), _request(time=True, timing_budget_s=0.01))
    assert result["speedup_ci"] is not None and json.loads(json.dumps(result)) == result


@pytest.mark.parametrize("extra, dropped", [
    ({"evaluation": "ev1"}, 0),
    ({"credit": {"evaluation": "ev1"}}, 0),  # the credit op's request names its evaluation there
    ({"evaluation": "ev2"}, 1),
    ({}, 1),
])
def test_deferred_workloads_of_another_evaluation_are_dropped(monkeypatch, extra, dropped):
    state = State()
    state.pending = [SimpleNamespace(evaluation="ev1")]
    monkeypatch.setattr(worker, "_run_checked", lambda *a: None)
    worker.run_workload(state, _request(**extra))
    assert state.dropped == dropped


def test_nothing_pending_drops_nothing(monkeypatch):
    state = State()
    monkeypatch.setattr(worker, "_run_checked", lambda *a: None)
    worker.run_workload(state, _request(evaluation="ev1"))
    assert state.dropped == 0


# ---------------------------------------------------------------- _run_checked: which phases run


class OnDevice(Workspace):
    """The workspace, saying which device it was asked for (on CPU, None would allocate there too)."""

    def __init__(self, task, plan, device="cuda"):
        super().__init__(task, plan, device)
        self.made_on = device


@pytest.fixture
def phases(monkeypatch):
    """Records the phases a request runs, in order, with what each was given."""
    calls: list[tuple] = []
    knobs = {"defer": False, "fail": None}
    wrong: list[str] = []  # arguments a phase was given that are not the workload's own

    def given(state, req, task, axes, ws, bound, result) -> None:
        expected = {"state": isinstance(state, State), "req": req.get("cubin") == b"cubin",
                    "task": isinstance(task, Task), "axes": axes == {"M": 70, "N": 64, "K": 32},
                    "ws": getattr(ws, "made_on", None) == "cpu",
                    "bound": getattr(bound, "ws", None) is ws, "result": isinstance(result, WorkloadResult)}
        wrong.extend(name for name, ok in expected.items() if not ok)

    def verify(state, req, task, axes, ws, bound, result, limit):
        given(state, req, task, axes, ws, bound, result)
        calls.append(("verify", limit, axes["M"]))
        if knobs["fail"]:
            raise knobs["fail"]

    class Phase:
        def __init__(self, state, req, task, wl, axes, ws, bound, rng, result, limit):
            given(state, req, task, axes, ws, bound, result)
            calls.append(("phase", rng.random(), wl.name, limit))

        def run(self):
            calls.append(("phase.run", names[-1:]))

    def defer(state, req, task, axes, ws, bound, result, limit, judge, phase=None):
        given(state, req, task, axes, ws, bound, result)
        calls.append(("defer", judge, isinstance(phase, Phase), limit))
        return knobs["defer"]

    def time_paired(state, req, task, wl, axes, ws, bound, rng, result, limit):
        given(state, req, task, axes, ws, bound, result)
        calls.append(("time_paired", rng.random(), wl.name, limit, names[-1:]))

    monkeypatch.setattr(worker, "verify", verify)
    monkeypatch.setattr(worker, "TimedPhase", Phase)
    monkeypatch.setattr(worker, "defer_counted", defer)
    names: list[str] = []  # the NVTX ranges open (Nsight's view of the phases)

    @contextmanager
    def nvtx_range(name):
        names.append(name)
        yield
        names.pop()

    monkeypatch.setattr(worker, "time_paired", time_paired)
    monkeypatch.setattr(worker, "nvtx_range", nvtx_range)
    monkeypatch.setattr(worker, "Workspace", OnDevice)
    yield calls, knobs
    assert not wrong, f"a phase was given another {wrong}"


class Binding(State):
    def bind(self, plan, cubin, symbols, ws):
        self.bound_with = (cubin, symbols, type(plan).__name__)
        return super().bind(plan, cubin, symbols, ws)


SEEDED = random.Random(7).random()


def test_an_untimed_request_runs_its_checks_only_under_the_default_limit(phases):
    calls, _ = phases
    state = Binding()
    result, _ = worker.run_workload(state, _request(symbols={"gemm": "_Z4gemm"}))
    assert calls == [("verify", 30.0, 70)]
    assert state.bound_with == (b"cubin", {"gemm": "_Z4gemm"}, "Plan")
    assert 0 <= result["phase_s"]["verify"] < 60


def test_a_timed_request_times_its_pairs_on_the_secret_seed(phases):
    calls, _ = phases
    worker.run_workload(State(), _request(time=True, kernel_timeout_s=5))
    assert calls == [("verify", 5.0, 70), ("time_paired", SEEDED, "M70", 5.0, ["time"])]


def test_a_credited_request_defers_its_counted_runs_after_its_checks(phases):
    calls, _ = phases
    worker.run_workload(State(), _request(credit={"evaluation": "e"}))
    assert calls == [("verify", 30.0, 70), ("defer", True, False, 30.0)]


@pytest.mark.parametrize("deferred", [True, False])
def test_a_timed_credited_request_hands_its_timed_phase_to_the_counted_runs(phases, deferred):
    calls, knobs = phases
    knobs["defer"] = deferred
    worker.run_workload(State(), _request(time=True, credit={"evaluation": "e"}))
    ran = [] if deferred else [("phase.run", ["time"])]  # deferred: timed at the credit op instead
    assert calls == [("verify", 30.0, 70), ("phase", SEEDED, "M70", 30.0), ("defer", True, True, 30.0), *ran]


@pytest.mark.parametrize("failure, credit, counted", [
    (Failed("incorrect", "off"), {"evaluation": "e"}, True),  # ran to the end: what it executed still counts
    (Failed("incorrect", "off", fatal=True), {"evaluation": "e"}, False),
    (Failed("input_modified", "B"), {"evaluation": "e"}, False),  # not creditable
    (Failed("incorrect", "off"), None, False),
])
def test_a_failed_check_is_still_counted_only_where_it_ran_to_the_end(phases, failure, credit, counted):
    calls, knobs = phases
    knobs["fail"] = failure
    result, _ = worker.run_workload(State(), _request(time=True, credit=credit))
    assert result["reason"] == failure.reason
    assert calls[1:] == ([("defer", False, False, 30.0)] if counted else [])


# ---------------------------------------------------------------- once


def _once(tmp_path, monkeypatch, make_state) -> dict:
    monkeypatch.setattr(worker, "State", make_state)
    (tmp_path / "req").write_bytes(pickle.dumps(_request()))
    assert worker.once(str(tmp_path / "req"), str(tmp_path / "res")) == 0
    return pickle.loads((tmp_path / "res").read_bytes())


def test_once_writes_the_workloads_result(tmp_path, monkeypatch):
    reply = _once(tmp_path, monkeypatch, State)
    assert (reply["op"], reply["result"]["status"], reply["fatal"]) == ("result", "passed", False)


def test_once_without_a_context_writes_why(tmp_path, monkeypatch):
    def no_gpu():
        raise RuntimeError("torch sees no CUDA device")
    reply = _once(tmp_path, monkeypatch, no_gpu)
    assert (reply["op"], reply["error"]) == ("error", "RuntimeError: torch sees no CUDA device")
    assert "no_gpu" in reply["traceback"]


# ---------------------------------------------------------------- State without a GPU


def _bare_state() -> worker.State:
    """State's attributes as __init__ leaves them, without the context it makes."""
    state = object.__new__(worker.State)
    state._gate = state.gate_error = state._module = None
    state._counters = state._counters_error = state._sass = state._sass_error = None
    state.pending = []
    return state


def test_the_gate_is_built_once_and_its_failure_remembered(monkeypatch):
    built = []
    monkeypatch.setattr(tools.timing, "StreamGate", lambda: built.append(1) or "gate")
    state = _bare_state()
    assert state.gate == "gate" and state.gate == "gate" and len(built) == 1 and state.gate_error is None

    def broken():
        built.append(2)
        raise OSError("no libcuda")
    monkeypatch.setattr(tools.timing, "StreamGate", broken)
    state = _bare_state()
    assert state.gate is None and state.gate is None
    assert state.gate_error == "OSError: no libcuda" and built.count(2) == 1


class Profiler:
    made: list = []

    def __init__(self, metrics, replay, keep_enabled=False):
        self.metrics, self.replay, self.keep_enabled, self.closed = metrics, replay, keep_enabled, False
        Profiler.made.append(self)

    def close(self):
        self.closed = True
        raise CuptiError("already closed")  # a failing close never stops the new set


def test_counters_are_built_once_per_metric_set(monkeypatch):
    Profiler.made = []
    monkeypatch.setattr(tools.cupti, "RangeProfiler", Profiler)
    state = _bare_state()
    first = state.counters(("a", "b"))
    assert state.counters(("a", "b")) is first and first.metrics == ["a", "b"] and first.replay == "user"
    second = state.counters(("c",))
    assert second is not first and first.closed and not second.closed and len(Profiler.made) == 2
    assert not first.keep_enabled and not second.keep_enabled  # kept enabled only as the experiment asks
    monkeypatch.setenv(tools.cupti.KEEP_ENABLED_ENV, "1")
    assert state.counters(("d",)).keep_enabled


@pytest.mark.parametrize("build, attr", [("RangeProfiler", "counters"), ("SassCounter", "sass_counter")])
def test_a_failing_cupti_set_up_is_remembered_and_said(monkeypatch, build, attr):
    tries = []

    def broken(*args, **kwargs):
        tries.append(1)
        raise RuntimeError("E" * 500)
    monkeypatch.setattr(tools.cupti, build, broken)
    state = _bare_state()
    call = getattr(state, attr)
    for _ in range(2):
        with pytest.raises(CuptiError) as err:
            call(("a",)) if attr == "counters" else call()
        assert str(err.value) == ("RuntimeError: " + "E" * 500)[:400]
    assert len(tries) == 1


def test_the_sass_counter_is_built_once(monkeypatch):
    built = []
    monkeypatch.setattr(tools.cupti, "SassCounter", lambda: built.append(object()) or built[-1])
    state = _bare_state()
    assert state.sass_counter() is state.sass_counter() is built[0] and len(built) == 1


class Module:
    def __init__(self, fails=False):
        self.fails, self.unloaded = fails, 0

    def unload(self):
        self.unloaded += 1
        if self.fails:
            raise RuntimeError("context gone")


def test_a_kept_module_leaves_the_state():
    state = _bare_state()
    state._module = module = Module()
    assert state.keep_module() is module and state._module is None


def test_dropping_deferred_workloads_unloads_their_modules():
    state = _bare_state()
    a, b = Module(fails=True), Module()
    state.pending = [SimpleNamespace(module=a), SimpleNamespace(module=None), SimpleNamespace(module=b)]
    state.drop_pending()
    assert state.pending == [] and (a.unloaded, b.unloaded) == (1, 1)


def test_held_bytes_are_the_deferred_workspaces_and_their_libraries():
    def counted(shapes, phase):
        guarded = {f"t{i}": SimpleNamespace(raw=torch.zeros(s, dtype=torch.float16)) for i, s in enumerate(shapes)}
        return SimpleNamespace(ws=SimpleNamespace(guarded=guarded), phase=phase)
    pending = [counted([10, 6], SimpleNamespace(held_bytes=1000)), counted([3], None)]
    assert worker.State.held_bytes(SimpleNamespace(pending=pending)) == 2 * (10 + 6 + 3) + 1000


@pytest.mark.parametrize("answer, sticky", [
    ((d.CUresult.CUDA_SUCCESS,), None),
    (d.CUresult.CUDA_SUCCESS, None),
    ((d.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,), "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (d.CUresult.CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED"),
    (RuntimeError("driver gone"), "CUDA_ERROR_UNKNOWN"),
])
def test_the_sticky_error_is_the_contexts_synchronize_answer(monkeypatch, answer, sticky):
    def synchronize():
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(d, "cuCtxSynchronize", synchronize)
    assert _bare_state().sticky_error() == sticky
