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
from dataclasses import dataclass

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
        from tools.cupti import CuptiError, RangeProfiler

        if self._counters_error is not None:
            raise CuptiError(self._counters_error)
        if self._counters is None or tuple(self._counters.metrics) != tuple(metrics):
            if self._counters is not None:  # another metric set: the old host configuration goes
                with contextlib.suppress(CuptiError):
                    self._counters.close()
                self._counters = None
            try:
                self._counters = RangeProfiler(list(metrics), replay="user")
            except Exception as exc:  # noqa: BLE001 - no counters is a skipped check, never a failed run
                self._counters_error = f"{type(exc).__name__}: {exc}"[:400]
                raise CuptiError(self._counters_error) from None
        return self._counters

    def wait(self, limit_s: float) -> None:
        from tools.timing import wait_idle

        wait_idle(limit_s)

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
        """Device memory the deferred workloads' workspaces hold (kept on purpose, not lost)."""
        return sum(g.raw.numel() * g.raw.element_size() for e in self.pending for g in e.ws.guarded.values())

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
# One workload: allocate, check twice with fresh inputs, time against the baseline, re-check.

class Workspace:
    """Every tensor of one workload, guarded, at fixed addresses (tensor maps point at them)."""

    def __init__(self, task, plan, device: str = "cuda"):
        import torch

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

    def prepare(self) -> None:
        """Before every run, not timed: outputs poisoned, zero=false scratch filled with garbage."""
        from tools.correctness import garbage_, poison_

        for t in self.outputs.values():
            poison_(t)
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
        """Everything a run needs before its launches (the checks run it whole)."""
        self.prepare()
        self.zero_scratch()

    def verdict(self, expected: dict | None, tol, scales: dict | None = None, samples: dict | None = None, *,
                inputs: dict | None = None):
        """(reason or None, detail, mismatches) for the outputs as they are now: guards, inputs
        unchanged, every output element written and not NaN, then the values against
        `expected` (whole outputs) or against `samples` (tasks.sampled: random rows only).

        `inputs`: the run's inputs generated again from its seed after the run. "Unchanged" is
        judged against them, never against a device copy: nothing the candidate could reach
        while it ran decides the verdict."""
        if inputs is None:
            raise ValueError("verdict() needs the inputs generated again from the run's seed (inputs=...)")
        from tasks.sampled import view_rows
        from tools.correctness import compare, poison_mask, same_bits

        for name, g in self.guarded.items():
            before, after = g.guard_damage()
            if before or after:
                kind = "output" if name in self.outputs else "input" if name in self.inputs else "buffer"
                where = " and ".join(s for s, n in (("before", before), ("after", after)) if n)
                return "out_of_bounds_write", (f"wrote outside {kind} {name!r}: {before + after} guard bytes changed "
                                               f"{where} it"), []
        for name, t in self.inputs.items():
            if not same_bits(t, inputs[name]):
                return "input_modified", f"input {name!r} changed during the run (inputs are read-only)", []
        for name, t in self.outputs.items():
            unwritten = int(poison_mask(t).sum())
            if unwritten:
                return "unwritten_output", (f"output {name!r}: {unwritten} of {t.numel()} elements were never "
                                            f"written (still the poison NaN)"), []
            nans = int(t.isnan().sum()) if t.is_floating_point() else 0  # whole output, also when rows are sampled
            if nans:
                return "nan_output", f"output {name!r} has {nans} NaN elements", []
        if samples is not None:
            mismatches = [compare(n, view_rows(self.outputs[n])[smp.rows], smp.expected, tol, smp.scale)
                          for n, smp in samples.items()]
        else:
            mismatches = [compare(n, self.outputs[n], expected[n], tol, (scales or {}).get(n)) for n in self.outputs]
        bad = [m for m in mismatches if not m.passed]
        if bad:
            return "incorrect", bad[0].describe() + (" (on randomly sampled rows)" if samples is not None else ""), \
                mismatches
        return None, None, mismatches


