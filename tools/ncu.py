"""Run-time evidence from NVIDIA's tools, each in its own subprocess (client side).

CreditProcess (the executed check): counts, under Nsight Compute (`ncu`), the SASS instructions that actually
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
import math
import os
from dataclasses import dataclass
import pickle
import re
import shutil
import statistics
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.results import ExecutedCheck, SanitizeResult, WorkloadCredit

REPO_ROOT = Path(__file__).resolve().parents[1]
OPCODE_METRIC = "sass__inst_executed_per_opcode"
GMMA_METRIC = "smsp__inst_executed_pipe_tensor_op_gmma.sum"  # executed wgmma, measured on the H200 (FACTS.md)
# The work behind the instructions (names from `ncu --query-metrics --chip gh100` on the H200).
# Tensor-core math issued by wgmma: HGMMA ops for 16-bit and tf32 sources. fp8 sources have one
# metric for wgmma (QGMMA) and mma.sync alike, so a kernel's fp8 ops count as wgmma's only
# when it issued QGMMA and no HMMA.
HGMMA_OPS_METRICS = ("sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_op_hgmma_src_fp16.sum",
                     "sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32.sum")
FP8_OPS_METRIC = "sm__ops_path_tensor_src_fp8.sum"
FLOPS_PER_OP = 1.0  # the ops metrics count FLOPs: 601.3e9 on the expert GEMM at M=8192, = 2*M*N*K (H200, 2026-11-30)
# Floating-point math done any other way, with FLOPs per counted unit (thread-level instruction
# counts: an FFMA is 2 FLOPs, an HFMA2 4), so "wgmma carried the work" can be checked against all
# the math the candidate did, not only against the task's FLOPs.
OTHER_FLOP_METRICS = {
    "sm__ops_path_tensor_op_hmma_src_bf16_dst_fp32.sum": 1.0, "sm__ops_path_tensor_op_hmma_src_fp16.sum": 1.0,
    "sm__ops_path_tensor_op_hmma_src_tf32_dst_fp32.sum": 1.0,
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 2.0, "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": 1.0,
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 1.0, "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum": 4.0,
    "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum": 2.0, "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum": 2.0,
    "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum": 2.0, "smsp__sass_thread_inst_executed_op_dmul_pred_on.sum": 1.0,
    "smsp__sass_thread_inst_executed_op_dadd_pred_on.sum": 1.0,
}
# Bytes TMA loads brought into shared memory, and bytes read from global memory any other way
# (LDG through the LSU pipe, cp.async's LDGSTS).
TMA_BYTES_METRIC = "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum"
OTHER_READ_METRICS = ("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", "sm__sass_data_bytes_mem_global_op_ldgsts.sum")
DURATION_METRIC = "gpu__time_duration.sum"  # ns per launch: ties the profiled run to the timed ones
WORK_METRICS = (*HGMMA_OPS_METRICS, FP8_OPS_METRIC, *OTHER_FLOP_METRICS, TMA_BYTES_METRIC, *OTHER_READ_METRICS,
                DURATION_METRIC)
# Hardware counters that stand in for the per-opcode counts where no SASS is patched (the
# in-process check, tools.cupti): executed TMA loads/stores (UTMALDG/UTMASTG, warp level), and
# the tensor pipe's HMMA-class instructions (recorded in the profile and the counted run's metrics)
TMA_INST_METRICS = ("smsp__inst_executed_op_tma_ld.sum", "smsp__inst_executed_op_tma_st.sum")
HMMA_INST_METRIC = "sm__inst_executed_pipe_tensor_op_hmma.sum"
# ... which counts the tensor pipe's HGMMA and QGMMA too (CUPTI's own description on GH100: "warp
# instructions executed by tensor pipe (HMMA/HFMA2.MMA/HGMMA/QGMMA ops)"), so it cannot say whether
# a wgmma kernel also ran mma.sync. In process that comes from the module's SASS instead: a row
# carries SASS_MMA_SYNC, "0" where no kernel of the module holds a warp-level MMA (issues_mma_sync).
SASS_MMA_SYNC = "sass:mma_sync"
FEATURE_COUNTERS = {"wgmma": (GMMA_METRIC,), "tma": TMA_INST_METRICS}
# What the in-process check reads, in one profiled run (CUPTI replays the kernel per pass,
# restoring the memory it may write, so every pass sees the same inputs and state): 6 passes on
# GH100, each a replay of every launch with the context's memory saved and restored (2 s per
# attention-backward workload on the H200, docs/BENCHMARKS.md).
CUPTI_METRICS = (GMMA_METRIC, *TMA_INST_METRICS, HMMA_INST_METRIC, *WORK_METRICS)
HMMA_OPS_METRICS = tuple(m for m in OTHER_FLOP_METRICS if m.startswith("sm__ops_path_tensor_op_hmma"))


def credit_metrics(mma_sync: bool | None) -> tuple[str, ...]:
    """What the in-process check (CUPTI user replay, one counted run per pass) collects.
    - Not the kernel time: a user range's gpu__time_duration spans the range (the stream gate
      included), so each counted run is timed with events, as a timed run is.
    - Not the mma.sync ops counters where the module cannot hold a warp-level MMA (`mma_sync`
      False: no mma/wmma in its PTX, tools.features.ptx_may_issue_mma_sync): a kernel with no HMMA
      instruction does no HMMA math, and without those three counters the set takes 3 passes on
      GH100 instead of 6. The verdict reads them as 0 only on rows whose module SASS was read and
      holds none (SASS_MMA_SYNC "0", work_metrics); anywhere else the other math is unmeasured."""
    drop = {DURATION_METRIC, *(HMMA_OPS_METRICS if mma_sync is False else ())}
    return tuple(m for m in CUPTI_METRICS if m not in drop)
# (A two-pass set that bounds the other math from above by warp-instruction counts, 128 FLOPs per
# FMA-pipe instruction for HFMA2, was tried on the H200 on 2026-12-01: the honest attention-backward
# experts' softmax arithmetic then reads as 10.7% of their math and they lose credit, so it is not
# offered. docs/BENCHMARKS.md, "Session of 2026-12-01 (night)".)
# When a feature carries the work (docs/METHODOLOGY.md, "Instruction credit"):
#   wgmma: its FLOPs are >= 90% of the task's matrix FLOPs, <= 2.5x them (tuned kernels measure
#          1.00-1.05; a causal kernel that computes every tile and masks does 2x: honest, slow;
#          the cap leaves no room for garbage wgmma beside the real math), and >= 90% of all the
#          floating-point math the candidate did (tuned kernels: >= 99%);
#   TMA:   it loaded >= half the task's input bytes, and other global reads stay <= 2x the input
#          bytes (a tiled GEMM or attention that streams its operands by LDG re-reads them
#          tens of times; the expert kernels' side passes read 1.2x); for a task that asks for
#          no matrix instruction (memory-bound, e.g. GDN decode: each input byte is read once)
#          <= 0.5x, so the bulk of the input must come through TMA.
#   tcgen05.mma: the same rule as wgmma (issue 41: credit must not differ by arch). Its FLOPs are
#          the derived sum `tcgen05_flops`, which no counter set read on the H200 provides; until a
#          B200 run names its counters, a tcgen05 share is "unverified on this GPU" and carries nothing.
WORK_SHARE = {"wgmma": 0.9, "tcgen05_mma": 0.9, "tma": 0.5}
MMA_FLOPS = {"wgmma": "wgmma_flops", "tcgen05_mma": "tcgen05_flops"}  # the derived FLOP sum of each MMA feature
WGMMA_MAX_OVERWORK = 2.5
WGMMA_MIN_OF_ALL_MATH = 0.9
TMA_MAX_OTHER_READS = 2.0
TMA_MAX_OTHER_READS_NO_MMA = 0.5
MMA_FEATURES = ("wgmma", "tcgen05_mma")
# The profiled run must be the kernel that was timed. A kernel can tell its runs apart (a
# __device__ launch counter: Nsight Compute profiles the first launch after the module loads; a
# coin from its input bits) and run the requested instructions only where it guesses it is
# profiled, a faster generic path where it is timed. It cannot make the profiled run take the
# timed runs' time without running the timed path there. So credit needs the profiled run's
# kernel time (Nsight Compute, clocks not locked, L2 flushed per kernel) within SAME_RUN_RATIO
# of the timed median of the same workload, plus SAME_RUN_SLACK_MS for launch gaps: a timed path
# that is more than that faster than the credited one loses the credit.
SAME_RUN_RATIO = 1.10  # the five expert kernels on the H200: 0.983-1.001 (docs/BENCHMARKS.md)
SAME_RUN_SLACK_MS = 0.01


def _opcodes_for(feature: str) -> set[str]:
    from tools.features import executed_opcodes

    return executed_opcodes(feature)


def _worker_cmd(req_path: Path, res_path: Path) -> list[str]:
    return [sys.executable, "-m", "tools.worker", "--once", str(req_path), str(res_path)]


def _tail(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-400:]


def parse_instances(cell: str) -> dict[str, float]:
    """'1234 (HGMMA: 64; IMAD: 1170)' (--print-metric-instances details) -> {opcode: count}."""
    m = re.search(r"\((.*)\)", cell or "")
    out: dict[str, float] = {}
    if not m:
        return out
    for item in m[1].split(";"):
        if ":" in item:
            key, _, value = item.rpartition(":")
            try:
                out[key.strip()] = out.get(key.strip(), 0) + float(value.strip().replace(",", ""))
            except ValueError:
                continue
    return out


def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """ncu --page raw --csv: a header row, a units row, then one row per profiled launch."""
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in text.splitlines() if not ln.startswith("==")))))
    if len(rows) < 2:
        return []
    header = rows[0]
    data = [dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)]
    return [r for r in data if r.get("ID", "0").strip().isdigit()]  # drops the units row


def _number(cell: str) -> float | None:
    try:
        return float((cell or "").split("(")[0].strip().replace(",", ""))
    except ValueError:
        return None


def _totals(rows: list[dict[str, str]], metric: str) -> float | None:
    """`metric` summed over the rows, or None where a row lacks it."""
    values = [_number(r.get(metric, "")) for r in rows]
    return float(sum(values)) if rows and all(v is not None for v in values) else None  # type: ignore[arg-type]


def counts_from_rows(rows: list[dict[str, str]], features: list[str]) -> tuple[dict[str, int], list[str]]:
    """Executed instructions per feature summed over profiled launches; and features that
    could not be counted (no per-opcode instances and no dedicated metric)."""
    per_opcode: dict[str, float] = {}
    counted: dict[str, float] = {}  # FEATURE_COUNTERS' totals, per feature, where every row has them
    have_opcodes = False
    for row in rows:
        if OPCODE_METRIC in row:
            inst = parse_instances(row[OPCODE_METRIC])
            total = _number(row[OPCODE_METRIC])
            if inst or total == 0:
                have_opcodes = True
            for k, v in inst.items():
                per_opcode[k.split(".")[0]] = per_opcode.get(k.split(".")[0], 0) + v
    for f, metrics in FEATURE_COUNTERS.items():
        totals = [_totals(rows, m) for m in metrics]
        if all(t is not None for t in totals):
            counted[f] = float(sum(totals))  # type: ignore[arg-type]
    counts: dict[str, int] = {}
    uncounted = []
    for f in features:
        try:
            opcodes = _opcodes_for(f)
        except KeyError:  # a feature tools.features does not know: cannot be counted
            uncounted.append(f)
            continue
        if have_opcodes:
            counts[f] = int(sum(per_opcode.get(op, 0) for op in opcodes))
        if f in counted:
            counts[f] = max(counts.get(f, 0), int(counted[f]))
        if f not in counts:
            uncounted.append(f)
    return counts, uncounted


@dataclass
class TaskWork:
    """What the task must do on the profiled workload: its matrix FLOPs and input bytes."""

    flops: float
    read_bytes: float
    # the matrix FLOPs with every size axis rounded up to a whole 128-row tile: an honest tiled
    # kernel computes its padded tiles (GEMM at M=70: 1.8x; attention at S=77: 2.8x)
    padded_flops: float | None = None


def per_kernel(rows: list[dict[str, str]], features: list[str]) -> dict[str, dict[str, int]]:
    """Executed instructions per feature for each profiled kernel (by name)."""
    by_kernel: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_kernel.setdefault(row.get("Kernel Name", "?"), []).append(row)
    return {name: counts_from_rows(rs, features)[0] for name, rs in by_kernel.items()}


def kernel_metrics(rows: list[dict[str, str]], metrics: list[str]) -> dict[str, dict[str, float]]:
    """Raw values of `metrics` per profiled kernel (by name): counters (.sum) summed over that
    kernel's launches, anything else (percentages, averages, limits) from its longest launch."""
    out: dict[str, dict[str, float]] = {}
    longest: dict[str, float] = {}
    for row in rows:
        name = row.get("Kernel Name", "?")
        dur = _number(row.get("gpu__time_duration.sum", "")) or 0.0
        mine = out.setdefault(name, {})
        take_all = dur >= longest.get(name, -1.0)
        longest[name] = max(longest.get(name, -1.0), dur)
        for m in metrics:
            v = _number(row.get(m, ""))
            if v is None:
                continue
            if m.endswith(".sum"):
                mine[m] = mine.get(m, 0.0) + v
            elif take_all or m not in mine:
                mine[m] = v
        mine["launches"] = mine.get("launches", 0.0) + 1
    return out


