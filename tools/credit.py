"""Instruction credit: when a requested instruction (wgmma, TMA) executed and carried the task's
work. The rules, their thresholds and the verdict live here; where the counts come from is apart
(tools.cupti in the worker, the usual path; tools.ncu's Nsight Compute process where CUPTI cannot
run). docs/METHODOLOGY.md, "Instruction credit", states each rule and why.

The rules count every way a kernel can do math or read memory, and where a counter lumps two
classes together the rule takes the side that refuses credit:
- math: wgmma's FLOPs (HGMMA ops by source; fp8 ops only where no warp-level MMA ran) against
  all the math the kernels did: every other tensor-pipe instruction (DMMA by its FP64 ops; HMMA,
  QMMA, IMMA, BMMA, IGMMA and any tensor instruction no counter names, bounded from above by the
  most ops such an instruction can do) and, by a bound that needs no list, every executed thread
  instruction of any pipe as a multiply-add (fp16 ones 4 FLOPs more; every one 8 where IDP may run),
  every uniform-datapath warp instruction as one, and every reduction done in memory (RED, ATOM/ATOMS
  .ALU, REDAS, TMA/bulk reduce) as the most adds its widest form does (hardware counters, all read on
  timed runs);
- reads: TMA's bytes count only where they are tensor-map loads. The TMA byte counter also counts
  plain bulk copies from global memory (cp.async.bulk, UBLKCP.S.G): where one executed on the counted
  run (exact per-opcode counts: CUPTI's SASS metrics in process, `exact_count_sites`; Nsight Compute's
  per-opcode counts), or where the module holds one and no exact count says otherwise (its SASS), TMA's
  bytes are other reads and TMA carries nothing.
  Other reads: LDG (any width, generic or global), atomics that return data, cp.async (LDGSTS);
  texture and surface reads have no byte counter here, so each executed warp instruction is charged
  the most it can read (TEX_BYTES_PER_INST).

    counting = Counting(mode="cupti")          # how an evaluation counts: the one object passed down
    wc = credit_in_process(meta, credit, features, work, timed_ms, module_opcodes)
    check = combine(features, [wc, ...])
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Literal

from tools.results import ExecutedCheck, WorkloadCredit

OPCODE_METRIC = "sass__inst_executed_per_opcode"  # Nsight Compute only: per-opcode instance values
GMMA_METRIC = "smsp__inst_executed_pipe_tensor_op_gmma.sum"  # HGMMA/QGMMA/IGMMA/BGMMA warp instructions
# Every TMA-pipe instruction (UTMALDG, UBLKCP, UTMASTG, ...): whether the "tma" feature executed
# at all. Whether it carried the work is the bytes' business (below).
TMA_INST_METRIC = "sm__inst_executed_pipe_tma.sum"
# The tensor pipe's warp instructions by class (names and descriptions from CUPTI's host API on
# GH100, tools.cupti.base_metrics): all of them, and the classes CUPTI names.
TENSOR_INST_METRIC = "sm__inst_executed_pipe_tensor.sum"
HMMA_INST_METRIC = "sm__inst_executed_pipe_tensor_op_hmma.sum"  # HMMA/HFMA2.MMA/HGMMA/QGMMA
HFMA2_MMA_INST_METRIC = "sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum"  # HFMA2.MMA
IMMA_INST_METRIC = "sm__inst_executed_pipe_tensor_op_imma.sum"  # IMMA/IGMMA/BMMA/BGMMA
DMMA_INST_METRIC = "sm__inst_executed_pipe_tensor_op_dmma.sum"  # DMMA
# Tensor-core math issued by wgmma: HGMMA ops for 16-bit and tf32 sources; fp8 has one counter for
# QGMMA and the warp-level QMMA alike, so fp8 ops are wgmma's only where no warp-level MMA ran.
HGMMA_OPS_METRICS = ("sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum", "sm__ops_path_tensor_op_hgmma_src_fp16.sum",
                     "sm__ops_path_tensor_op_hgmma_src_tf32_dst_fp32.sum")
FP8_OPS_METRIC = "sm__ops_path_tensor_src_fp8.sum"
DMMA_OPS_METRIC = "sm__ops_path_tensor_src_fp64.sum"  # FP64 tensor ops (DMMA): exact
FLOPS_PER_OP = 1.0  # the ops metrics count FLOPs: 601.3e9 on the expert GEMM at M=8192, = 2*M*N*K (H200, 2026-11-30)
# Upper bounds, in FLOPs per warp instruction, for tensor-pipe math no ops counter measures within
# three passes: a warp-level HMMA/QMMA does at most m16n8k32 fp8 = 8192; an IMMA-pipe instruction
# (IMMA, IGMMA, BMMA, BGMMA) at most BGMMA m64n256k256 shared by 4 warps = 2**21; HFMA2.MMA 32
# threads x 2 lanes x 2 = 128. A tensor instruction of a class no counter names gets the largest.
MMA_SYNC_MAX_FLOPS = 8192.0
IMMA_MAX_FLOPS = float(2 * 64 * 256 * 256 // 4)
HFMA2_MMA_FLOPS = 128.0
# Math outside the tensor pipe, by a bound that needs no list of opcodes (issue 42, item 1): EVERY
# executed thread instruction, whatever pipe ran it (FMA, ALU, FP64, XU, LSU, ADU, CBU, the
# texture and TMA pipes ...), is charged as at least one multiply-add (2 FLOPs). A product taken
# from a table (LDS/LDG indexed by the operands) is then charged as its load, and its accumulation
# as whatever instruction adds it. Where a class does more per thread instruction, it is charged
# the most its widest form does, on top (hardware counters all, read on timed runs):
# - the FMA pipes' fp16 instructions (HFMA2: two lanes) 4 more;
# - the uniform datapath (UIMAD, UIADD3, ULOP3 ... on uniform registers): one op per warp
#   instruction, which a thread-instruction count need not hold: each warp instruction one more
#   multiply-add;
# - reductions done by the memory system, where the add is no instruction of the SM's math pipes
#   (REDUCTION_ADDS_PER_LANE): every warp instruction 32 lanes of its widest form's adds, each add
#   charged as a multiply-add (it may accumulate a looked-up product);
# - TMA and bulk reductions (cp.reduce.async.bulk{.tensor} .add: UTMAREDG, UBLKRED; the adds are done
#   in L2 or in the destination's shared memory) by their bytes: at least 2 bytes an element (f16,
#   bf16), so one add (2 FLOPs) per 2 bytes: FLOPs = bytes.
# One class does more per thread instruction than any counter can tell: IDP (dp4a, dp2a: 4 int8
# products and their sum, 8 ops). No counter separates it, so where the module's SASS holds one (or the
# SASS was not read: the side that refuses) EVERY thread instruction is charged IDP's 8 FLOPs. Honest
# kernels hold none.
THREAD_INST_METRIC = "smsp__thread_inst_executed_pred_on.sum"  # every pipe's thread instructions
FP16_INST_METRIC = "sm__thread_inst_executed_pipe_fma_type_fp16_pred_on.sum"
SIMT_FLOP_METRICS = {THREAD_INST_METRIC: 2.0, FP16_INST_METRIC: 4.0}
WIDE_SIMT_OPCODES = ("IDP",)  # SASS base opcodes (IDP.4A.S8.S8, IDP.2A.LO ...)
WIDE_SIMT_FLOPS = 8.0  # what each thread instruction is charged where the module holds one
UNIFORM_INST_METRIC = "sm__inst_executed_pipe_uniform.sum"  # warp instructions of the uniform datapath
UNIFORM_FLOPS_PER_INST = 2.0
# Adds one lane of a warp instruction does at most, by class (PTX ISA 8.x, ptxas 13.0 on sm_90a):
# global reductions (RED, REDG: red.global.add.noftz.v8.bf16 or .v4.bf16x2, 128 bits of 16-bit
# elements: 8) and ALU atomics (ATOM, ATOMG .ALU: the same vector forms, 8); shared-memory ALU atomics
# (ATOMS .ALU: no vector form; f16x2: 2); distributed shared-memory reductions (REDAS: f16x2: 2).
# Shared-memory float adds (red.shared.add.f32) compile to a CAS loop whose FADD is a thread instruction.
REDUCTION_ADDS_PER_LANE = {
    "smsp__inst_executed_op_global_red.sum": 8.0,
    "smsp__inst_executed_op_generic_atom_dot_alu.sum": 8.0,
    "smsp__inst_executed_op_shared_atom_dot_alu.sum": 2.0,
    "smsp__inst_executed_op_redas.sum": 2.0,
}
LANES = 32
# TMA/bulk reduction bytes sent to L2 (global) and to another CTA's shared memory (distributed shared)
TMA_REDUCTION_BYTES_METRICS = ("l1tex__m_l1tex2xbar_write_bytes_mem_global_op_tma_red.sum",
                               "l1tex__m_l1tex2xbar_write_bytes_mem_dshared_op_tma_red.sum")
TMA_REDUCTION_FLOPS_PER_BYTE = 1.0  # 2 bytes (one f16/bf16 element) per add, an add charged 2 FLOPs
# The derived sums a workload's credit keeps (WorkloadCredit.work): what a reader needs to see how
# near each limit an honest kernel stands (docs/METHODOLOGY.md's margins come from these).
WORK_SUMS = ("wgmma_flops", "other_tensor_flops", "simt_flops", "wide_simt", "uniform_flops", "reduction_flops",
             "other_flops", "wgmma_of_all_math", "tma_bytes", "other_read_bytes", "bulk_copy", "bulk_copy_unknown",
             "tex_reads", "tma_exact_instructions", "exact_untied")
TENSOR_INST_METRICS = (TENSOR_INST_METRIC, HMMA_INST_METRIC, HFMA2_MMA_INST_METRIC, IMMA_INST_METRIC, DMMA_INST_METRIC)
# Bytes TMA loads brought into shared memory (tensor-map loads and plain bulk copies alike), and
# bytes read from global memory any other way: LDG and generic loads (LSU), atomics that return
# data, cp.async's LDGSTS. Texture/surface reads: counted by instruction (no byte counter fits).
TMA_BYTES_METRIC = "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum"
OTHER_READ_METRICS = ("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_global_op_atom.sum")
# cp.async (LDGSTS) reads: no hardware byte counter covers both its cached and its bypassing form, so
# each executed warp instruction is charged the most it can copy, 32 lanes x 16 bytes
LDGSTS_INST_METRIC = "smsp__inst_executed_op_ldgsts.sum"
LDGSTS_BYTES_PER_INST = 32 * 16
TEX_INST_METRIC = "sm__inst_executed_pipe_tex.sum"  # TEX, TLD, SULD, SUATOM, ...
# The texture pipe's reads have no byte counter that separates them, so each warp-level instruction
# is charged the most it can read: 32 lanes x 8 texels (a trilinear fetch) x 16 bytes. A kernel that
# streams its input through textures exceeds the other-reads cap; a few stray ones (the GEMM expert
# issues 1,120 at M=70, 4.6 MB charged against 74 MB of input; H200, 2026-12-03) do not.
TEX_BYTES_PER_INST = 32 * 8 * 16
DURATION_METRIC = "gpu__time_duration.sum"  # ns per launch (Nsight Compute): ties the profiled run to the timed ones
WORK_METRICS = (GMMA_METRIC, *HGMMA_OPS_METRICS, FP8_OPS_METRIC, DMMA_OPS_METRIC, *TENSOR_INST_METRICS, *SIMT_FLOP_METRICS,
                UNIFORM_INST_METRIC, *REDUCTION_ADDS_PER_LANE, *TMA_REDUCTION_BYTES_METRICS,
                TMA_BYTES_METRIC, *OTHER_READ_METRICS, LDGSTS_INST_METRIC, TEX_INST_METRIC, DURATION_METRIC)
FEATURE_COUNTERS = {"wgmma": (GMMA_METRIC,), "tma": (TMA_INST_METRIC,)}
# What the in-process check reads: 4 passes on GH100, hardware counters only (CUPTI's host API says
# so without a GPU, tests/test_cupti_user_replay.py), each pass counting every timed run of its stretch:
# no pass runs SASS-patched code (which a kernel could sense, 2.6-49x slower, after the timed runs).
CUPTI_METRICS = tuple(dict.fromkeys((GMMA_METRIC, TMA_INST_METRIC, *WORK_METRICS)))
# The module's SASS facts a row may carry (counter_rows): whether it holds a plain bulk copy.
SASS_BULK_COPY = "sass:bulk_copy"
SASS_WIDE_SIMT = "sass:wide_simt"  # and whether it holds an instruction of WIDE_SIMT_OPCODES
BULK_COPY_OPCODES = ("UBLKCP",)  # cp.async.bulk without .tensor (loads UBLKCP.S.G, stores UBLKCP.G.S)
# Exact counts (issue 42, item 4): the TMA load counters (instructions and bytes) count a tensor-map
# load (UTMALDG) and a plain bulk copy from global memory (UBLKCP.S.G) alike, and no hardware counter
# splits them. Per-instruction counts do (tools.cupti.SassCounter, on a counted run of its own: the
# instrumented pass): `exact_count_sites` names the instructions to count, the worker's counted runs
# return their executions per opcode, and a row carries them as OPCODE_METRIC does for Nsight Compute.
TENSOR_MAP_LOAD = "UTMALDG"
BULK_LOAD = "UBLKCP.S.G"
# The exact counts come from an instrumented run of their own; the hardware passes count every TMA-pipe
# warp instruction (TMA_INST_METRIC) of theirs. The two must agree within EXACT_TIE (relative, plus
# EXACT_TIE_SLACK instructions), else the exact counts are not the counted runs' and tell nothing.
EXACT_TIE = 0.01
EXACT_TIE_SLACK = 8.0


def is_bulk_load(opcode: str) -> bool:
    """A plain bulk copy that may read global memory: UBLKCP.S.G (full opcode), or a bare UBLKCP
    (Nsight Compute's per-opcode names carry no modifiers: a bulk store cannot be told from a load,
    so it counts as one, the side that refuses)."""
    return opcode == "UBLKCP" or opcode.startswith(BULK_LOAD)


def exact_count_sites(insp) -> dict[str, dict[int, str]] | None:
    """Where the executed check needs exact per-instruction counts: every launched kernel's TMA-pipe
    instructions (pc offset -> full opcode, tools.results.KernelSass.tma_sites), when a plain bulk
    load is among them; None where the counters' lumped class can only be tensor-map loads (no bulk
    load in the launched kernels) or the SASS was not read (then the rows' SASS flag refuses). All the
    TMA pipe's, not the loads alone: their sum is tied to the hardware passes' TMA instruction count
    (EXACT_TIE), so an instrumented run that issues other TMA instructions than the counted runs
    did is seen."""
    if insp is None or getattr(insp, "status", None) != "ok" or not insp.kernels:
        return None
    launched = {n: k for n, k in insp.kernels.items() if n not in set(insp.uncounted_kernels)}
    if not any(is_bulk_load(op) for k in launched.values() for op in k.tma_sites.values()):
        return None
    return {n: dict(k.tma_sites) for n, k in launched.items() if k.tma_sites}


def credit_metrics() -> tuple[str, ...]:
    """What the in-process check (CUPTI user replay, every timed run counted) collects: all of
    CUPTI_METRICS but the kernel time (a user range's gpu__time_duration spans the range, the
    stream gate included, so each counted run is timed with events, as a timed run is)."""
    return tuple(m for m in CUPTI_METRICS if m != DURATION_METRIC)


# When a feature carries the work (docs/METHODOLOGY.md, "Instruction credit"):
#   wgmma: its FLOPs are >= 90% of the task's matrix FLOPs, <= 2.5x them (tuned kernels measure
#          1.00-1.05; a causal kernel that computes every tile and masks does 2x: honest, slow;
#          the cap leaves no room for garbage wgmma beside the real math), and >= 85% of all the
#          math the candidate did, every pipe counted (WGMMA_MIN_OF_ALL_MATH, below);
#   TMA:   its tensor-map loads brought >= half the task's input bytes, and other global reads stay
#          <= 2x the input bytes (a tiled GEMM or attention that streams its operands by LDG re-reads
#          them tens of times; the expert kernels' side passes read 1.2x); for a task that asks for
#          no matrix instruction (memory-bound, e.g. GDN decode: each input byte is read once)
#          <= 0.5x, so the bulk of the input must come through TMA.
#   tcgen05.mma: the same rule as wgmma (issue 41: credit must not differ by arch). Its FLOPs are
#          the derived sum `tcgen05_flops`, which no counter set read on the H200 provides; until a
#          B200 run names its counters, a tcgen05 share is "unverified on this GPU" and carries nothing.
WORK_SHARE = {"wgmma": 0.9, "tcgen05_mma": 0.9, "tma": 0.5}
MMA_FLOPS = {"wgmma": "wgmma_flops", "tcgen05_mma": "tcgen05_flops"}  # the derived FLOP sum of each MMA feature
WGMMA_MAX_OVERWORK = 2.5
# wgmma's share of ALL the math, every thread instruction charged as a multiply-add (loads, stores,
# barriers, branches and address arithmetic included). The threshold sits between two bounds:
# - a kernel that does the task's F FLOPs anywhere but the tensor pipe pays at least one charged
#   FLOP per multiply-add it does (a thread instruction does at most two multiply-adds outside
#   IDP, which is charged 8 wherever it may run, and fp16x2's extra 4; every add of a product also
#   needs an instruction or a reduction, both charged), so >= F/2; beside the largest decoy wgmma
#   the overwork cap allows (2.5 F) its share is at most 2.5 / 3.0 = 0.833;
# - honest kernels (H200, 2026-12-03, scripts/credit_margins.py): GEMM 0.981-0.992, FP8 GEMM
#   0.977-0.985, attention fwd 0.941-0.969, bwd 0.931-0.963, GDN prefill 0.892-0.901 (its data
#   movement and gating are SIMT: loads, stores and uniform-datapath instructions, each charged as
#   a multiply-add, are a fifth of its charge).
# 0.85: above what the cheapest uncounted-math attack can reach, below every shipped expert.
WGMMA_MIN_OF_ALL_MATH = 0.85
TMA_MAX_OTHER_READS = 2.0
TMA_MAX_OTHER_READS_NO_MMA = 0.5
MMA_FEATURES = ("wgmma", "tcgen05_mma")
# The counted runs must be the kernel that was timed (tie_to_timed_run), within SAME_RUN_RATIO (plus
# SAME_RUN_SLACK_MS for launch gaps), both ways. In process every timed run is counted (tools.counted):
# the counts are the timed runs' own, so what is tied is each hardware pass's median to the range of
# the other passes' runs (a kernel that told the passes apart by their boundaries and took another
# path in one must take it at the timed path's speed). Elsewhere (Nsight Compute, a workload counted
# after its runs) each counted run is tied to the range of the workload's timed runs.
SAME_RUN_RATIO = 1.10  # the five expert kernels on the H200: 0.983-1.001 (docs/BENCHMARKS.md)
SAME_RUN_SLACK_MS = 0.01
# A range (timed_band: the fastest and the slowest; below TIE_BAND_RUNS runs, the median), not the
# median: on the H200 the attention-backward expert at S=8192 draws the card to its power limit
# (684 W, "SW power cap", the SM clock down to 1620-1740 MHz from 1980), and whichever side runs
# second in a pair runs up to 15% slower, most of the time, not always (2026-12-03 night,
# scripts/diag_counted_slowdown.py; 2026-12-04, scripts/diag_ranged.py: in a CUPTI range or not alike).
# How many runs fall in the slow mode changes from one evaluation (and one pass) to the next; the range
# holds every mode an honest kernel showed at least once. A pass holds runs of both places in the pair,
# so its median lies between the modes.
TIE_BAND = (0.0, 1.0)
TIE_BAND_RUNS = 4


@dataclass
class Counting:
    """How an evaluation counts executed instructions: the one object the evaluator passes down
    (instead of flags). `mode`: "cupti" (in the worker, counted runs after the timed ones), "ncu"
    (a Nsight Compute process: where CUPTI cannot run), or "off" (not asked, or nothing to count:
    `reason` says which). `process`: the Nsight Compute process where one runs (the "ncu" mode, or
    beside "cupti" for a profile only: it never decides credit then)."""

    mode: Literal["cupti", "ncu", "off"]
    process: object = None  # tools.ncu.CreditProcess
    reason: str = "the task requests no features for this arch"

    @property
    def in_process(self) -> bool:
        return self.mode == "cupti"

    @property
    def profile_wanted(self) -> bool:
        return self.process is not None and bool(getattr(self.process, "extra_metrics", ()))

    def close(self) -> None:
        if self.process is not None:
            self.process.close()


@dataclass
class TaskWork:
    """What the task must do on the profiled workload: its matrix FLOPs and input bytes."""

    flops: float
    read_bytes: float
    # the matrix FLOPs with every size axis rounded up to a whole 128-row tile: an honest tiled
    # kernel computes its padded tiles (GEMM at M=70: 1.8x; attention at S=77: 2.8x)
    padded_flops: float | None = None


def _opcodes_for(feature: str) -> set[str]:
    from tools.features import executed_opcodes

    return executed_opcodes(feature)


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


def _row_bulk_copy(row: dict[str, str]) -> bool | None:
    """Whether plain bulk copies (UBLKCP) may be among this launch's TMA loads: from exact per-opcode
    counts where the row has them (Nsight Compute's, or CUPTI's SASS metrics on a counted run:
    _exact_opcodes), else from the module's SASS (counter_rows); None where neither is known."""
    if OPCODE_METRIC in row:
        ops = parse_instances(row[OPCODE_METRIC])
        if ops or _number(row[OPCODE_METRIC]) == 0:
            return any(is_bulk_load(k) and v > 0 for k, v in ops.items())
    flag = row.get(SASS_BULK_COPY)
    return None if flag is None else flag == "1"


def _row_wide_simt(row: dict[str, str]) -> bool | None:
    """Whether an instruction of WIDE_SIMT_OPCODES (IDP) may be among this launch's thread
    instructions: from Nsight Compute's per-opcode counts of every opcode where the row has them (not
    the worker's exact counts, which are of TMA sites only), else from the module's SASS
    (counter_rows); None where neither is known."""
    if OPCODE_METRIC in row and not row.get(EXACT_SOURCE):
        ops = parse_instances(row[OPCODE_METRIC])
        if ops or _number(row[OPCODE_METRIC]) == 0:
            return any(k.split(".")[0] in WIDE_SIMT_OPCODES and v > 0 for k, v in ops.items())
    flag = row.get(SASS_WIDE_SIMT)
    return None if flag is None else flag == "1"


def work_metrics(rows: list[dict[str, str]]) -> dict[str, float]:
    """Totals over the profiled launches of the metrics behind the work shares, and the derived
    sums the verdict uses: wgmma_flops, other_tensor_flops, simt_flops, other_flops, tma_bytes,
    other_read_bytes (and bulk_copy / bulk_copy_unknown / tex_reads where those refuse TMA's
    share). A derived sum is absent when one of its metrics is missing from a launch (then it is
    not measured, and no share that needs it is granted)."""
    out: dict[str, float] = {}
    for metric in WORK_METRICS:
        total = _totals(rows, metric)
        if total is not None:
            out[metric] = total
    have = lambda names: all(m in out for m in names)  # noqa: E731
    if have([*HGMMA_OPS_METRICS, FP8_OPS_METRIC, DMMA_OPS_METRIC, *TENSOR_INST_METRICS, GMMA_METRIC]):
        gmma, tensor, hmma = out[GMMA_METRIC], out[TENSOR_INST_METRIC], out[HMMA_INST_METRIC]
        hfma2, imma, dmma = out[HFMA2_MMA_INST_METRIC], out[IMMA_INST_METRIC], out[DMMA_INST_METRIC]
        # warp-level HMMA/QMMA: the HMMA-class instructions that are neither HFMA2.MMA nor warpgroup
        # MMAs (IGMMA/BGMMA sit in the GMMA counter but not the HMMA one: adding the IMMA class
        # back keeps this an upper bound)
        warp_mma = max(0.0, hmma - hfma2 - gmma + imma)
        unnamed = max(0.0, tensor - hmma - imma - dmma)  # a tensor instruction of no class CUPTI names
        fp8_wgmma = out[FP8_OPS_METRIC] if warp_mma == 0 else 0.0  # QGMMA's only where no QMMA could have run
        out["wgmma_flops"] = (sum(out[m] for m in HGMMA_OPS_METRICS) + fp8_wgmma) * FLOPS_PER_OP
        out["other_tensor_flops"] = ((out[FP8_OPS_METRIC] - fp8_wgmma + out[DMMA_OPS_METRIC]) * FLOPS_PER_OP
                                     + warp_mma * MMA_SYNC_MAX_FLOPS + hfma2 * HFMA2_MMA_FLOPS
                                     + (imma + unnamed) * IMMA_MAX_FLOPS)
    if have(SIMT_FLOP_METRICS):
        weights = dict(SIMT_FLOP_METRICS)
        if any(_row_wide_simt(r) is not False for r in rows):  # IDP ran or is in the module, or not known
            weights[THREAD_INST_METRIC] = WIDE_SIMT_FLOPS
            out["wide_simt"] = 1.0
        out["simt_flops"] = sum(out[m] * w for m, w in weights.items())
    if have([UNIFORM_INST_METRIC]):
        out["uniform_flops"] = out[UNIFORM_INST_METRIC] * UNIFORM_FLOPS_PER_INST
    if have([*REDUCTION_ADDS_PER_LANE, *TMA_REDUCTION_BYTES_METRICS]):
        out["reduction_flops"] = (sum(out[m] * LANES * adds * 2.0 for m, adds in REDUCTION_ADDS_PER_LANE.items())
                                  + sum(out[m] for m in TMA_REDUCTION_BYTES_METRICS) * TMA_REDUCTION_FLOPS_PER_BYTE)
    if all(k in out for k in ("other_tensor_flops", "simt_flops", "uniform_flops", "reduction_flops")):
        out["other_flops"] = sum(out[k] for k in ("other_tensor_flops", "simt_flops", "uniform_flops",
                                                   "reduction_flops"))
        if "wgmma_flops" in out:
            out["wgmma_of_all_math"] = out["wgmma_flops"] / max(out["wgmma_flops"] + out["other_flops"], 1.0)
    exact = [_exact_tma_total(r) for r in rows if r.get(EXACT_SOURCE)]
    if exact and all(x is not None for x in exact):  # (where one was not read, the module's SASS decides)
        # tied to the hardware passes' TMA instructions (EXACT_TIE), with or without the control
        # instructions (TMA_CONTROL_OPCODES); not measured there: untied
        data, every = sum(x[0] for x in exact), sum(x[1] for x in exact)
        hw = _totals(rows, TMA_INST_METRIC)
        tied = [n for n in (data, every) if hw is not None and abs(n - hw) <= EXACT_TIE * hw + EXACT_TIE_SLACK]
        out["tma_exact_instructions"] = tied[0] if tied else every
        if not tied:
            out["exact_untied"] = 1.0
    if have([TMA_BYTES_METRIC]) and rows:
        bulk = [_row_bulk_copy(r) for r in rows]
        if any(b is None for b in bulk) or out.get("exact_untied"):
            out["bulk_copy_unknown"] = 1.0
        elif any(bulk):
            out["bulk_copy"] = 1.0
        else:
            out["tma_bytes"] = out[TMA_BYTES_METRIC]
    if have(OTHER_READ_METRICS) and have([TMA_BYTES_METRIC, LDGSTS_INST_METRIC]):
        # TMA bytes that may be plain bulk copies are other reads: never TMA's, always counted
        lumped = 0.0 if "tma_bytes" in out else out[TMA_BYTES_METRIC]
        out["other_read_bytes"] = (sum(out[m] for m in OTHER_READ_METRICS) + lumped
                                   + out[LDGSTS_INST_METRIC] * LDGSTS_BYTES_PER_INST)
    if out.get(TEX_INST_METRIC, 0.0) > 0:
        out["tex_reads"] = out[TEX_INST_METRIC]
        if "other_read_bytes" in out:  # no byte counter fits them: each charged the most one can read
            out["other_read_bytes"] += out["tex_reads"] * TEX_BYTES_PER_INST
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
    if feature == "tma":  # what the counters cannot tell apart refuses first: the share would be a guess
        if metrics.get("bulk_copy"):
            return False, ("plain bulk copies (cp.async.bulk without .tensor, SASS UBLKCP) ran or the module holds "
                           "them, and the TMA byte counter counts them with tensor-map loads: only tensor-map loads "
                           "count as TMA")
        if metrics.get("exact_untied"):
            return False, (f"the instrumented run's exact TMA instructions ({metrics.get('tma_exact_instructions', 0):.0f}) "
                           "are not the counted runs' (the TMA instruction counter): whether TMA's bytes were "
                           "tensor-map loads or plain bulk copies could not be told")
        if metrics.get("bulk_copy_unknown"):
            return False, ("whether TMA's bytes were tensor-map loads or plain bulk copies could not be told (SASS not "
                           "read, or no exact count of its bulk copies)")
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
        why = mma_carries(feature, share, metrics[MMA_FLOPS[feature]], metrics.get("other_flops"), work,
                          of_all=metrics.get("wgmma_of_all_math") if feature == "wgmma" else None, metrics=metrics)
        if why:
            return False, why
    if feature == "tma":
        other = metrics.get("other_read_bytes")
        if other is None:
            return False, "the global-memory reads made outside TMA could not be measured"
        cap = TMA_MAX_OTHER_READS if any(f in MMA_FEATURES for f in features) else TMA_MAX_OTHER_READS_NO_MMA
        if other > cap * work.read_bytes:
            return False, (f"{other / work.read_bytes:.1f}x the task's input bytes were read from global "
                           f"memory outside tensor-map loads (LDG, atomics, cp.async, bulk copies; at most {cap:g}x)")
    return True, None




def mma_carries(feature: str, share: float, mma_flops: float, other_flops: float | None, work: TaskWork,
                of_all: float | None = None, metrics: dict[str, float] | None = None) -> str | None:
    """The work-share rule of a matrix instruction (wgmma on sm_90a, tcgen05.mma on sm_100a: one
    rule for both arches), past the minimum share: at most WGMMA_MAX_OVERWORK times the task's
    FLOPs in whole tiles (no garbage MMAs beside the real math), and at least WGMMA_MIN_OF_ALL_MATH
    of all the math the kernels did, every pipe counted. None when it carries, else why not."""
    metrics = metrics or {}
    cap = WGMMA_MAX_OVERWORK * max(1.0, (work.padded_flops or work.flops) / work.flops)
    if share > cap:
        return (f"{feature} issued {share:.1f}x the task's matrix FLOPs (at most {cap:.3g}x, "
                f"{WGMMA_MAX_OVERWORK:g}x its work in whole 128-row tiles, counts as doing the task's work)")
    if other_flops is None:
        return (f"the math done outside {feature} (other tensor-pipe, thread, uniform and reduction instructions) "
                "could not be measured")
    if of_all is None:
        of_all = mma_flops / max(mma_flops + other_flops, 1.0)
    if of_all < WGMMA_MIN_OF_ALL_MATH:
        return (f"{feature} did {of_all:.1%} of the math the kernels did (needs "
                f"{WGMMA_MIN_OF_ALL_MATH:.0%}); the rest: other tensor instructions (mma.sync, DMMA, IMMA: "
                f"{metrics.get('other_tensor_flops', 0.0):.3g} FLOPs at most), thread instructions of any pipe "
                f"(each a multiply-add: {metrics.get('simt_flops', 0.0):.3g}), the uniform datapath "
                f"({metrics.get('uniform_flops', 0.0):.3g}) and reductions in memory (atomics, red, TMA reduce: "
                f"{metrics.get('reduction_flops', 0.0):.3g})")
    return None


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
                        kernel_ms=kernel_ms, run_ms=list(run_ms or []), tie_band_ms=list(r.get("tie_band_ms") or []),
                        instrumented_ms=list(r.get("instrumented_ms") or []), timed_ms=timed_ms,
                        pass_ms=[round(statistics.median(x), 5) if x else math.nan
                                 for x in pass_tie_runs(r.get("pass_ms") or [], r.get("pass_first_ms"))],
                        pass_band_ms=[list(b) for b in r.get("pass_band_ms") or []])
    if uncounted:
        unread = sorted(set(r.get("unread") or []))
        wc.status, wc.reason = "skipped", (f"no executed-instruction counts for {', '.join(uncounted)}"
                                           + (f" (CUPTI read no value for {', '.join(unread)})" if unread else ""))[:400]
        return wc
    v = verdict(features, counts, per_kernel(rows, features), metrics, work)
    wc.executed, wc.shares, wc.carries, wc.notes = v.executed, v.shares, v.carries, v.notes
    wc.work = {k: metrics[k] for k in WORK_SUMS if k in metrics}
    tie_to_timed_run(wc, timed_ms)
    return wc


