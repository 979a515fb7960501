"""Where a kernel sits against the hardware: roofline time and speed-of-light score.

T_SOL, the speed-of-light time of a workload, is the roofline's lower bound on its run
time: max(task FLOPs / dense tensor peak, compulsory bytes / HBM bandwidth), with the
peaks of tools/ceilings.py (the task's fp8 peak when it computes in fp8). Whichever term
is larger names the bound: "compute" or "memory".

The SOL score follows SOL-ExecBench (NVIDIA/SOL-ExecBench, src/sol_execbench/sol_score.py):

    S = 1 / (1 + (T - T_SOL) / (T_lib - T_SOL))

S = 1 at the speed of light, 0.5 at the library's time, towards 0 as T grows. Our T and
T_lib come from paired timing: T_lib is the library's median and T = T_lib / speedup (the
median of per-pair ratios, which cancels clock drift; docs/METHODOLOGY.md), so in terms of
the speedup s and r = T_SOL / T_lib:  S = (1 - r) / (1 + 1/s - 2r).

Edge cases, decided here once:
- T < T_SOL (faster than the roofline but within the implausibility margin, 5%): S = 1.
  Beyond the margin the workload is `implausible` and gets no speedup, hence no score.
- T_lib <= T_SOL (the library at or past the roofline: only within the margin): as
  SOL-ExecBench, S = 1 if T <= T_SOL else 0 (no gap left to close).
- No GPU ceiling known (not an H100/H200/B200), no speedup or no baseline time: None.
"""
from __future__ import annotations

import math
from typing import Literal

from tools.ceilings import ceiling_for, computes_in_fp8

Bound = Literal["compute", "memory"]


def speed_of_light(gpu_name: str | None, flops: float, min_bytes: float,
                   fp8: bool = False) -> tuple[float, Bound] | None:
    """(T_SOL in ms, which roof bounds it), or None for a GPU without a known ceiling."""
    ceiling = ceiling_for(gpu_name)
    if ceiling is None or (flops <= 0 and min_bytes <= 0):
        return None
    peak_flops = ceiling.tensor_tflops(fp8) * 1e12
    compute_s = max(flops, 0.0) / peak_flops
    memory_s = max(min_bytes, 0.0) / (ceiling.hbm_tbps * 1e12)
    return max(compute_s, memory_s) * 1e3, ("compute" if compute_s >= memory_s else "memory")


def sol_score(t_ms: float, t_lib_ms: float, t_sol_ms: float) -> float:
    """SOL-ExecBench's score with the edge cases above (all times in the same unit)."""
    gap = t_lib_ms - t_sol_ms
    if gap <= 0:
        return 1.0 if t_ms <= t_sol_ms else 0.0
    if t_ms <= t_sol_ms:
        return 1.0
    return 1.0 / (1.0 + (t_ms - t_sol_ms) / gap)


def apply_roofline(res, task) -> None:
    """Fill WorkloadResult.sol_ms / roofline_bound / sol_score and EvalResult.sol_score in place.

    Pure: reads only the result and the task. Call it after the speedups are summarised
    (a workload's score needs its speedup and the library's median). EvalResult.sol_score
    is the geometric mean over the visible workloads, set only when each of them passed
    and has a score (as `speedup`)."""
    fp8 = computes_in_fp8(task)
    for w in res.workloads:
        try:
            axes = task.axis_values(w.axes)  # every axis, constants included
        except ValueError:  # e.g. "*", the harness-error row
            continue
        sol = speed_of_light(res.gpu, task.flop_count(axes), task.min_bytes(axes), fp8)
        if sol is None:
            continue
        w.sol_ms, w.roofline_bound = sol
        if w.status == "passed" and w.speedup and w.baseline is not None and w.baseline.median_ms > 0:
            t_lib = w.baseline.median_ms
            w.sol_score = sol_score(t_lib / w.speedup, t_lib, w.sol_ms)
    visible = [w for w in res.workloads if w.split == "visible"]
    scores = [w.sol_score for w in visible if w.sol_score is not None]
    if visible and len(scores) == len(visible) and all(w.status == "passed" for w in visible):
        res.sol_score = 0.0 if min(scores) <= 0 else math.exp(sum(math.log(s) for s in scores) / len(scores))


__all__ = ["speed_of_light", "sol_score", "apply_roofline"]