def work_metrics(rows: list[dict[str, str]]) -> dict[str, float]:
    """Totals over the profiled launches of the metrics behind the work shares, and the derived
    sums the verdict uses: wgmma_flops, other_flops, tma_bytes, other_read_bytes. A derived sum
    is absent when one of its metrics is missing from a launch (then it is not measured)."""
    out: dict[str, float] = {}
    # no warp-level MMA in the module's SASS: no mma.sync math, so its counters read 0 (credit_metrics)
    rows = [{**{m: "0" for m in HMMA_OPS_METRICS}, **r} if r.get(SASS_MMA_SYNC) == "0" else r for r in rows]
    for metric in WORK_METRICS:
        total = _totals(rows, metric)
        if total is not None:
            out[metric] = total
    have = lambda names: all(m in out for m in names)  # noqa: E731
    if have(HGMMA_OPS_METRICS) and have([FP8_OPS_METRIC]):
        wgmma_fp8 = 0.0
        for row in rows:  # fp8 ops are wgmma's only in kernels that issued QGMMA and no HMMA
            if OPCODE_METRIC in row:
                ops = parse_instances(row[OPCODE_METRIC])
                qgmma = sum(v for k, v in ops.items() if k.startswith("QGMMA"))
                hmma = sum(v for k, v in ops.items() if k.startswith("HMMA"))
            else:  # hardware counters only: any GMMA, and no warp-level MMA anywhere in the module's SASS
                qgmma = _number(row.get(GMMA_METRIC, "")) or 0.0
                hmma = 0.0 if row.get(SASS_MMA_SYNC) == "0" else 1.0  # SASS unknown: the fp8 ops are not wgmma's
            if qgmma > 0 and hmma == 0:
                wgmma_fp8 += _number(row[FP8_OPS_METRIC]) or 0.0
        out["wgmma_flops"] = (sum(out[m] for m in HGMMA_OPS_METRICS) + wgmma_fp8) * FLOPS_PER_OP
        if have(OTHER_FLOP_METRICS):
            out["other_flops"] = (sum(out[m] * w for m, w in OTHER_FLOP_METRICS.items())
                                  + (out[FP8_OPS_METRIC] - wgmma_fp8) * FLOPS_PER_OP)
    if have([TMA_BYTES_METRIC]):
        out["tma_bytes"] = out[TMA_BYTES_METRIC]
    if have(OTHER_READ_METRICS):
        out["other_read_bytes"] = sum(out[m] for m in OTHER_READ_METRICS)
    if have([DURATION_METRIC]):
        out["kernel_ms"] = out[DURATION_METRIC] / 1e6
    return out