def counter_rows(launches: list[dict], module_opcodes: set[str] | None = None) -> list[dict[str, str]]:
    """The in-process check's launches ({name, metrics}) as rows like ncu's raw CSV, so one
    verdict (counts_from_rows, work_metrics, per_kernel) serves both. `module_opcodes`: the SASS
    base opcodes of every kernel in the module (None: not read), for what counters lump together."""
    sass = {} if module_opcodes is None else {
        SASS_BULK_COPY: "1" if any(op in BULK_COPY_OPCODES for op in module_opcodes) else "0",
        SASS_WIDE_SIMT: "1" if any(op in WIDE_SIMT_OPCODES for op in module_opcodes) else "0"}
    # a value CUPTI could not read (NaN, inf: a pass that was not collected; None once the worker's
    # result went through JSON) is left out, so it is "not measured" and never passes a share test
    # (NaN compares false both ways)
    return [{"Kernel Name": x["name"], **{m: repr(float(v)) for m, v in x["metrics"].items()
                                          if isinstance(v, (int, float)) and math.isfinite(v)}, **sass,
             **_exact_opcodes(x)}
            for x in launches]


EXACT_SOURCE = "sass:exact"  # a row whose OPCODE_METRIC is the worker's exact count (not Nsight Compute's)


# TMA-pipe opcodes that move no data (tensor-map prefetch and cache control, command flush): whether the
# hardware's TMA instruction count includes them is not documented, so the tie accepts either sum
TMA_CONTROL_OPCODES = ("UTMACCTL", "UTMACMDFLUSH")


