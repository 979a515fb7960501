"""The evaluator: compile -> inspect -> (on a GPU) correctness, timing, executed instructions.

    with Evaluator() as ev:
        result = ev.evaluate(solution, task, "sm_90a", workloads="all", executed_check=True)

This process never initialises CUDA. GPU work happens in worker subprocesses
(tools/worker.py), one per GPU, started on first use and reused. A watchdog kills a
worker whose request runs past its deadline (reason "timeout"); a worker that exits
without answering is a "worker_crash"; after a sticky CUDA error the worker exits by
itself. Either way the next request starts a fresh worker.
"""
from __future__ import annotations

import collections
import contextlib
import os
import queue
import random
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools import worker as protocol
from tools.ceilings import computes_in_fp8
from tools.credit import Counting, TaskWork, combine, credit_in_process, credit_metrics, exact_count_sites
from tools.launch import NOMINAL_LIMITS, ManifestError, plan_launches
from tools.profile import PROFILE_METRICS, build_profile, skipped as profile_skipped
from tools.roofline import apply_roofline
from tools.results import (CREDITABLE, CompileResult, EvalResult, ExecutedCheck, InspectResult, SanitizeResult,
                           WorkloadResult)
from tools.timing import TIMING_BUDGET_S, TIMING_CAP_S, geo_spread, geomean

REPO_ROOT = Path(__file__).resolve().parents[1]
ARCH_CC = {"sm_90a": "9.0", "sm_100a": "10.0"}  # arch-specific ("a") cubins run on exactly this
ARCH_GPU = {"sm_90a": "an H100/H200", "sm_100a": "a B200/GB200"}


# where a crashed worker's note quotes what it wrote last (a candidate's printf lands there too)
LAST_WORDS = "; its last words: "


class WorkerTimeout(RuntimeError):
    pass


class WorkerCrash(RuntimeError):
    pass


class WorkerStartError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------
# GPU discovery without CUDA

def require_gpu(what: str) -> None:
    """For a script that only means something on a GPU (scripts/ marked GPU in the README): one
    line and exit 3 (the machine, not the input) where there is none, instead of a traceback or
    a table of None."""
    ids, why = detect_gpus()
    if not ids:
        print(f"{what} needs an NVIDIA GPU: {why}", file=sys.stderr)
        raise SystemExit(3)


