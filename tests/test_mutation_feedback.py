"""What the agent decides from an evaluation and what the model is told next (agent/feedback.py),
in process and fast enough for mutation testing (scripts/mutation.sh; the loop tests of
tests/test_feedback_rules.py run the agent: seconds a mutant).

Two kinds of test:
- the rules, each with why: the outcome a candidate gets (the first problem to fix), when
  memcheck runs, which candidate continues the conversation or becomes the run's best, evolve's
  parents and their draw, what the model is never told (held-out sizes; instructions under
  --require off);
- every feedback text, rendered for a set of evaluations that reach every branch of the
  renderer (agent/feedback_catalogue.py), compared with tests/fixtures/feedback_texts.json. The
  feedback is the prompt of turns 2+: a changed word changes every later turn of every run, so it
  is changed on purpose, here, and shows in review (`PYTHONPATH=. python
  tests/test_mutation_feedback.py` rewrites the file); the same catalogue's digest is part of the
  template hash, so a run does not resume under other feedback.
"""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pytest

from agent import feedback as fb
from agent import feedback_catalogue
from agent.feedback_catalogue import CARRIED, ev, evaluations, inspected, profiles, record, texts, wl
from agent.trajectory import CandidateRecord, Verdicts
from tools import profile
from tools.results import CompileResult, EvalResult, ExecutedCheck, SanitizeResult, WorkloadCredit, WorkloadResult

TEXTS = Path(__file__).resolve().parent / "fixtures" / "feedback_texts.json"


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


GEMM = "gemm_n7168_k5120"  # visible M8192; held out M4096, M1024, M8000 and M70


