"""Result types of every stage a candidate goes through, in one place.

compile -> CompileResult, inspect -> InspectResult, evaluate -> EvalResult (which holds
the others). Every stage returns one of these and never raises for a bad kernel: a bad
kernel is data. A stage that could not run has status "skipped" and a reason; it never
counts as passed.

A fault of the harness itself (the toolchain missing or broken, the GPU worker failing
to start or failing on its own, the profiler failing) is not the candidate's: it sets
`infra_error`, the candidate gets no verdict, the model is never told, and metrics leave
it out (an agent run stops with stop_reason "infra_error" and can be resumed).
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from tools.profile import Profile

Status = Literal["ok", "failed", "skipped"]


class Diagnostic(BaseModel):
    """One line of compiler output (NVRTC or ptxas), parsed."""

    tool: Literal["nvrtc", "ptxas", "harness"]
    severity: Literal["error", "warning", "info"]
    code: str | None = None  # ptxas message code, e.g. "C7515"
    message: str
    line: int | None = None  # line in the user's source file, where it could be mapped
    ptx_line: int | None = None  # line in the PTX that ptxas saw
    kernel: str | None = None  # kernel the line is about, when ptxas says

    def render(self) -> str:
        where = f"line {self.line}: " if self.line else (f"ptx line {self.ptx_line}: " if self.ptx_line else "")
        code = f" ({self.code})" if self.code else ""
        return f"{self.tool} {self.severity}{code}: {where}{self.message}"


class KernelResources(BaseModel):
    """ptxas -v figures for one kernel."""

    registers: int | None = None
    shared_bytes: int = 0  # static shared memory
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    constant_bytes: int = 0


class CompileResult(BaseModel):
    status: Status
    arch: str
    language: Literal["cuda", "ptx"]
    error: str | None = None  # one-line summary when status != ok
    ptx: str | None = None
    cubin: bytes | None = Field(default=None, exclude=True, repr=False)
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    kernels: dict[str, KernelResources] = Field(default_factory=dict)
    seconds: dict[str, float] = Field(default_factory=dict)  # {"nvrtc": .., "ptxas": ..}
    toolchain: dict[str, str] = Field(default_factory=dict)  # tool -> version
    # kernel name -> PTX entry, for kernels with C++ linkage (mangled by NVRTC); extern "C" kernels need none
    symbols: dict[str, str] = Field(default_factory=dict)
    # the toolchain failed, not the source (ptxas or NVRTC missing or unable to run, the compile
    # sandbox unable to start): status is "failed", but no verdict may be drawn from it
    infra_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


class FeatureVerdict(BaseModel):
    present: bool
    opcodes: dict[str, int] = Field(default_factory=dict)  # proving SASS opcodes -> count


class KernelSass(KernelResources):
    opcodes: dict[str, int] = Field(default_factory=dict)  # base opcode (no modifiers) -> count
    instructions: int = 0
    # pc offset -> full opcode of each TMA-pipe instruction (UTMA*, UBLK*): among them tensor-map loads
    # (UTMALDG) and plain bulk copies from global memory (UBLKCP.S.G), which the load counters lump
    # together; the executed check counts these sites one by one where both kinds may run
    # (tools.credit.exact_count_sites)
    tma_sites: dict[int, str] = Field(default_factory=dict)


class InspectResult(BaseModel):
    status: Status
    reason: str | None = None
    arch: str
    kernels: dict[str, KernelSass] = Field(default_factory=dict)
    features: dict[str, FeatureVerdict] = Field(default_factory=dict)  # whole module
    flags: dict[str, bool] = Field(default_factory=lambda: {"wgmma_serialized": False, "setmaxnreg_ignored": False})
    flag_evidence: dict[str, str] = Field(default_factory=dict)  # flag -> why it was raised
    tool: str | None = None  # "cuobjdump 13.0.88" / "nvdisasm ..."
    # Kernels in the module that no launch runs: listed in `kernels`, but their instructions
    # do not count for `features` or the SASS-derived flags.
    uncounted_kernels: list[str] = Field(default_factory=list)
    # no usable disassembler (missing, or failing on ptxas's own cubin): the toolchain's fault,
    # no verdict on the features may be drawn (module docstring)
    infra_error: str | None = None

    def feature_present(self, name: str) -> bool:
        v = self.features.get(name)
        return bool(v and v.present)

    def missing(self, requested: list[str]) -> list[str]:
        return [f for f in requested if not self.feature_present(f)]


class ElementSample(BaseModel):
    """One failing element: where, what the kernel wrote, what the reference has."""

    index: list[int]
    got: float
    expected: float


class Mismatch(BaseModel):
    """How one output compared with the reference."""

    output: str
    max_abs_err: float
    max_rel_err: float
    mismatch_frac: float
    nan_count: int = 0
    first_mismatch: list[int] | None = None  # multi-index of the first failing element
    got: float | None = None
    expected: float | None = None
    rel_l2: float | None = None  # ||out - ref|| / ||ref|| over what was compared
    rel_l2_bound: float | None = None  # the task's aggregate bound for this output, if any
    row_ratio: float | None = None  # worst row's error / its allowance (Tolerance.rows; > 1 fails)
    bad_rows: int | None = None  # rows over their allowance
    worst_row: list[int] | None = None  # index of the worst row (the output's dims without the row's own)
    # a few failing elements (the first, the worst, spread over the rest): a pattern shows at sight
    samples: list[ElementSample] = Field(default_factory=list)
    passed: bool
    # the elementwise scale s the figures above are relative to (tools.correctness.judge_outputs):
    # "ref" |ref|; "terms" max(|ref|, rss) everywhere; "terms_rows" max(|ref|, rss) on the rows that
    # failed against |ref| (rss less a margin) and |ref| elsewhere. None: not recorded (older results)
    judged_against: str | None = None

    def describe(self) -> str:
        """One line on why this output failed."""
        if self.rel_l2_bound is not None and self.rel_l2 is not None and self.rel_l2 > self.rel_l2_bound \
                and self.first_mismatch is None:
            return (f"output {self.output!r}: relative L2 error {self.rel_l2:.3g} exceeds the bound "
                    f"{self.rel_l2_bound:g} (every element is within the elementwise tolerance, the whole is not)")
        if self.bad_rows and self.first_mismatch is None:
            return (f"output {self.output!r}: {self.bad_rows} row(s) off (the worst, at {self.worst_row}, errs by "
                    f"{self.row_ratio:.3g}x its row's allowance; every element is within the elementwise tolerance)")
        where = (f"; first at {self.first_mismatch}: got {self.got:.6g}, expected {self.expected:.6g}"
                 if self.first_mismatch is not None and self.got is not None and self.expected is not None else "")
        l2 = f", relative L2 error {self.rel_l2:.3g}" if self.rel_l2 is not None else ""
        return f"output {self.output!r}: {self.mismatch_frac:.2%} of elements off (max abs err {self.max_abs_err:.3g}{l2}){where}"


class Timing(BaseModel):
    median_ms: float
    iqr_ms: float
    cv: float
    runs: int

    @property
    def spread(self) -> float:
        return self.iqr_ms / self.median_ms if self.median_ms else math.nan


# Reasons a workload can fail; feedback and reports key on these names.
FailReason = Literal[
    "incorrect", "nan_output", "unwritten_output", "out_of_bounds_write", "input_modified",
    "timeout", "cuda_error", "launch_error", "manifest_error", "wrong_after_first_call",
    "worker_crash", "oom",
    "wrong_in_timed_run",  # a timed run's output failed its check (every timed run is judged)
    "implausible",  # faster than the GPU's physical ceiling: no speedup is credited
    "harness_error",  # the evaluator itself failed on this candidate (its message in detail)
]
# Reasons that mean "ran, and the numbers are wrong" (as opposed to a crash, hang or bad manifest)
WRONG_NUMBERS = frozenset({"incorrect", "nan_output", "unwritten_output", "wrong_after_first_call",
                           "wrong_in_timed_run"})
# Verdicts reached by running the kernel to the end: the executed check still counts what such a
# kernel executed (a fault, a hang or the manifest decided the others: nothing to count)
CREDITABLE = WRONG_NUMBERS | {"implausible"}
# The judge's own rules, dated: a change to how a verdict is drawn (what is counted, on which runs,
# what it is tied to) is another judge, so a run judged under other rules is not resumed under these
# (agent.run.toolchain_change). 2026-12-02: instruction credit read on the counted runs that follow
# the timed runs (CUPTI user replay, one per pass), every one judged and tied to the timed median.
# 2026-12-03: those counted runs made for every workload in one profiler session, after the last
# workload's timed runs (each workload's module instance and workspace kept until then).
RULES_VERSION = "2026-12-03"


class WorkloadResult(BaseModel):
    workload: str
    split: Literal["visible", "held_out"]
    axes: dict[str, int]
    status: Literal["passed", "failed", "skipped"]
    reason: FailReason | None = None
    detail: str | None = None  # e.g. the CUDA error name, or the manifest field at fault
    outputs: list[Mismatch] = Field(default_factory=list)
    timing: Timing | None = None
    baseline: Timing | None = None
    baseline_name: str | None = None  # e.g. "cublas", "sdpa:cudnn"
    speedup: float | None = None  # median of the per-pair ratios baseline/candidate (paired timing)
    speedup_ci: tuple[float, float] | None = None  # bootstrap 95% interval of that median
    tflops: float | None = None
    gbps: float | None = None  # the task's compulsory bytes / median time
    # roofline (tools/roofline.py): the speed-of-light time, which roof bounds it, and the
    # SOL-ExecBench score 1/(1 + (T - T_SOL)/(T_lib - T_SOL)): 1 at the roofline, 0.5 at the library
    sol_ms: float | None = None
    roofline_bound: Literal["compute", "memory"] | None = None
    sol_score: float | None = None
    seeds: list[int] = Field(default_factory=list)  # input seeds of the correctness checks, in order
    # the timed phase: its secret seed (inputs, run counts and sampled rows derive from it), how
    # many runs were timed and warmed up (drawn at random), and how many were judged whole
    timing_seed: int | None = None
    timed_runs: int = 0
    warmup_runs: int = 0
    full_checks: int = 0
    # why the timed pairs ended (tools.timing.paired): "planned" (the drawn count, planned_runs),
    # "interval" (tight enough to rank a kernel far from the library) or "cap" (the per-workload
    # time cap, far from the library); speedup_ci is the interval it left
    timing_stop: str | None = None
    planned_runs: int = 0
    gpu_state: dict[str, dict[str, float]] = Field(default_factory=dict)  # "start"/"end" -> sm_mhz, temp_c, power_w
    # wall seconds in the worker: "verify" (the seeded checks), "baseline" (choosing/building the
    # library side), "timed" (the paired runs, inputs and judging included), "judge" (judging the
    # candidate's runs, inside "timed")
    phase_s: dict[str, float] = Field(default_factory=dict)
    # the executed check's in-process run (tools.counted.defer_counted): status ("ran", "failed",
    # "unavailable"), reason, runs, profiled_at, passes, profile_s, launches [{name, metrics}]
    credit: dict | None = None


class WorkloadCredit(BaseModel):
    """The executed check on one judged workload: its counted runs (in process: one per CUPTI
    pass, right after the timed runs, tools.counted.defer_counted; under Nsight Compute: one
    profiled run drawn among its credit runs, tools.counted.run_credit), counts, work shares and
    verdict, and the tie of every counted run's kernel time to the workload's timed median."""

    workload: str
    split: str = "visible"
    status: Status
    reason: str | None = None
    profiled_at: int | None = None  # Nsight Compute: which credit run was profiled (1-based), drawn per evaluation
    counted_from: int | None = None  # in process: the first counted run (1-based, after the timed runs); the last is `runs`
    runs: int = 0  # credit runs on this workload
    counts: dict[str, int] = Field(default_factory=dict)
    executed: dict[str, bool] = Field(default_factory=dict)
    shares: dict[str, float | None] = Field(default_factory=dict)
    carries: dict[str, bool] = Field(default_factory=dict)
    notes: dict[str, str] = Field(default_factory=dict)
    kernel_ms: float | None = None  # the counted runs' median (in process) or the profiled run's kernels (Nsight Compute)
    run_ms: list[float] = Field(default_factory=list)  # each counted run of a hardware pass, timed as timed runs are: all tied
    # what every run_ms is tied to: [fastest, slowest] of the workload's other timed runs
    # (tools.credit.timed_band; empty: the timed median)
    tie_band_ms: list[float] = Field(default_factory=list)
    instrumented_ms: list[float] = Field(default_factory=list)  # the SASS-patched pass's run: instrumented code, not tied
    timed_ms: float | None = None  # the workload's timed median, when it was timed
    # the sums behind the verdict (tools.credit.WORK_SUMS: wgmma_flops, other_flops, simt_flops, uniform_flops,
    # reduction_flops, wgmma_of_all_math, tma_bytes, other_read_bytes, ...): how near each limit the counted runs stood
    work: dict[str, float] = Field(default_factory=dict)


class ExecutedCheck(BaseModel):
    """Executed-instruction counts from Nsight Compute, per requested feature and per launch.

    `executed[f]`: feature f ran at least once in a launched kernel (the seed paper's
    criterion). `carries[f]`: f did the task's work: wgmma/tcgen05 issued >= 90% of the
    task's matrix FLOPs, TMA moved >= half of the bytes the task must read. `shares[f]`
    is the measured fraction behind `carries` (None where it could not be measured)."""

    status: Status
    reason: str | None = None
    counts: dict[str, int] = Field(default_factory=dict)  # feature -> executed instructions, all launches
    executed: dict[str, bool] = Field(default_factory=dict)
    per_kernel: dict[str, dict[str, int]] = Field(default_factory=dict)  # launched kernel -> feature -> count
    shares: dict[str, float | None] = Field(default_factory=dict)  # feature -> measured share of the task's work
    carries: dict[str, bool] = Field(default_factory=dict)
    notes: dict[str, str] = Field(default_factory=dict)  # feature -> why it executed but did not carry the work
    metrics: dict[str, float] = Field(default_factory=dict)  # raw totals behind the shares (names in METHODOLOGY)
    # when a profile was asked for: kernel -> metric -> value, from the same ncu pass
    kernel_metrics: dict[str, dict[str, float]] = Field(default_factory=dict)
    profile: Profile | None = None  # built from kernel_metrics (tools/profile.py); None: not asked for
    # the candidate's timed median on the first visible workload, when it was timed: each profiled
    # run's kernel time must be within tools.ncu.SAME_RUN_RATIO of its workload's timed median
    timed_ms: float | None = None
    # every judged workload's own credit; the fields above combine them: a feature is executed and
    # carries only where it does on every credited workload, `shares` is the smallest, `notes` name
    # the workload that withheld credit; counts are summed, metrics/per_kernel/profile are the first
    # visible workload's
    workloads: list[WorkloadCredit] = Field(default_factory=list)
    # where the check's wall time went after the timed runs: runs (the profiled process, from the
    # hand-over to its end), worker_ready (its start-up, overlapped with the evaluation), import;
    # in process: counted_runs and counted_runs.<part> (tools.counted.COST_PARTS)
    phase_s: dict[str, float] = Field(default_factory=dict)


class SanitizeResult(BaseModel):
    status: Status
    reason: str | None = None
    errors: list[str] = Field(default_factory=list)
    # compute-sanitizer itself could not run (not loadable, killed): no memcheck verdict (module docstring)
    infra_error: str | None = None


class EvalResult(BaseModel):
    task: str
    arch: str
    compile: CompileResult
    inspect: InspectResult
    requested_features: list[str] = Field(default_factory=list)
    run_status: Status = "skipped"  # correctness + timing on a GPU
    run_reason: str | None = None
    workloads: list[WorkloadResult] = Field(default_factory=list)
    executed: ExecutedCheck = Field(default_factory=lambda: ExecutedCheck(status="skipped", reason="not requested"))
    sanitize: SanitizeResult = Field(default_factory=lambda: SanitizeResult(status="skipped", reason="not requested"))
    speedup: float | None = None  # geometric mean over timed visible workloads
    speedup_ci: tuple[float, float] | None = None  # from the workloads' bootstrap intervals (geometric mean of ends)
    speedup_spread: float | None = None  # geometric std factor over workloads
    speedup_held_out: float | None = None  # geometric mean over timed held-out workloads
    sol_score: float | None = None  # geometric mean of the visible workloads' SOL scores (tools/roofline.py)
    gpu: str | None = None
    device: str | None = None  # which GPU ran it: its CUDA_VISIBLE_DEVICES id (None: nothing ran)
    seconds: float = 0.0
    # wall seconds per stage of this evaluation, where its time goes: compile (NVRTC + ptxas),
    # workloads (every worker round trip), inspect_wait (SASS inspection left after the runs it
    # overlaps), executed (the ncu pass), sanitize, worker_start (the GPU's worker started, or
    # found up), queue_wait (waiting for the GPU another evaluation held), counted_runs (the
    # credit op less its timed phases, inside workloads) and counted_runs.<part> (where that went:
    # tools.counted.COST_PARTS); agent/cost.py reads them
    phase_s: dict[str, float] = Field(default_factory=dict)
    # the GPU side failed, not the candidate (a worker that cannot start on a GPU machine, a
    # worker error); the toolchain's faults are compile.infra_error and inspect.infra_error
    harness_fault: str | None = None

    @property
    def infra_error(self) -> str | None:
        """Why this candidate has no verdict because the harness failed (module docstring), or None."""
        return (self.compile.infra_error or self.inspect.infra_error or self.harness_fault
                or self.sanitize.infra_error)

    # --- the benchmark's verdicts (DESIGN.md, Metrics) ---
    @property
    def compiled(self) -> bool:
        return self.compile.ok

    @property
    def arch_ok(self) -> bool:
        """Requested features present in SASS and wgmma not serialized."""
        if not self.compiled or self.inspect.status != "ok":
            return False
        if self.inspect.missing(self.requested_features):
            return False
        return not self.inspect.flags.get("wgmma_serialized", False)

    @property
    def arch_executed_any(self) -> bool | None:
        """Every requested feature executed at least once (the seed paper's criterion); None: not checked."""
        if self.executed.status != "ok":
            return None
        return all(self.executed.executed.get(f, False) for f in self.requested_features)

    @property
    def arch_executed(self) -> bool | None:
        """Every requested feature executed and carried the task's work; None: not checked."""
        if self.executed.status != "ok":
            return None
        return all(self.executed.carries.get(f, False) for f in self.requested_features)

    def split_correct(self, split: str) -> bool | None:
        ws = [w for w in self.workloads if w.split == split]
        if self.run_status != "ok" or not ws:
            return None
        return all(w.status == "passed" for w in ws)

    @property
    def correct(self) -> bool | None:
        """None when correctness was not checked (no GPU); False if any visible workload failed."""
        return self.split_correct("visible")

    @property
    def implausible(self) -> str | None:
        """Why a workload's throughput is above the physical ceiling, if one is."""
        return next((w.detail for w in self.workloads if w.reason == "implausible"), None)

    @property
    def correct_with_arch(self) -> bool | None:
        """Correct, the features in the SASS, and executed carrying the work. None when
        correctness or the executed check could not run ("unverified"): never true unverified."""
        c = self.correct
        if c is None:
            return None
        if not c or not self.arch_ok or self.arch_executed is False:
            return False
        return True if self.arch_executed else None

    def verdicts(self) -> dict[str, object]:
        """The benchmark's verdicts. `arch_sass` is the static verdict; the target
        architecture itself is `EvalResult.arch` (never mix the two)."""
        return {
            "compiled": self.compiled, "arch_sass": self.arch_ok, "arch_executed_any": self.arch_executed_any,
            "arch_executed": self.arch_executed, "correct": self.correct,
            "correct_held_out": self.split_correct("held_out"), "correct_with_arch": self.correct_with_arch,
            "speedup": self.speedup, "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None,
            "speedup_held_out": self.speedup_held_out, "sol_score": self.sol_score,
        }