def detect_gpus() -> tuple[list[str], str | None]:
    """(device ids to hand to CUDA_VISIBLE_DEVICES, reason when there are none).

    Uses nvidia-smi, so this process creates no CUDA context. Honours CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return [], f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found (no NVIDIA driver on this machine)"
    try:
        proc = subprocess.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    rows = [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not rows:
        return [], f"nvidia-smi lists no GPU ({(proc.stderr or proc.stdout).strip()[:200] or 'no output'})"
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        known = {r[0] for r in rows} | {r[1] for r in rows if len(r) > 1}
        ids = [w for w in wanted if w in known or any(len(r) > 1 and r[1].startswith(w) for r in rows)]
        return (ids, None) if ids else ([], f"CUDA_VISIBLE_DEVICES={visible!r} matches no GPU nvidia-smi lists")
    return [r[0] for r in rows], None


# ----------------------------------------------------------------------------------------
# One worker subprocess

class WorkerHandle:
    """Client side of one worker: start, request with a deadline, kill, restart lazily."""

    def __init__(self, device: str, cmd: list[str] | None = None, startup_timeout_s: float = 300.0,
                 log_path: Path | None = None):
        self.device = device
        self.cmd = cmd or [sys.executable, "-m", "tools.worker"]
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.info: dict | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=60)
        self.starts = 0

    @property
    def env(self) -> dict[str, str]:
        """The worker's environment (also ncu's and the sanitizer's): no credentials reach a
        process that runs a candidate (tools.sandbox.scrubbed_env)."""
        from tools.sandbox import scrubbed_env

        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        return scrubbed_env({"CUDA_VISIBLE_DEVICES": self.device, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})

    @property
    def env_without_device(self) -> dict[str, str]:
        """The same, with no device chosen yet (the executed check's process learns its GPU when it
        is handed its requests, before it initialises CUDA)."""
        env = dict(self.env)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> dict:
        """Start the worker if it is not running; returns its device info."""
        if self.alive() and self.info is not None:
            return self.info
        self.kill()
        self.stderr_tail.clear()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=self.env, start_new_session=True)
        self.starts += 1
        threading.Thread(target=self._drain_stderr, args=(self.proc,), daemon=True).start()
        try:
            hello = self._recv(time.monotonic() + self.startup_timeout_s)
        except (WorkerTimeout, WorkerCrash) as exc:
            self.kill()
            raise WorkerStartError(f"GPU worker did not start: {exc}") from None
        if hello.get("error"):
            self.kill()
            raise WorkerStartError(f"GPU worker did not start: {hello['error']}")
        self.info = hello.get("info") or {}
        return self.info

    def request(self, msg: dict, timeout_s: float) -> dict:
        # last words are this request's own: never what an earlier request's candidate wrote (a held-out
        # run's printf of its sizes, another client's evaluation)
        self.stderr_tail.clear()
        self.start()
        assert self.proc and self.proc.stdin
        try:
            self.proc.stdin.write(protocol.encode(msg))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerCrash(self._death_note()) from None
        return self._recv(time.monotonic() + timeout_s)

    def _recv(self, deadline: float) -> dict:
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        need = protocol._HEADER.size
        while True:
            if len(buf) >= protocol._HEADER.size:
                need = protocol._HEADER.size + protocol._HEADER.unpack(bytes(buf[:protocol._HEADER.size]))[0]
                if len(buf) >= need:
                    import pickle

                    return pickle.loads(bytes(buf[protocol._HEADER.size:need]))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerTimeout("no answer before the deadline; the worker was killed")
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, max(need - len(buf), 1 << 16))
            if not chunk:
                raise WorkerCrash(self._death_note())
            buf += chunk

    def _death_note(self) -> str:
        rc = None
        if self.proc is not None:
            try:
                rc = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.info = None
        how = f"was killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exited with status {rc}"
        time.sleep(0.05)  # let the stderr drain catch the last lines
        tail = " | ".join(line for line in list(self.stderr_tail)[-3:] if line)
        return f"the worker {how}" + (f"{LAST_WORDS}{tail}" if tail else "")

    def _drain_stderr(self, proc: subprocess.Popen) -> None:
        log = open(self.log_path, "a") if self.log_path else None
        try:
            for raw in iter(proc.stderr.readline, b""):
                line = raw.decode(errors="replace").rstrip()
                self.stderr_tail.append(line)
                if log:
                    log.write(line + "\n")
                    log.flush()
        except (OSError, ValueError):
            pass
        finally:
            if log:
                log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self.info = None

    def close(self) -> None:
        if self.alive():
            try:
                self.proc.stdin.write(protocol.encode({"op": "exit"}))  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


# ----------------------------------------------------------------------------------------

def static_check(solution, compile_result, task, axes: dict[str, int], limits) -> ManifestError | None:
    """Manifest problems visible without a GPU: names, expressions, shapes, nominal limits,
    kernels missing from the compiled module."""
    try:
        plan = plan_launches(solution.manifest, task, axes, limits)
    except ManifestError as exc:
        return exc
    from tools.kernel_names import AmbiguousKernel, entry_param_sizes, resolve_kernel
    from tools.launch import check_param_sizes

    symbols = getattr(compile_result, "symbols", {}) or {}
    if compile_result.kernels:  # ptxas -v listed the module's kernels
        planned = {lp.index: lp for lp in plan.launches}
        for i, lc in enumerate(solution.manifest.launches):  # a launch this workload skips (`when`) too
            try:
                entry = resolve_kernel(lc.kernel, set(compile_result.kernels), symbols)
            except AmbiguousKernel as exc:
                return ManifestError(f"launches[{i}].kernel: {exc}")
            if entry is None:
                avail = ", ".join(sorted(symbols or compile_result.kernels))
                return ManifestError(f"launches[{i}].kernel: {lc.kernel!r} is not in the compiled module "
                                     f"(kernels: {avail}); declare it extern \"C\" or use the name it has")
            sizes = entry_param_sizes(compile_result.ptx or "").get(entry)
            if (lp := planned.get(i)) is not None and sizes is not None:  # the launch checks again with the driver's figures
                try:
                    check_param_sizes(lp, list(sizes), f"launches[{lp.index}] ({lp.kernel!r})")
                except ManifestError as exc:
                    return exc
    return None


class Evaluator:
    """Compile, inspect and (where a matching GPU exists) run candidates. One worker per GPU."""

    def __init__(self, gpus: list[int | str] | None = None, timeout_s: float = 180.0, cache_dir: str | Path | None = None,
                 kernel_timeout_s: float | None = None, startup_timeout_s: float = 300.0,
                 worker_cmd: list[str] | None = None, seed: int | None = None,
                 ncu_timeout_s: float = 600.0, timing_budget_s: float = TIMING_BUDGET_S,
                 timing_cap_s: float = TIMING_CAP_S, profile_metrics: tuple[str, ...] | None = None):
        self.timeout_s = timeout_s
        self.kernel_timeout_s = kernel_timeout_s or max(5.0, min(60.0, timeout_s / 3))
        self.cache_dir = (Path(cache_dir) if cache_dir else Path("runs") / ".cache").resolve()
        self.timing_budget_s = timing_budget_s  # wall time of the paired runs per workload, roughly
        self.timing_cap_s = timing_cap_s  # the paired runs' cap for a kernel far from the library (tools.timing)
        self.ncu_timeout_s = ncu_timeout_s
        # collected in the executed check's ncu pass (so the profile costs no extra run), whether or
        # not the agent shows it to the model: both arms of the profile ablation are measured alike
        self.profile_metrics = tuple(PROFILE_METRICS if profile_metrics is None else profile_metrics)
        # the executed check in the worker, through CUPTI (PTXBENCH_CREDIT=ncu: in a Nsight Compute
        # process, as before 2026-12-01; docs/METHODOLOGY.md says why in process is the default)
        self.in_process_credit = os.environ.get("PTXBENCH_CREDIT", "cupti") != "ncu"
        self._rng = secrets.SystemRandom() if seed is None else random.Random(seed)  # seed: reproducible tests
        if gpus is None:
            devices, self.no_gpu_reason = detect_gpus()
        else:
            devices, self.no_gpu_reason = [str(g) for g in gpus], (None if gpus else "no GPU given (gpus=[])")
        self._workers = [WorkerHandle(d, worker_cmd, startup_timeout_s,
                                      log_path=self.cache_dir / f"worker-gpu{d}.log") for d in devices]
        self._free: queue.Queue[WorkerHandle] = queue.Queue()
        for w in self._workers:
            self._free.put(w)
        if self._workers:
            self.cache_dir.mkdir(parents=True, exist_ok=True)

    # -- lifecycle
    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for w in self._workers:
            w.close()

    @property
    def has_gpu(self) -> bool:
        return bool(self._workers)

    def gpu_name(self) -> str | None:
        """The GPU evaluations will run on (starts the first worker, which the first evaluation
        needs anyway); None without a GPU; "unavailable: <why>" when the worker cannot start."""
        if not self._workers:
            return None
        try:
            return (self.gpu_info() or {}).get("gpu")
        except Exception as exc:  # noqa: BLE001 - the worker could not start: every evaluation will say why
            return f"unavailable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"

    def gpu_info(self) -> dict | None:
        """Device info from a worker (starts one); None without a GPU."""
        if not self._workers:
            return None
        with self._worker() as w:
            return w.start()

    @contextlib.contextmanager
    def _worker(self):
        w = self._free.get()
        try:
            yield w
        finally:
            self._free.put(w)

    def _seed(self) -> int:
        return self._rng.randrange(1, 2**31 - 1)

    def _seeds(self, timed: bool) -> list[int]:
        """The seeded checks' seeds (tools.workspace.verify): two calls on fresh inputs, each output
        judged whole, so a kernel right on its first call only fails (`wrong_after_first_call`); one
        where a timed phase follows. Every timed run is a later call on fresh inputs, judged (sampled
        rows, every whole-tensor scan, one or two of them whole), so the second seeded call would
        repeat a verdict the timed runs give anyway, at the price of a whole reference (issue 43:
        0.5 s at S=8192 for attention backward); such a kernel then fails as `wrong_in_timed_run`."""
        return [self._seed() for _ in range(1 if timed else 2)]

    # -- the whole verdict
    @staticmethod
    def compile_and_inspect(solution, arch: str) -> tuple[CompileResult, InspectResult]:
        """The GPU-free first half of evaluate(): NVRTC + ptxas, then the SASS verdicts of the
        kernels the manifest launches. A Ray driver runs it in its own threads, so the GPU
        actors only run kernels."""
        comp = _compile(solution, arch)
        return comp, _inspect(comp, solution, arch)

    def evaluate(self, solution, task, arch: str, workloads: str = "visible", executed_check: bool = False,
                 sanitize: bool = False, time: bool = True,
                 compiled: tuple[CompileResult, InspectResult] | None = None, profile: bool = False) -> EvalResult:
        """The whole verdict. `compiled`: compile_and_inspect()'s result for this solution and
        arch when the caller already has it. Otherwise the SASS inspection (a disassembler run
        of ~0.6 s) overlaps the GPU work: nothing on the GPU side needs it.
        `executed_check`: count the executed instructions, in the worker (tools.cupti), on every
        judged workload. `profile`: also collect the Nsight Compute profile (`profile_metrics`,
        the --profile-feedback block), which takes a process of its own; it never decides credit."""
        import time as _time
        from concurrent.futures import ThreadPoolExecutor

        t0 = _time.perf_counter()
        if workloads not in ("visible", "held_out", "all"):
            raise ValueError(f"workloads must be visible, held_out or all, not {workloads!r}")
        if isinstance(task, str):
            from tasks import get_task

            task = get_task(task)
        with ThreadPoolExecutor(max_workers=1) as pool, contextlib.ExitStack() as stack:
            inspecting = None
            try:
                if compiled:
                    comp, insp = compiled
                else:
                    comp = _compile(solution, arch)
                    inspecting = pool.submit(_inspect, comp, solution, arch)
                    insp = InspectResult(status="skipped", reason="inspection still running", arch=arch)
            except Exception as exc:  # noqa: BLE001 - a toolchain failure is a verdict, not a crash
                comp = _harness_compile_failure(solution, arch, exc)
                insp = InspectResult(status="skipped", reason="did not compile", arch=arch)
            # The executed check runs in the worker (tools.cupti) unless CUPTI cannot (then, or for
            # a profile, a Nsight Compute process: it starts once there is a module to run, so its
            # start-up overlaps the SASS inspection and the timed runs; it touches the GPU only when
            # handed the requests, tools.ncu.CreditProcess).
            # `counting` is how this evaluation counts executed instructions: None where the check
            # was not asked; the one object _judge, _run and _executed read (no flags beside it)
            checks = executed_check and comp.ok and bool(self._workers) and arch in ARCH_CC and task.features_for(arch)
            counting = (Counting(mode=("cupti" if self.in_process_credit else "ncu") if checks else "off")
                        if executed_check else None)
            if checks and (profile or not counting.in_process):
                from tools import ncu

                counting.process = ncu.CreditProcess(task.features_for(arch), self._workers[0].env_without_device,
                                                     self.ncu_timeout_s,
                                                     extra_metrics=self.profile_metrics if profile else ())
                stack.callback(counting.close)
            res = EvalResult(task=task.name, arch=arch, compile=comp, inspect=insp,
                             requested_features=task.features_for(arch))
            if not compiled:
                res.phase_s["compile"] = _time.perf_counter() - t0

            def module_sass(wait: bool = True) -> InspectResult | None:
                """The SASS inspection, waited for where it still runs (it overlaps the runs: by the
                executed check it is done); wait=False: None while it runs."""
                if inspecting is None:
                    return res.inspect
                if not wait and not inspecting.done():
                    return None
                try:
                    return inspecting.result()
                except Exception as exc:  # noqa: BLE001 - reported where the inspection is collected
                    return InspectResult(status="skipped", reason=f"inspection failed: {exc}"[:200], arch=arch)

            try:
                self._judge(res, solution, task, arch, workloads, sanitize, time, counting, module_sass)
            except Exception as exc:  # noqa: BLE001 - judging a candidate never raises: a harness failure is a verdict
                import traceback

                res.run_status, res.run_reason = "failed", f"harness_error: {type(exc).__name__}: {str(exc)[:300]}"
                res.harness_fault = res.run_reason
                res.workloads.append(WorkloadResult(workload="*", split="visible", axes={}, status="failed",
                                                    reason="harness_error", detail=traceback.format_exc()[-2000:]))
            if inspecting is not None:
                t1 = _time.perf_counter()
                try:
                    res.inspect = inspecting.result()
                except Exception as exc:  # noqa: BLE001
                    res.compile = _harness_compile_failure(solution, arch, exc, comp)
                    res.inspect = InspectResult(status="skipped", reason="did not compile", arch=arch)
                res.phase_s["inspect_wait"] = _time.perf_counter() - t1  # beyond what overlapped the runs
        res.seconds = _time.perf_counter() - t0
        return res

    def _judge(self, res: EvalResult, solution, task, arch: str, workloads: str, sanitize: bool, time: bool,
               counting: Counting | None = None, module_sass=None) -> None:
        """`counting`: how the executed check counts (tools.credit.Counting), None where it was not asked."""
        comp = res.compile
        wls = task.workloads_for(workloads)  # type: ignore[arg-type]
        wls = [w for w in wls if w.split == "visible"] + [w for w in wls if w.split != "visible"]
        if not comp.ok:
            res.run_reason = "did not compile"
            res.executed = ExecutedCheck(status="skipped", reason="did not compile")
        elif not wls:
            from tasks import missing_workloads_reason

            res.run_reason = missing_workloads_reason(task, workloads) or "no workloads"
        else:
            reason = self._cannot_run(arch, res.phase_s)  # starts the GPU's worker where it is not up
            if reason:
                self._static_only(res, solution, task, wls, arch, reason)
                if self._workers and reason.startswith("GPU worker did not start"):
                    res.harness_fault = reason  # a GPU machine whose worker fails: ours (tools/results.py)
                if counting is not None:
                    res.executed = ExecutedCheck(status="skipped", reason=reason)
                if sanitize:
                    res.sanitize = SanitizeResult(status="skipped", reason=reason)
            else:
                self._run(res, solution, task, wls, arch, sanitize, time, counting, module_sass)

    def _cannot_run(self, arch: str, phase_s: dict[str, float] | None = None) -> str | None:
        """Why this arch cannot run here, or None. `phase_s`: an evaluation's, which gets the wait
        for the GPU (queue_wait: another evaluation held it) and the worker's start-up (worker_start,
        0 where it was up) apart."""
        import time as _time

        if not self._workers:
            return f"no GPU: {self.no_gpu_reason}"
        if arch not in ARCH_CC:
            return f"unknown arch {arch!r}"
        try:
            t0 = _time.perf_counter()
            with self._worker() as w:
                t1 = _time.perf_counter()
                try:
                    info = w.start() or {}
                finally:
                    if phase_s is not None:
                        phase_s["queue_wait"] = phase_s.get("queue_wait", 0.0) + t1 - t0
                        phase_s["worker_start"] = _time.perf_counter() - t1
        except WorkerStartError as exc:
            return str(exc)
        if info.get("cc") != ARCH_CC[arch]:
            return (f"{arch} needs {ARCH_GPU[arch]} (compute capability {ARCH_CC[arch]}); this machine has "
                    f"{info.get('gpu')} (compute capability {info.get('cc')})")
        return None

    def _static_only(self, res: EvalResult, solution, task, wls, arch: str, reason: str) -> None:
        """No run possible: still report manifest errors that need no GPU."""
        limits = NOMINAL_LIMITS.get(arch, NOMINAL_LIMITS["sm_90a"])
        res.run_status, res.run_reason = "skipped", reason
        for w in wls:
            axes = task.axis_values(w)
            err = static_check(solution, res.compile, task, axes, limits)
            if err is not None:
                res.workloads.append(WorkloadResult(workload=w.name, split=w.split, axes=axes, status="failed",
                                                    reason=err.reason, detail=str(err)))
            else:
                res.workloads.append(WorkloadResult(workload=w.name, split=w.split, axes=axes, status="skipped",
                                                    detail=reason))
        bad = [w for w in res.workloads if w.status == "failed"]
        if bad:
            res.run_status = "failed"
            res.run_reason = f"{reason}; the manifest is wrong without running: {_quotable(bad[0])}"

    def _run(self, res: EvalResult, solution, task, wls, arch: str, sanitize: bool, time: bool,
             counting: Counting | None = None, module_sass=None) -> None:
        import time as _time

        t0 = _time.perf_counter()
        with self._worker() as w:
            res.phase_s["queue_wait"] = res.phase_s.get("queue_wait", 0.0) + _time.perf_counter() - t0  # held by another
            info = w.start()
            t0 = _time.perf_counter()
            res.gpu, res.device = info.get("gpu"), w.device
            limits = info.get("limits") or NOMINAL_LIMITS[arch]
            stop: str | None = None
            metrics: list[str] | None = None
            evaluation = secrets.token_hex(8)  # the worker keeps deferred workloads of this evaluation only
            for wl in wls:
                axes = task.axis_values(wl)
                if stop:
                    res.workloads.append(WorkloadResult(workload=wl.name, split=wl.split, axes=axes, status="skipped",
                                                        detail=stop))
                    continue
                err = static_check(solution, res.compile, task, axes, limits)
                if err is not None:
                    res.workloads.append(WorkloadResult(workload=wl.name, split=wl.split, axes=axes, status="failed",
                                                        reason=err.reason, detail=str(err)))
                    continue
                req = self._request(solution, res.compile, task, wl, seeds=self._seeds(time), time=time)
                # every request names its evaluation, counted or not: the worker keeps the workloads this
                # evaluation deferred (their timed phases too) until its credit op, and drops only another's
                req["evaluation"] = evaluation
                if (counting is not None and counting.in_process and counting.process is None  # a profile keeps every run
                        and module_sass and _no_requested_sass(module_sass(wait=False), res.requested_features)):
                    pass  # no counted runs: the verdict is known from the SASS (_executed)
                elif counting is not None and counting.in_process:  # secret, like the timing seed: the counted runs' inputs derive from it
                    if metrics is None:  # one set for every module: each math pipe and read path (tools.credit)
                        metrics = list(credit_metrics())
                    # the worker keeps the workload (timed too, where asked) for its counted runs: every
                    # workload's in one profiler session, inside its timed runs (the credit op, _counted_runs)
                    req["credit"] = {"seed": self._rng.getrandbits(62), "metrics": metrics, "evaluation": evaluation}
                wr = self._ask(w, req, wl, axes)
                res.workloads.append(wr)
                if wr.reason == "harness_error" or (wr.status == "skipped" and
                                                    (wr.detail or "").startswith("GPU worker did not start")):
                    # the worker failed or could not start: ours, not the candidate's (tools/results.py)
                    res.harness_fault = res.harness_fault or _quotable(wr, named=True)
                if wr.reason in ("timeout", "cuda_error", "worker_crash"):
                    stop = f"not run: workload {wl.name} ended with {wr.reason}"
            if not stop and any((x.credit or {}).get("status") == "pending" for x in res.workloads):
                if (counting is None or counting.process is None) and module_sass and _no_requested_sass(module_sass(), res.requested_features):
                    self._drop_counted_runs(w, res)  # the inspection ended after the first workloads were sent
                else:  # where a plain bulk load may run beside tensor-map loads, their exact counts too
                    sites = (exact_count_sites(module_sass() if module_sass else res.inspect)
                             if "tma" in res.requested_features else None)
                    stop = self._counted_runs(w, res, sites)
            for x in res.workloads:  # the worker that kept them is gone: nothing was counted
                if (x.credit or {}).get("status") == "pending":
                    x.credit = {**x.credit, "status": "failed", "reason": f"not counted: {stop}"[:400]}
            res.run_status = "ok"
            res.phase_s["workloads"] = _time.perf_counter() - t0
            _summarise_speed(res)
            try:
                apply_roofline(res, task)
            except Exception as exc:  # noqa: BLE001 - the roofline is information, never a verdict
                res.run_reason = f"roofline not computed: {type(exc).__name__}: {exc}"
            first = next((x for x in wls if x.split == "visible"), wls[0])
            # A kernel that hangs would hang under the tools too; one that faults is still worth a
            # memcheck run (it says where), but its executed-instruction counts mean nothing.
            req = self._request(solution, res.compile, task, first, seeds=[self._seed()], time=False)
            names = _entries(res.compile, solution)
            if counting is not None:
                t0 = _time.perf_counter()
                res.executed = self._executed(res, solution, task, wls, stop, counting, w.device, arch,
                                              module_sass() if module_sass else res.inspect)
                res.phase_s["executed"] = _time.perf_counter() - t0
            if sanitize:
                from tools import ncu

                t0 = _time.perf_counter()
                hung = stop is not None and stop.endswith("timeout")
                res.sanitize = (SanitizeResult(status="skipped", reason=stop.removeprefix("not run: ")) if hung else
                                ncu.sanitize_check(req, names, w.env, self.ncu_timeout_s))
                res.phase_s["sanitize"] = _time.perf_counter() - t0

    def _counted_runs(self, w: WorkerHandle, res: EvalResult, sites: dict | None = None) -> str | None:
        """The evaluation's credit op: the worker makes every deferred workload's counted runs in
        one profiler session (tools.counted.run_pending) and each workload gets its credit back;
        `sites` (tools.credit.exact_count_sites): the instructions whose executions it also counts
        one by one, on a counted run of their own. A
        counted run that answered wrong fails its workload (`wrong_in_timed_run`); one that hung
        or killed the context fails it too and, as for any workload, stops the evaluation
        (returned: the stop reason). Where the op itself gives no answer, no workload is credited."""
        import time as _time

        from tools.results import Mismatch

        t0 = _time.perf_counter()
        pending = [x for x in res.workloads if (x.credit or {}).get("status") == "pending"]
        why = plain = None
        try:
            op = {"op": "credit"}
            if sites:  # JSON: pc offsets as strings
                op["sass_sites"] = {fn: {str(off): code for off, code in at.items()} for fn, at in sites.items()}
            # the op runs the kept workloads' timed phases too: each as long as its own request was
            reply = w.request(op, self.timeout_s * max(1, len(pending)))
        except (WorkerTimeout, WorkerCrash, WorkerStartError) as exc:
            reply, why = {}, f"the counted runs gave no answer: {exc}"
            plain = f"the counted runs gave no answer: {str(exc).split(LAST_WORDS)[0]}"
        if not why and reply.get("op") != "credits":
            why = f"the counted runs failed in the worker: {reply.get('error')}"
            plain = "the counted runs failed in the worker"
        told = why  # a visible workload's reason, which reaches a model and a client (agent.feedback.redact_held_out)
        if why and any(x.split != "visible" for x in pending):
            # what the worker wrote (its last words, its error) may be a held-out run's: a printf of the
            # sizes, a shape in an exception. The held-out workloads keep it; a visible one says what happened
            told = f"{plain} (what the worker wrote is kept with the held-out workloads it also ran)"
        if reply.get("fatal"):
            w.kill()  # it exits by itself; make sure before the next request
        stop = None
        _timed_in_the_op(pending, reply)
        for x in pending:
            x.credit = (reply.get("credits") or {}).get(x.workload) or {**(x.credit or {}), "status": "failed", "reason": (
                (why if x.split != "visible" else told)
                or "not counted: the worker that kept this workload restarted before the counted runs")}
            x.phase_s["credit"] = float(x.credit.get("own_s") or 0.0)
            failed = (reply.get("failed") or {}).get(x.workload)
            if failed:
                x.status, x.reason, x.detail = "failed", failed["reason"], failed["detail"]
                x.outputs = [Mismatch.model_validate(m) for m in failed.get("outputs") or []] or x.outputs
                if x.reason in ("timeout", "cuda_error"):
                    stop = f"not run: workload {x.workload} ended with {x.reason} in its counted runs"
        # the op also ran the workloads' timed phases (their counted runs are timed runs): those are
        # the workloads' own time (phase_s["timed"]), not the check's
        wall = _time.perf_counter() - t0
        res.phase_s["counted_runs"] = max(0.0, wall - float(reply.get("timed_s") or 0.0))
        # where that went (tools.counted.COST_PARTS); the round trip beyond the worker's own seconds is `other`
        for part, seconds in (reply.get("cost_parts") or {}).items():
            res.phase_s[f"counted_runs.{part}"] = float(seconds) + (
                max(0.0, wall - float(reply.get("seconds") or wall)) if part == "other" else 0.0)
        return stop

    def _drop_counted_runs(self, w: WorkerHandle, res: EvalResult) -> None:
        """The worker drops the workloads it kept for counted runs that the SASS made needless."""
        reply: dict = {}
        try:  # the kept workloads' timed phases still run there (nothing counted)
            kept = sum((x.credit or {}).get("status") == "pending" for x in res.workloads)
            reply = w.request({"op": "credit", "drop": True}, self.timeout_s * max(1, kept))
        except (WorkerTimeout, WorkerCrash, WorkerStartError):  # the next evaluation's first request drops them
            pass
        _timed_in_the_op([x for x in res.workloads if (x.credit or {}).get("status") == "pending"], reply)
        for x in res.workloads:
            if (x.credit or {}).get("status") == "pending":
                x.credit = {**x.credit, "status": "skipped", "reason": NO_REQUESTED_SASS}

    def _executed(self, res: EvalResult, solution, task, wls, stop: str | None, counting: Counting | None,
                  device: str, arch: str = "sm_90a", sass: InspectResult | None = None) -> ExecutedCheck:
        """The executed check on every judged workload that ran to a verdict of its own (one the
        manifest, a fault or a hang did not decide: those count nothing), each tied to its timed
        median. In process: each workload's counted run came back with its result. Nsight
        Compute (where CUPTI could not run, or for the profile): its process runs the workloads
        again now. The profile comes from the first visible workload."""
        from tools import ncu

        if stop:
            return ExecutedCheck(status="skipped", reason=stop.removeprefix("not run: "))
        if counting is None or counting.mode == "off":
            return ExecutedCheck(status="skipped", reason=counting.reason if counting else
                                 "the task requests no features for this arch")
        credit, in_process = counting.process, counting.in_process
        ran = {x.workload: x for x in res.workloads if x.status == "passed" or x.reason in CREDITABLE}
        profile_wanted = credit is not None and bool(credit.extra_metrics)
        features = task.features_for(arch)
        if ran and not profile_wanted and _no_requested_sass(sass, features):
            # An instruction the module's SASS does not hold cannot execute: the counted runs (and
            # their SASS-patched pass, 50x a slow kernel's run) would only confirm zeros.
            if credit is not None:
                credit.close()
            return ExecutedCheck(status="ok", reason=NO_REQUESTED_SASS, counts={f: 0 for f in features},
                                 executed={f: False for f in features}, carries={f: False for f in features},
                                 shares={f: None for f in features},
                                 notes={f: NO_REQUESTED_SASS for f in features})
        chosen = [w for w in wls if w.name in ran]
        if not chosen:
            bad = next((x for x in res.workloads if x.status == "failed"), None)
            why = f"{bad.reason}: {_quotable(bad)}" if bad else "no workload ran"
            return ExecutedCheck(status="skipped", reason=f"not profiled: no workload ran to a verdict ({why})"[:400])
        works = [_task_work(task, w) for w in chosen]
        timed = {name: (x.timing.median_ms if x.timing else None) for name, x in ran.items()}
        unavailable = next((ran[w.name].credit["reason"] for w in chosen
                            if (ran[w.name].credit or {}).get("status") == "unavailable"), None)
        ex: ExecutedCheck | None = None
        if in_process and unavailable is None:
            opcodes = _module_opcodes(sass)  # what the counters lump together (plain bulk copies with TMA)
            credits = [credit_in_process({"workload": w.name, "split": w.split}, ran[w.name].credit, features,
                                         work, timed[w.name], opcodes) for w, work in zip(chosen, works)]
            ex = combine(features, credits)
            # the credit op's wall time (every workload's counted runs, CUPTI's session included; 0
            # where the evaluation stopped before it)
            ex.phase_s = {k: round(v, 4 if "." in k else 3) for k, v in res.phase_s.items() if k.startswith("counted_runs")}
            ex.phase_s.setdefault("counted_runs", 0.0)
        elif in_process and credit is None:  # CUPTI cannot run here: Nsight Compute counts instead
            credit = counting.process = ncu.CreditProcess(features, self._workers[0].env_without_device,
                                                          self.ncu_timeout_s)
        if credit is not None:
            requests = [{**self._request(solution, res.compile, task, w, seeds=self._seeds(False),
                                         time=False), "credit_seed": self._rng.getrandbits(62)} for w in chosen]
            try:
                by_ncu = credit.finish(requests, device, works=works, timed_ms=timed)
            finally:
                credit.close()
            if ex is None:
                ex = by_ncu
                if unavailable:  # say why the fallback ran, and whether it could
                    how = "Nsight Compute counted instead" if ex.status == "ok" else "and Nsight Compute could not count"
                    ex.reason = "; ".join(x for x in (f"in-process counters unavailable ({unavailable}), {how}",
                                                      ex.reason) if x)[:600]
            else:  # the profile only: the credit stays the in-process one, in both profile arms alike
                ex.kernel_metrics = by_ncu.kernel_metrics
        assert ex is not None
        first = chosen[0]
        axes0 = task.axis_values(first)
        ex.profile = (build_profile(ex.kernel_metrics, res.gpu, task.flop_count(axes0), task.min_bytes(axes0),
                                    fp8=computes_in_fp8(task))
                      if ex.kernel_metrics else
                      profile_skipped((ex.reason or "ncu collected no profile") if profile_wanted else
                                      "not asked for (evaluate(profile=True), --profile-feedback on)", res.gpu))
        return ex

    def _request(self, solution, comp, task, wl, seeds: list[int], time: bool) -> dict:
        return {"op": "run", "cubin": comp.cubin, "symbols": getattr(comp, "symbols", {}) or {},
                "manifest": solution.manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
                "workload": wl.model_dump(mode="json"), "seeds": seeds, "time": time,
                # secret: the timed phase's fresh inputs, run counts and sampled rows all derive from it
                "timing_seed": self._rng.getrandbits(62), "timing_budget_s": self.timing_budget_s,
                "timing_cap_s": self.timing_cap_s,
                "kernel_timeout_s": self.kernel_timeout_s,
                "baseline_cache": str(self.cache_dir / "baselines.json")}

    def _ask(self, w: WorkerHandle, req: dict, wl, axes: dict[str, int]) -> WorkloadResult:
        def failed(reason: str, detail: str) -> WorkloadResult:
            return WorkloadResult(workload=wl.name, split=wl.split, axes=axes, status="failed", reason=reason,
                                  detail=detail, seeds=req["seeds"])

        try:
            reply = w.request(req, self.timeout_s)
        except WorkerTimeout:
            return failed("timeout", f"no result within {self.timeout_s:.0f} s; the worker was killed (a hang?)")
        except WorkerCrash as exc:
            return failed("worker_crash", str(exc))
        except WorkerStartError as exc:
            return WorkloadResult(workload=wl.name, split=wl.split, axes=axes, status="skipped", detail=str(exc))
        if reply.get("op") != "result":
            return failed("harness_error", f"the worker failed on this candidate: {reply.get('error')}")
        if reply.get("fatal"):
            w.kill()  # it exits by itself; make sure before the next request
        return WorkloadResult.model_validate(reply["result"])


def _quotable(w: WorkloadResult, named: bool = False) -> str:
    """A workload's failure as the evaluation's own reasons may quote it (`named`: with its name).
    A held-out workload's detail holds its sizes (a manifest expression's value, a grid, a shape)
    and those reasons reach a model and a service's client (agent.feedback.redact_held_out): of
    it only its name, which that view rewrites; the detail stays in the workload's own result."""
    if w.split != "visible":
        return f"held-out workload {w.workload} (its detail stays in its own result)"
    return f"workload {w.workload}: {w.detail}" if named else (w.detail or "")


