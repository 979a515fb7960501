"""Run-time evidence from NVIDIA's tools, each in its own subprocess (client side).

CreditProcess (the executed check where CUPTI cannot run in the worker, and the profile): counts, under Nsight Compute (`ncu`), the SASS instructions that actually
executed per requested feature (tools.features.executed_opcodes) and the work they carried,
on every judged workload. The process (`python -m tools.worker --credit RES`, CreditProcess) runs each
workload as the evaluation does (fresh module, seeded checks, then judged runs on fresh
inputs) and opens the profiler's window (`--profile-from-start off`) around one of those runs,
drawn at random per evaluation. A wgmma that sits in a branch never taken is in the binary but
counts zero here; one taken only on the module's first launch, or only at one shape, does not
earn the credit either.

sanitize_check: runs the candidate once under compute-sanitizer memcheck
(`python -m tools.worker --once REQ RES`: one correctness check, no timing).

Both run with the same CUDA_VISIBLE_DEVICES as the evaluator's worker. Without the tool, or
when it fails, the result is "skipped" with the reason: never a pass.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.credit import (DURATION_METRIC, GMMA_METRIC, OPCODE_METRIC, WORK_METRICS, TaskWork, _credit, _unprofiled,
                          combine)
from tools.results import ExecutedCheck, SanitizeResult

REPO_ROOT = Path(__file__).resolve().parents[1]
# The credit rules and the metrics they read are tools.credit's; Nsight Compute adds the per-opcode
# counts (OPCODE_METRIC), which split what the hardware counters lump (UBLKCP from UTMALDG).


def _worker_cmd(req_path: Path, res_path: Path) -> list[str]:
    return [sys.executable, "-m", "tools.worker", "--once", str(req_path), str(res_path)]


def _tail(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-400:]


def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """ncu --page raw --csv: a header row, a units row, then one row per profiled launch."""
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in text.splitlines() if not ln.startswith("==")))))
    if len(rows) < 2:
        return []
    header = rows[0]
    data = [dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)]
    return [r for r in data if r.get("ID", "0").strip().isdigit()]  # drops the units row


class CreditProcess:
    """The executed check's process (`ncu ... python -m tools.worker --credit RES`), started when
    the evaluation starts, so that its start-up (Python, torch, the CUDA context, Nsight Compute's
    injection) overlaps compilation and the timed runs. It touches the GPU only once `finish()`
    hands it the requests, after the timed runs: nothing runs beside them.

    finish(): on every judged workload (`requests`: one worker request each, with a secret
    `credit_seed`), one credit run drawn at random among several is profiled
    (tools.counted.run_credit). Counts, work shares and the verdict per workload, each tied both
    ways to that workload's timed median (`timed_ms` by workload name); then combined (a feature
    carries only where it carries on every credited workload). `works`: the task's work per
    request. `extra_metrics` (a profile) are collected in the same pass."""

    def __init__(self, features: list[str], env: dict[str, str], timeout_s: float = 600.0,
                 extra_metrics: tuple[str, ...] = ()):
        self.features, self.env, self.timeout_s = features, env, timeout_s
        self.extra_metrics = tuple(extra_metrics)
        self.ncu = shutil.which("ncu")
        self.skip = ("ncu (Nsight Compute) is not on PATH" if self.ncu is None else
                     "the task requests no features for this arch" if not features else None)
        self._tmp = tempfile.TemporaryDirectory(prefix="ptxbench-ncu-")
        self.dir = Path(self._tmp.name)
        self.proc: subprocess.Popen | None = None
        if self.skip is None:
            self._start(self._attempts()[0])

    def _attempts(self) -> list[list[str]]:
        work_list = [OPCODE_METRIC, GMMA_METRIC, *WORK_METRICS]
        extra = [m for m in self.extra_metrics if m not in work_list]
        return ([work_list + extra] if extra else []) + [
            work_list, [OPCODE_METRIC, GMMA_METRIC, DURATION_METRIC], [OPCODE_METRIC, DURATION_METRIC]]

    @property
    def report(self) -> Path:
        return self.dir / "profile.ncu-rep"

    def _start(self, metrics: list[str]) -> None:
        self.close()  # a retry: the previous process has ended; its log is closed
        for p in (self.dir / "res.pkl", self.report):
            p.unlink(missing_ok=True)
        # No kernel-name filter: the profiler's window holds the candidate's launches and nothing
        # else (tools.counted.run_credit), and the names are not known before the compile ends.
        cmd = [self.ncu, "--profile-from-start", "off", "--clock-control", "none", "--metrics", ",".join(metrics),
               "--kernel-name-base", "mangled", "--export", str(self.dir / "profile"), "--force-overwrite",
               sys.executable, "-m", "tools.worker", "--credit", str(self.dir / "res.pkl")]
        self.log = open(self.dir / "ncu.log", "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=str(REPO_ROOT), start_new_session=True)

    def _output(self) -> str:
        self.log.flush()
        return (self.dir / "ncu.log").read_text(errors="replace")

    def _run(self, requests: list[dict], device: str | None) -> str | None:
        """Hand the requests over and wait for the process to end; why it did not, or None."""
        from tools.worker import encode

        assert self.proc and self.proc.stdin
        try:
            self.proc.stdin.write(encode({"op": "credit", "requests": requests, "device": device}))
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it died before the requests came: its output says why
        try:
            self.proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            return f"ncu ran longer than {self.timeout_s:.0f} s"
        return None

    def finish(self, requests: list[dict], device: str | None = None, works: list[TaskWork | None] | None = None,
               timed_ms: dict[str, float | None] | None = None) -> ExecutedCheck:
        """`device`: the GPU (CUDA_VISIBLE_DEVICES) the evaluation ran on; the process uses it too."""
        try:
            return self._finish(requests, device, works, timed_ms)
        finally:
            self.close()

    def _finish(self, requests: list[dict], device: str | None, works, timed_ms) -> ExecutedCheck:
        if self.skip:
            return ExecutedCheck(status="skipped", reason=self.skip)
        if not requests:
            return ExecutedCheck(status="skipped", reason="no workload could be run (nothing to profile)")
        t0 = time.perf_counter()
        last_error = ""
        for i, metrics in enumerate(self._attempts()):  # retry without the metrics this ncu lacks
            if i:
                self._start(metrics)
            why = self._run(requests, device)
            if why:
                return ExecutedCheck(status="skipped", reason=why)
            if self.report.exists():
                break
            last_error = _tail(self._output())
            if "metric" not in last_error.lower():
                break  # not a metric this ncu lacks: retrying without one would not help
        phase_s = {"runs": time.perf_counter() - t0}
        reply = _credit_reply(self.dir / "res.pkl")
        if isinstance(reply, str):
            return ExecutedCheck(status="skipped", reason=f"the profiled process failed: {reply}; "
                                                          f"ncu: {_tail(self._output())}")
        runs = list(reply.get("results") or [])
        phase_s.update({f"worker_{k}": v for k, v in (reply.get("phase_s") or {}).items()})
        if not self.report.exists():
            if not any(r.get("profiled_at") for r in runs):
                return combine(self.features, [_unprofiled(r) for r in runs], self.extra_metrics)
            return ExecutedCheck(status="skipped", reason=f"ncu produced no report: {last_error}")
        t1 = time.perf_counter()
        imported = subprocess.run([self.ncu, "--import", str(self.report), "--csv", "--page", "raw",
                                   "--print-units", "base", "--print-metric-instances", "details",
                                   "--print-kernel-base", "mangled"],
                                  capture_output=True, text=True, errors="replace", timeout=120)
        rows = parse_raw_csv(imported.stdout)
        phase_s["import"] = time.perf_counter() - t1
        expected = sum(int(r.get("launches") or 0) for r in runs if r.get("profiled_at"))
        if len(rows) != expected:
            return ExecutedCheck(status="skipped", reason=f"ncu profiled {len(rows)} launches, the credit runs "
                                                          f"made {expected}: {_tail(imported.stderr)}")
        works = list(works) if works is not None else [None] * len(requests)
        by_name = {m["workload"]: w for m, w in zip(requests_meta(requests), works)}
        credits, profiled, at = [], {}, 0
        for r in runs:
            if not r.get("profiled_at"):
                credits.append(_unprofiled(r))
                continue
            mine = rows[at:at + int(r["launches"])]
            at += int(r["launches"])
            credits.append(_credit(r, mine, self.features, by_name.get(r["workload"]),
                                   (timed_ms or {}).get(r["workload"])))
            profiled[r["workload"]] = mine
        out = combine(self.features, credits, self.extra_metrics, profiled)
        out.phase_s = {k: round(v, 3) for k, v in phase_s.items()}
        return out

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        if self.proc is not None:
            self.log.close()
            self.proc = None


def requests_meta(requests: list[dict]) -> list[dict]:
    """{workload, split} of each request, in order."""
    return [{"workload": q["workload"]["name"], "split": q["workload"].get("split", "visible")} for q in requests]


def _credit_reply(res_path: Path) -> dict | str:
    """The credit process's reply, or why there is none."""
    if not res_path.exists():
        return "it wrote no result (killed, or crashed before the end)"
    reply = pickle.loads(res_path.read_bytes())
    if reply.get("op") == "error" and not reply.get("results"):
        return str(reply.get("error"))
    return reply


