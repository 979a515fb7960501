"""A fixed catalogue of evaluations and candidates that reaches every text agent/feedback.py can
emit, rendered; its digest; and asked_hash, the hash a run records and resumes only under.

The feedback is the prompt of every turn after the first. A run resumes only where it would be
told what it was told before (agent.run.inputs_change), so the hash must change exactly when a
word of the feedback does: it is taken over what these cases render, not over the code that
renders them (a refactor that says the same leaves it alone; no version to remember to bump).
tests/test_mutation_feedback.py pins the same texts (tests/fixtures/feedback_texts.json) and
checks that every `*_section` and `*_line` function of agent/feedback.py is reached from here.
A new text belongs in this catalogue, or that check fails.
"""
from __future__ import annotations

import hashlib
import typing

from agent import feedback as fb
from agent import prompts
from agent.trajectory import CandidateRecord, Verdicts
from tools.profile import KernelProfile, Profile
from tools.results import (CompileResult, Diagnostic, ElementSample, EvalResult, ExecutedCheck, FailReason,
                           FeatureVerdict, InspectResult, KernelResources, KernelSass, Mismatch, SanitizeResult,
                           Timing, WorkloadCredit, WorkloadResult)


# ---------------------------------------------------------------------------------------
# Builders (the tests of agent/feedback.py build their cases with these too)
# ---------------------------------------------------------------------------------------
def compiled(language: str = "cuda", **kw) -> CompileResult:
    return CompileResult(status="ok", arch="sm_90a", language=language, **kw)


def inspected(*present: str, **kw) -> InspectResult:
    return InspectResult(status="ok", arch="sm_90a",
                         features={f: FeatureVerdict(present=True, opcodes={"HGMMA": 8, "UTMALDG": 2}) for f in present},
                         **kw)


def wl(name: str, status: str, split: str = "visible", reason: str | None = None, **kw) -> WorkloadResult:
    return WorkloadResult(workload=name, split=split, axes={"M": 128, "N": 256}, status=status, reason=reason, **kw)


def ev(workloads=(), run_status: str = "ok", requested=("wgmma", "tma"), comp: CompileResult | None = None,
       insp: InspectResult | None = None, executed: ExecutedCheck | None = None, **kw) -> EvalResult:
    extra = {"executed": executed} if executed is not None else {}
    return EvalResult(task="gemm_n7168_k5120", arch="sm_90a", requested_features=list(requested),
                      compile=comp or compiled(), inspect=insp or inspected("wgmma", "tma"),
                      run_status=run_status, workloads=list(workloads), **extra, **kw)


CARRIED = ExecutedCheck(status="ok", executed={"wgmma": True, "tma": True}, carries={"wgmma": True, "tma": True})


def record(outcome: str, speedup: float | None = None, correct: bool | None = None, verified: bool = False,
           turn: int = 1, sample: int = 0, **kw) -> CandidateRecord:
    return CandidateRecord(turn=turn, sample=sample, path=f"candidates/{turn}-{sample}", outcome=outcome,
                           verdicts=Verdicts(speedup=speedup, correct=correct, compiled=outcome != "compile_error"),
                           verified=verified, **kw)


# ---------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------
def _diag(i: int, severity: str = "error", tool: str = "nvrtc", **kw) -> Diagnostic:
    return Diagnostic(tool=tool, severity=severity, message=f"message {i}", line=i + 1, **kw)


def _mismatch(**kw) -> Mismatch:
    base = dict(output="C", max_abs_err=0.25, max_rel_err=0.5, mismatch_frac=0.125, passed=False)
    return Mismatch(**{**base, **kw})