SAMPLED_ROWS = 64  # rows of each output judged on every timed run, for op types tasks.sampled.rows_for does not raise


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

    def __init__(self, task, axes: dict, ws: "Workspace", rng, device: str, rows: int | None = None):
        from tasks.sampled import has_sampler, rows_for

        self.task, self.axes, self.ws, self.rng, self.device = task, axes, ws, rng, device
        self.rows = rows or max(SAMPLED_ROWS, rows_for(task))
        self.sampled = has_sampler(task)
        self.seed: int | None = None
        self.full_at: set[int] | None = None
        self.full_checks = 0
        self._pair_inputs_used = False

    def _inputs(self) -> dict:
        from tasks.generators import generate_inputs

        return generate_inputs(self.task, self.axes, self.seed, device=self.device, fast=True)

    def before_pair(self, i: int, total: int) -> None:
        self.seed = self.rng.getrandbits(31)
        self.ws.load_inputs(self._inputs())  # the generated tensors are dropped once copied in
        self._pair_inputs_used = False

    def inputs_for_run(self) -> None:
        """Before each side's run of a pair (untimed). The first side runs on the inputs
        before_pair loaded; the second gets them generated again from the pair's seed, so neither
        side ever reads a buffer the other could have rewritten since it was generated: a
        candidate that rewrites its inputs cannot steer the library's time in the same pair."""
        if self._pair_inputs_used:
            self.ws.load_inputs(self._inputs())
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
        judge_run(self.task, self.axes, self.ws, self.seed, self.rng, self.device, self.rows, full, what)


def judge_run(task, axes: dict, ws: "Workspace", seed: int, rng, device: str, rows: int, full: bool,
              what: str) -> None:
    """The verdict on one run's output, as every timed run gets it; raises Failed naming `what`.
    The inputs are generated again from the run's `seed` (fast generator) now, after the run:
    while the candidate ran, nothing the reference is computed from existed in device memory, and
    the inputs are judged unchanged against this regeneration. `full`: compared whole against the
    reference; else on `rows` random rows of each output (drawn from `rng`), the whole output
    still scanned (guards, poison, NaN)."""
    from tasks.generators import generate_inputs

    fresh = generate_inputs(task, axes, seed, device=device, fast=True)
    if full:
        from tasks.reference import run_reference

        expected, scales = run_reference(task, fresh), _term_scales(task, fresh)
        reason, detail, mism = ws.verdict(expected, task.tolerance, scales, inputs=fresh)
    else:
        import torch

        from tasks.sampled import sample

        gen = torch.Generator(device=device)
        gen.manual_seed(rng.getrandbits(63))
        reason, detail, mism = ws.verdict(None, task.tolerance, inputs=fresh, samples=sample(task, fresh, gen, rows))
    if reason is None:
        return
    if reason in ("incorrect", "unwritten_output", "nan_output"):
        raise Failed("wrong_in_timed_run", f"{what} (fresh inputs, right in the checks before): {detail}",
                     outputs=mism)
    raise Failed(reason, f"{what}: {detail}", outputs=mism)


def _term_scales(task, fresh: dict) -> dict | None:
    """Term scales for tasks judged with tolerance.scale == "terms", else None."""
    if getattr(task.tolerance, "scale", "ref") != "terms":
        return None
    from tasks.reference import term_scales

    return term_scales(task, fresh)


class Failed(Exception):
    def __init__(self, reason: str, detail: str, fatal: bool = False, outputs=None):
        super().__init__(detail)
        self.reason, self.detail, self.fatal, self.outputs = reason, detail, fatal, outputs or []


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

    if state.pending and state.pending[0].evaluation != (req.get("credit") or {}).get("evaluation"):
        state.drop_pending()  # another evaluation's, which never asked for its counted runs
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
    fatal = fatal or _must_restart(state, wl.name)
    return result.model_dump(mode="json"), fatal


def _must_restart(state: State, after: str) -> bool:
    """Restore what a candidate may have changed in the context; True where that is not enough
    (the worker must not serve another request)."""
    try:
        why = state.restore()
    except Exception as exc:  # noqa: BLE001 - a context that cannot be restored is not reused
        why = f"{type(exc).__name__}: {exc}"
    if why:
        log(f"restarting after {after}: {why}")
    return bool(why)


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
        _verify(state, req, task, axes, ws, bound, result, limit)
        result.phase_s["verify"] = time.perf_counter() - t0
        if req.get("time"):
            with nvtx_range("time"):
                _time_paired(state, req, task, wl, axes, ws, bound, random.Random(int(req["timing_seed"])), result,
                             limit)
    except Failed as f:
        # a kernel that ran to the end with wrong numbers: what it executed is still counted
        # (arch_executed_any), on a run that is not judged (its verdict is already in)
        if req.get("credit") and f.reason in CREDITABLE and not f.fatal:
            _credit_run(state, req, task, axes, ws, bound, result, limit, judge=False)
        raise
    if req.get("credit"):
        _credit_run(state, req, task, axes, ws, bound, result, limit, judge=True)