def work_shares(metrics: dict[str, float], work: TaskWork | None) -> dict[str, float | None]:
    """Share of the task's work each feature carried: wgmma FLOPs / task FLOPs, TMA bytes /
    task input bytes (capped at 1: re-reads through TMA do not count twice). None where the
    metric is missing or the task has no such work."""
    shares: dict[str, float | None] = {**{f: None for f in MMA_FLOPS}, "tma": None}
    if work is None:
        return shares
    for feature, flops in MMA_FLOPS.items():
        if flops in metrics and work.flops > 0:
            shares[feature] = metrics[flops] / work.flops
    if "tma_bytes" in metrics and work.read_bytes > 0:
        shares["tma"] = min(1.0, metrics["tma_bytes"] / work.read_bytes)
    return shares


def carries(feature: str, metrics: dict[str, float], work: TaskWork | None,
            features: list[str] = ()) -> tuple[bool, str | None]:
    """Did `feature` carry the task's work (WORK_SHARE and the limits beside it)? And if not, why,
    in a sentence a model can act on."""
    share = work_shares(metrics, work).get(feature)
    if share is None and feature == "tcgen05_mma" and work is not None:
        return False, ("tcgen05_mma's share of the task's matrix FLOPs is unverified on this GPU (no counter "
                       "of tcgen05.mma FLOPs is read yet), so it carries no credit")
    if share is None:
        return False, f"the share of the work {feature} carried could not be measured"
    if share < WORK_SHARE[feature]:
        what = "of the task's matrix FLOPs" if feature in MMA_FLOPS else "of the task's input bytes"
        return False, f"{feature} carried {share:.1%} {what} (needs {WORK_SHARE[feature]:.0%})"
    assert work is not None
    if feature in MMA_FLOPS:
        why = mma_carries(feature, share, metrics[MMA_FLOPS[feature]], metrics.get("other_flops"), work)
        if why:
            return False, why
    if feature == "tma":
        other = metrics.get("other_read_bytes")
        if other is None:
            return False, "the global-memory reads made outside TMA could not be measured"
        cap = TMA_MAX_OTHER_READS if any(f in MMA_FEATURES for f in features) else TMA_MAX_OTHER_READS_NO_MMA
        if other > cap * work.read_bytes:
            return False, (f"{other / work.read_bytes:.1f}x the task's input bytes were read from global "
                           f"memory outside TMA (LDG/cp.async; at most {cap:g}x)")
    return True, None