def gemm_credit(w, tile_rows: int = 128, tma: bool = True) -> WorkloadCredit:
    """One workload's credit as tools.credit.credit_in_process makes it (tools.credit.verdict on the
    counted runs' totals, against the work tools.evaluator weighs) for a wgmma + TMA GEMM whose
    row tiles are `tile_rows` tall; tma=False: its rows read with plain loads (TMA never runs)."""
    from tasks import get_task
    from tools.credit import verdict
    from tools.evaluator import _task_work

    task = get_task(GEMM)
    axes, work = task.axis_values(w), _task_work(task, w)
    tiles = -(-axes["M"] // tile_rows) * (axes["N"] // 256)
    counts = {"wgmma": tiles * axes["K"] // 16, "tma": tiles * axes["K"] // 32 if tma else 0}
    metrics = {"wgmma_flops": work.flops * tiles * tile_rows * 256 / (axes["M"] * axes["N"]), "other_flops": 0.0,
               "tma_bytes": work.read_bytes if tma else 0.0, "other_read_bytes": 0.0 if tma else work.read_bytes}
    v = verdict(list(counts), counts, {}, metrics, work)
    return WorkloadCredit(workload=w.name, split=w.split, status="ok", counted_from=31, runs=36, counts=counts,
                          executed=v.executed, shares=v.shares, carries=v.carries, notes=v.notes)


def held_out_credit_eval() -> EvalResult:
    """An evaluation of every GEMM workload whose kernel takes another path below 128 rows (one
    512-row tile, rows read with plain loads): right everywhere, credited on the visible workload,
    not on held-out M70. The executed check combines the credits as the evaluator does."""
    from tasks import get_task
    from tools.credit import combine

    task = get_task(GEMM)
    ws = task.workloads_for("visible") + task.workloads_for("held_out")
    credits = [gemm_credit(w) if task.axis_values(w)["M"] >= 128 else gemm_credit(w, 512, tma=False) for w in ws]
    return ev([WorkloadResult(workload=w.name, split=w.split, axes=task.axis_values(w), status="passed") for w in ws],
              executed=combine(["wgmma", "tma"], credits))


def test_a_held_out_workloads_credit_figures_never_reach_the_model():
    """The executed check's counts are summed over workloads and its notes name the workload that
    withheld the credit, with its figures: summed with held-out counts (which grow with their
    sizes) and quoting M70's padding cap (2.5 x 128/70 = 4.57x), they drew the held-out sizes.
    The model reads the visible workloads' counts and notes, and that a held-out workload withheld
    the credit, by kind."""
    e = held_out_credit_eval()
    held = [c for c in e.executed.workloads if c.split == "held_out"]
    assert "4.57x" in e.executed.notes["wgmma"]  # what the evaluator's combined check says
    text = fb.render_feedback(2, "repair", "cuda", record("incorrect"), e)
    visible_tma = sum(c.counts["tma"] for c in e.executed.workloads if c.split == "visible")
    assert f"`tma`: executed on some workloads but not on every one ({visible_tma} instructions executed in all)" in text
    assert f"({e.executed.counts['tma']} instructions" not in text
    assert not any(note in text for c in held for note in c.notes.values()) and "4.57" not in text and "7.3x" not in text
    assert "`wgmma`: executed, but did not carry the task's work: a held-out workload: wgmma did not carry the " \
           "work there" in text
    assert "`M70`" not in text and "M70" not in text


def test_a_string_still_naming_a_held_out_workload_or_size_is_rewritten():
    """Free text on the whole evaluation (run_reason, harness_fault; a stop names the workload that
    hung) keeps no held-out name, and no `axis=value` or `axis: value` only held-out workloads have."""
    held = WorkloadResult(workload="M70", split="held_out", axes={"M": 70, "N": 256}, status="failed", reason="timeout")
    e = ev([wl("W0", "passed"), held], run_reason="M70 hung at M: 70 (M=70, N=256); M700 at M=700",
           harness_fault="workload M70")
    out = fb.redact_held_out(e)
    assert out.run_reason == "held_out_1 hung at M=<held-out> (M=<held-out>, N=256); M700 at M=700"
    assert out.harness_fault == "workload held_out_1" and out.workloads[1].detail == "timeout"


def test_a_check_that_failed_as_a_whole_says_what_failed_not_what_it_quotes():
    said = "in-process counters unavailable (CUPTI: no), and no ncu; the profiled process failed: E: rows 70"
    assert fb._what_failed(said) == ("in-process counters unavailable (CUPTI: no), and no ncu; the profiled process "
                                     "failed (the rest is not shown where held-out workloads ran)")
    assert fb._what_failed("workload held_out_1 ended with timeout") == "workload held_out_1 ended with timeout"
    assert fb._what_failed(None) is None
    e = ev([wl("W0", "passed"), wl("H0", "passed", "held_out")], executed=ExecutedCheck(status="skipped", reason=said))
    assert fb.redact_held_out(e).executed.reason == fb._what_failed(said)


def test_what_was_measured_on_a_held_out_workload_alone_is_not_answered():
    """An evaluation of the held-out workloads alone (a client's `workloads: held_out`): memcheck
    ran on the first of them (the sanitizer's report: thread and block indices, an allocation's
    size), and the executed check's raw totals and profile are the first credited workload's (its
    FLOPs, bytes, grid)."""
    e = held_out_credit_eval()
    e.workloads = [w for w in e.workloads if w.split == "held_out"]
    e.executed.workloads = [c for c in e.executed.workloads if c.split == "held_out"]
    e.executed.metrics, e.executed.per_kernel, e.executed.timed_ms = {"wgmma_flops": 6.2e12}, {"k": {"wgmma": 7}}, 1.5
    e.executed.profile = profile.Profile(time_ms=1.5, tflops=600.0)
    e.sanitize = SanitizeResult(status="failed", errors=["Invalid __global__ write of size 4 bytes by thread "
                                                         "(31,0,0) in block (69,0,0): 4 bytes after an allocation of "
                                                         "size 286720 bytes"])
    out = fb.redact_held_out(e)
    assert out.sanitize.status == "failed" and out.sanitize.errors == [fb.HELD_OUT_MEMCHECK]
    ex = out.executed
    assert (ex.metrics, ex.per_kernel, ex.timed_ms, ex.profile, ex.counts) == ({}, {}, None, None, {})
    assert out.verdicts() == e.verdicts()


def test_every_field_of_an_evaluation_is_placed_before_a_model_or_client_reads_it():
    """redact_held_out builds what a model and a client read field by field: a field added to
    EvalResult (or to the executed check, whose view _executed_view builds) reaches neither, its
    default in its place, until it is placed here: kept, scrubbed, or rebuilt without the held-out
    workloads' figures."""
    assert sorted(fb.KEPT_FIELDS + fb.SCRUBBED_FIELDS + fb.REBUILT_FIELDS) == sorted(EvalResult.model_fields)
    assert sorted(ExecutedCheck.model_fields) == [  # each set by _executed_view
        "carries", "counts", "executed", "kernel_metrics", "metrics", "notes", "per_kernel", "phase_s", "profile",
        "reason", "shares", "status", "timed_ms", "workloads"]
    e = held_out_credit_eval()
    e.speedup_held_out, e.phase_s = 1.7, {"workloads": 3.5}
    view = fb.redact_held_out(e)
    assert {k: getattr(view, k) for k in fb.KEPT_FIELDS} == {k: getattr(e, k) for k in fb.KEPT_FIELDS}
    # a run over the service renders its feedback from the view it was answered: the same words
    assert fb.redact_held_out(view) == view and fb.eval_sections(view, "cuda") == fb.eval_sections(e, "cuda")


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


# ---------------------------------------------------------------------------------------
# A run resumes only under the feedback it started with (agent.feedback_catalogue.asked_hash)
# ---------------------------------------------------------------------------------------
def _text_functions() -> dict:
    """agent/feedback.py's functions that write a part of the feedback, by the names they go by."""
    return {n: f for n, f in vars(fb).items()
            if inspect.isfunction(f) and f.__module__ == fb.__name__ and n.endswith(("_section", "_line"))}


def _reworded(render, old: str, new: str):
    def reworded(*args, **kw):
        text = render(*args, **kw)
        return text.replace(old, new)
    return reworded


WORDINGS = {  # each changes what a model reads, and nothing else
    "a section's sentence": lambda mp: mp.setattr(fb, "timing_section",
                                                  _reworded(fb.timing_section, "speed of light", "the roofline")),
    "a line's words": lambda mp: mp.setattr(fb, "held_out_line", _reworded(fb.held_out_line, "sizes not", "sizes")),
    "a mismatch line": lambda mp: mp.setattr(fb, "_mismatch_line", _reworded(fb._mismatch_line, "ratio", "quotient")),
    "an outcome's words": lambda mp: mp.setattr(fb, "outcome_words", lambda c, require=True: c.outcome),
    "a limit": lambda mp: mp.setattr(fb, "MAX_MEMCHECK_LINES", 7),
    "the profile block": lambda mp: mp.setattr(profile, "_share", lambda x: f"{x:.1%}"),
    **{f"the held-out class of {reason}": (lambda mp, r=reason: mp.setitem(fb.HELD_OUT_CLASSES, r, "renamed"))
       for reason in fb.HELD_OUT_CLASSES},
}


@pytest.mark.parametrize("change", WORDINGS)
def test_a_changed_word_of_the_feedback_changes_the_template_hash(monkeypatch, change):
    """A run resumed after the feedback's wording changed would be told one thing after its first
    turns and another after its later ones: agent.run.inputs_change refuses it, by the hash."""
    before = feedback_catalogue.asked_hash()
    WORDINGS[change](monkeypatch)
    assert feedback_catalogue.asked_hash() != before


def test_code_that_says_the_same_leaves_the_template_hash(monkeypatch):
    """The hash is over what the model reads, not over the code: a refactor that renders the same
    text, or a change to a rule that no feedback text states, refuses no resume."""
    before = feedback_catalogue.asked_hash()
    for name, render in _text_functions().items():
        monkeypatch.setattr(fb, name, _reworded(render, "", ""))  # another function, the same text
    monkeypatch.setattr(fb, "rank", lambda c, require=True: (0,))
    monkeypatch.setattr(fb, "MEMCHECK_TRIGGERS", frozenset())
    assert feedback_catalogue.asked_hash() == before


def test_the_catalogue_reaches_every_text_of_the_feedback():
    """Every `*_section` and `*_line` function of agent/feedback.py runs while the hash is taken, so
    a text added later outside agent/feedback_catalogue.py fails here instead of escaping the hash."""
    names = {f.__code__: n for n, f in _text_functions().items()}
    assert {"compile_section", "arch_section", "run_section", "memcheck_section", "timing_section",
            "profile_section", "format_section", "held_out_line", "_mismatch_line"} <= set(names.values())
    reached = set()

    def seen(frame, event, arg):
        if event == "call" and frame.f_code in names:
            reached.add(names[frame.f_code])
    previous = sys.getprofile()
    sys.setprofile(seen)
    try:
        feedback_catalogue.asked_hash()
    finally:
        sys.setprofile(previous)
    assert sorted(set(names.values()) - reached) == []


if __name__ == "__main__":
    TEXTS.write_text(json.dumps(texts(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {TEXTS}")


def test_the_hash_a_run_records_moves_with_its_templates_and_credit_rules_too(monkeypatch):
    """asked_hash folds the feedback in above prompts.template_hash (the templates, the credit rules):
    a run resumes only where both are as they were."""
    from agent import prompts

    before = feedback_catalogue.asked_hash()
    monkeypatch.setattr(prompts, "template_hash", lambda version=prompts.PROMPT_VERSION: "0" * 64)
    assert feedback_catalogue.asked_hash() != before