def _timed_in_the_op(pending: list[WorkloadResult], reply: dict) -> None:
    """Workloads the worker timed at the credit op (tools.counted.run_pending: `results`) take
    their whole result from there (timing, verdict); their credit is merged by the caller."""
    for x in pending:
        fresh = (reply.get("results") or {}).get(x.workload)
        if fresh:
            new = WorkloadResult.model_validate(fresh)
            for name in WorkloadResult.model_fields:
                if name != "credit":
                    setattr(x, name, getattr(new, name))


NO_REQUESTED_SASS = ("not counted: the SASS holds none of the requested instructions, so none can execute "
                     "(verdict known without running: not credited)")


def _no_requested_sass(sass: InspectResult | None, features: list[str]) -> bool:
    """The module's SASS was read and no kernel in it, launched or not (a launched kernel may
    start another: dynamic parallelism), holds an opcode of any requested feature: the executed
    check's verdict is known (nothing executed, nothing credited). False while unknown."""
    from tools.features import executed_opcodes

    opcodes = _module_opcodes(sass)
    if opcodes is None or not features:
        return False
    return not opcodes & set().union(*(executed_opcodes(f) for f in features))


# The padding allowance of the wgmma overwork cap (tools.credit.TaskWork.padded_flops): the task's
# first size axis (its rows: M, S, L, total_seq_len) rounded up to whole 128-row tiles.
TILE_ROWS = 128


