"""From an EvalResult to what the agent decides and what the model is told next.

`classify` names a candidate's outcome (the first problem to fix), `rank` orders
candidates, and `render_feedback` turns the full EvalResult into the next user message:
compile diagnostics with lines, ptxas info lines (C7515 serialized wgmma, C7508 ignored
setmaxnreg), requested instructions present or missing in the SASS, mismatch summaries for
the visible workloads with got/expected and their ratio, held-out failures as counts per
reason class (their shapes are never shown), compute-sanitizer memcheck lines for a crash,
hang or out-of-bounds write, and speed with the resource figures. Rendering goes through
agent.prompts.

`redact_held_out` is the evaluation as a model or a client of the service (agent/service.py) may
see it: the feedback is rendered from it, and the service answers it.
"""
from __future__ import annotations

import math
import random
import re

from agent import prompts
from agent.trajectory import CandidateRecord, Outcome, Verdicts
from tools.profile import render as render_profile
from tools.profile import skipped as skipped_profile
from tools.results import (WRONG_NUMBERS, EvalResult, ExecutedCheck, Mismatch, SanitizeResult, WorkloadCredit,
                           WorkloadResult)

MAX_DIAGNOSTICS = 30
MAX_MEMCHECK_LINES = 8  # the first memcheck reports: where the first bad access is, not the 20th repeat
# Held-out failures are told by class only (a held-out size never reaches the model):
# FailReason -> the class name the feedback uses.
HELD_OUT_CLASSES = {
    **{r: "incorrect" for r in WRONG_NUMBERS},
    "manifest_error": "manifest_error",
    "launch_error": "launch_error", "cuda_error": "launch_error", "oom": "launch_error", "worker_crash": "launch_error",
    "timeout": "timeout",
    "out_of_bounds_write": "out-of-bounds write", "input_modified": "out-of-bounds write",
}
# Visible failures after which compute-sanitizer memcheck runs on the candidate (agent/nodes.py):
# it says which access went wrong, where the workload result only says that something did.
MEMCHECK_TRIGGERS = frozenset({"launch_error", "cuda_error", "timeout", "out_of_bounds_write", "worker_crash"})


# ---------------------------------------------------------------------------------------
# Outcome, verdicts, ranking
# ---------------------------------------------------------------------------------------
def ran(ev: EvalResult) -> bool:
    """Correctness was checked on a GPU. (The evaluator sets run_status "failed" only for a
    manifest found wrong without running, where no GPU is; on a GPU it is "ok" and the
    workloads say what passed.)"""
    return ev.run_status == "ok"


def visible(ev: EvalResult) -> list[WorkloadResult]:
    return [w for w in ev.workloads if w.split == "visible"]


def classify(ev: EvalResult) -> Outcome:
    if not ev.compiled:
        return "compile_error"
    if ev.run_status == "failed":  # the manifest is wrong, found without running
        return "run_failed"
    if ran(ev):
        failed = [w for w in visible(ev) if w.status == "failed"]
        if any(w.reason not in WRONG_NUMBERS for w in failed):
            return "run_failed"
        if failed:
            return "incorrect"
        # correct; None: features in the SASS but the executed-instruction check did not run
        return {True: "correct_with_arch", None: "unverified"}.get(ev.correct_with_arch, "arch_missing")
    return "unverified" if ev.arch_ok else "arch_missing"


def memcheck_trigger(ev: EvalResult) -> str | None:
    """The visible failure that calls for compute-sanitizer memcheck ("workload: reason"), or None.
    Only a candidate that ran on a GPU and was not sanitized yet."""
    if not ran(ev) or not (ev.sanitize.status == "skipped" and ev.sanitize.reason == "not requested"):
        return None
    return next((f"{w.workload}: {w.reason}" for w in visible(ev)
                 if w.status == "failed" and w.reason in MEMCHECK_TRIGGERS), None)


def candidate_record(turn: int, sample: int, path: str, ev: EvalResult | None = None,
                     format_error: str | None = None) -> CandidateRecord:
    if ev is None:
        return CandidateRecord(turn=turn, sample=sample, path=path, outcome="format_error", error=format_error)
    outcome = classify(ev)
    error = ev.compile.error if outcome == "compile_error" else None
    if outcome == "run_failed":
        error = ev.run_reason or next((f"{w.reason}: {w.detail or ''}".strip(": ") for w in visible(ev)
                                       if w.status == "failed"), None)
    return CandidateRecord(turn=turn, sample=sample, path=path, outcome=outcome,
                           verdicts=Verdicts(**ev.verdicts()), verified=ran(ev), error=error)