def _verify(state: State, req: dict, task, axes: dict, ws: Workspace, bound, result, limit: float) -> None:
    """The seeded checks: each seed's inputs, one whole run, the whole output judged."""
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference

    with nvtx_range("verify"):
        for call, seed in enumerate(req["seeds"], 1):
            ws.load_inputs(generate_inputs(task, axes, seed, device=state.device))
            ws.reset()
            bound.launch()
            state.wait(limit)
            # The reference's inputs are generated again from the seed, and the answer computed,
            # only now: while the candidate ran, neither was anywhere in device memory.
            fresh = generate_inputs(task, axes, seed, device=state.device)
            expected, scales = run_reference(task, fresh), _term_scales(task, fresh)
            reason, detail, mism = ws.verdict(expected, task.tolerance, scales, inputs=fresh)
            result.outputs = mism
            if reason is None:
                continue
            if call > 1 and reason in ("incorrect", "unwritten_output", "nan_output"):
                raise Failed("wrong_after_first_call", f"right on the first call, wrong on call {call} (fresh "
                                                       f"inputs, seed {seed}): {detail}", outputs=mism)
            raise Failed(reason, detail, outputs=mism)


# ----------------------------------------------------------------------------------------
# The executed-instruction check's side. In process (tools.cupti), after the timed runs of the
# same module instance; or, where CUPTI cannot run, in a process of its own under Nsight Compute
# with --profile-from-start off (run_credit).

CREDIT_RUNS = (1, 8)  # Nsight Compute's process: runs after the seeded checks; one of them, drawn at random, is profiled
CREDIT_LEAD_RUNS = (1, 4)  # in process, where nothing was timed: uncounted runs before the counted ones
COUNTED_RANGE = "counted_run"  # each workload's counted runs are made in the user range counted_run_<k>
INSTRUMENTED_SLOWDOWN = 50.0  # a SASS-patched pass's run may take this many times a plain run (49x seen: bwd S77)


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


def _credit_run(state: State, req: dict, task, axes: dict, ws: Workspace, bound, result, limit: float,
                judge: bool) -> None:
    """The executed check for this workload, in this worker and module instance: counted runs
    that continue the timed runs (run_counted), made at the evaluation's credit op (run_pending).
    The workload's module and workspace are kept until then, as its timed runs left them, and every
    workload's counted runs run in one profiler session (CUPTI's first start and its SASS patching
    paid once per evaluation, not per workload). Fills result.credit ("pending" until the credit
    op); a CUPTI failure is reported there ("unavailable" or a reason), never as the candidate's
    fault."""
    import random

    from tools.cupti import CuptiError

    spec = req["credit"]
    rng = random.Random(int(spec["seed"]))
    # where the workload was timed and judged, the counted runs follow its timed runs (their
    # number is secret and drawn per evaluation); where not, 1-4 uncounted runs come first, so the
    # counted ones never start at a place the kernel can count to
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
        return
    out["passes"], out["runs"], out["counted_from"] = profiler.passes, lead + profiler.passes, lead + 1
    entry = Counted(label=f"{COUNTED_RANGE}_{len(state.pending)}", workload=req["workload"]["name"], task=task,
                    axes=axes, ws=ws, bound=bound, limit=limit, judge=judge, rng=rng, lead=lead, out=out,
                    profiler=profiler, evaluation=spec.get("evaluation"), module=state.keep_module())
    out["status"], out["reason"] = "pending", "its counted runs wait for the evaluation's credit op"
    state.pending.append(entry)


class _NothingLeft(Exception):
    """Every workload of the counted runs has answered wrong: the passes stop."""


