"""What the agent decides from an evaluation and what the model is told next (agent/feedback.py),
in process and fast enough for mutation testing (scripts/mutation.sh; the loop tests of
tests/test_feedback_rules.py run the agent: seconds a mutant).

Two kinds of test:
- the rules, each with why: the outcome a candidate gets (the first problem to fix), when
  memcheck runs, which candidate continues the conversation or becomes the run's best, evolve's
  parents and their draw, what the model is never told (held-out sizes; instructions under
  --require off);
- every feedback text, rendered for a set of evaluations that reach every branch of the
  renderer, compared with tests/fixtures/feedback_texts.json. The feedback is the prompt of turns
  2+: a changed word changes every later turn of every run, so it is changed on purpose, here,
  and shows in review (`PYTHONPATH=. python tests/test_mutation_feedback.py` rewrites the file).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import feedback as fb
from agent.trajectory import CandidateRecord, Verdicts
from tools.profile import Profile
from tools.results import (CompileResult, Diagnostic, ElementSample, EvalResult, ExecutedCheck, FeatureVerdict,
                           InspectResult, KernelResources, KernelSass, Mismatch, SanitizeResult, Timing,
                           WorkloadResult)

TEXTS = Path(__file__).resolve().parent / "fixtures" / "feedback_texts.json"


# ---------------------------------------------------------------------------------------
# Evaluations
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
# The outcome: the first problem to fix
# ---------------------------------------------------------------------------------------
def test_the_outcome_is_the_first_problem_in_the_candidates_way():
    passed = wl("W0", "passed")
    assert fb.classify(ev(comp=CompileResult(status="failed", arch="sm_90a", language="cuda"))) == "compile_error"
    # a manifest found wrong without running: the run failed, not the numbers
    assert fb.classify(ev([passed], run_status="failed")) == "run_failed"
    # wrong numbers are "incorrect"; any other visible failure (a crash, a hang) is a failed run,
    # even beside wrong numbers: the crash is what to fix first
    assert fb.classify(ev([wl("W0", "failed", reason="nan_output")])) == "incorrect"
    assert fb.classify(ev([wl("W0", "failed", reason="wrong_in_timed_run")])) == "incorrect"
    assert fb.classify(ev([wl("W0", "failed", reason="incorrect"), wl("W1", "failed", reason="timeout")])) == "run_failed"
    assert fb.classify(ev([wl("W0", "failed", reason="implausible")])) == "run_failed"
    # a held-out failure is no visible problem: the model is never shown held-out shapes
    assert fb.classify(ev([passed, wl("H0", "failed", "held_out", "incorrect")], executed=CARRIED)) == "correct_with_arch"
    # correct: with the instructions verified, unverified (no executed check), or without them
    assert fb.classify(ev([passed], executed=CARRIED)) == "correct_with_arch"
    assert fb.classify(ev([passed])) == "unverified"
    assert fb.classify(ev([passed], insp=inspected("wgmma"))) == "arch_missing"
    not_carried = ExecutedCheck(status="ok", executed={"wgmma": True, "tma": True}, carries={"wgmma": True, "tma": False})
    assert fb.classify(ev([passed], executed=not_carried)) == "arch_missing"
    # not run (no GPU): the static verdict alone
    assert fb.classify(ev(run_status="skipped")) == "unverified"
    assert fb.classify(ev(run_status="skipped", insp=inspected("tma"))) == "arch_missing"


def test_memcheck_runs_after_a_visible_crash_hang_or_bad_write_once():
    """compute-sanitizer says which access went wrong, where the workload only says that something
    did: it runs for the failures a bad access causes, never for wrong numbers, once per candidate."""
    assert fb.MEMCHECK_TRIGGERS == {"launch_error", "cuda_error", "timeout", "out_of_bounds_write", "worker_crash"}
    for reason in fb.MEMCHECK_TRIGGERS:
        e = ev([wl("W0", "passed"), wl("W1", "failed", reason=reason)])
        assert fb.memcheck_trigger(e) == f"W1: {reason}"
        e.sanitize = SanitizeResult(status="failed", errors=["x"])
        assert fb.memcheck_trigger(e) is None  # sanitized already
        e.sanitize = SanitizeResult(status="skipped", reason="no compute-sanitizer")
        assert fb.memcheck_trigger(e) is None  # tried already
    for reason in ("incorrect", "nan_output", "input_modified", "oom", "manifest_error"):
        assert fb.memcheck_trigger(ev([wl("W1", "failed", reason=reason)])) is None
    assert fb.memcheck_trigger(ev([wl("H1", "failed", "held_out", "cuda_error")])) is None  # held out: never shown
    assert fb.memcheck_trigger(ev([wl("W1", "failed", reason="cuda_error")], run_status="skipped")) is None
    # the first triggering visible workload names it
    assert fb.memcheck_trigger(ev([wl("W0", "failed", reason="incorrect"), wl("W1", "failed", reason="timeout"),
                                   wl("W2", "failed", reason="cuda_error")])) == "W1: timeout"


def test_a_candidate_record_carries_the_error_to_fix():
    c = fb.candidate_record(2, 1, "candidates/2-1", format_error="no code block")
    assert (c.outcome, c.error, c.turn, c.sample, c.path) == ("format_error", "no code block", 2, 1, "candidates/2-1")
    e = ev(comp=CompileResult(status="failed", arch="sm_90a", language="cuda", error="ptxas: bad operand"))
    assert fb.candidate_record(1, 0, "p", e).error == "ptxas: bad operand"
    e = ev([wl("W0", "failed", reason="cuda_error", detail="CUDA_ERROR_ILLEGAL_ADDRESS"), wl("W1", "failed", reason="timeout")])
    c = fb.candidate_record(1, 0, "p", e)
    assert (c.outcome, c.error, c.verified) == ("run_failed", "cuda_error: CUDA_ERROR_ILLEGAL_ADDRESS", True)
    assert fb.candidate_record(1, 0, "p", ev([wl("W0", "failed", reason="timeout")])).error == "timeout"
    # only the joining ": " is trimmed, never the detail's own letters
    assert fb.candidate_record(1, 0, "p", ev([wl("W0", "failed", reason="cuda_error", detail="grid too large in X")])
                               ).error == "cuda_error: grid too large in X"
    # a manifest refused with no reason recorded: no error line rather than a crash
    assert fb.candidate_record(1, 0, "p", ev(run_status="failed")).error is None
    assert fb.candidate_record(1, 0, "p", ev([wl("W0", "passed")], run_status="failed", run_reason="bad grid")).error == "bad grid"
    c = fb.candidate_record(1, 0, "p", ev([wl("W0", "failed", reason="incorrect")]))
    assert (c.outcome, c.error) == ("incorrect", None)  # wrong numbers: the mismatch lines say it
    c = fb.candidate_record(1, 0, "p", ev([wl("W0", "passed")], executed=CARRIED))
    assert c.verdicts == Verdicts(**ev([wl("W0", "passed")], executed=CARRIED).verdicts()) and c.verified
    assert fb.candidate_record(1, 0, "p", ev(run_status="skipped")).verified is False


# ---------------------------------------------------------------------------------------
# Which candidate continues, becomes the best, or is a parent
# ---------------------------------------------------------------------------------------
def test_the_goal_is_what_the_model_was_asked_for():
    for outcome in ("correct_with_arch", "unverified"):
        assert fb.best_eligible(record(outcome)) and fb.best_eligible(record(outcome), False)
    # under --require off the instructions were never asked for: a correct kernel without them meets the goal
    assert not fb.best_eligible(record("arch_missing")) and fb.best_eligible(record("arch_missing"), False)
    for outcome in ("incorrect", "run_failed", "compile_error", "format_error", "model_error"):
        assert not fb.best_eligible(record(outcome)) and not fb.best_eligible(record(outcome), False)


def test_under_require_off_the_model_hears_nothing_about_instructions():
    assert fb.outcome_words(record("correct_with_arch")) == "correct with arch"
    assert fb.outcome_words(record("arch_missing")) == "arch missing"
    assert fb.outcome_words(record("arch_missing", correct=True), False) == "correct"
    assert fb.outcome_words(record("unverified", correct=None), False) == "compiled, correctness not checked"
    assert fb.outcome_words(record("correct_with_arch", correct=True), False) == "correct"
    assert fb.outcome_words(record("run_failed"), False) == "run failed"


def test_rank_orders_the_goal_first_then_correctness_then_speed():
    order = [record("correct_with_arch", 0.5, True), record("unverified"), record("arch_missing", 3.0, True),
             record("incorrect", 9.0, False), record("run_failed"), record("format_error"),
             record("compile_error")]
    ranked = sorted(reversed(order), key=fb.rank, reverse=True)
    assert [c.outcome for c in ranked] == [c.outcome for c in order]
    # among equals, the faster
    assert fb.rank(record("correct_with_arch", 1.2, True)) > fb.rank(record("correct_with_arch", 1.1, True))
    assert fb.rank(record("correct_with_arch", 0.1, True)) > fb.rank(record("correct_with_arch", None, True))
    # the SASS verdict counts before compiling alone (an incorrect kernel with the instructions first)
    with_arch = CandidateRecord(turn=1, sample=0, path="a", outcome="incorrect",
                                verdicts=Verdicts(compiled=True, arch_sass=True))
    assert fb.rank(with_arch) > fb.rank(record("incorrect"))
    # a kernel that did not compile still ranks above a reply with no kernel (a format or model error)
    no_kernel = [CandidateRecord(turn=1, sample=0, path="a", outcome=o) for o in ("format_error", "model_error")]
    assert all(fb.rank(record("compile_error")) > fb.rank(c) for c in no_kernel)
    # --require off: correct first whatever the instructions, then the goal, then fast
    off = lambda c: fb.rank(c, False)  # noqa: E731
    assert off(record("arch_missing", 1.0, True)) > off(record("correct_with_arch", 2.0, None))
    assert off(record("unverified")) > off(record("incorrect"))
    assert off(record("incorrect")) > off(record("format_error"))
    assert off(record("arch_missing", 2.0, True)) > off(record("correct_with_arch", 1.0, True))
    assert all(off(record("compile_error")) > off(c) for c in no_kernel)
    assert off(record("arch_missing", 0.5, True)) > off(record("arch_missing", None, True))  # no speed: 0


def test_evolves_parents_are_the_best_k_and_the_draw_is_the_runs_own():
    a, b, c, d = (record("correct_with_arch", s, True, turn=t) for t, s in ((1, 1.0), (2, 2.0), (3, 2.0), (4, None)))
    e = record("incorrect", turn=5)
    pop = fb.population([a, b, c, d, e], 3)
    assert [x.turn for x in pop] == [2, 3, 1]  # by rank; of two equals, the earlier first
    assert [x.turn for x in fb.population([a, b, c, d, e], 10)] == [2, 3, 1, 4, 5]
    # the draw depends on the seed and the turn only: a resumed run draws the same parent
    draws = [fb.draw_parent(pop, 7, t).turn for t in range(1, 61)]
    assert draws == [fb.draw_parent(pop, 7, t).turn for t in range(1, 61)]
    assert draws != [fb.draw_parent(pop, 8, t).turn for t in range(1, 61)]
    # weighted by rank: k for the best ... 1 for the k-th (3:2:1 here)
    many = [fb.draw_parent(pop, s, 1).turn for s in range(3000)]
    assert many.count(2) > many.count(3) > many.count(1) > 300
    assert abs(many.count(2) / 3000 - 0.5) < 0.04 and abs(many.count(1) / 3000 - 1 / 6) < 0.04
    assert fb.draw_parent([a], None, 3) is a
    # the population follows --require: off, a correct kernel without the instructions may lead
    fast_without = record("arch_missing", 5.0, True, turn=6)
    assert fb.population([a, fast_without], 1) == [a] and fb.population([a, fast_without], 1, True) == [a]
    assert fb.population([a, fast_without], 1, False) == [fast_without]


def test_the_best_is_replaced_by_a_verified_or_faster_candidate_only():
    old = record("correct_with_arch", 1.5, True, verified=True)
    assert fb.better_best(record("unverified"), None)
    assert not fb.better_best(record("incorrect", 9.0), None)
    assert fb.better_best(record("correct_with_arch", 1.6, True, verified=True), old)
    assert not fb.better_best(record("correct_with_arch", 1.5, True, verified=True), old)  # a tie keeps the first
    assert not fb.better_best(record("unverified", 3.0), old)  # verified beats any speed unverified
    assert fb.better_best(old, record("unverified", 3.0))
    assert fb.better_best(record("correct_with_arch", 0.1, True, verified=True),
                          record("correct_with_arch", None, True, verified=True))
    assert not fb.better_best(record("arch_missing", 9.0, True, verified=True), old)
    assert not fb.better_best(record("correct_with_arch", None, True, verified=True),
                              record("correct_with_arch", 0.5, True, verified=True))  # no speed counts as 0
    assert fb.better_best(record("arch_missing", 9.0, True, verified=True), old, require=False)


# ---------------------------------------------------------------------------------------
# The texts
# ---------------------------------------------------------------------------------------
def test_the_limits_on_what_the_model_is_shown():
    """30 compiler lines: the first errors are what to fix, and a cascade of hundreds would crowd
    out the rest of the prompt. 8 memcheck reports: where the first bad access is, not its 20th
    repeat. Held-out failures by class only, so no held-out size leaks into a prompt."""
    assert fb.MAX_DIAGNOSTICS == 30 and fb.MAX_MEMCHECK_LINES == 8
    assert fb.HELD_OUT_CLASSES == {
        "incorrect": "incorrect", "nan_output": "incorrect", "unwritten_output": "incorrect",
        "wrong_after_first_call": "incorrect", "wrong_in_timed_run": "incorrect",
        "manifest_error": "manifest_error", "launch_error": "launch_error", "cuda_error": "launch_error",
        "oom": "launch_error", "worker_crash": "launch_error", "timeout": "timeout",
        "out_of_bounds_write": "out-of-bounds write", "input_modified": "out-of-bounds write"}


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
    }


def profiles() -> dict[str, EvalResult]:
    """The --profile-feedback block: a profile, a reason there is none, or nothing for wrong numbers."""
    ok = ev([wl("W0", "passed")], executed=CARRIED.model_copy(update={"profile": Profile(time_ms=1.5, kernels=[])}))
    return {
        "profile": ok,
        "profile_not_collected": ev([wl("W0", "passed")], executed=CARRIED),
        "profile_skipped": ev([wl("W0", "passed")], executed=ExecutedCheck(status="skipped", reason="no ncu")),
        "profile_skipped_unknown": ev([wl("W0", "passed")], executed=ExecutedCheck(status="failed")),
        "profile_of_a_wrong_kernel": ev([wl("W0", "failed", reason="incorrect")], executed=CARRIED),
    }


def texts() -> dict[str, str]:
    out = {}
    chosen = record("incorrect", turn=3, sample=1)
    for name, e in evaluations().items():
        out[name] = fb.render_feedback(3, "repair", "cuda", chosen, e)
        if name in ("correct_and_timed", "everything_wrong"):
            out[name + "/require_off"] = fb.render_feedback(3, "repair", "cuda", chosen, e, require=False)
    for name, e in profiles().items():
        out[name] = fb.eval_sections(e, "cuda", profile=True)
    good = evaluations()["correct_and_timed"]
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
        1, "repair", "cuda", record("incorrect", note="the last of 2 code blocks"), evaluations()["never_executed"])
    return out


def test_the_profile_block_is_added_only_when_asked_for():
    e = profiles()["profile"]
    assert "### Profile" not in fb.eval_sections(e, "cuda") and "### Profile" in fb.eval_sections(e, "cuda", True)


def test_every_feedback_text_is_the_recorded_one():
    now, recorded = texts(), json.loads(TEXTS.read_text())
    changed = sorted(n for n in now.keys() | recorded.keys() if now.get(n) != recorded.get(n))
    assert not changed, f"feedback texts changed: {changed}\n" + "\n".join(
        f"--- {n} now:\n{now.get(n)}\n--- recorded:\n{recorded.get(n)}" for n in changed[:2])


@pytest.mark.parametrize("name", ["everything_wrong", "correct_and_timed"])
def test_no_held_out_size_reaches_the_model(name):
    """Held-out workloads are counts per failure class: their names and sizes stay out of the prompt."""
    e = evaluations()[name]
    held = [w for w in e.workloads if w.split == "held_out"]
    for w in held:
        w.axes = {"M": 77777}
    text = fb.render_feedback(2, "repair", "cuda", record("incorrect"), e)
    assert "77777" not in text and not any(f"`{w.workload}`" in text for w in held)
    assert "held-out workloads (sizes not shown)" in text


def test_the_recorded_texts_say_what_the_rules_say():
    """A few facts read from the recorded texts, so the file is checked by more than itself."""
    t = json.loads(TEXTS.read_text())
    wrong = t["everything_wrong"]
    assert "... 4 more" in t["compile_errors_nvrtc"] and "NVRTC" in t["compile_errors_nvrtc"]  # 34 lines, 30 shown
    assert "- held-out workloads (sizes not shown): 1 of 8 passed; failed: 3 timeout, 2 incorrect, " \
           "1 launch_error, 1 other failure" in wrong
    assert "- ... 3 more" in wrong  # 11 memcheck reports, 8 shown
    assert "`clusters`: MISSING" in wrong and "`tma`: MISSING" in wrong
    assert "ratio 0.5" in wrong and "5 NaN" in wrong and "relative L2 error 0.03 (at most 0.005 allowed)" in wrong
    # --require off: the instructions are judged, never reported (no section, no verdict on them)
    off = t["everything_wrong/require_off"]
    assert "### Architecture instructions" in wrong and "### Architecture instructions" not in off
    assert "MISSING" not in off and "requested instructions" not in off
    assert "keeping the requested instructions" not in t["optimise_require_off"]
    assert "keeping the requested instructions" in t["optimise_verified"]
    assert "-> speedup 1.25x" in t["correct_and_timed"] and "75% of speed of light" in t["correct_and_timed"]


if __name__ == "__main__":
    TEXTS.write_text(json.dumps(texts(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {TEXTS}")