def best_eligible(c: CandidateRecord, require: bool = True) -> bool:
    """The run's goal is met: correct with the requested instructions (on CPU: compiled with them,
    flagged unverified). Under --require off the model was never asked for them, so the loop's goal
    is what it was told: correct (on CPU: compiled and not shown wrong); arch_missing is such a
    kernel. The benchmark's verdicts (reports) are drawn from every candidate, not from this."""
    if require:
        return c.outcome in ("correct_with_arch", "unverified")
    return c.outcome in ("correct_with_arch", "unverified", "arch_missing")


def outcome_words(c: CandidateRecord, require: bool = True) -> str:
    """A candidate's outcome as the model is told it: under --require off, nothing about instructions."""
    if require or c.outcome not in ("correct_with_arch", "unverified", "arch_missing"):
        return c.outcome.replace("_", " ")
    return "correct" if c.verdicts.correct is True else "compiled, correctness not checked"


def rank(c: CandidateRecord, require: bool = True) -> tuple:
    """Higher is better; choosing the sample that continues the conversation. Under --require off
    the instructions play no part (the model was not asked for them): correct, then fast."""
    v = c.verdicts
    if not require:
        return (v.correct is True, best_eligible(c, False), v.compiled, c.outcome not in ("format_error", "model_error"),
                v.speedup or 0.0)
    return (c.outcome == "correct_with_arch", c.outcome == "unverified", v.correct is True, v.arch_sass, v.compiled,
            c.outcome not in ("format_error", "model_error"), v.speedup or 0.0)


def population(attempts: list[CandidateRecord], k: int, require: bool = True) -> list[CandidateRecord]:
    """Evolve's parents: the best k candidates so far by `rank` (correct with the requested
    instructions first, then speedup), earlier ones first among equals."""
    return sorted(attempts, key=lambda c: rank(c, require), reverse=True)[:k]  # sorted() is stable under reverse


def draw_parent(pop: list[CandidateRecord], seed: int | None, turn: int) -> CandidateRecord:
    """A parent drawn from the population, weighted by rank (the best k times the k-th). The
    draw depends only on the run's seed and the turn, so a resumed or replayed run draws the same."""
    rng = random.Random(f"evolve:{seed}:{turn}")  # str seeds are hashed with sha512: stable across processes
    return rng.choices(pop, weights=range(len(pop), 0, -1))[0]


def better_best(new: CandidateRecord, old: CandidateRecord | None, require: bool = True) -> bool:
    if not best_eligible(new, require):
        return False
    if old is None:
        return True
    return (new.verified, new.verdicts.speedup or 0.0) > (old.verified, old.verdicts.speedup or 0.0)


# ---------------------------------------------------------------------------------------
# Held-out workloads: what of them reaches a model or a client
# ---------------------------------------------------------------------------------------
# Every field of an EvalResult, by what a held-out workload can have put in it (a test holds the
# three to EvalResult's fields, so a new field is placed here before anyone is shown it).
# Nothing, or only as a verdict or a geometric mean: speedup and sol_score are the visible
# workloads'; seconds and phase_s are wall times (docs/METHODOLOGY.md, Known limits).
KEPT_FIELDS = ("task", "arch", "compile", "inspect", "requested_features", "run_status", "speedup", "speedup_ci",
               "speedup_spread", "speedup_held_out", "sol_score", "gpu", "device", "seconds", "phase_s")
# Free text on the whole evaluation: the evaluator quotes no held-out workload's detail in it
# (tools.evaluator), and one it names (a stop: "workload M70 ended with timeout") is scrubbed.
SCRUBBED_FIELDS = ("run_reason", "harness_fault")
# Rebuilt: held-out workloads by class, the executed check's figures and memcheck's report visible only.
REBUILT_FIELDS = ("workloads", "executed", "sanitize")
HELD_OUT_MEMCHECK = ("memcheck ran on a held-out workload (no visible one was judged): "
                     "its report, which would draw its grid and sizes, is not shown")


