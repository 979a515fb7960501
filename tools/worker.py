"""The GPU worker: a subprocess that owns one GPU's CUDA context and runs candidates.

    python -m tools.worker                  serve requests on stdin/stdout (the Evaluator starts it)
    python -m tools.worker --once REQ RES   run one request from a pickle file, write the reply
                                            (how compute-sanitizer runs a candidate)
    python -m tools.worker --credit RES     the executed check's process under Nsight Compute: every
                                            judged workload's credit runs (run_credit), requests on stdin

Protocol: each message is an 8-byte little-endian length followed by a pickled dict.
stdout carries only the protocol (fd 1 is pointed at stderr at start, so stray prints
and driver messages cannot corrupt it); logs go to stderr. The first message is
{"op": "hello", "info": {...}} or {"op": "hello", "error": "..."}. Requests:
{"op": "info"}, {"op": "run", ...} (see `run_workload`), {"op": "exit"}.

After a sticky CUDA error or a hung kernel the context is dead: the worker answers with
"fatal": True and exits, and the client starts a fresh one for the next request.

Imports: torch, cuda.bindings, pydantic, numpy, tasks/, tools/ only (the GPU machine has
nothing else); framing functions at the top import nothing, so the client and the tests
can use them without CUDA.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import struct
import sys
import time
import traceback
from contextlib import contextmanager

from tools.counted import Counted, defer_counted, run_credit, run_pending
from tools.timed import TimedPhase, time_paired
from tools.workspace import Failed, Workspace, log, must_restart, nvtx_range, verify

_HEADER = struct.Struct("<Q")
MAX_MESSAGE = 1 << 31


def encode(msg: dict) -> bytes:
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def write_msg(stream, msg: dict) -> None:
    stream.write(encode(msg))
    stream.flush()


def read_msg(stream) -> dict | None:
    """One message from a binary stream; None at a clean end of stream."""
    head = _read_exact(stream, _HEADER.size)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    if n > MAX_MESSAGE:
        raise ValueError(f"protocol message of {n} bytes is too large")
    body = _read_exact(stream, n)
    if body is None:
        raise EOFError("stream ended inside a message")
    return pickle.loads(body)


def _read_exact(stream, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            if buf:
                raise EOFError("stream ended inside a message")
            return None
        buf += chunk
    return buf


# ----------------------------------------------------------------------------------------
# Worker state: one CUDA context, loaded modules, the L2 flush buffer.

RESTART_LOST_BYTES = 2 << 30  # more device memory than this missing after a candidate: restart


def _nvml_handle():
    """NVML handle of this worker's GPU, or None (nvidia-ml-py missing, no NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        if visible.startswith("GPU-"):
            return pynvml.nvmlDeviceGetHandleByUUID(visible)
        return pynvml.nvmlDeviceGetHandleByIndex(int(visible or 0))
    except Exception:  # noqa: BLE001 - telemetry is optional; its absence shows as an empty record
        return None