_SAN_HEADER = re.compile(r"^=========\s+((?:Invalid|Out-of-range|Misaligned|Program hit|Barrier error|"
                         r"Race|Uninitialized|Malformed|Hardware exception|Error:)[^\n]*)")
_SAN_AT = re.compile(r"^=========\s+at\s+(\S+)")


def parse_sanitizer(text: str, kernel_names: list[str]) -> list[str]:
    """compute-sanitizer output -> one line per error ("Invalid __global__ write ... at gemm+0x70")."""
    errors: list[list[str]] = []
    for line in text.splitlines():
        h = _SAN_HEADER.match(line)
        if h:
            errors.append([h[1].strip()])
            continue
        a = _SAN_AT.match(line)
        if a and errors and len(errors[-1]) == 1:
            errors[-1].append(a[1])
    lines = [f"{e[0]} at {e[1]}" if len(e) > 1 else e[0] for e in errors]
    ours = [ln for ln in lines if any(n in ln for n in kernel_names)]
    return ours or lines


def sanitize_check(request: dict, kernel_names: list[str], env: dict[str, str],
                   timeout_s: float = 600.0) -> SanitizeResult:
    cs = shutil.which("compute-sanitizer")
    if cs is None:
        return SanitizeResult(status="skipped", reason="compute-sanitizer is not on PATH")
    names = list(dict.fromkeys(kernel_names))
    only = ["--kernel-name", f"kne={names[0]}"] if len(names) == 1 else []  # leave torch's own kernels alone
    with tempfile.TemporaryDirectory(prefix="ptxbench-sanitize-") as tmp:
        req, res = Path(tmp) / "req.pkl", Path(tmp) / "res.pkl"
        req.write_bytes(pickle.dumps(request))
        # --report-api-errors no: the driver's own probing (cuGetProcAddress) is not the kernel's error
        cmd = [cs, "--tool", "memcheck", "--report-api-errors", "no", "--error-exitcode", "86", "--print-limit", "20",
               *only, *_worker_cmd(req, res)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout_s,
                                  env={**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, cwd=str(REPO_ROOT))
        except subprocess.TimeoutExpired:
            return SanitizeResult(status="skipped", reason=f"compute-sanitizer ran longer than {timeout_s:.0f} s")
        out = proc.stdout + proc.stderr
        if proc.returncode in (126, 127) or proc.returncode < 0 or "error while loading shared libraries" in out:
            # the sanitizer could not run or died itself (a kernel's fault ends the worker under it, not
            # the sanitizer): the harness's fault, no verdict
            why = f"compute-sanitizer could not run or died (exit status {proc.returncode}): {_tail(out)}"
            return SanitizeResult(status="skipped", reason=why, infra_error=why)
        errors = parse_sanitizer(out, names)
        if errors or proc.returncode == 86:
            return SanitizeResult(status="failed", errors=errors or [_tail(out)])
        if not res.exists() or proc.returncode != 0:
            return SanitizeResult(status="skipped", reason=f"the sanitized run did not finish (status "
                                                            f"{proc.returncode}): {_tail(out)}")
    return SanitizeResult(status="ok")


__all__ = ["CreditProcess", "requests_meta", "sanitize_check", "parse_raw_csv", "parse_sanitizer"]