def mma_carries(feature: str, share: float, mma_flops: float, other_flops: float | None,
                work: TaskWork) -> str | None:
    """The work-share rule of a matrix instruction (wgmma on sm_90a, tcgen05.mma on sm_100a: one
    rule for both arches), past the minimum share: at most WGMMA_MAX_OVERWORK times the task's
    FLOPs in whole tiles (no garbage MMAs beside the real math), and at least WGMMA_MIN_OF_ALL_MATH
    of all the floating-point math the kernels did. None when it carries, else why not."""
    cap = WGMMA_MAX_OVERWORK * max(1.0, (work.padded_flops or work.flops) / work.flops)
    if share > cap:
        return (f"{feature} issued {share:.1f}x the task's matrix FLOPs (at most {cap:.3g}x, "
                f"{WGMMA_MAX_OVERWORK:g}x its work in whole 128-row tiles, counts as doing the task's work)")
    if other_flops is None:
        return f"the floating-point math done outside {feature} could not be measured"
    of_all = mma_flops / max(mma_flops + other_flops, 1.0)
    if of_all < WGMMA_MIN_OF_ALL_MATH:
        return (f"{feature} did {of_all:.1%} of the floating-point math the kernels did (needs "
                f"{WGMMA_MIN_OF_ALL_MATH:.0%}); the rest ran on FFMA/HMMA/other units")
    return None