def redact_held_out(ev: EvalResult) -> EvalResult:
    """The evaluation as a model (render_feedback) and a client of the service (agent.service) see
    it. Each held-out workload keeps its split, status and failure reason, with its class
    (HELD_OUT_CLASSES) as detail, under an alias (held_out_1, ... in the task's order); nothing
    else of it is copied. The result is built field by field (KEPT, SCRUBBED and REBUILT_FIELDS),
    so a new field is not copied either. The executed check's figures are the visible workloads'
    (_executed_view); memcheck's report only where it ran on a visible workload. Last, any string
    naming a held-out workload, or giving an axis a value only held-out workloads have, is
    rewritten. The verdicts (`verdicts()`) are the evaluation's own."""
    held = [w for w in ev.workloads if w.split != "visible"]
    if not held:
        return ev
    alias = {w.workload: f"held_out_{i}" for i, w in enumerate(held, 1)}
    # memcheck runs on the first visible workload; without one it ran on a held-out size, and its
    # report (thread and block indices, allocation sizes and addresses) would draw the grid
    memcheck_told = any(w.split == "visible" for w in ev.workloads) or ev.sanitize.status != "failed"
    view = EvalResult(**{k: getattr(ev, k) for k in KEPT_FIELDS + SCRUBBED_FIELDS},
                      workloads=[w if w.split == "visible" else _held_out_workload(w, alias) for w in ev.workloads],
                      executed=_executed_view(ev.executed, ev.requested_features, alias),
                      sanitize=ev.sanitize if memcheck_told else SanitizeResult(
                          status="failed", errors=[HELD_OUT_MEMCHECK], infra_error=ev.sanitize.infra_error))
    loose = _scrub(view.model_dump(include=set(SCRUBBED_FIELDS + REBUILT_FIELDS)), _held_out_patterns(ev, alias))
    return EvalResult.model_validate({**{k: getattr(ev, k) for k in KEPT_FIELDS}, **loose})


def _held_out_workload(w: WorkloadResult, alias: dict[str, str]) -> WorkloadResult:
    return WorkloadResult(workload=alias[w.workload], split="held_out", axes={}, status=w.status, reason=w.reason,
                          detail=HELD_OUT_CLASSES.get(w.reason or "", "other failure") if w.status == "failed" else None)


def _executed_view(ex: ExecutedCheck, features: list[str], alias: dict[str, str]) -> ExecutedCheck:
    """The executed check without the held-out workloads' figures. Its verdicts (executed, carries)
    stay the evaluation's; counts, shares and notes are the visible workloads' own (tools.credit.combine
    over them alone): a held-out workload's counts grow with its size, and its notes quote its FLOPs,
    its tile padding, its kernel times. A feature a held-out workload withheld is said so by class.
    The raw totals and the profile stay where they are a visible workload's (combine takes the first
    visible one's)."""
    from tools.credit import combine

    if not ex.workloads and ex.status != "ok":  # why it failed as a whole, maybe in a process held-out workloads ran in
        return ex.model_copy(update={"reason": _what_failed(ex.reason)})
    held = [c for c in ex.workloads if c.split != "visible"]
    if not held:
        return ex
    vis = [c for c in ex.workloads if c.split == "visible"]
    own, first_visible = combine(features, vis), any(c.status == "ok" for c in vis)
    reason = ex.reason
    if any(c.status != "ok" for c in held):  # combine quoted why a held-out workload was not credited
        uncredited = sum(c.status != "ok" for c in held)
        reason = "; ".join(x for x in ((own.reason if vis else None), f"{uncredited} held-out workload"
                                       f"{'s' if uncredited > 1 else ''} not credited (why is not shown)") if x)
    return ExecutedCheck(
        status=ex.status, reason=reason, counts=own.counts, executed=ex.executed, shares=own.shares,
        carries=ex.carries, notes={f: own.notes.get(f) or _withheld_on_held_out(f, held) for f in ex.notes},
        per_kernel=ex.per_kernel if first_visible else {}, metrics=ex.metrics if first_visible else {},
        kernel_metrics=ex.kernel_metrics if first_visible else {}, profile=ex.profile if first_visible else None,
        timed_ms=ex.timed_ms if first_visible else None, phase_s=ex.phase_s,
        workloads=vis + [WorkloadCredit(workload=alias.get(c.workload, "held_out"), split="held_out", status=c.status,
                                        executed=c.executed, carries=c.carries) for c in held])