def evaluations() -> dict[str, EvalResult]:
    """One evaluation per path through the renderer."""
    ptx = "\n".join(f"  instr {i};" for i in range(1, 9)) + "\n\n"
    resources = {"gemm_kernel": KernelSass(registers=168, shared_bytes=1024, stack_frame=16, spill_stores=8,
                                           spill_loads=4)}
    many = [_diag(i) for i in range(33)] + [_diag(90, "warning", "ptxas")]
    long_line = "  mov.b32 %r1, " + "1" * 200 + ";"
    edge_ptx = f"  first;\n{long_line}\n  last;"  # no blank line at the end
    resources2 = {**resources, "epilogue": KernelSass(registers=32)}
    timed = Timing(median_ms=2.0, iqr_ms=0.1, cv=0.02, runs=40)
    passed_timed = wl("W0", "passed", outputs=[_mismatch(max_abs_err=0.003, passed=True)], timing=timed,
                      baseline=Timing(median_ms=2.5, iqr_ms=0.1, cv=0.02, runs=40), baseline_name="cublas",
                      speedup=1.25, tflops=612.5, sol_ms=1.5, roofline_bound="compute", sol_score=0.8)
    wrong = _mismatch(first_mismatch=[3, 7], got=2.0, expected=4.0, nan_count=5, rel_l2=0.03, rel_l2_bound=0.005,
                      samples=[ElementSample(index=[3, 7], got=2.0, expected=4.0),
                               ElementSample(index=[9, 1], got=1.0, expected=0.0),
                               ElementSample(index=[12, 2], got=float("nan"), expected=1.0)])
    return {
        "compile_errors_nvrtc": ev(comp=CompileResult(status="failed", arch="sm_90a", language="cuda",
                                                      diagnostics=many)),
        "compile_error_without_diagnostics": ev(comp=CompileResult(status="failed", arch="sm_90a", language="ptx",
                                                                   error="ptxas exited 255")),
        "compile_error_bare": ev(comp=CompileResult(status="failed", arch="sm_90a", language="ptx")),
        "compile_error_ptx_lines": ev(comp=CompileResult(
            status="failed", arch="sm_90a", language="cuda", ptx=ptx,
            diagnostics=[Diagnostic(tool="ptxas", severity="error", message="bad operand", ptx_line=3),
                         Diagnostic(tool="ptxas", severity="error", message="blank", ptx_line=9),
                         Diagnostic(tool="ptxas", severity="error", message="far", ptx_line=99),
                         Diagnostic(tool="ptxas", severity="error", message="at PTX line 0", ptx_line=0),
                         Diagnostic(tool="ptxas", severity="warning", code="C1", message="mapped", line=4,
                                    ptx_line=5)])),
        "compile_error_ptx_edges": ev(comp=CompileResult(  # the first, a long and the last PTX line quoted
            status="failed", arch="sm_90a", language="cuda", ptx=edge_ptx,
            diagnostics=[Diagnostic(tool="ptxas", severity="error", message=f"m{i}", ptx_line=i) for i in (0, 1, 2, 3, 4)])),
        "compile_errors_thirty": ev(comp=CompileResult(status="failed", arch="sm_90a", language="cuda",
                                                       diagnostics=[_diag(i) for i in range(30)])),
        "compile_error_ptx_mention": ev(comp=CompileResult(
            status="failed", arch="sm_90a", language="cuda",
            diagnostics=[Diagnostic(tool="ptxas", severity="error", message="see PTX line 4", line=2)])),
        "compile_error_ptx_source": ev(comp=CompileResult(
            status="failed", arch="sm_90a", language="ptx", ptx=ptx,
            diagnostics=[Diagnostic(tool="ptxas", severity="error", message="bad", ptx_line=3)])),
        "everything_wrong": ev(
            [wl("W0", "failed", reason="incorrect", detail="2 outputs", outputs=[wrong, _mismatch(output="D", passed=True)]),
             wl("W1", "failed", reason="incorrect", outputs=[_mismatch(got=1.0, expected=0.0),
                                                              _mismatch(output="D", rel_l2=0.2),  # no bound: no L2 part
                                                              _mismatch(output="E", rel_l2_bound=0.1, got=1.0),
                                                              _mismatch(output="F", expected=1.0)]),
             wl("W2", "skipped", detail="an earlier workload crashed"), wl("W3", "skipped"),
             wl("W4", "failed", reason="timeout"),
             wl("H0", "failed", "held_out", "incorrect"), wl("H1", "failed", "held_out", "nan_output"),
             wl("H2", "failed", "held_out", "cuda_error"), wl("H3", "passed", "held_out"),
             wl("H4", "failed", "held_out", None), wl("H5", "skipped", "held_out"),
             *(wl(f"H{i}", "failed", "held_out", "timeout") for i in (6, 7, 8))],  # the most frequent class first
            comp=compiled(diagnostics=[Diagnostic(tool="ptxas", severity="info", code="C7515", message="serialized",
                                                  ptx_line=2),
                                       Diagnostic(tool="ptxas", severity="info", message="no code, not shown"),
                                       Diagnostic(tool="nvrtc", severity="warning", message="unused", line=3)],
                          ptx=ptx, kernels={"ignored": KernelResources(registers=1)}),
            insp=inspected("wgmma", kernels=resources2, uncounted_kernels=["helper", "other"],
                           flags={"wgmma_serialized": True, "setmaxnreg_ignored": True},
                           flag_evidence={"wgmma_serialized": "C7515 at ptx line 2"}),
            requested=("clusters", "wgmma", "tma"),  # a missing one first: the features after it are still told
            executed=ExecutedCheck(status="ok", executed={"wgmma": True}, counts={"wgmma": 0}),
            sanitize=SanitizeResult(status="failed", errors=[f"Invalid __global__ read {i}" for i in range(11)])),
        "correct_and_timed": ev(
            [passed_timed, wl("W1", "passed", timing=Timing(median_ms=4.0, iqr_ms=0.4, cv=0.1, runs=20)),
             wl("H0", "passed", "held_out")],
            comp=compiled(kernels={"from_ptxas": KernelResources(registers=None, shared_bytes=2048)}),
            insp=inspected("wgmma", "tma"), speedup=0.8, sol_score=0.75, executed=CARRIED,
            sanitize=SanitizeResult(status="ok")),
        "executed_without_carrying": ev(
            [wl("W0", "passed", timing=timed, speedup=1.0, sol_ms=0.5, roofline_bound="memory",
                baseline=Timing(median_ms=2.0, iqr_ms=0.1, cv=0.02, runs=40))],  # a baseline without a name
            requested=("wgmma", "tma", "tcgen05"), speedup=1.0,  # exactly the library's: no "above 1" note
            insp=inspected("wgmma", "tma", "tcgen05"),
            executed=ExecutedCheck(status="ok", executed={"wgmma": True, "tma": True, "tcgen05": True},
                                   carries={"wgmma": False, "tma": False, "tcgen05": True},
                                   shares={"wgmma": 0.42, "tma": None},
                                   notes={"tma": "cp.async read 3x the input"}),
            sanitize=SanitizeResult(status="skipped", reason="compute-sanitizer not found in X.")),
        "never_executed": ev([wl("W0", "passed", timing=timed)], insp=inspected("wgmma", "tma"),  # timed, no mean
                             executed=ExecutedCheck(status="ok", executed={"wgmma": True, "tma": False},
                                                    counts={"wgmma": 12}, carries={"wgmma": True}),
                             sanitize=SanitizeResult(status="failed")),
        # combined over workloads: tma ran on one workload (3 instructions) but not on another, so not executed
        "executed_on_some_workloads": ev([wl("W0", "passed")], insp=inspected("wgmma", "tma"),
                                         executed=ExecutedCheck(status="ok", executed={"wgmma": True, "tma": False},
                                                                counts={"wgmma": 12, "tma": 3}, carries={"wgmma": True})),
        "carries_not_recorded": ev([wl("W0", "passed")], insp=inspected("wgmma", "tma"),
                                   executed=ExecutedCheck(status="ok", executed={"wgmma": True, "tma": True},
                                                          carries={"wgmma": True}),
                                   sanitize=SanitizeResult(status="failed", errors=[f"e{i}" for i in range(8)])),
        "memcheck_skipped_without_reason": ev([wl("W0", "passed")], sanitize=SanitizeResult(status="skipped")),
        "inspection_skipped": ev(run_status="skipped", run_reason="no GPU on this machine X.",
                                 insp=InspectResult(status="skipped", arch="sm_90a", reason="cuobjdump not found")),
        "inspection_skipped_unknown": ev(run_status="skipped", insp=InspectResult(status="skipped", arch="sm_90a")),
        "nothing_requested": ev([wl("W0", "passed")], requested=(), speedup=float("nan")),
        "manifest_wrong": ev([wl("W0", "failed", reason="manifest_error", detail="grid")], run_status="failed",
                             run_reason="grid.x is 0; the manifest says M/128"),
        "manifest_wrong_no_reason": ev(run_status="failed"),
        # the credit a held-out workload withheld, by kind: its counts and notes (its figures) are not told
        "credit_withheld_on_held_out": ev(
            [wl("W0", "passed"), wl("H0", "passed", "held_out"), wl("H1", "passed", "held_out")],
            executed=ExecutedCheck(
                status="ok", executed={"wgmma": True, "tma": False}, carries={"wgmma": False, "tma": False},
                counts={"wgmma": 70, "tma": 30}, shares={"wgmma": 7.3, "tma": 1.0},
                notes={"wgmma": "held-out workload #1 (counted runs 3-4): wgmma issued 7.3x X",
                       "tma": "held-out workload #2 (counted runs 3-4): tma did not execute"},
                workloads=[WorkloadCredit(workload="W0", status="ok", counts={"wgmma": 40, "tma": 20},
                                          executed={"wgmma": True, "tma": True}, carries={"wgmma": True, "tma": True},
                                          shares={"wgmma": 1.0, "tma": 1.0}),
                           WorkloadCredit(workload="H0", split="held_out", status="ok", counts={"wgmma": 20, "tma": 10},
                                          executed={"wgmma": True, "tma": True}, carries={"wgmma": False, "tma": True},
                                          shares={"wgmma": 7.3, "tma": 1.0}, notes={"wgmma": "wgmma issued 7.3x X"}),
                           WorkloadCredit(workload="H1", split="held_out", status="ok", counts={"wgmma": 10},
                                          executed={"wgmma": True, "tma": False},
                                          carries={"wgmma": True, "tma": False})])),
        # memcheck on an evaluation of held-out workloads only: its report is not told
        "memcheck_on_held_out_only": ev([wl("H0", "failed", "held_out", "out_of_bounds_write")],
                                        sanitize=SanitizeResult(status="failed", errors=["block (69,0,0) X"])),
        # every reason a held-out workload can fail for, so every class name HELD_OUT_CLASSES gives is told
        "held_out_every_reason": ev([wl("W0", "passed"), wl("H0", "passed", "held_out")]
                                    + [wl(f"H{r}", "failed", "held_out", r) for r in typing.get_args(FailReason)]),
    }