class CreditProcess:
    """The executed check's process (`ncu ... python -m tools.worker --credit RES`), started when
    the evaluation starts, so that its start-up (Python, torch, the CUDA context, Nsight Compute's
    injection) overlaps compilation and the timed runs. It touches the GPU only once `finish()`
    hands it the requests, after the timed runs: nothing runs beside them.

    finish(): on every judged workload (`requests`: one worker request each, with a secret
    `credit_seed`), one credit run drawn at random among several is profiled
    (tools.worker.run_credit). Counts, work shares and the verdict per workload, each tied both
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
        # else (tools.worker.run_credit), and the names are not known before the compile ends.
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


def _unprofiled(r: dict) -> WorkloadCredit:
    why = f"{r.get('reason')}: {r.get('detail')}" if r.get("reason") else "its profiled run was not reached"
    return WorkloadCredit(workload=r["workload"], split=r.get("split", "visible"), status="skipped", runs=r.get("runs", 0),
                          reason=f"not credited: {why}"[:400])


def _credit(r: dict, rows: list[dict[str, str]], features: list[str], work: TaskWork | None,
            timed_ms: float | None, run_ms: list[float] | None = None) -> WorkloadCredit:
    """One workload's verdict from its counted run(s)' rows, tied to its timed median. `run_ms`:
    the in-process check's counted runs (hardware passes), each timed as a timed run; else the
    profiled run's kernel time from its rows (Nsight Compute)."""
    counts, uncounted = counts_from_rows(rows, features)
    metrics = work_metrics(rows)
    kernel_ms = statistics.median(run_ms) if run_ms else metrics.get("kernel_ms")
    if run_ms:
        metrics["kernel_ms"] = kernel_ms
    wc = WorkloadCredit(workload=r["workload"], split=r.get("split", "visible"), status="ok", runs=r.get("runs", 0),
                        profiled_at=r.get("profiled_at"), counted_from=r.get("counted_from"), counts=counts,
                        kernel_ms=kernel_ms, run_ms=list(run_ms or []),
                        instrumented_ms=list(r.get("instrumented_ms") or []), timed_ms=timed_ms)
    if uncounted:
        unread = sorted(set(r.get("unread") or []))
        wc.status, wc.reason = "skipped", (f"no executed-instruction counts for {', '.join(uncounted)}"
                                           + (f" (CUPTI read no value for {', '.join(unread)})" if unread else ""))[:400]
        return wc
    v = verdict(features, counts, per_kernel(rows, features), metrics, work)
    wc.executed, wc.shares, wc.carries, wc.notes = v.executed, v.shares, v.carries, v.notes
    tie_to_timed_run(wc, timed_ms)
    return wc