def _what_failed(reason: str | None) -> str | None:
    """A reason up to its first ': ' outside parentheses: what failed, not what it quotes. A check
    that failed as a whole quotes the process that ran every workload (the Nsight Compute process's
    last lines, its error), held-out ones too, where a kernel's printf of its sizes lands."""
    depth = 0
    for i, ch in enumerate(reason or ""):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and reason[i:i + 2] == ": ":
            return reason[:i] + " (the rest is not shown where held-out workloads ran)"
    return reason


def _withheld_on_held_out(feature: str, held: list[WorkloadCredit]) -> str:
    c = next((c for c in held if c.status == "ok" and not c.carries.get(feature, False)), None)
    how = "did not execute" if c is not None and not c.executed.get(feature, False) else "did not carry the work"
    return f"a held-out workload: {feature} {how} there (its figures are not shown)"


def _held_out_patterns(ev: EvalResult, alias: dict[str, str]) -> list[tuple[re.Pattern, str]]:
    """Each held-out workload's name, and each axis value only held-out workloads have as
    `axis=value` or `axis: value`."""
    patterns = [(re.compile(rf"\b{re.escape(name)}\b"), a) for name, a in alias.items()]
    visible = [w.axes for w in ev.workloads if w.split == "visible"]
    for w in ev.workloads:
        for axis, value in (w.axes.items() if w.split != "visible" else ()):
            if all(v.get(axis) != value for v in visible):
                patterns.append((re.compile(rf"\b{re.escape(axis)}\s*[=:]\s*{value}\b"), f"{axis}=<held-out>"))
    return patterns


def _scrub(obj: object, patterns: list[tuple[re.Pattern, str]]) -> object:
    if isinstance(obj, str):
        for pattern, repl in patterns:
            obj = pattern.sub(repl, obj)
        return obj
    if isinstance(obj, dict):
        return {_scrub(k, patterns): _scrub(v, patterns) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_scrub(v, patterns) for v in obj)
    return obj


# ---------------------------------------------------------------------------------------
# Feedback text
# ---------------------------------------------------------------------------------------
def render_feedback(turn: int, action: str, lang: str, chosen: CandidateRecord, ev: EvalResult | None,
                    others: list[CandidateRecord] = (), samples: int = 1, best: CandidateRecord | None = None,
                    profile: bool = False, max_turns: int | None = None, next_turn: int | None = None,
                    require: bool = True) -> str:
    """The user message that follows the chosen candidate's reply. `best`: the best candidate
    so far; when a repair is asked for after a regression, the model is pointed back to it.
    `profile`: add the Nsight Compute profile block (the --profile-feedback ablation).
    `max_turns`: the run's turn budget, stated with the next step (`next_turn`, by default turn + 1;
    evolve answers an older parent).
    `require`: the --require axis; off leaves out the requested-instruction verdicts (agent.prompts)."""
    sections = format_section(chosen, lang) if ev is None else eval_sections(ev, lang, profile, require)
    if chosen.note:  # the reply held several candidates: say which one these results are about
        sections = f"Your reply: {chosen.note}\n\n{sections}"
    other_line = ""
    if others:
        other_line = "Other samples this turn: " + ", ".join(
            f"{c.turn}-{c.sample} {outcome_words(c, require)}" for c in others) + ".\n"
    if action == "optimise":
        if require:
            status = ("is correct and uses the requested instructions" if chosen.verified else
                      "compiles with the requested instructions (its correctness is not known yet)")
        else:
            status = "is correct" if chosen.verified else "compiles (its correctness is not known yet)"
        next_step = prompts.render("next_optimise", status=status,
                                   keeping=" and keeping the requested instructions" if require else "")
    else:
        next_step = prompts.render("next_repair")
        if best is not None and best.path != chosen.path:
            v = best.verdicts
            status = outcome_words(best, require) + (f", speedup {v.speedup:.3g}x" if v.speedup is not None else "")
            next_step += prompts.render("feedback_best", turn=best.turn, status=status)
    if max_turns:
        next_step = (next_step.rstrip() + "\n" + prompts.budget_line(next_turn or turn + 1, max_turns, require)
                     + "\n")
    sample_note = f" (sample {chosen.sample} of {samples}, the best this turn)" if samples > 1 else ""
    of_turns = f" of {max_turns}" if max_turns else ""
    text = prompts.render("feedback", turn=f"{turn}{of_turns}", sample_note=sample_note,
                          sections=sections.strip() + "\n", others=other_line, next_step=next_step)
    return re.sub(r"\n{3,}", "\n\n", text)