def profiles() -> dict[str, EvalResult]:
    """The --profile-feedback block: a profile, a reason there is none, or nothing for wrong numbers."""
    ok = ev([wl("W0", "passed")], executed=CARRIED.model_copy(update={"profile": Profile(time_ms=1.5, kernels=[])}))
    return {
        "profile": ok,
        "profile_not_collected": ev([wl("W0", "passed")], executed=CARRIED),
        "profile_skipped": ev([wl("W0", "passed")], executed=ExecutedCheck(status="skipped", reason="no ncu")),
        "profile_skipped_unknown": ev([wl("W0", "passed")], executed=ExecutedCheck(status="failed")),
        "profile_process_failed_with_held_out": ev(
            [wl("W0", "passed"), wl("H0", "passed", "held_out")],
            executed=ExecutedCheck(status="skipped", reason="the profiled process failed (X): Y; ncu: rows 70")),
        "profile_skipped_held_out_uncredited": ev(
            [wl("W0", "passed"), wl("H0", "passed", "held_out")],
            executed=ExecutedCheck(status="skipped", reason="no ncu; held-out workload #1: at M=70 X", workloads=[
                WorkloadCredit(workload="W0", status="skipped", reason="no ncu"),
                WorkloadCredit(workload="H0", split="held_out", status="skipped", reason="at M=70 X")])),
        "profile_of_a_wrong_kernel": ev([wl("W0", "failed", reason="incorrect")], executed=CARRIED),
        "profile_of_kernels": ev([wl("W0", "passed")], executed=CARRIED.model_copy(update={"profile": _profile()})),
        "profile_of_one_kernel": ev([wl("W0", "passed")], executed=CARRIED.model_copy(update={"profile": Profile(
            time_ms=0.5, tflops=300.0, kernels=[KernelProfile(name="k", occupancy_pct=50.0, waves=2.5)])})),
    }