def counter_rows(launches: list[dict], mma_sync: bool | None = None) -> list[dict[str, str]]:
    """The in-process check's launches ({name, metrics}) as rows like ncu's raw CSV, so one
    verdict (counts_from_rows, work_metrics, per_kernel) serves both. `mma_sync`: whether the
    module's SASS holds a warp-level MMA (None: not known)."""
    sass = {} if mma_sync is None else {SASS_MMA_SYNC: "1" if mma_sync else "0"}
    # a value CUPTI could not read (NaN, inf: a pass that was not collected; None once the worker's
    # result went through JSON) is left out, so it is "not measured" and never passes a share test
    # (NaN compares false both ways)
    return [{"Kernel Name": x["name"], **{m: repr(float(v)) for m, v in x["metrics"].items()
                                          if isinstance(v, (int, float)) and math.isfinite(v)}, **sass}
            for x in launches]


def issues_mma_sync(opcodes: set[str] | None) -> bool | None:
    """Whether SASS base opcodes hold a warp-level MMA (HMMA, IMMA, QMMA, DMMA, ...: any *MMA but
    the warpgroup *GMMA); None where the SASS is not known."""
    if opcodes is None:
        return None
    return any(op.endswith("MMA") and not op.endswith("GMMA") for op in opcodes)