def _nvml_state(handle) -> dict[str, float]:
    if handle is None:
        return {}
    import pynvml

    out: dict[str, float] = {}
    for key, read in (("sm_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                      ("temp_c", lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                      ("power_w", lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)):
        try:
            out[key] = float(read())
        except Exception:  # noqa: BLE001
            pass
    return out


class State:
    """The worker's CUDA side. Tests on CPU substitute a stand-in with the same methods
    (device, limits, info, flusher, bind, wait, sticky_error)."""

    device = "cuda"

    def __init__(self):
        import torch
        from cuda.bindings import driver as d

        from tools.launch import DeviceLimits, check

        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # makes the primary context current before any module load
        check(d.cuInit(0), "cuInit")
        dev = check(d.cuCtxGetDevice(), "cuCtxGetDevice")

        def attr(name: str) -> int:
            return int(check(d.cuDeviceGetAttribute(getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"), dev),
                             f"cuDeviceGetAttribute({name})"))

        props = torch.cuda.get_device_properties(0)
        self.limits = DeviceLimits(
            num_sms=attr("MULTIPROCESSOR_COUNT"), max_smem_per_block=attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            max_threads_per_block=attr("MAX_THREADS_PER_BLOCK"),
            max_block=(attr("MAX_BLOCK_DIM_X"), attr("MAX_BLOCK_DIM_Y"), attr("MAX_BLOCK_DIM_Z")),
            max_grid=(attr("MAX_GRID_DIM_X"), attr("MAX_GRID_DIM_Y"), attr("MAX_GRID_DIM_Z")))
        l2 = attr("L2_CACHE_SIZE")
        driver_version = check(d.cuDriverGetVersion(), "cuDriverGetVersion")
        try:
            import cuda.bindings as cb
            bindings_version = cb.__version__
        except Exception:  # noqa: BLE001
            bindings_version = None
        self.info = {
            "gpu": props.name, "cc": f"{props.major}.{props.minor}", "num_sms": self.limits.num_sms,
            "l2_bytes": l2, "smem_per_block": self.limits.max_smem_per_block, "memory_bytes": props.total_memory,
            "driver": f"{driver_version // 1000}.{driver_version % 1000 // 10}", "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "cuda_bindings": bindings_version,
            "pid": os.getpid(), "limits": self.limits,
        }
        self._flusher = None
        self._gate, self.gate_error = None, None
        self._module = None
        # What a candidate may change in the context, as it was at start: restored after each workload
        self._limits0 = {lim: int(check(d.cuCtxGetLimit(lim), f"cuCtxGetLimit({lim.name})")) for lim in (
            d.CUlimit.CU_LIMIT_STACK_SIZE, d.CUlimit.CU_LIMIT_PRINTF_FIFO_SIZE, d.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE)}
        self._free0 = int(check(d.cuMemGetInfo(), "cuMemGetInfo")[0])
        self._nvml = _nvml_handle()
        self._counters, self._counters_error = None, None
        self._sass, self._sass_error = None, None  # CUPTI's SASS metrics (sass_counter), built when first needed
        self.pending: list[Counted] = []  # deferred workloads, waiting for the evaluation's credit op

    @property
    def gate(self):
        """The stream gate (tools.timing.StreamGate), or None where it cannot be built: then
        runs are timed ungated, and `gate_error` says why (each timed result repeats it)."""
        from tools.timing import StreamGate

        if self._gate is None and self.gate_error is None:
            try:
                self._gate = StreamGate()
            except Exception as exc:  # noqa: BLE001 - timing without the gate beats no timing
                self.gate_error = f"{type(exc).__name__}: {exc}"
                log(f"no stream gate, timing includes host issue time: {self.gate_error}")
        return self._gate

    @property
    def flusher(self):
        from tools.timing import L2Flusher

        if self._flusher is None:
            self._flusher = L2Flusher(self.info["l2_bytes"])
        return self._flusher

    def bind(self, plan, cubin: bytes, symbols: dict | None, ws: "Workspace"):
        """The plan bound to the workspace's tensors, ready to launch. The module is loaded
        afresh for every workload, so `__device__` state never carries over from another
        workload or an earlier evaluation (the previous one is unloaded first)."""
        from tools.launch import Bound, Module

        if self._module is not None:
            self._module.unload()
            self._module = None
        self._module = Module(cubin, symbols)
        return Bound(plan, self._module, ws.pointers())

    @contextmanager
    def profiler_window(self):
        """Nsight Compute (--profile-from-start off) profiles only launches made inside."""
        from cuda.bindings import driver as d

        from tools.launch import check

        check(d.cuProfilerStart(), "cuProfilerStart")
        try:
            yield
        finally:
            check(d.cuProfilerStop(), "cuProfilerStop")

    def counters(self, metrics: tuple[str, ...]):
        """The in-process hardware counters (tools.cupti.RangeProfiler, user replay) for `metrics`,
        built once per worker and metric set; raises CuptiError (remembered: a failing set-up is not retried) where CUPTI's
        range profiler cannot run here."""
        from tools.cupti import KEEP_ENABLED_ENV, CuptiError, RangeProfiler

        if self._counters_error is not None:
            raise CuptiError(self._counters_error)
        if self._counters is None or tuple(self._counters.metrics) != tuple(metrics):
            if self._counters is not None:  # another metric set: the old host configuration goes
                with contextlib.suppress(CuptiError):
                    self._counters.close()
                self._counters = None
            try:
                self._counters = RangeProfiler(list(metrics), replay="user",
                                               keep_enabled=os.environ.get(KEEP_ENABLED_ENV) == "1")
            except Exception as exc:  # noqa: BLE001 - no counters is a skipped check, never a failed run
                self._counters_error = f"{type(exc).__name__}: {exc}"[:400]
                raise CuptiError(self._counters_error) from None
        return self._counters

    def sass_counter(self):
        """CUPTI's SASS metrics API (tools.cupti.SassCounter), built once per worker; raises
        CuptiError (remembered) where it cannot run here."""
        from tools.cupti import CuptiError, SassCounter

        if self._sass_error is not None:
            raise CuptiError(self._sass_error)
        if self._sass is None:
            try:
                self._sass = SassCounter()
            except Exception as exc:  # noqa: BLE001 - no exact counts: the module's SASS decides (refusing)
                self._sass_error = f"{type(exc).__name__}: {exc}"[:400]
                raise CuptiError(self._sass_error) from None
        return self._sass

    def wait(self, limit_s: float) -> None:
        from tools.timing import wait_idle

        wait_idle(limit_s)

    def stream_busy(self) -> bool:
        """Whether the GPU has unfinished work on the runs' stream (a host query: nothing is enqueued)."""
        from cuda.bindings import driver as d

        res = d.cuStreamQuery(d.CUstream(0))
        err = res[0] if isinstance(res, tuple) else res
        return err == d.CUresult.CUDA_ERROR_NOT_READY

    def event(self):
        import torch

        return torch.cuda.Event(enable_timing=True)

    def gpu_state(self) -> dict[str, float]:
        """SM clock, temperature and power now (NVML), so drift is visible in every result."""
        return _nvml_state(self._nvml)

    def keep_module(self):
        """The current module, handed to a deferred workload (Counted.module): bind and restore
        leave it loaded, so its counted runs use the module instance its timed runs used."""
        module, self._module = self._module, None
        return module

    def drop_pending(self) -> None:
        """Drop deferred workloads whose evaluation never asked for their counted runs."""
        for e in self.pending:
            if e.module is not None:
                with contextlib.suppress(Exception):
                    e.module.unload()
        self.pending = []

    def held_bytes(self) -> int:
        """Device memory the deferred workloads hold (kept on purpose, not lost): their workspaces,
        and what their timed phases' libraries took when they were made (TimedPhase.held_bytes)."""
        return sum(g.raw.numel() * g.raw.element_size() for e in self.pending for g in e.ws.guarded.values()) + sum(
            getattr(e.phase, "held_bytes", 0) for e in self.pending)

    def restore(self) -> str | None:
        """Undo what the last candidate may have changed in the context (stack size, printf
        FIFO and malloc heap limits; its module; cached memory). Returns why the worker must
        restart when that is not enough: device memory it could not get back."""
        import torch
        from cuda.bindings import driver as d

        from tools.launch import check

        if self._module is not None:
            self._module.unload()
            self._module = None
        for lim, value in self._limits0.items():
            # Set only what changed: the driver refuses some limits once kernels have run (the
            # printf FIFO after any launch), so an unconditional reset would restart every time.
            if int(check(d.cuCtxGetLimit(lim), f"cuCtxGetLimit({lim.name})")) != value:
                check(d.cuCtxSetLimit(lim, value), f"cuCtxSetLimit({lim.name})")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free = int(check(d.cuMemGetInfo(), "cuMemGetInfo")[0])
        lost = (self._free0 - free - (self._flusher.buffer.numel() if self._flusher is not None else 0)
                - self.held_bytes())
        if lost > RESTART_LOST_BYTES:
            return f"{lost / 2**30:.1f} GiB of device memory was not given back after the candidate"
        return None

    def sticky_error(self) -> str | None:
        """The context's error after something failed, or None if it is healthy."""
        from cuda.bindings import driver as d

        try:
            res = d.cuCtxSynchronize()
            err = res[0] if isinstance(res, tuple) else res
        except Exception:  # noqa: BLE001
            return "CUDA_ERROR_UNKNOWN"
        return None if err == d.CUresult.CUDA_SUCCESS else err.name



# ----------------------------------------------------------------------------------------
# One workload: allocate, check twice with fresh inputs, time against the baseline, count, re-check.

def run_workload(state: State, req: dict) -> tuple[dict, bool]:
    """Request fields: cubin (bytes), symbols (plain -> mangled kernel names), manifest and
    task (JSON-able dicts), workload ({name, axes, split}), seeds (>= 2 for a full check),
    time (bool), timing_seed (secret: drives the timed phase's inputs, run counts and
    sampled rows), kernel_timeout_s, baseline_cache (path or None).
    Returns (WorkloadResult as a dict, fatal). fatal: the worker must not serve another
    request (dead context, or a context the candidate changed beyond repair)."""
    import torch

    from tasks.schema import Task, Workload
    from tools.launch import STICKY_ERRORS, CudaError, ManifestError
    from tools.results import WorkloadResult
    from tools.solution import LaunchManifest
    from tools.timing import KernelTimeout

    if state.pending and state.pending[0].evaluation != (req.get("evaluation") or (req.get("credit") or {}).get(
            "evaluation")):
        # another evaluation's, which never asked for its counted runs. A later workload of the same
        # evaluation sent without counted runs (the SASS read meanwhile showed none can execute) keeps
        # them: they carry their timed phases, run at its credit op (issue 43: dropped, they went untimed)
        state.drop_pending()
    task = Task.model_validate(req["task"])
    wl = Workload.model_validate(req["workload"])
    result = WorkloadResult(workload=wl.name, split=wl.split, axes=task.axis_values(wl), status="failed",
                            seeds=list(req["seeds"]))
    fatal = False
    try:
        _run_checked(state, req, task, wl, LaunchManifest.model_validate(req["manifest"]), result)
    except Failed as f:
        result.reason, result.detail, fatal = f.reason, f.detail, f.fatal
        result.outputs = f.outputs or result.outputs
    except ManifestError as exc:
        result.reason, result.detail = exc.reason, str(exc)
    except KernelTimeout as exc:
        result.reason, result.detail, fatal = "timeout", str(exc), True
    except CudaError as exc:
        result.reason, result.detail, fatal = "cuda_error", f"{exc.name} ({exc.what})", True
    except torch.cuda.OutOfMemoryError as exc:
        result.reason, result.detail = "oom", str(exc).splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - judging a candidate never raises: maybe the context died under torch
        sticky = state.sticky_error()
        if sticky:
            result.reason, result.detail, fatal = "cuda_error", f"{sticky} (seen as {type(exc).__name__}: {exc})", True
        else:
            log(traceback.format_exc())
            result.reason, result.detail = "harness_error", f"{type(exc).__name__}: {str(exc)[:500]}"
    if result.reason == "cuda_error" and result.detail and result.detail.split()[0] not in STICKY_ERRORS:
        fatal = state.sticky_error() is not None
    if result.reason is None:
        result.status = "passed"
    fatal = fatal or must_restart(state, wl.name)
    return result.model_dump(mode="json"), fatal


def _run_checked(state: State, req: dict, task, wl, manifest, result) -> None:
    import random

    from tools.launch import plan_launches
    from tools.results import CREDITABLE

    limit = float(req.get("kernel_timeout_s", 30.0))
    axes = task.axis_values(wl)
    plan = plan_launches(manifest, task, axes, state.limits)
    ws = Workspace(task, plan, state.device)
    bound = state.bind(plan, req["cubin"], req.get("symbols"), ws)

    t0 = time.perf_counter()
    try:
        verify(state, req, task, axes, ws, bound, result, limit)
        result.phase_s["verify"] = time.perf_counter() - t0
        if req.get("time") and req.get("credit"):
            # timed at the evaluation's credit op, where its counted runs are runs of its timed
            # sequence (tools.counted.run_counted); here only where the counters are unavailable
            phase = TimedPhase(state, req, task, wl, axes, ws, bound, random.Random(int(req["timing_seed"])), result,
                               limit)
            if defer_counted(state, req, task, axes, ws, bound, result, limit, judge=True, phase=phase):
                return
            with nvtx_range("time"):
                phase.run()
            return
        if req.get("time"):
            with nvtx_range("time"):
                time_paired(state, req, task, wl, axes, ws, bound, random.Random(int(req["timing_seed"])), result,
                            limit)
    except Failed as f:
        # a kernel that ran to the end with wrong numbers: what it executed is still counted
        # (arch_executed_any), on a run that is not judged (its verdict is already in)
        if req.get("credit") and f.reason in CREDITABLE and not f.fatal:
            defer_counted(state, req, task, axes, ws, bound, result, limit, judge=False)
        raise
    if req.get("credit"):
        defer_counted(state, req, task, axes, ws, bound, result, limit, judge=True)  # untimed: after its checks


# ----------------------------------------------------------------------------------------

def exit_with_parent(poll_s: float = 0.5) -> None:
    """A daemon thread that ends this process when the process that started it is gone. The
    worker has a session of its own (killed as a group by its client), so a client that dies
    without closing it (SIGKILL, a test's timeout) would leave it running its request, holding
    the GPU and the device's one profiling session, and the next evaluation's counters would be
    unavailable. Polling the parent, not PR_SET_PDEATHSIG: that signal fires when the *thread*
    that started the worker exits, and evaluations start workers from pool threads."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log(f"the client (pid {parent}) is gone; exiting")
        os._exit(4)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def serve() -> int:
    exit_with_parent()
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything printed to fd 1 from now on (python or C) lands in stderr
    sys.stdout = sys.stderr
    proto_in = sys.stdin.buffer
    try:
        state = State()
    except Exception as exc:  # noqa: BLE001
        write_msg(proto_out, {"op": "hello", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    write_msg(proto_out, {"op": "hello", "info": state.info})
    log(f"ready on {state.info['gpu']} (pid {os.getpid()})")
    while True:
        msg = read_msg(proto_in)
        if msg is None or msg.get("op") == "exit":
            return 0
        if msg.get("op") == "info":
            write_msg(proto_out, {"op": "info", "info": state.info})
            continue
        if msg.get("op") not in ("run", "credit"):
            write_msg(proto_out, {"op": "error", "error": f"unknown op {msg.get('op')!r}"})
            continue
        t0 = time.perf_counter()
        try:
            if msg["op"] == "credit" and msg.get("drop"):  # the verdict is known without them (the SASS)
                dropped = len(state.pending)  # their timed phases still run (nothing counted)
                reply, fatal = run_pending(state, count=False)
                reply.update(credits={}, dropped=dropped, fatal=fatal)
            elif msg["op"] == "credit":  # the evaluation's deferred counted runs (run_pending)
                reply, fatal = run_pending(state, msg.get("sass_sites"))
                reply["fatal"] = fatal
            else:
                result, fatal = run_workload(state, msg)
                reply = {"op": "result", "result": result, "fatal": fatal}
        except Exception as exc:  # noqa: BLE001 - a harness bug: report it, keep serving
            log(traceback.format_exc())
            reply = {"op": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            fatal = state.sticky_error() is not None
        reply["seconds"] = time.perf_counter() - t0
        write_msg(proto_out, reply)
        if fatal:
            log("context is dead after a sticky error or a hang; exiting")
            os._exit(3)


def once(request_path: str, result_path: str) -> int:
    with open(request_path, "rb") as f:
        req = pickle.load(f)
    try:
        state = State()
        result, fatal = run_workload(state, req)
        reply = {"op": "result", "result": result, "fatal": fatal}
    except Exception as exc:  # noqa: BLE001
        reply = {"op": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(result_path, "wb") as f:
        pickle.dump(reply, f)
    return 0


def credit(result_path: str) -> int:
    """The executed check's process (tools.ncu.CreditProcess). It starts while the evaluation is
    still compiling and timing and imports what it needs, then waits on stdin for
    {"op": "credit", "requests": [...]}, sent once the timed runs are over: it makes its CUDA
    context only then, so nothing of it runs on the GPU beside the timed runs. Then every judged
    workload's credit runs (run_credit) in order. A workload that kills the context ends the
    list there."""
    t0 = time.perf_counter()
    results: list[dict] = []
    phase_s: dict[str, float] = {}
    try:
        import torch  # noqa: F401 - the imports are most of the start-up: done before the hand-over

        import tasks.generators, tasks.reference, tasks.sampled, tools.correctness, tools.launch  # noqa: F401, E401

        phase_s["imports"] = time.perf_counter() - t0
        msg = read_msg(sys.stdin.buffer)
        if msg is None or msg.get("op") != "credit":
            return 0  # the evaluation ended without asking
        if msg.get("device") is not None:  # the evaluation's GPU, chosen after this process started
            os.environ["CUDA_VISIBLE_DEVICES"] = str(msg["device"])
        t1 = time.perf_counter()
        state = State()
        phase_s["context"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        for req in msg["requests"]:
            results.append(run_credit(state, req))
            if state.sticky_error():
                break
        phase_s["credit_runs"] = time.perf_counter() - t1
        reply = {"op": "credit", "results": results, "phase_s": phase_s}
    except Exception as exc:  # noqa: BLE001
        reply = {"op": "error", "error": f"{type(exc).__name__}: {exc}", "results": results,
                 "traceback": traceback.format_exc()}
    with open(result_path, "wb") as f:
        pickle.dump(reply, f)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--once"] and len(argv) == 3:
        return once(argv[1], argv[2])
    if argv[:1] == ["--credit"] and len(argv) == 2:
        return credit(argv[1])
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    return serve()


if __name__ == "__main__":
    sys.exit(main())