def run_counted(state: State, entries: list[Counted]) -> None:
    """The counted runs of `entries`, all in one session of CUPTI's user replay: one run of each
    workload per pass, in order, each inside its workload's own range. Each run is prepared and
    timed as a timed run is (fresh inputs from the workload's secret credit seed, outputs
    poisoned, L2 flushed, scratch zeroed and, in the hardware passes, the launches behind the
    stream gate, events around them) and judged as a timed run is (`judge`; sampled rows, the
    whole output scanned): credit is only taken on right answers, and a wrong one is the
    workload's failure (`failed`). The hardware passes' times (`run_ms`) are tied to the timed
    median, every one, both ways (tools.credit.tie_to_timed_run); the SASS-patched pass runs
    instrumented code: its time is recorded (`instrumented_ms`), never tied. A hang or a dead
    context raises (fatal); a CUPTI failure is every entry's `reason`."""
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

    def prepare(e: Counted, seed: int) -> None:
        e.ws.load_inputs(generate_inputs(e.task, e.axes, seed, device=state.device, fast=True))
        e.ws.prepare()
        state.flusher.flush()

    def side(e: Counted, gated: bool = True) -> Side:
        return Side("candidate", lambda: (e.ws.zero_scratch(), e.bound.launch()), gated=gated)

    for e in entries:  # uncounted runs first, where the workload was not timed and judged
        for _ in range(e.lead):
            prepare(e, e.rng.getrandbits(31))
            gated_run(side(e), state)
            state.wait(e.limit)

    def run_pass(i: int, ranged) -> None:
        for e in entries:
            t0 = clock()
            seed = e.rng.getrandbits(31)
            prepare(e, seed)
            t1 = clock()
            slow = INSTRUMENTED_SLOWDOWN * max(e.out["run_ms"], default=0.0) / 1e3 if i in instrumented else 0.0
            try:
                # The SASS-patched pass runs ungated: CUPTI patches a kernel at its first launch
                # there, blocking the host until the stream drains, while the gate holds the stream
                # until its limit (0.2 s a workload, measured on the GEMM expert). That pass's time
                # is recorded, never tied, so the gate buys it nothing.
                with ranged(e.label):
                    start, end = gated_run(side(e, gated=i not in instrumented), state)
                state.wait(e.limit + slow)
            except (KernelTimeout, CudaError) as exc:  # fatal: the workload whose run it was is named
                why = f"{exc.name} ({exc.what})" if isinstance(exc, CudaError) else str(exc)
                e.failed = Failed("timeout" if isinstance(exc, KernelTimeout) else "cuda_error",
                                  f"the executed check's counted run {e.lead + i + 1}: {why}", fatal=True)
                raise
            t2 = clock()
            (e.out["instrumented_ms"] if i in instrumented else e.out["run_ms"]).append(
                round(start.elapsed_time(end), 5))
            if e.judge and e.failed is None:
                rows = max(SAMPLED_ROWS, rows_for(e.task))
                try:
                    judge_run(e.task, e.axes, e.ws, seed, e.rng, state.device, rows, not has_sampler(e.task), what=(
                        f"the executed check's counted run {e.lead + i + 1} (after the timed runs)"))
                except Failed as f:  # the workload fails; the passes go on while another one is counted
                    e.failed = f
            e.seconds += clock() - t0
            # where a counted run's cost goes: prepare (inputs, poison, flush), run (range, gate, wait), judge
            e.out.setdefault("pass_s", []).append([round(t1 - t0, 4), round(t2 - t1, 4), round(clock() - t2, 4)])
            if all(x.failed is not None for x in entries):
                raise _NothingLeft

    t0 = clock()
    try:
        launches = {x.name: x for x in profiler.profile_passes(run_pass, entries[0].label)}
    except CuptiError as exc:
        for e in entries:
            e.out["reason"] = str(exc)[:400]
        return
    except _NothingLeft:
        for e in entries:
            e.out["reason"] = "not counted: its counted run answered wrong"
        return
    finally:
        total = round(clock() - t0, 4)
        parts = {k: round(v, 4) for k, v in (getattr(profiler, "last_phase_s", None) or {}).items()}
        stops = list(getattr(profiler, "last_stops", None) or [])  # CUPTI's own pass bookkeeping, recorded
        for e in entries:
            e.out.update(profile_s=total, profile_phase_s=parts, stops=stops, workloads_counted=len(entries),
                         own_s=round(e.seconds, 4))
    for e in entries:
        got = launches.get(e.label)
        if got is None:
            e.out["reason"] = f"CUPTI returned no range {e.label!r} (it returned {sorted(launches)})"[:400]
            continue
        e.out["status"] = "ran"
        e.out["launches"] = [{"name": got.name, "metrics": got.metrics}]


