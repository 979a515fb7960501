"""What Nsight Compute says about a candidate's kernels, as a kernel engineer reads it.

The executed-instruction check (tools/ncu.py) already runs the candidate once under `ncu`
on the first visible workload; PROFILE_METRICS are added to that one pass, so the profile
costs no second run. `build_profile` turns the per-kernel metric values into a `Profile`
(time share, tensor TFLOP/s and % of the dense peak, DRAM GB/s and % of peak, tensor-pipe
utilisation, achieved occupancy and its limiter, top warp-stall reasons, L2 hit rate);
`render` writes the compact block the model reads in its feedback. Any metric may be
missing (an older ncu, another chip): its figure is None and is left out of the text,
never guessed. Metric names: `ncu --query-metrics --chip gh100` (Nsight Compute
2025.3.1, H200, 2026-12-01); docs/METHODOLOGY.md ("Profile") lists which figure comes
from which metric.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tools.ceilings import ceiling_for

TIME = "gpu__time_duration.sum"  # ns per launch
# Tensor-path math ops (1 op = 1 FLOP, measured on the expert GEMM: 2*M*N*K) by source type,
# every tensor instruction (mma.sync, wgmma, fp8 wgmma) included.
TENSOR_OPS = ("sm__ops_path_tensor_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_src_fp16.sum",
              "sm__ops_path_tensor_src_fp8.sum")
TENSOR_PIPE = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
DRAM_READ, DRAM_WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
L2_HIT = "lts__t_sector_hit_rate.pct"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"  # achieved
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
# Blocks per SM each resource allows; the smallest one limits the theoretical occupancy.
OCCUPANCY_LIMITS = {"registers": "launch__occupancy_limit_registers",
                    "shared memory": "launch__occupancy_limit_shared_mem",
                    "block size": "launch__occupancy_limit_warps",
                    "blocks per SM": "launch__occupancy_limit_blocks"}
REGISTERS = "launch__registers_per_thread"
BLOCK_SIZE = "launch__block_size"
GRID_SIZE = "launch__grid_size"
WAVES = "launch__waves_per_multiprocessor"
# Warp states as ncu's Warp State Statistics shows them: warps waiting on each reason per
# issued instruction. "selected" (the warp issuing) is not a stall and is left out.
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "gmma", "math_pipe_throttle", "mio_throttle",
                 "lg_throttle", "wait", "not_selected", "membar", "branch_resolving", "dispatch_stall", "drain",
                 "imc_miss", "misc", "no_instruction", "sleeping", "tex_throttle")


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


PROFILE_METRICS: tuple[str, ...] = (
    TIME, *TENSOR_OPS, TENSOR_PIPE, DRAM_READ, DRAM_WRITE, L2_HIT, OCCUPANCY, THEORETICAL_OCCUPANCY,
    *OCCUPANCY_LIMITS.values(), REGISTERS, BLOCK_SIZE, GRID_SIZE, WAVES, *(stall_metric(r) for r in STALL_REASONS))

TOP_STALLS = 3
TOP_KERNELS = 3  # kernels shown one by one in the text; the rest as one line


class KernelProfile(BaseModel):
    """One launched kernel (all its launches of the profiled run together)."""

    name: str
    time_ms: float | None = None
    time_share: float | None = None  # of all profiled kernels' time
    tflops: float | None = None  # tensor-path FLOPs counted by ncu / its time
    tflops_pct: float | None = None  # of the GPU's dense tensor peak (bf16, or fp8 for fp8 tasks)
    dram_gbps: float | None = None  # bytes read + written in DRAM / its time
    dram_pct: float | None = None  # of the HBM bandwidth
    tensor_pipe_pct: float | None = None
    occupancy_pct: float | None = None  # achieved: warps active / the SM's maximum
    theoretical_occupancy_pct: float | None = None
    occupancy_limiter: str | None = None  # registers | shared memory | block size | blocks per SM | grid size
    registers: int | None = None
    block_size: int | None = None
    grid_size: int | None = None
    waves: float | None = None
    stalls: list[tuple[str, float]] = Field(default_factory=list)  # top reasons, share of all stalled warps
    l2_hit_pct: float | None = None


class Profile(BaseModel):
    """The profile of one candidate run (first visible workload). status "skipped" says why
    there is none (no ncu, no GPU, the run failed); the kernels' figures are None where a
    metric was missing."""

    status: Literal["ok", "skipped"] = "ok"
    reason: str | None = None
    gpu: str | None = None
    kernels: list[KernelProfile] = Field(default_factory=list)  # longest first
    time_ms: float | None = None  # all profiled kernels
    tflops: float | None = None  # the task's FLOPs / that time
    tflops_pct: float | None = None
    gbps: float | None = None  # the task's compulsory bytes / that time
    peak_tflops: float | None = None  # the dense tensor peak used for the percentages
    peak_tbps: float | None = None


def build_profile(per_kernel_metrics: dict[str, dict[str, float]], gpu_name: str | None, flops: float,
                  min_bytes: float, fp8: bool = False) -> Profile:
    """The Profile from per-kernel metric values (ExecutedCheck.kernel_metrics: counters summed
    over a kernel's launches, the other figures from its longest launch). `flops` and
    `min_bytes`: the task's work on the profiled workload; `fp8`: the task computes in fp8
    (its tensor peak is the fp8 one)."""
    ceiling = ceiling_for(gpu_name)
    peak_tflops = ceiling.tensor_tflops(fp8) if ceiling else None
    peak_tbps = ceiling.hbm_tbps if ceiling else None
    if not per_kernel_metrics:
        return Profile(status="skipped", reason="ncu profiled no kernel of the solution", gpu=gpu_name)
    kernels = [_kernel(name, m, peak_tflops, peak_tbps) for name, m in per_kernel_metrics.items()]
    times = [k.time_ms for k in kernels]
    total = sum(times) if all(t is not None for t in times) else None  # type: ignore[misc]
    if total:
        for k in kernels:
            k.time_share = k.time_ms / total  # type: ignore[operator]
    kernels.sort(key=lambda k: -(k.time_ms or 0.0))
    tflops = flops / (total * 1e-3) / 1e12 if total and flops > 0 else None
    return Profile(gpu=gpu_name, kernels=kernels, time_ms=total, tflops=tflops,
                   tflops_pct=_pct(tflops, peak_tflops),
                   gbps=min_bytes / (total * 1e-3) / 1e9 if total and min_bytes > 0 else None,
                   peak_tflops=peak_tflops, peak_tbps=peak_tbps)


def skipped(reason: str, gpu_name: str | None = None) -> Profile:
    """No profile, and why (no ncu, no GPU, the run failed before it could be profiled)."""
    return Profile(status="skipped", reason=reason, gpu=gpu_name)


def _kernel(name: str, m: dict[str, float], peak_tflops: float | None, peak_tbps: float | None) -> KernelProfile:
    seconds = m[TIME] * 1e-9 if m.get(TIME) else None
    ops = [m[x] for x in TENSOR_OPS if x in m]
    tflops = sum(ops) / seconds / 1e12 if ops and seconds and sum(ops) > 0 else None
    dram = [m[x] for x in (DRAM_READ, DRAM_WRITE) if x in m]
    gbps = sum(dram) / seconds / 1e9 if len(dram) == 2 and seconds else None
    stalled = {r: m[stall_metric(r)] for r in STALL_REASONS if stall_metric(r) in m}
    total_stalled = sum(stalled.values())
    stalls = ([(r.replace("_", " "), v / total_stalled) for r, v in
               sorted(stalled.items(), key=lambda kv: -kv[1])[:TOP_STALLS]] if total_stalled > 0 else [])
    return KernelProfile(
        name=name, time_ms=seconds * 1e3 if seconds else None, tflops=tflops, tflops_pct=_pct(tflops, peak_tflops),
        dram_gbps=gbps, dram_pct=_pct(gbps / 1e3 if gbps is not None else None, peak_tbps),
        tensor_pipe_pct=m.get(TENSOR_PIPE), occupancy_pct=m.get(OCCUPANCY),
        theoretical_occupancy_pct=m.get(THEORETICAL_OCCUPANCY), occupancy_limiter=_limiter(m),
        registers=_int(m.get(REGISTERS)), block_size=_int(m.get(BLOCK_SIZE)), grid_size=_int(m.get(GRID_SIZE)),
        waves=m.get(WAVES), stalls=stalls,
        # ncu's sector hit rate can read slightly above 100% (102% seen on the H200): a share, so capped
        l2_hit_pct=min(m[L2_HIT], 100.0) if L2_HIT in m else None)


def _limiter(m: dict[str, float]) -> str | None:
    """What bounds the blocks resident per SM: the smallest per-resource limit, every one of
    them when several tie (a wgmma kernel is often bound by registers and shared memory at
    once). A grid of less than one wave leaves SMs idle whatever the limits say."""
    if m.get(WAVES) is not None and m[WAVES] < 1:
        return "grid size"
    limits = {what: m[metric] for what, metric in OCCUPANCY_LIMITS.items() if metric in m}
    if not limits:
        return None
    least = min(limits.values())
    return " and ".join(what for what, v in limits.items() if v == least)


def _pct(value: float | None, peak: float | None) -> float | None:
    return 100.0 * value / peak if value is not None and peak else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


# ---------------------------------------------------------------------------------------
# The text the model reads
# ---------------------------------------------------------------------------------------
def render(profile: Profile | None) -> str:
    """A compact block for the feedback (about 100-200 tokens for one to three kernels):
    one line for the whole run, one per kernel (the longest TOP_KERNELS), figures left out
    where a metric was missing. Without a profile: one line saying why."""
    if profile is None:
        return "No profile: the Nsight Compute pass did not run for this candidate."
    if profile.status != "ok":
        return f"No profile: {(profile.reason or 'not measured').rstrip('.')}."
    lines = []
    whole = []
    if profile.time_ms is not None:
        whole.append(f"{profile.time_ms:.4g} ms in {len(profile.kernels)} kernel"
                     + ("s" if len(profile.kernels) != 1 else ""))
    if profile.tflops is not None:
        whole.append(f"{profile.tflops:.0f} TFLOP/s of task work" + (
            f" = {profile.tflops_pct:.0f}% of the {profile.peak_tflops:.0f} TFLOP/s dense tensor peak"
            if profile.tflops_pct is not None else ""))
    if whole:
        lines.append("- all kernels: " + ", ".join(whole))
    for k in profile.kernels[:TOP_KERNELS]:
        lines.append(_kernel_line(k))
    rest = profile.kernels[TOP_KERNELS:]
    if rest:
        share = sum(k.time_share or 0.0 for k in rest)
        lines.append(f"- {len(rest)} more kernel{'s' if len(rest) > 1 else ''}: {_share(share)} of time")
    return "\n".join(lines)


def _kernel_line(k: KernelProfile) -> str:
    parts = []
    if k.tensor_pipe_pct is not None:
        parts.append(f"tensor pipe {k.tensor_pipe_pct:.0f}%")
    if k.tflops is not None:
        parts.append(f"{k.tflops:.0f} TFLOP/s" + (f" ({k.tflops_pct:.0f}% of peak)" if k.tflops_pct is not None else ""))
    if k.dram_gbps is not None:
        parts.append(f"DRAM {k.dram_gbps:.0f} GB/s" + (f" ({k.dram_pct:.0f}% of peak)" if k.dram_pct is not None else ""))
    if k.l2_hit_pct is not None:
        parts.append(f"L2 hit {k.l2_hit_pct:.0f}%")
    if k.occupancy_pct is not None:
        occ = f"occupancy {k.occupancy_pct:.0f}%"
        if k.theoretical_occupancy_pct is not None:
            occ += f" (max {k.theoretical_occupancy_pct:.0f}%)"
        if k.occupancy_limiter:
            occ += f", bound by {k.occupancy_limiter}"
        launch = [f"{k.registers} regs" if k.registers is not None else "",
                  f"{k.block_size} threads" if k.block_size is not None else "",
                  f"{k.grid_size} blocks" + (f" = {k.waves:.2g} wave{'' if k.waves == 1 else 's'}"
                                             if k.waves is not None else "")
                  if k.grid_size is not None else ""]
        launch = [x for x in launch if x]
        parts.append(occ + (f": {', '.join(launch)}" if launch else ""))
    if k.stalls:
        parts.append("stalls: " + ", ".join(f"{r} {s:.0%}" for r, s in k.stalls))
    share = f" ({_share(k.time_share)} of time)" if k.time_share is not None else ""
    return f"- `{k.name}`{share}: " + ("; ".join(parts) if parts else "no figures measured")


def _share(x: float) -> str:
    return "<1%" if 0 < x < 0.005 else f"{x:.0%}"


def tokens(text: str) -> int:
    """Token estimate for budgeting the block: 4 characters a token, the same on every machine (a
    tokenizer's count would depend on which encodings the process happens to have: litellm
    ships cl100k and points tiktoken at it once imported, so counts changed with test order)."""
    return (len(text) + 3) // 4


__all__ = ["PROFILE_METRICS", "Profile", "KernelProfile", "build_profile", "render",
           "skipped", "tokens"]