def format_section(chosen: CandidateRecord, lang: str) -> str:
    return prompts.render("feedback_format", error=(chosen.error or "no solution found").rstrip("."),
                          fence=prompts.fence(lang))


def eval_sections(ev: EvalResult, lang: str, profile: bool = False, require: bool = True) -> str:
    ev = redact_held_out(ev)  # the model reads what a client of the service may: no held-out size
    parts = [compile_section(ev, lang)]
    if ev.compiled:
        if require:  # under --require off the instructions are judged, never reported to the model
            parts.append(arch_section(ev))
        parts.append(run_section(ev))
        parts.append(memcheck_section(ev))
        parts.append(timing_section(ev))
        if profile:
            parts.append(profile_section(ev))
    return "\n".join(p for p in parts if p)


def compile_section(ev: EvalResult, lang: str) -> str:
    c = ev.compile
    source_file = "kernel.cu" if c.language == "cuda" else "kernel.ptx"
    if not c.ok:
        diags = c.errors() + [d for d in c.diagnostics if d.severity != "error"]
        lines = [_diagnostic_line(d, c) for d in diags[:MAX_DIAGNOSTICS]]
        if len(diags) > MAX_DIAGNOSTICS:
            lines.append(f"... {len(diags) - MAX_DIAGNOSTICS} more")
        if not lines:
            lines = [c.error or "compilation failed without diagnostics"]
        stage = "NVRTC" if any(d.tool == "nvrtc" and d.severity == "error" for d in c.diagnostics) else "ptxas"
        return prompts.render("feedback_compile", stage=stage, where=_where(diags[:MAX_DIAGNOSTICS], c, source_file),
                              diagnostics="\n".join(lines))
    shown = [d for d in c.diagnostics if d.severity == "warning" or (d.severity == "info" and d.code)]
    info = ""
    if shown:
        listed = "\n".join(_diagnostic_line(d, c) for d in shown[:MAX_DIAGNOSTICS])
        info = f"ptxas reported ({_where(shown, c, source_file)}):\n```\n{listed}\n```\n"
    resources = "\n".join(_resource_line(name, k) for name, k in (ev.inspect.kernels or c.kernels).items()) \
        or "- (ptxas reported no kernels)"
    return prompts.render("feedback_ptxas", info=info, resources=resources)


def _unmapped(d, c) -> bool:
    """A ptxas line about a PTX line no line of the user's CUDA source is known for."""
    return c.language == "cuda" and d.tool == "ptxas" and d.line is None and d.ptx_line is not None


def _where(diags: list, c, source_file: str) -> str:
    """What the line numbers refer to. For CUDA, ptxas reads the PTX NVRTC made: its lines map
    back to kernel.cu through the PTX's .loc debug lines where there are any; the others are
    PTX lines, and said to be."""
    if any(_unmapped(d, c) or (c.language == "cuda" and "PTX line" in d.message) for d in diags):
        return (f"`line N` is a line of your {source_file}; `ptx line N` is a line of the PTX NVRTC generated "
                f"from it (so is `PTX line N` in a message), quoted where no {source_file} line is known")
    return f"lines refer to your {source_file}"


def _diagnostic_line(d, c) -> str:
    text = d.render()
    if _unmapped(d, c) and c.ptx:
        ptx_lines = c.ptx.splitlines()
        if 0 < d.ptx_line <= len(ptx_lines) and ptx_lines[d.ptx_line - 1].strip():
            text += f"  [ptx: {ptx_lines[d.ptx_line - 1].strip()[:160]}]"
    return text


def _resource_line(name: str, k) -> str:
    spills = f"{k.spill_stores} B spill stores, {k.spill_loads} B spill loads"
    return (f"- `{name}`: {k.registers if k.registers is not None else '?'} registers, "
            f"{k.shared_bytes} B static shared memory, {k.stack_frame} B stack, {spills}")