def _exact_tma_total(row: dict[str, str]) -> tuple[float, float] | None:
    """The exact TMA-pipe instructions of a row (EXACT_SOURCE): (the data-moving ones, all of them);
    None where they could not be read."""
    ops = parse_instances(row.get(OPCODE_METRIC, ""))
    if not ops and _number(row.get(OPCODE_METRIC, "")) != 0:
        return None
    tma = {k: v for k, v in ops.items() if k.startswith(("UTMA", "UBLK"))}
    return sum(v for k, v in tma.items() if k.split(".")[0] not in TMA_CONTROL_OPCODES), sum(tma.values())


def _exact_opcodes(launch: dict) -> dict[str, str]:
    """A launch's exact executions per opcode (the worker's `opcodes`, where exact_count_sites asked
    for them) as Nsight Compute writes OPCODE_METRIC, so _row_bulk_copy reads both alike; where the
    worker could not count them all (`opcodes_missing`: a site CUPTI returned no record for), a cell
    that reads as no count, so the module's SASS decides (it holds a bulk load: refused)."""
    if "opcodes" not in launch and "opcodes_missing" not in launch:
        return {}
    if launch.get("opcodes_missing"):
        return {OPCODE_METRIC: "n/a", EXACT_SOURCE: "1"}
    ops = {k: float(v) for k, v in (launch.get("opcodes") or {}).items()}
    return {OPCODE_METRIC: f"{sum(ops.values()):.0f} (" + "; ".join(f"{k}: {v:.0f}" for k, v in sorted(ops.items()))
            + ")", EXACT_SOURCE: "1"}