def _task_work(task, wl):
    """The work a workload asks for, as the executed check weighs it."""
    axes = task.axis_values(wl)
    rows = next((k for k, a in task.axes.items() if a.type == "var"), None)  # M, S, L, total_seq_len, ...
    padded = {k: (-(-v // TILE_ROWS) * TILE_ROWS if k == rows else v) for k, v in axes.items()}
    return TaskWork(flops=task.flop_count(axes), read_bytes=task.input_bytes(axes),
                        padded_flops=task.flop_count(padded))


# Successful compiles by (source, language, arch): NVRTC + ptxas are deterministic for a given
# toolchain, and one source often serves many evaluations (the shared simple kernels of a family,
# 8-11 s each for attention forward; a model resubmitting a kernel). Only successes are kept: a
# failure may be the sandbox's (a timeout under load), not the source's.
_COMPILED: collections.OrderedDict[tuple[str, str, str], CompileResult] = collections.OrderedDict()
_COMPILED_MAX = 32
_COMPILED_LOCK = threading.Lock()


def _compile(solution, arch: str) -> CompileResult:
    import hashlib

    from tools.compile import compile_solution

    key = (hashlib.sha256(solution.source.encode()).hexdigest(), solution.language, arch)
    with _COMPILED_LOCK:
        hit = _COMPILED.get(key)
        if hit is not None:
            _COMPILED.move_to_end(key)
            return hit.model_copy(deep=True)
    with protocol.nvtx_range("compile") if _has_nvtx() else contextlib.nullcontext():
        comp = compile_solution(solution, arch)
    if comp.ok:
        with _COMPILED_LOCK:
            _COMPILED[key] = comp.model_copy(deep=True)
            while len(_COMPILED) > _COMPILED_MAX:
                _COMPILED.popitem(last=False)
    return comp


def _inspect(comp: CompileResult, solution, arch: str) -> InspectResult:
    """The SASS verdicts of the kernels the manifest launches."""
    from tools.sass import inspect

    if not comp.ok:
        return InspectResult(status="skipped", reason="did not compile", arch=arch)
    return inspect(comp, kernels=[launch.kernel for launch in solution.manifest.launches])


def _module_opcodes(insp: InspectResult | None) -> set[str] | None:
    """The SASS base opcodes of every kernel in the module, launched or not; None where the SASS
    was not read (then nothing may be taken as absent from it)."""
    if insp is None or insp.status != "ok" or insp.infra_error or not insp.kernels:
        return None
    return {op for k in insp.kernels.values() for op in k.opcodes}


def _harness_compile_failure(solution, arch: str, exc: Exception, comp: CompileResult | None = None) -> CompileResult:
    """A toolchain failure (ours, not the candidate's) as a failed compile with the reason."""
    error = f"harness_error: compile/inspect failed: {type(exc).__name__}: {str(exc)[:300]}"
    if comp is not None:
        return comp.model_copy(update={"status": "failed", "error": error, "infra_error": error})
    return CompileResult(status="failed", arch=arch, language=getattr(solution, "language", "cuda"), error=error,
                         infra_error=error)


def _entries(comp: CompileResult, solution) -> list[str]:
    """The PTX entry of every launched kernel, by the one mapping every stage uses."""
    from tools.kernel_names import AmbiguousKernel, resolve_kernel

    out = []
    for lc in solution.manifest.launches:
        try:
            out.append(resolve_kernel(lc.kernel, set(comp.kernels), comp.symbols) or lc.kernel)
        except AmbiguousKernel:
            out.append(lc.kernel)
    return list(dict.fromkeys(out))


def _summarise_speed(res: EvalResult) -> None:
    """Speedups over workloads: geometric means, visible and held-out apart, each only when
    every workload of its split passed and was timed. The interval is the geometric mean of
    the workloads' interval ends (an approximation: the workloads are measured independently)."""
    for split in ("visible", "held_out"):
        ws = [x for x in res.workloads if x.split == split]
        speedups = [x.speedup for x in ws if x.speedup]
        if not ws or not all(x.status == "passed" for x in ws) or len(speedups) != len(ws):
            continue
        if split == "held_out":
            res.speedup_held_out = geomean(speedups)
            continue
        res.speedup, res.speedup_spread = geomean(speedups), geo_spread(speedups)
        cis = [x.speedup_ci for x in ws if x.speedup_ci]
        if len(cis) == len(ws):
            res.speedup_ci = (geomean([c[0] for c in cis]), geomean([c[1] for c in cis]))


def _has_nvtx() -> bool:
    try:
        import nvtx  # noqa: F401
        return True
    except ImportError:
        return False


__all__ = ["Evaluator", "WorkerHandle", "WorkerTimeout", "WorkerCrash", "WorkerStartError", "detect_gpus",
           "static_check"]