def credit_in_process(meta: dict, credit: dict | None, features: list[str], work: TaskWork | None,
                      timed_ms: float | None, mma_sync: bool | None = None) -> WorkloadCredit:
    """One workload's credit from its worker result's in-process run (tools.worker._credit_run)."""
    if not credit or credit.get("status") != "ran":
        why = (credit or {}).get("reason") or "its profiled run was not reached"
        return WorkloadCredit(workload=meta["workload"], split=meta["split"], status="skipped",
                              runs=(credit or {}).get("runs", 0), reason=f"not credited: {why}"[:400])
    unread = [m for x in credit.get("launches") or [] for m, v in x["metrics"].items()
              if not (isinstance(v, (int, float)) and math.isfinite(v))]
    r = {**meta, "runs": credit.get("runs", 0), "profiled_at": credit.get("profiled_at"), "unread": unread,
         "counted_from": credit.get("counted_from"), "instrumented_ms": credit.get("instrumented_ms")}
    return _credit(r, counter_rows(credit.get("launches") or [], mma_sync), features, work, timed_ms,
                   credit.get("run_ms") or None)


def combine(features: list[str], credits: list[WorkloadCredit], extra_metrics: tuple[str, ...] = (),
             profiled: dict[str, list[dict[str, str]]] | None = None) -> ExecutedCheck:
    """Every workload's credit as one verdict: executed / carries only where they hold on every
    credited workload; the first workload that withheld a feature's credit is named. `profiled`:
    each credited workload's ncu rows (the raw totals and the profile are the first visible one's)."""
    ok = [c for c in credits if c.status == "ok"]
    if not ok:
        why = next((c.reason for c in credits if c.reason), "no workload was credited")
        return ExecutedCheck(status="skipped", reason=why, workloads=credits)
    first = next((c for c in ok if c.split == "visible"), ok[0])
    rows = (profiled or {}).get(first.workload, [])
    out = ExecutedCheck(status="ok", workloads=credits, timed_ms=first.timed_ms,
                        metrics=work_metrics(rows), per_kernel=per_kernel(rows, features),
                        kernel_metrics=kernel_metrics(rows, list(dict.fromkeys([*WORK_METRICS, *extra_metrics])))
                        if extra_metrics else {})
    held_out_seen = 0
    labels = {}
    for c in credits:  # held-out workloads are named by number: their sizes are never shown
        if c.split == "visible":
            labels[c.workload] = f"workload {c.workload}"
        else:
            held_out_seen += 1
            labels[c.workload] = f"held-out workload #{held_out_seen}"
    for f in features:
        out.counts[f] = sum(c.counts.get(f, 0) for c in ok)
        out.executed[f] = all(c.executed.get(f, False) for c in ok)
        out.carries[f] = all(c.carries.get(f, False) for c in ok)
        shares = [c.shares.get(f) for c in ok if f in c.shares]
        if shares:
            out.shares[f] = None if any(x is None for x in shares) else min(shares)  # type: ignore[type-var]
        withheld = next((c for c in ok if not c.carries.get(f, False)), None)
        if withheld is not None:
            why = withheld.notes.get(f) or (f"{f} did not execute" if not withheld.executed.get(f) else
                                            f"{f} did not carry the work")
            out.notes[f] = f"{labels[withheld.workload]} ({_runs_label(withheld)}): {why}"
    skipped = [c for c in credits if c.status != "ok"]
    if skipped:
        out.reason = "; ".join(f"{labels[c.workload]}: {c.reason}" for c in skipped)[:600]
    return out


