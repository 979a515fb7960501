"""The GPU worker: a subprocess that owns one GPU's CUDA context and runs candidates.

    python -m tools.worker                  serve requests on stdin/stdout (the Evaluator starts it)
    python -m tools.worker --once REQ RES   run one request from a pickle file, write the reply
                                            (how ncu and compute-sanitizer run a candidate)

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

import os
import pickle
import struct
import sys
import time
import traceback
from contextlib import contextmanager

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
        self._module = None

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

    def wait(self, limit_s: float) -> None:
        from tools.timing import wait_idle

        wait_idle(limit_s)

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
        self.pristine = {n: torch.empty_like(t) for n, t in self.inputs.items()}
        self.buffers = {b.name: (self.guarded[b.name].tensor, b.zero) for b in plan.buffers}

    def pointers(self) -> dict[str, int]:
        return {name: g.data_ptr() for name, g in self.guarded.items()}

    def load_inputs(self, fresh: dict) -> None:
        for n, t in self.inputs.items():
            t.copy_(fresh[n])
            self.pristine[n].copy_(fresh[n])

    def prepare(self) -> None:
        """Before every run: outputs poisoned, scratch zeroed (or filled with garbage)."""
        from tools.correctness import garbage_, poison_

        for t in self.outputs.values():
            poison_(t)
        for t, zero in self.buffers.values():
            t.zero_() if zero else garbage_(t)

    def verdict(self, expected: dict, rtol: float, atol: float, scales: dict | None = None):
        """(reason or None, detail, mismatches) for the outputs as they are now."""
        from tools.correctness import compare, poison_mask, same_bits

        for name, g in self.guarded.items():
            before, after = g.guard_damage()
            if before or after:
                kind = "output" if name in self.outputs else "input" if name in self.inputs else "buffer"
                where = " and ".join(s for s, n in (("before", before), ("after", after)) if n)
                return "out_of_bounds_write", (f"wrote outside {kind} {name!r}: {before + after} guard bytes changed "
                                               f"{where} it"), []
        for name, t in self.inputs.items():
            if not same_bits(t, self.pristine[name]):
                return "input_modified", f"input {name!r} changed during the run (inputs are read-only)", []
        scales = scales or {}
        mismatches = [compare(n, self.outputs[n], expected[n], rtol, atol, scales.get(n)) for n in self.outputs]
        for name, t in self.outputs.items():
            unwritten = int(poison_mask(t).sum())
            if unwritten:
                return "unwritten_output", (f"output {name!r}: {unwritten} of {t.numel()} elements were never "
                                            f"written (still the poison NaN)"), mismatches
        for m in mismatches:
            if m.nan_count:
                return "nan_output", f"output {m.output!r} has {m.nan_count} NaN elements", mismatches
        bad = [m for m in mismatches if not m.passed]
        if bad:
            m = bad[0]
            return "incorrect", (f"output {m.output!r}: {m.mismatch_frac:.2%} of elements off (max abs err "
                                 f"{m.max_abs_err:.3g}); first at {m.first_mismatch}: got {m.got:.6g}, expected "
                                 f"{m.expected:.6g}"), mismatches
        return None, None, mismatches


def timing_seed_for(seeds: list[int]) -> int:
    """The seed of the second input set used while timing: derived, so a run is reproducible."""
    return (seeds[-1] * 1_000_003 + 12_345) % (2**31 - 1) or 1


class InputRotation:
    """Inputs for the timed runs: before every one, the next of several input sets (each with
    its own reference) is copied in, so a kernel that replays an output it cached for the
    inputs it saw last cannot look fast or pass the check of the last timed run. The copy
    happens in prepare(), before the L2 flush, so it warms nothing that is timed."""

    def __init__(self, ws: Workspace, sets: list[tuple[dict, dict, dict | None]]):
        self.ws, self.sets, self.runs, self.loaded = ws, sets, 0, 0

    def prepare(self) -> None:
        self.runs += 1
        self.loaded = self.runs % len(self.sets)
        self.ws.load_inputs(self.sets[self.loaded][0])
        self.ws.prepare()

    @property
    def expected(self) -> dict:
        return self.sets[self.loaded][1]

    @property
    def scales(self) -> dict | None:
        return self.sets[self.loaded][2]

    def seed_label(self, seeds: list[int]) -> int:
        """The seed of the set loaded last: the last check's seed, or the timing seed."""
        return seeds[-2] if self.loaded == 0 else seeds[-1]


class Failed(Exception):
    def __init__(self, reason: str, detail: str, fatal: bool = False, outputs=None):
        super().__init__(detail)
        self.reason, self.detail, self.fatal, self.outputs = reason, detail, fatal, outputs or []


def run_workload(state: State, req: dict) -> tuple[dict, bool]:
    """Request fields: cubin (bytes), symbols (plain -> mangled kernel names), manifest and
    task (JSON-able dicts), workload ({name, axes, split}), seeds (>= 2 for a full check),
    time (bool), rounds, kernel_timeout_s, baseline_cache (path or None).
    Returns (WorkloadResult as a dict, fatal)."""
    import torch

    from tasks.schema import Task, Workload
    from tools.launch import STICKY_ERRORS, CudaError, ManifestError
    from tools.results import WorkloadResult
    from tools.solution import LaunchManifest
    from tools.timing import KernelTimeout

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
    except Exception as exc:  # noqa: BLE001 - maybe the context died under torch: ask the driver
        sticky = state.sticky_error()
        if sticky:
            result.reason, result.detail, fatal = "cuda_error", f"{sticky} (seen as {type(exc).__name__}: {exc})", True
        else:
            raise
    if result.reason == "cuda_error" and result.detail and result.detail.split()[0] not in STICKY_ERRORS:
        fatal = state.sticky_error() is not None
    if result.reason is None:
        result.status = "passed"
    if not fatal and state.device == "cuda":
        torch.cuda.empty_cache()  # workloads differ in size: give the memory back between them
    return result.model_dump(mode="json"), fatal