def run_pending(state: State) -> tuple[dict, bool]:
    """The evaluation's credit op: every deferred workload's counted runs (run_counted) in one
    profiler session, after all the timed runs. Returns (reply, fatal): reply has `credits`
    (workload -> its credit dict), `failed` (workload -> reason, detail, outputs: a counted run
    answered wrong, or hung) and `seconds`."""
    from tools.launch import CudaError
    from tools.timing import KernelTimeout

    entries, state.pending = state.pending, []
    reply: dict = {"op": "credits", "credits": {}, "failed": {}}
    fatal = False
    t0 = time.perf_counter()
    try:
        if entries:
            run_counted(state, entries)
    except (KernelTimeout, CudaError):  # run_counted named the workload whose run it was
        fatal = True
        culprit = next((e.workload for e in entries if e.failed is not None and e.failed.fatal), "a workload")
        for e in entries:
            e.out["status"] = "failed"
            e.out["reason"] = e.out["reason"] or f"not counted: {culprit}'s counted run ended the session"
    finally:
        for e in entries:  # the kept modules and workspaces go now (the context may be dead: best effort)
            if e.module is not None and not fatal:
                with contextlib.suppress(Exception):
                    e.module.unload()
            e.module = e.ws = e.bound = None
    for e in entries:
        reply["credits"][e.workload] = e.out
        if e.failed is not None:
            reply["failed"][e.workload] = {"reason": e.failed.reason, "detail": e.failed.detail, "outputs": [
                m.model_dump(mode="json") for m in e.failed.outputs]}
    fatal = fatal or _must_restart(state, "the counted runs")
    reply["seconds"] = time.perf_counter() - t0
    return reply, fatal


def _prepared_runs(state: State, task, axes: dict, ws: Workspace, bound, seeds: list[int], limit: float, at: int,
                   counted, fast_from: int = 0) -> None:
    """One run per seed, on inputs generated from it and prepared as a timed run's are (outputs
    poisoned, garbage scratch, L2 flushed, zeroed scratch reset on the stream before the
    launches); run `at` is made through `counted(run)` (under a profiler, and whatever it checks
    before the next run overwrites the outputs). Seeds from `fast_from` on use the fast
    generator, as the timed runs do."""
    from tasks.generators import generate_inputs

    def run() -> None:
        bound.launch()
        state.wait(limit)

    for i, seed in enumerate(seeds):
        ws.load_inputs(generate_inputs(task, axes, seed, device=state.device, fast=i >= fast_from))
        ws.prepare()
        state.flusher.flush()
        ws.zero_scratch()  # outside what `counted` measures
        if i == at:
            counted(run)
        else:
            run()


def run_credit(state: State, req: dict) -> dict:
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
                       limit, checks + at, profiled, fast_from=checks)
        out["status"] = "ran"  # not "passed": nothing is judged here
    except Exception as exc:  # noqa: BLE001 - a candidate's fault here is reported, never raised
        out["reason"], out["detail"] = "run_failed", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        with contextlib.suppress(Exception):
            state.restore()
    return out


def _time_paired(state: State, req: dict, task, wl, axes: dict, ws: Workspace, bound, rng, result, limit: float) -> None:
    """The timed phase: candidate and baseline alternate run by run on fresh inputs, every
    candidate run judged; then the speedup (median of per-pair ratios, bootstrap interval),
    the throughput against the physical ceilings, and the GPU's state before and after."""
    import statistics

    from tools.ceilings import ceiling_for, implausible
    from tools.timing import TIMING_BUDGET_S, TIMING_CAP_S, Side, median_ci, paired, summarize

    t0 = time.perf_counter()
    baseline, base_name, note = _baseline(state, req, task, wl, ws.inputs, limit)
    result.phase_s["baseline"] = time.perf_counter() - t0
    judge = TimedJudge(task, axes, ws, rng, state.device)

    def candidate_run() -> None:
        ws.zero_scratch()
        bound.launch()

    def candidate_prepare() -> None:
        judge.inputs_for_run()
        ws.prepare()

    if baseline is not None:
        library_prepare = baseline.prepare
        baseline.prepare = lambda: (judge.inputs_for_run(), library_prepare())

    result.timing_seed = int(req["timing_seed"])
    result.gpu_state["start"] = state.gpu_state()
    t0 = time.perf_counter()
    times = paired(Side("candidate", candidate_run, candidate_prepare), baseline, state, rng, judge.before_pair,
                   judge.after_pair, limit_s=limit, budget_s=float(req.get("timing_budget_s", TIMING_BUDGET_S)),
                   cap_s=float(req.get("timing_cap_s", TIMING_CAP_S)))
    result.phase_s["timed"] = time.perf_counter() - t0
    result.phase_s["judge"] = times.judge_s  # inside "timed": judging each candidate run
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


def _library_side(name: str, baseline, inputs: dict):
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


def _baseline(state: State, req: dict, task, wl, inputs: dict, limit: float):
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
                made[name] = _library_side(name, lib, inputs)
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
                dropped = len(state.pending)
                state.drop_pending()
                reply, fatal = {"op": "credits", "credits": {}, "failed": {}, "dropped": dropped, "fatal": False}, False
            elif msg["op"] == "credit":  # the evaluation's deferred counted runs (run_pending)
                reply, fatal = run_pending(state)
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