def _runs_label(c: WorkloadCredit) -> str:
    """Which runs the credit was read on, for notes: the in-process check's counted runs (1-based
    places after the timed runs), or Nsight Compute's one profiled run among its credit runs."""
    if c.counted_from is not None:
        return f"counted runs {c.counted_from}-{c.runs}"
    return f"profiled run {c.profiled_at} of {c.runs}"


def verdict(features: list[str], counts: dict[str, int], kernels: dict[str, dict[str, int]],
            metrics: dict[str, float], work: TaskWork | None) -> ExecutedCheck:
    """executed: ran at least once (the seed's criterion). carries: for wgmma and TMA, the
    measured share of the task's work reaches WORK_SHARE (a decoy launch that issues a few
    wgmmas beside a SIMT kernel does not); other features carry when they executed. A share
    that could not be measured does not carry."""
    shares = work_shares(metrics, work)
    executed = {f: counts.get(f, 0) > 0 for f in features}
    carried, notes = {}, {}
    for f in features:
        if not executed[f]:
            carried[f] = False
        elif f in WORK_SHARE:
            carried[f], why = carries(f, metrics, work, features)
            if why:
                notes[f] = why
        else:
            carried[f] = True
    return ExecutedCheck(status="ok", counts=counts, executed=executed, per_kernel=kernels,
                         shares={f: shares.get(f) for f in features if f in WORK_SHARE}, carries=carried,
                         notes=notes, metrics=metrics)


def tie_to_timed_run(credit: WorkloadCredit, timed_ms: float | None) -> None:
    """Withdraw the credit of counted runs that were not the timed kernel, in place: each one's
    kernel time (every counted run of the in-process check, `run_ms`; else the one profiled run,
    `kernel_ms`) must be within SAME_RUN_RATIO (+ SAME_RUN_SLACK_MS) of the timed median of its
    workload, both ways. Slower: the credited path is not the timed one (the timed path is faster
    and generic). Faster: the timed runs took a slower path than the one whose instructions were
    counted. `timed_ms` None: the workload was not timed, so no speed is claimed and nothing is tied."""
    if credit.status != "ok" or timed_ms is None:
        return
    credit.timed_ms = timed_ms
    runs = [(f"counted run {credit.counted_from + k}" if credit.counted_from is not None else "the counted run", ms)
            for k, ms in enumerate(credit.run_ms)] or [("the profiled run", credit.kernel_ms)]
    why = None
    for what, ms in runs:
        if ms is None:
            why = f"{what}'s kernel time was not measured, so it cannot be tied to the timed runs"
        elif ms > SAME_RUN_RATIO * timed_ms + SAME_RUN_SLACK_MS:
            why = (f"{what}'s kernels took {ms:.4g} ms, the timed runs {timed_ms:.4g} ms (median): "
                   "the kernel that was timed is not the one whose instructions were counted")
        elif ms < timed_ms / SAME_RUN_RATIO - SAME_RUN_SLACK_MS:
            why = (f"{what}'s kernels took {ms:.4g} ms, the timed runs {timed_ms:.4g} ms (median): "
                   "the timed runs took a slower path than the one whose instructions were counted")
        if why:
            break
    if why is None:
        return
    for f, carried in credit.carries.items():
        if carried:
            credit.carries[f] = False
            credit.notes[f] = why


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


__all__ = ["CreditProcess", "verdict", "tie_to_timed_run", "requests_meta", "work_shares", "TaskWork", "sanitize_check", "parse_raw_csv", "parse_instances", "counts_from_rows",
           "parse_sanitizer"]