def _run_checked(state: State, req: dict, task, wl, manifest, result) -> None:
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference
    from tools.launch import plan_launches
    from tools.timing import Side, interleaved, summarize

    limit = float(req.get("kernel_timeout_s", 30.0))
    axes = task.axis_values(wl)
    tol = task.tolerance
    plan = plan_launches(manifest, task, axes, state.limits)
    ws = Workspace(task, plan, state.device)
    bound = state.bind(plan, req["cubin"], req.get("symbols"), ws)
    expected, scales = None, None

    def check(call: int, what: str) -> None:
        reason, detail, mism = ws.verdict(expected, tol.rtol, tol.atol, scales)
        result.outputs = mism
        if reason is None:
            return
        if call > 1 and reason in ("incorrect", "unwritten_output", "nan_output"):
            raise Failed("wrong_after_first_call", f"right on the first call, wrong on {what}: {detail}",
                         outputs=mism)
        raise Failed(reason, detail, outputs=mism)

    def judged(seed: int) -> tuple[dict, dict, dict | None]:
        """Fresh inputs for a seed, their fp32 reference, and the term scales if the task uses them."""
        fresh = generate_inputs(task, axes, seed, device=state.device)
        terms = None
        if getattr(tol, "scale", "ref") == "terms":  # judged against max(|ref|, rss of the summed terms)
            from tasks.reference import term_scales

            terms = term_scales(task, fresh)
        return fresh, run_reference(task, fresh), terms

    timed = bool(req.get("time")) and wl.split == "visible"
    with nvtx_range("verify"):
        for call, seed in enumerate(req["seeds"], 1):
            fresh, expected, scales = judged(seed)
            ws.load_inputs(fresh)
            ws.prepare()
            bound.launch()
            state.wait(limit)
            check(call, f"call {call} (fresh inputs, seed {seed})")
            if not (timed and call == len(req["seeds"])):
                del fresh

    if not timed:
        return
    with nvtx_range("time"):
        timing_seed = timing_seed_for(req["seeds"])
        result.seeds = list(req["seeds"]) + [timing_seed]
        rotation = InputRotation(ws, [(fresh, expected, scales), judged(timing_seed)])
        baseline, base_name, note = _baseline(state, req, task, wl, ws.inputs, limit)
        cand = Side("candidate", bound.launch, rotation.prepare)
        ct, bt = interleaved(cand, baseline, state.flusher, rounds=int(req.get("rounds", 5)), limit_s=limit)
    expected, scales = rotation.expected, rotation.scales
    check(len(req["seeds"]) + 1, f"the last timed run (inputs of seed {rotation.seed_label(result.seeds)})")
    result.timing = summarize(ct)
    flops = task.flop_count(axes)
    if flops > 0 and result.timing.median_ms > 0:
        result.tflops = flops / (result.timing.median_ms * 1e-3) / 1e12
    if baseline is not None and bt:
        result.baseline, result.baseline_name = summarize(bt), base_name
        result.speedup = result.baseline.median_ms / result.timing.median_ms
        if req.get("baseline_cache"):
            from tools.baseline_cache import BaselineCache, cache_key

            BaselineCache(req["baseline_cache"]).update(
                cache_key(task.name, wl.name, axes, state.info), best=base_name,
                last={"median_ms": result.baseline.median_ms, "iqr_ms": result.baseline.iqr_ms,
                      "runs": result.baseline.runs})
    elif note:
        result.baseline_name = note


def _baseline(state: State, req: dict, task, wl, inputs: dict, limit: float):
    """(Side for the best library backend or None, its name, a note when there is none).

    The backend is chosen once per (task, workload, GPU, library versions): each candidate
    backend timed cold, the fastest kept in the cache; later evaluations time only it."""
    from tasks.baselines import BaselineUnavailable, list_backends, make_baseline
    from tools.timing import Side, measure, summarize

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

    def make(candidates: list[str]) -> tuple[dict, list[str]]:
        made, refused = {}, []
        for name in candidates:
            try:
                made[name] = make_baseline(task, inputs, name).run
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
        for name, fn in backends.items():
            try:
                medians[name] = summarize(measure(Side(name, fn), state.flusher, 5, limit)).median_ms
            except Exception as exc:  # noqa: BLE001 - e.g. a backend that rejects this shape late
                log(f"baseline backend {name} failed: {type(exc).__name__}: {exc}")
        if not medians:
            return None, None, "none: every library backend failed on this workload"
        best = min(medians, key=medians.get)
        if cache is not None:
            cache.update(key, best=best, backends=medians)
    return Side(f"baseline:{best}", backends[best]), best, None


# ----------------------------------------------------------------------------------------

def serve() -> int:
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
        if msg.get("op") != "run":
            write_msg(proto_out, {"op": "error", "error": f"unknown op {msg.get('op')!r}"})
            continue
        t0 = time.perf_counter()
        try:
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--once"] and len(argv) == 3:
        return once(argv[1], argv[2])
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    return serve()


if __name__ == "__main__":
    sys.exit(main())