def credit_in_process(meta: dict, credit: dict | None, features: list[str], work: TaskWork | None,
                      timed_ms: float | None, module_opcodes: set[str] | None = None) -> WorkloadCredit:
    """One workload's credit from its worker result's in-process run (tools.counted.defer_counted)."""
    if not credit or credit.get("status") != "ran":
        why = (credit or {}).get("reason") or "its profiled run was not reached"
        return WorkloadCredit(workload=meta["workload"], split=meta["split"], status="skipped",
                              runs=(credit or {}).get("runs", 0), reason=f"not credited: {why}"[:400])
    unread = [m for x in credit.get("launches") or [] for m, v in x["metrics"].items()
              if not (isinstance(v, (int, float)) and math.isfinite(v))]
    r = {**meta, "runs": credit.get("runs", 0), "profiled_at": credit.get("profiled_at"), "unread": unread,
         "counted_from": credit.get("counted_from"), "instrumented_ms": credit.get("instrumented_ms"),
         "tie_band_ms": credit.get("tie_band_ms"), "pass_ms": credit.get("pass_ms"), "pass_first_ms": credit.get("pass_first_ms"),
         "pass_band_ms": credit.get("pass_band_ms")}
    return _credit(r, counter_rows(credit.get("launches") or [], module_opcodes), features, work, timed_ms,
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


def timed_band(pair_ms: list, warmup: int, counted_pairs: list[int | None],
               band: tuple[float, float] = TIE_BAND, least: int = TIE_BAND_RUNS) -> list[float] | None:
    """[lower, upper] quantile (`band`; TIE_BAND: the fastest and the slowest) of the workload's timed candidate runs other than the counted
    ones (`pair_ms`: [candidate ms, library ms] of every pair in order, the first `warmup` pairs not
    timed; `counted_pairs`: the counted runs' pairs, None for a run outside them): what tie_to_timed_run
    holds every counted run to. None where fewer than `least` such runs were timed."""
    import statistics

    skip = {p for p in counted_pairs if p is not None}
    times = sorted(c for i, (c, _) in enumerate(pair_ms) if i >= warmup and i not in skip and c is not None)
    if len(times) < max(least, 2):
        return None
    q = statistics.quantiles(times, n=100, method="inclusive")
    lo, hi = (times[0] if band[0] <= 0 else q[round(band[0] * 100) - 1],
              times[-1] if band[1] >= 1 else q[round(band[1] * 100) - 1])
    return [round(lo, 5), round(hi, 5)]


def pass_tie_runs(pass_ms: list[list[float]], pass_first_ms: list[list[float]] | None) -> list[list[float]]:
    """The runs each hardware pass is tied by (tie_to_timed_run): its runs made first in their pair
    (`pass_first_ms`), or all of its runs where it has none. The second run of a pair is slowed by
    the first at the H200's power cap (the attention-backward expert at S=8192: 30-35 ms second
    against 28.7-30.4 first, 2026-12-04), by how much depending on how hot the card is, which
    changes from pass to pass as the session goes on; the first run is not (28.7-30.4 ms from 176 W
    to 686 W). A kernel that takes another path in a pass takes it at both places (the counts sum
    both), so tying the first places loses nothing."""
    first = pass_first_ms or []
    return [f if k < len(first) and (f := first[k]) else runs for k, runs in enumerate(pass_ms)]


def tie_to_timed_run(credit: WorkloadCredit, timed_ms: float | None) -> None:
    """Withdraw the credit of counted runs that were not the timed kernel, in place. In process with
    every timed run counted (tools.counted, `pass_ms`): the counts are the timed runs', so what is
    left to tie is each hardware pass against the others: the median of a pass's runs must lie
    within SAME_RUN_RATIO (+ SAME_RUN_SLACK_MS), both ways, of the range of the other passes' runs
    (`pass_band_ms`; of the timed median where they are too few). A kernel that took another path in
    one pass (each pass reads other counters) must take it at the other path's speed. Otherwise each
    counted run's kernel time (the in-process check's runs made after the timed ones, `run_ms`; else
    the one profiled run, `kernel_ms`) is held so to the workload's other timed runs (`tie_band_ms`,
    timed_band: their range) where the worker measured it, else to the timed median. Slower: the
    credited path is not the timed one. Faster: the timed runs took a slower path than the one whose
    instructions were counted. `timed_ms` None: the workload was not timed, so no speed is claimed
    and nothing is tied."""
    if credit.status != "ok" or timed_ms is None:
        return
    credit.timed_ms = timed_ms
    if credit.pass_ms:  # (each pass's runs first in their pair: pass_tie_runs)
        bands = credit.pass_band_ms if len(credit.pass_band_ms) == len(credit.pass_ms) else [[]] * len(credit.pass_ms)
        runs = [(f"hardware pass {k + 1}", f"hardware pass {k + 1}'s timed runs took (median)", "the other passes' runs",
                 ms, band) for k, (ms, band) in enumerate(zip(credit.pass_ms, bands))]
    else:
        runs = [(who, f"{who}'s kernels took", "the other timed runs", ms, credit.tie_band_ms) for who, ms in (
            (f"counted run {credit.counted_from + k}" if credit.counted_from is not None else "the counted run", ms)
            for k, ms in enumerate(credit.run_ms))]
        runs = runs or [("the profiled run", "the profiled run's kernels took", "the other timed runs", credit.kernel_ms,
                         credit.tie_band_ms)]
    why = None
    for who, what, others, ms, band in runs:
        if len(band) == 2:
            lo, hi = band
            against = f"{others} {lo:.4g}-{hi:.4g} ms (their range)"
        else:
            lo = hi = timed_ms
            against = f"the timed runs {timed_ms:.4g} ms (median)"
        if ms is None or (isinstance(ms, float) and math.isnan(ms)):
            why = f"{who}'s kernel time was not measured, so it cannot be tied to the timed runs"
        elif ms > SAME_RUN_RATIO * hi + SAME_RUN_SLACK_MS:
            why = (f"{what} {ms:.4g} ms, {against}: "
                   "the kernel that was timed is not the one whose instructions were counted")
        elif ms < lo / SAME_RUN_RATIO - SAME_RUN_SLACK_MS:
            why = (f"{what} {ms:.4g} ms, {against}: "
                   "the timed runs took a slower path than the one whose instructions were counted")
        if why:
            break
    if why is None:
        return
    for f, carried in credit.carries.items():
        if carried:
            credit.carries[f] = False
            credit.notes[f] = why