def arch_section(ev: EvalResult) -> str:
    requested = ev.requested_features
    if not requested:
        return ""
    insp = ev.inspect
    if insp.status != "ok":
        return prompts.render("feedback_arch", verdict="not checked",
                              lines=f"SASS inspection skipped: {insp.reason or 'unknown reason'}.")
    lines = []
    for f in requested:
        v = insp.features.get(f)
        if v and v.present:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(v.opcodes.items()))
            lines.append(f"- `{f}`: present in SASS ({ops})")
        else:
            lines.append(f"- `{f}`: MISSING - no instruction proving it is in the SASS of the launched kernels")
    if insp.uncounted_kernels:
        lines.append("- not counted, since launch.json never launches them: "
                     + ", ".join(f"`{k}`" for k in insp.uncounted_kernels))
    for flag, label in (("wgmma_serialized", "wgmma is serialized by ptxas (runs without overlap)"),
                        ("setmaxnreg_ignored", "setmaxnreg is ignored by ptxas")):
        if insp.flags.get(flag):
            why = insp.flag_evidence.get(flag)
            lines.append(f"- {label}" + (f": {why}" if why else ""))
    ex = ev.executed
    if ex.status == "ok":
        for f in requested:
            if not ex.executed.get(f, False):
                if not insp.feature_present(f):
                    continue  # said above: MISSING from the SASS, so it could not execute
                n = ex.counts.get(f, 0)
                # counts are summed over workloads; "executed" needs every workload to run it
                lines.append(f"- `{f}`: executed on some workloads but not on every one ({n} instructions executed "
                             "in all): the credit needs it on every workload" if n else
                             f"- `{f}`: in the SASS but never executed at run time (0 instructions executed)")
            elif not ex.carries.get(f, False):
                share, why = ex.shares.get(f), ex.notes.get(f)
                lines.append(f"- `{f}`: executed, but did not carry the task's work"
                             + (f": {why}" if why else f" (it did {share:.0%} of it)" if share is not None else ""))
    missing = insp.missing(requested)
    problems = []
    if missing:
        problems.append("missing " + ", ".join(missing))
    if insp.flags.get("wgmma_serialized"):
        problems.append("wgmma serialized")
    if ex.status == "ok" and not all(ex.executed.get(f, False) for f in requested):
        problems.append("not executed")
    elif ex.status == "ok" and not all(ex.carries.get(f, False) for f in requested):
        problems.append("executed without carrying the work")
    verdict = "; ".join(problems) if problems else "all requested instructions present"
    return prompts.render("feedback_arch", verdict=verdict, lines="\n".join(lines))


def run_section(ev: EvalResult) -> str:
    if ev.run_status == "skipped":
        reason = ev.run_reason or "evaluation did not run"
        return prompts.render("feedback_skipped", reason=reason[0].upper() + reason[1:].rstrip("."))
    lines = []
    vis = visible(ev)
    for w in vis:
        axes = ", ".join(f"{k}={v}" for k, v in w.axes.items())
        if w.status == "passed":
            worst = max((m.max_abs_err for m in w.outputs), default=0.0)
            lines.append(f"- `{w.workload}` ({axes}): passed (max abs error {worst:.3g})")
        elif w.status == "skipped":
            lines.append(f"- `{w.workload}` ({axes}): skipped{': ' + w.detail if w.detail else ''}")
        else:
            lines.append(f"- `{w.workload}` ({axes}): FAILED ({w.reason}{': ' + w.detail if w.detail else ''})")
            lines.extend(_mismatch_line(m) for m in w.outputs if not m.passed)
    held = [w for w in ev.workloads if w.split == "held_out" and w.status != "skipped"]
    if held:
        lines.append(held_out_line(held))
    if not ran(ev):  # checked without a GPU: the launch manifest cannot work
        verdict = "FAILED before running (the launch manifest is wrong)"
        lines.append(f"- {(ev.run_reason or 'not run').split(';')[0]}: correctness and timing were not checked.")
    else:
        verdict = "passed" if ev.correct else "FAILED"
    return prompts.render("feedback_run", verdict=verdict, lines="\n".join(lines))


def held_out_line(held: list[WorkloadResult]) -> str:
    """Held-out results as counts per failure class: what kind of mistake, never which size
    (a manifest that breaks only at one sequence length says so by its class)."""
    failed = [w for w in held if w.status == "failed"]
    line = f"- held-out workloads (sizes not shown): {len(held) - len(failed)} of {len(held)} passed"
    if failed:
        classes: dict[str, int] = {}
        for w in failed:
            name = HELD_OUT_CLASSES.get(w.reason or "", "other failure")
            classes[name] = classes.get(name, 0) + 1
        line += "; failed: " + ", ".join(f"{n} {name}" for name, n in sorted(classes.items(), key=lambda x: -x[1]))
    return line


def _ratio(got: float, expected: float) -> str:
    if expected == 0 or not (math.isfinite(got) and math.isfinite(expected)):
        return ""
    return f", ratio {got / expected:.4g}"