def _profile() -> Profile:
    """Every figure tools.profile.render can state: kernels with all, some and no figures, one wave and
    a fraction of one, and more kernels than it lists one by one."""
    full = KernelProfile(name="gemm_main", time_ms=1.2, time_share=0.8, tflops=610.0, tflops_pct=62.0,
                         dram_gbps=2100.0, dram_pct=44.0, tensor_pipe_pct=71.0, occupancy_pct=12.0,
                         theoretical_occupancy_pct=12.5, occupancy_limiter="registers and shared memory",
                         registers=168, block_size=384, grid_size=132, waves=1.0,
                         stalls=[("long scoreboard", 0.4), ("barrier", 0.2)], l2_hit_pct=88.0)
    some = KernelProfile(name="epilogue", time_share=0.19, tflops=20.0, dram_gbps=900.0, occupancy_pct=40.0,
                         grid_size=66, waves=0.5)
    return Profile(time_ms=1.5, tflops=600.0, tflops_pct=61.0, peak_tflops=989.0,
                   kernels=[full, some, KernelProfile(name="bare"), KernelProfile(name="tail", time_share=0.004),
                            KernelProfile(name="tail2", time_share=0.0)])


def texts() -> dict[str, str]:
    """Every case rendered as the model would read it, by name."""
    out, evs = {}, evaluations()
    chosen = record("incorrect", turn=3, sample=1)
    for name, e in evs.items():
        out[name] = fb.render_feedback(3, "repair", "cuda", chosen, e)
        if name in ("correct_and_timed", "everything_wrong"):
            out[name + "/require_off"] = fb.render_feedback(3, "repair", "cuda", chosen, e, require=False)
    for name, e in profiles().items():
        out[name] = fb.eval_sections(e, "cuda", profile=True)
    good = evs["correct_and_timed"]
    verified = record("correct_with_arch", 1.25, True, verified=True, turn=2)
    unverified = record("unverified", turn=2)
    others = [record("arch_missing", correct=True, turn=2, sample=1), record("compile_error", turn=2, sample=2)]
    best = record("correct_with_arch", 1.4, True, verified=True, turn=1)
    out["optimise_verified"] = fb.render_feedback(2, "optimise", "ptx", verified, good, others=others, samples=3,
                                                  max_turns=8)
    out["optimise_unverified"] = fb.render_feedback(2, "optimise", "cuda", unverified, good, max_turns=8, next_turn=6)
    out["optimise_require_off"] = fb.render_feedback(2, "optimise", "cuda", verified, good, others=others,
                                                     require=False)
    out["optimise_unverified_require_off"] = fb.render_feedback(2, "optimise", "cuda", unverified, good, require=False,
                                                                max_turns=8)
    out["two_samples"] = fb.render_feedback(2, "optimise", "cuda", verified, good, samples=2)
    out["repair_back_to_the_best"] = fb.render_feedback(4, "repair", "cuda", chosen, good, best=best, samples=1)
    out["repair_back_to_an_untimed_best"] = fb.render_feedback(4, "repair", "cuda", chosen, good,
                                                               best=record("unverified", turn=1), require=False)
    out["repair_the_best_itself"] = fb.render_feedback(4, "repair", "cuda", best, good, best=best)
    out["format_error"] = fb.render_feedback(1, "repair", "ptx", record("format_error", error="no ``` block X."), None,
                                             max_turns=4)
    out["format_error_unknown"] = fb.render_feedback(1, "repair", "cuda", record("format_error"), None)
    out["several_candidates_in_a_reply"] = fb.render_feedback(
        1, "repair", "cuda", record("incorrect", note="the last of 2 code blocks"), evs["never_executed"])
    return out


def digest() -> str:
    """sha256 over every catalogue text, by name: what the model would read, not the code."""
    h = hashlib.sha256()
    for name, text in sorted(texts().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def asked_hash(version: str = prompts.PROMPT_VERSION) -> str:
    """What a run records as its `template_hash` and resumes only under: the templates and the credit
    rules (prompts.template_hash), then the digest of the feedback as rendered. What turns 2+ are told is
    written in agent/feedback.py's code as well as in templates, and a resumed run told other words
    after its later turns than after its first would be a confound no one sees; taken over the texts,
    not the code, the digest moves with a changed word and with nothing else."""
    return hashlib.sha256(f"{prompts.template_hash(version)}\0feedback\0{digest()}".encode()).hexdigest()