def _mismatch_line(m: Mismatch) -> str:
    where = f", first mismatch at index {tuple(m.first_mismatch)}" if m.first_mismatch else ""
    got = ""
    if m.got is not None and m.expected is not None:  # the ratio tells a scale error (0.5, 2, 1/sqrt(d)) at sight
        got = f" (got {m.got:.4g}, expected {m.expected:.4g}{_ratio(m.got, m.expected)})"
    nans = f", {m.nan_count} NaN" if m.nan_count else ""
    l2 = (f", relative L2 error {m.rel_l2:.3g} (at most {m.rel_l2_bound:g} allowed)"
          if m.rel_l2 is not None and m.rel_l2_bound is not None else "")
    line = (f"  - output `{m.output}`: max abs error {m.max_abs_err:.3g}, max rel error {m.max_rel_err:.3g}, "
            f"{m.mismatch_frac:.2%} of elements out of tolerance{nans}{l2}{where}{got}")
    more = [x for x in m.samples if x.index != m.first_mismatch]
    if more:  # a few more failing elements: a pattern (one row, one tile edge, a constant factor) shows at sight
        line += "\n    also: " + "; ".join(f"at {tuple(x.index)} got {x.got:.4g}, expected {x.expected:.4g}"
                                        f"{_ratio(x.got, x.expected)}" for x in more)
    return line


def memcheck_section(ev: EvalResult) -> str:
    """compute-sanitizer memcheck's first reports, when it ran on this candidate (the loop runs
    it after a visible crash, hang or out-of-bounds write), or why it could not run."""
    san = ev.sanitize
    if san.status == "skipped" and san.reason == "not requested":
        return ""
    if san.status == "ok":
        lines = "memcheck found no invalid access on the first visible workload."
    elif san.status == "skipped":
        lines = f"memcheck did not run: {(san.reason or 'unknown reason').rstrip('.')}."
    else:
        shown = [f"- {e}" for e in san.errors[:MAX_MEMCHECK_LINES]]
        if len(san.errors) > MAX_MEMCHECK_LINES:
            shown.append(f"- ... {len(san.errors) - MAX_MEMCHECK_LINES} more")
        lines = "\n".join(shown) or "- memcheck failed without a report"
    return prompts.render("feedback_memcheck", lines=lines)


def timing_section(ev: EvalResult) -> str:
    timed = [w for w in visible(ev) if w.timing is not None]
    if not timed:
        return ""
    lines = []
    for w in timed:
        axes = ", ".join(f"{k}={v}" for k, v in w.axes.items())
        t = w.timing
        line = f"- `{w.workload}` ({axes}): {t.median_ms:.4g} ms (spread {t.spread:.1%})"
        if w.baseline is not None:
            line += f" vs {w.baseline_name or 'library'} {w.baseline.median_ms:.4g} ms"
        if w.speedup is not None:
            line += f" -> speedup {w.speedup:.3g}x"
        if w.tflops is not None:
            line += f", {w.tflops:.4g} TFLOP/s"
        if w.sol_ms is not None:
            line += (f"; roofline ({w.roofline_bound}-bound) {w.sol_ms:.4g} ms, so "
                     f"{w.sol_ms / t.median_ms:.0%} of speed of light")
            if w.sol_score is not None:
                line += f", SOL score {w.sol_score:.2f}"
        lines.append(line)
    if ev.speedup is not None and not math.isnan(ev.speedup):
        lines.append(f"- geometric-mean speedup over the library: {ev.speedup:.3g}x"
                     + (" (above 1 is faster than the library)" if ev.speedup < 1 else ""))
    if ev.sol_score is not None:
        lines.append(f"- SOL score {ev.sol_score:.2f} (1 = at the roofline, 0.5 = as fast as the library)")
    return prompts.render("feedback_timing", lines="\n".join(lines))


def profile_section(ev: EvalResult) -> str:
    """The Nsight Compute profile of the candidate (tools/profile.py), or one line on why there
    is none. Left out for a kernel that computed wrong numbers: its speed is not the problem."""
    if ev.correct is False:
        return ""
    ex = ev.executed
    if ex.profile is None:
        why = ex.reason if ex.status != "ok" else "the Nsight Compute pass collected no profile"
        return prompts.render("feedback_profile", lines=render_profile(skipped_profile(why or "not measured")))
    return prompts.render("feedback_profile", lines=render_profile(ex.profile))
