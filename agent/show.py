"""One run read as a researcher reads it: a turn-by-turn view (`agent show RUN`) and a page of it
(`agent show RUN --html OUT`).

A run folder (agent/trajectory.py) holds everything, spread over events.jsonl, summary.json and each
candidate's reply.md, kernel and eval.json. This module gathers it into typed views: RunView (every
turn and sample with its action, verdicts, opcode counts, speedup, tokens and the feedback's gist)
and TurnDetail (one candidate's prompt, reply, feedback and kernel diff against the kernel it
answered). It only reads: the run's verdicts are the ones recorded, never recomputed.
"""
from __future__ import annotations

import difflib
import html
import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from agent.trajectory import (CandidateRecord, RunFolderError, TurnRecord, Usage, read_config, read_events,
                              read_summary)

Action = Literal["draft", "repair", "optimise"]


class FeatureView(BaseModel):
    """One requested instruction family of one candidate: in the SASS, and counted at run time."""

    name: str
    in_sass: bool | None = None  # None: the SASS was not inspected (compile failed)
    opcodes: dict[str, int] = Field(default_factory=dict)  # proving SASS opcodes -> static count
    ran: bool | None = None  # the executed check saw it execute; None: not checked
    executed: int | None = None  # executed instructions it counted (where it reports a count)
    share: float | None = None  # measured share of the task's work it carried
    carries: bool | None = None


class CandidateView(BaseModel):
    turn: int
    sample: int
    path: str
    action: Action
    outcome: str
    best: bool = False  # the run's best kernel
    chosen: bool = False  # its reply continued the conversation
    parent: str | None = None  # the candidate whose feedback it answered
    compiled: bool = False
    arch_sass: bool = False
    features: list[FeatureView] = Field(default_factory=list)
    flags: dict[str, bool] = Field(default_factory=dict)  # wgmma_serialized, setmaxnreg_ignored
    executed_check: str = "skipped"  # "ok", "failed" or "skipped: <reason>"
    run: str = "skipped"  # correctness and timing: "ok", "failed: <reason>", "skipped: <reason>"
    correct: bool | None = None
    correct_held_out: bool | None = None
    correct_with_arch: bool | None = None
    speedup: float | None = None
    speedup_ci: list[float] | None = None
    speedup_held_out: float | None = None
    error: str | None = None
    kernel: str | None = None  # kernel file name in the candidate's folder
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None


class SectionView(BaseModel):
    """A doc section the arm retrieved for a turn, and whether that turn's prompt newly carried it."""

    id: str
    doc: str
    heading: str
    tokens: int
    why: str = ""
    sent: bool = False


class TurnView(BaseModel):
    turn: int
    action: Action
    candidates: list[CandidateView] = Field(default_factory=list)
    decision: str | None = None  # what the loop did next (repair | optimise | stop) and why
    feedback: str | None = None  # the feedback on this turn's kernel: the next turn's user message
    feedback_gist: str | None = None  # its section headings on one line
    retrieved: list[SectionView] = Field(default_factory=list)
    retrieved_tokens: int | None = None  # tokens of the docs sent with this turn's prompt


class RunView(BaseModel):
    run_dir: str
    run_id: str
    task: str
    arch: str
    model: str
    context: str
    strategy: str
    samples: int
    requested_features: list[str]
    status: str  # finished | running | interrupted | failed (summary.json), "running" without one
    stop_reason: str | None = None
    stop_detail: str | None = None
    evaluation: str = "ok"
    gpu: str | None = None
    turns: list[TurnView] = Field(default_factory=list)
    best: str | None = None  # the best candidate's path
    best_speedup: float | None = None
    usage: Usage = Field(default_factory=Usage)
    wall_s: float = 0.0


class TurnDetail(BaseModel):
    """One candidate in full: what the model was sent, what it replied, what it was told, what changed."""

    turn: int
    sample: int
    path: str
    prompt: str | None = None  # the last user message sent (the task on turn 1, then the feedback and new docs)
    earlier_messages: list[str] = Field(default_factory=list)  # "system: 1304 chars" for each message before it
    reply: str | None = None
    feedback: str | None = None
    kernel: str | None = None
    previous: str | None = None  # the candidate diffed against (its parent, else the previous turn's chosen)
    diff: str | None = None  # unified diff of the kernel against `previous`'s; None where there is none


class ShowError(RunFolderError):
    """A folder or turn that cannot be shown; the message is one line for a person."""


# ---------------------------------------------------------------------------------------
# Reading a run
# ---------------------------------------------------------------------------------------
def load_run(run_dir: str | Path) -> RunView:
    """The run at `run_dir` as a RunView. A run still going (no summary.json) shows what its events hold."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise ShowError(f"{run_dir}: not a run folder (no config.json)")
    config = read_config(run_dir)
    summary = read_summary(run_dir)
    events = list(read_events(run_dir))
    per_turn = summary.per_turn if summary and summary.per_turn else _turns_from_events(events)
    best = (summary.best_path or (summary.best.path if summary.best else None)) if summary else None
    usage_of = {(e.get("turn"), e.get("sample")): e.get("usage") or {} for e in events if e["type"] == "llm_response"}
    decisions = {e.get("turn"): e for e in events if e["type"] == "decision"}
    feedback = {e.get("turn"): e.get("text") for e in events if e["type"] == "feedback"}
    retrievals = {e.get("turn"): e for e in events if e["type"] == "retrieval"}

    turns = []
    for t in per_turn:
        previous = decisions.get(t.turn - 1, {}).get("action")
        action: Action = "draft" if t.turn == 1 else ("optimise" if previous == "optimise" else "repair")
        cands = [_candidate_view(run_dir, c, action, usage_of.get((c.turn, c.sample), {}),
                                 best=c.path == best, chosen=t.chosen == c.sample, requested=config.requested_features)
                 for c in t.candidates]
        d = decisions.get(t.turn)
        text = feedback.get(t.turn)
        r = retrievals.get(t.turn) or {}
        sent = set(r.get("new_sections") or [])
        turns.append(TurnView(
            turn=t.turn, action=action, candidates=cands,
            decision=f"{d.get('action')}: {d.get('reason')}" if d else (t.action or None),
            feedback=text, feedback_gist=feedback_gist(text),
            retrieved=[SectionView(id=s.get("id", ""), doc=s.get("doc", ""), heading=s.get("heading", ""),
                                   tokens=int(s.get("tokens") or 0), why=s.get("why") or "", sent=s.get("id") in sent)
                       for s in r.get("sections") or []],
            retrieved_tokens=r.get("prompt_tokens")))
    return RunView(run_dir=str(run_dir), run_id=config.run_id, task=config.task, arch=config.arch, model=config.model,
                   context=config.context, strategy=config.strategy, samples=config.samples,
                   requested_features=list(config.requested_features),
                   status=summary.status if summary else "running",
                   stop_reason=summary.stop_reason if summary else None,
                   stop_detail=summary.stop_detail if summary else None,
                   evaluation=summary.evaluation if summary else "ok", gpu=config.gpu, turns=turns, best=best,
                   best_speedup=summary.best_speedup if summary else None,
                   usage=summary.usage if summary else Usage(), wall_s=summary.wall_s if summary else 0.0)


def _turns_from_events(events: list[dict]) -> list[TurnRecord]:
    """Per-turn candidates of a run without a summary yet: its candidate events (a resumed turn's last)."""
    found: dict[tuple[int, int], CandidateRecord] = {}
    for e in events:
        if e["type"] == "candidate":
            try:
                found[(e["turn"], e["sample"])] = CandidateRecord.model_validate(e)
            except (ValidationError, KeyError):
                continue
    chosen = {e.get("turn"): e.get("chosen") for e in events if e["type"] == "decision"}
    turns: dict[int, TurnRecord] = {}
    for (turn, _), c in sorted(found.items()):
        turns.setdefault(turn, TurnRecord(turn=turn, chosen=chosen.get(turn))).candidates.append(c)
    return [turns[t] for t in sorted(turns)]


def _eval(run_dir: Path, c: CandidateRecord):
    """The candidate's EvalResult, or None (no eval.json: no kernel, or an unreadable one)."""
    from tools.results import EvalResult

    path = run_dir / c.path / "eval.json"
    try:
        return EvalResult.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError):
        return None


def _candidate_view(run_dir: Path, c: CandidateRecord, action: Action, usage: dict, *, best: bool, chosen: bool,
                    requested: list[str]) -> CandidateView:
    v = c.verdicts
    ev = _eval(run_dir, c)
    features: list[FeatureView] = []
    view = CandidateView(turn=c.turn, sample=c.sample, path=c.path, action=action, outcome=c.outcome, best=best,
                         chosen=chosen, parent=c.parent, compiled=v.compiled, arch_sass=v.arch_sass,
                         correct=v.correct, correct_held_out=v.correct_held_out, correct_with_arch=v.correct_with_arch,
                         speedup=v.speedup, speedup_ci=v.speedup_ci, speedup_held_out=v.speedup_held_out,
                         error=c.error, kernel=next((k for k in ("kernel.cu", "kernel.ptx")
                                                     if (run_dir / c.path / k).is_file()), None),
                         prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                         cost_usd=usage.get("cost_usd"))
    for name in (ev.requested_features if ev and ev.requested_features else requested):
        f = FeatureView(name=name)
        if ev is not None and ev.inspect.status == "ok":
            verdict = ev.inspect.features.get(name)
            f.in_sass = bool(verdict and verdict.present)
            f.opcodes = dict(verdict.opcodes) if verdict else {}
        if ev is not None and ev.executed.status == "ok":
            f.ran = ev.executed.executed.get(name)
            f.executed = ev.executed.counts.get(name)
            f.share = ev.executed.shares.get(name)
            f.carries = ev.executed.carries.get(name)
        features.append(f)
    view.features = features
    if ev is not None:
        view.flags = {k: on for k, on in ev.inspect.flags.items() if on}
        view.executed_check = _status(ev.executed.status, ev.executed.reason)
        view.run = _status(ev.run_status, ev.run_reason)
    return view


def _status(status: str, reason: str | None) -> str:
    return status if status == "ok" or not reason else f"{status}: {reason}"


def feedback_gist(text: str | None) -> str | None:
    """The feedback on one line: its section headings ("Compile: ok · Architecture instructions: missing
    wgmma, tma · ..."), which carry each stage's verdict; the first non-empty line where it has none."""
    if not text:
        return None
    heads = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("### ")]
    if heads:
        return " · ".join(heads)
    return next((line.strip().lstrip("#").strip() for line in text.splitlines() if line.strip()), None)


# ---------------------------------------------------------------------------------------
# One turn in full
# ---------------------------------------------------------------------------------------
def turn_details(view: RunView, turn: int) -> list[TurnDetail]:
    """Every candidate of `turn` in full (one per sample). ShowError for a turn the run does not have."""
    by_turn = {t.turn: t for t in view.turns}
    if turn not in by_turn:
        have = ", ".join(str(t) for t in by_turn) or "none"
        raise ShowError(f"run {view.run_id} has no turn {turn} (its turns: {have})")
    return [candidate_detail(view, c) for c in by_turn[turn].candidates]


def candidate_detail(view: RunView, c: CandidateView, requests: list[dict] | None = None) -> TurnDetail:
    """`requests`: the run's llm_request events, where the caller read them once for many candidates."""
    run_dir = Path(view.run_dir)
    if requests is None:
        requests = list(read_events(run_dir, "llm_request"))
    requests = [e for e in requests if e.get("turn") == c.turn and e.get("sample") == c.sample]
    messages = (requests[-1].get("messages") or []) if requests else []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    turn = next(t for t in view.turns if t.turn == c.turn)
    prev = _previous(view, c)
    kernel = _read(run_dir / c.path / c.kernel) if c.kernel else None
    prev_kernel = _read(run_dir / prev.path / prev.kernel) if prev and prev.kernel else None
    diff = None
    if kernel is not None and prev_kernel is not None:
        diff = "".join(difflib.unified_diff(prev_kernel.splitlines(keepends=True), kernel.splitlines(keepends=True),
                                            fromfile=f"{prev.path}/{prev.kernel}",  # type: ignore[union-attr]
                                            tofile=f"{c.path}/{c.kernel}"))
    return TurnDetail(
        turn=c.turn, sample=c.sample, path=c.path,
        prompt=messages[last_user].get("content") if last_user is not None else None,
        earlier_messages=[f"{m.get('role')}: {len(m.get('content') or '')} chars" for m in messages[:last_user or 0]],
        reply=_read(run_dir / c.path / "reply.md"),
        feedback=turn.feedback if c.chosen or len(turn.candidates) == 1 else None,
        kernel=kernel, previous=prev.path if prev else None, diff=diff)


def _previous(view: RunView, c: CandidateView) -> CandidateView | None:
    """The kernel `c` answered: its recorded parent, else the previous turn's chosen (or only) candidate."""
    cands = {x.path: x for t in view.turns for x in t.candidates}
    if c.parent and c.parent in cands:
        return cands[c.parent]
    before = [t for t in view.turns if t.turn == c.turn - 1]
    if not before or not before[0].candidates:
        return None
    return next((x for x in before[0].candidates if x.chosen), before[0].candidates[0])


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


# ---------------------------------------------------------------------------------------
# Words for verdicts (the terminal and the page say the same)
# ---------------------------------------------------------------------------------------
def tri(value: bool | None) -> str:
    return "n/a" if value is None else "yes" if value else "no"


def speedup_text(c: CandidateView) -> str:
    if c.speedup is None:
        return "n/a"
    ci = f" [{c.speedup_ci[0]:.3f}-{c.speedup_ci[1]:.3f}]" if c.speedup_ci and len(c.speedup_ci) == 2 else ""
    held = f", held-out {c.speedup_held_out:.3f}x" if c.speedup_held_out is not None else ""
    return f"{c.speedup:.3f}x{ci}{held}"


def feature_text(f: FeatureView) -> str:
    """wgmma: in SASS (HGMMA x64); executed 1.2e6, share 98%, carries."""
    sass = "not inspected" if f.in_sass is None else (
        "in SASS" + (" (" + ", ".join(f"{op} x{n}" for op, n in sorted(f.opcodes.items())) + ")"
                     if f.opcodes else "") if f.in_sass
        else "MISSING from SASS")
    run = ""
    if f.ran is not None or f.executed is not None:
        share = f", share {f.share:.0%}" if f.share is not None and math.isfinite(f.share) else ""
        carries = "" if f.carries is None else (", carries the work" if f.carries else ", does NOT carry the work")
        run = f"; {_ran(f)}{share}{carries}"
    return f"{f.name}: {sass}{run}"


def tokens_text(c: CandidateView) -> str:
    if c.prompt_tokens is None and c.completion_tokens is None:
        return "n/a"
    cost = "" if c.cost_usd is None else f", ${c.cost_usd:.4f}"
    return f"{c.prompt_tokens or 0:,} in / {c.completion_tokens or 0:,} out{cost}"


# ---------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------
# No script, no remote anything: the policy forbids every fetch, so the page works (and is the
# same) offline, and a reader's browser loads nothing a run's text might name.
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:72em;color:#222;padding:0 1em}
h1{font-size:1.4em}h2{font-size:1.15em;margin:0 0 .4em}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}th{background:#f3f3f3}
.card{border:1px solid #bbb;border-radius:6px;padding:.8em 1em;margin:1em 0}.card.best{border:2px solid #2a7}
.ok{color:#1a7f37}.bad{color:#c62828}.na{color:#888}.tag{display:inline-block;border-radius:3px;padding:0 5px;
margin-right:4px;font-size:12px;background:#eee}.tag.best{background:#2a7;color:#fff}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:12px;max-height:40em}
.diff .add{background:#e6ffec}.diff .del{background:#ffebe9}.diff .hunk{color:#6639ba}
.diff span{display:inline-block;min-width:100%}summary{cursor:pointer;margin:.3em 0}
.bar{display:inline-block;height:10px;background:#4a7bd0;vertical-align:middle;margin-right:4px}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _verdict_span(label: str, value: bool | None) -> str:
    cls = "na" if value is None else "ok" if value else "bad"
    return f"<span class='{cls}'>{_e(label)}: {tri(value)}</span>"


def render_html(view: RunView) -> str:
    """The run as one self-contained page: a card per turn, a plot of speed and verdicts over turns,
    the retrieved sections. Nothing on it is fetched: no script, no stylesheet, no font, no image URL."""
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             f"<meta http-equiv='Content-Security-Policy' content=\"{_CSP}\">",
             f"<title>{_e(view.run_id)}: ptxbench run</title><style>{_CSS}</style></head><body>",
             f"<h1>Run {_e(view.run_id)}</h1>", _run_table(view), _plot_svg(view)]
    requests = list(read_events(Path(view.run_dir), "llm_request"))
    for turn in view.turns:
        for c in turn.candidates:
            parts.append(_card(view, turn, c, candidate_detail(view, c, requests)))
    parts.append(_retrieved(view))
    parts.append("</body></html>")
    return "\n".join(parts)


def _run_table(view: RunView) -> str:
    u = view.usage
    cost = "unknown" if u.cost_usd is None else f"${u.cost_usd:.4f}"
    rows = [("task", f"{view.task} on {view.arch}"), ("model", view.model),
            ("context arm", view.context), ("strategy", f"{view.strategy}, {view.samples} sample(s) a turn"),
            ("requested instructions", ", ".join(view.requested_features) or "none"),
            ("status", f"{view.status}" + (f" ({view.stop_reason}: {view.stop_detail})" if view.stop_reason else "")),
            ("evaluation", view.evaluation), ("GPU", view.gpu or "none"),
            ("best kernel", (view.best or "none") + (f", {view.best_speedup:.3f}x" if view.best_speedup else "")),
            ("usage", f"{u.llm_calls} LLM calls, {u.prompt_tokens:,} prompt + {u.completion_tokens:,} completion "
                      f"tokens, {cost}, {view.wall_s:.1f} s")]
    return "<table class='run'>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def _plot_svg(view: RunView) -> str:
    """Speedup of each candidate over turns (log-free, 0 to the largest), with a marker per verdict:
    green filled = correct with arch, hollow = not (or unknown); n/a speeds sit on the axis, grey."""
    cands = [c for t in view.turns for c in t.candidates]
    if not cands:
        return "<p class='na'>no candidates</p>"
    w, h, left, bottom, top = 560, 200, 50, 30, 15
    turns = max(c.turn for c in cands)
    ymax = max([1.0] + [c.speedup for c in cands if c.speedup is not None]) * 1.1
    x = lambda t: left + (t - 0.5) * (w - left - 10) / turns  # noqa: E731
    y = lambda s: h - bottom - s * (h - bottom - top) / ymax  # noqa: E731
    out = [f"<figure><svg role='img' aria-label='speedup and verdicts over turns' width='{w}' height='{h}' "
           f"xmlns='http://www.w3.org/2000/svg' font-size='11' font-family='sans-serif'>",
           f"<line x1='{left}' y1='{h - bottom}' x2='{w - 10}' y2='{h - bottom}' stroke='#555'/>",
           f"<line x1='{left}' y1='{top}' x2='{left}' y2='{h - bottom}' stroke='#555'/>",
           f"<line x1='{left}' y1='{y(1.0):.1f}' x2='{w - 10}' y2='{y(1.0):.1f}' stroke='#aaa' stroke-dasharray='4 3'/>",
           f"<text x='{left - 4}' y='{y(1.0) + 4:.1f}' text-anchor='end'>1x</text>",
           f"<text x='{left - 4}' y='{h - bottom + 4}' text-anchor='end'>0</text>",
           f"<text x='{(w + left) / 2}' y='{h - 4}' text-anchor='middle'>turn</text>"]
    for t in range(1, turns + 1):
        out.append(f"<text x='{x(t):.1f}' y='{h - bottom + 14}' text-anchor='middle'>{t}</text>")
    points = []
    for c in cands:
        cx = x(c.turn) + (c.sample - (view.samples - 1) / 2) * 8
        cy = y(c.speedup) if c.speedup is not None else h - bottom
        colour = "#1a7f37" if c.correct_with_arch else "#c62828" if c.correct is False or not c.compiled else "#888"
        fill = colour if c.correct_with_arch else "white"
        label = (f"turn {c.turn} sample {c.sample}: {c.outcome}, speedup {speedup_text(c)}"
                 + (" (best)" if c.best else ""))
        out.append(f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='{7 if c.best else 5}' fill='{fill}' stroke='{colour}' "
                   f"stroke-width='2'><title>{_e(label)}</title></circle>")
        out.append(f"<text x='{cx:.1f}' y='{cy - 9:.1f}' text-anchor='middle' fill='{colour}'>{_e(c.outcome)}</text>")
        if c.speedup is not None:
            points.append(f"{cx:.1f},{cy:.1f}")
    if len(points) > 1:
        out.append(f"<polyline points='{' '.join(points)}' fill='none' stroke='#4a7bd0' stroke-width='1.5'/>")
    out.append("</svg><figcaption>Speedup vs the library per candidate (n/a on the axis); filled green: correct "
               "with arch; red: failed; grey: unknown (e.g. no GPU). Labels: the outcome.</figcaption></figure>")
    return "".join(out)


def _card(view: RunView, turn: TurnView, c: CandidateView, d: TurnDetail) -> str:
    tags = [f"<span class='tag'>{_e(c.action)}</span>", f"<span class='tag'>{_e(c.outcome)}</span>"]
    if c.best:
        tags.append("<span class='tag best'>best kernel</span>")
    title = f"Turn {c.turn}" + (f", sample {c.sample}" if view.samples > 1 else "")
    verdicts = " · ".join([
        _verdict_span("compiled", c.compiled), _verdict_span("requested instructions in SASS", c.arch_sass),
        _verdict_span("correct", c.correct), _verdict_span("held-out", c.correct_held_out),
        _verdict_span("correct with arch", c.correct_with_arch)])
    parts = [f"<section class='card{' best' if c.best else ''}' id='turn-{c.turn}-{c.sample}'>",
             f"<h2>{_e(title)} {''.join(tags)}</h2>", f"<p class='verdicts'>{verdicts}</p>",
             f"<p>speedup: {_e(speedup_text(c))} · run: {_e(c.run)} · executed check: {_e(c.executed_check)} · "
             f"tokens: {_e(tokens_text(c))}</p>"]
    if c.error:
        parts.append(f"<p class='bad'>{_e(c.error)}</p>")
    parts.append(_histogram(c))
    if turn.decision:
        parts.append(f"<p>decision: {_e(turn.decision)}</p>")
    if d.feedback:
        parts.append(f"<details open><summary>feedback: {_e(turn.feedback_gist or '')}</summary>"
                     f"<pre class='feedback'>{_e(d.feedback)}</pre></details>")
    if d.prompt is not None:
        earlier = f" (after {len(d.earlier_messages)} earlier messages: {'; '.join(d.earlier_messages)})" \
            if d.earlier_messages else ""
        parts.append(f"<details><summary>prompt{_e(earlier)}</summary><pre>{_e(d.prompt)}</pre></details>")
    if d.reply is not None:
        parts.append(f"<details><summary>reply</summary><pre>{_e(d.reply)}</pre></details>")
    if d.kernel is not None:
        parts.append(f"<details><summary>kernel ({_e(c.kernel)})</summary><pre>{_e(d.kernel)}</pre></details>")
    if d.diff is not None:
        parts.append(f"<details open><summary>diff against {_e(d.previous)}</summary>{_diff_html(d.diff)}</details>")
    elif d.kernel is not None:
        parts.append("<p class='na'>no earlier kernel to diff against</p>")
    parts.append("</section>")
    return "\n".join(parts)


def _histogram(c: CandidateView) -> str:
    """The requested families' proving opcodes, as bars scaled to the largest count in the card."""
    counts = [(f, op, n) for f in c.features for op, n in sorted(f.opcodes.items())]
    rows = []
    top = max((n for _, _, n in counts), default=1)
    for f in c.features:
        if not f.opcodes:
            rows.append(f"<tr><td>{_e(f.name)}</td><td colspan='2' class='{'na' if f.in_sass is None else 'bad'}'>"
                        f"{_e('not inspected' if f.in_sass is None else 'none in the SASS')}</td>"
                        f"<td>{_e(_executed(f))}</td></tr>")
        for op, n in sorted(f.opcodes.items()):
            rows.append(f"<tr><td>{_e(f.name)}</td><td>{_e(op)}</td><td><span class='bar' "
                        f"style='width:{max(2, round(160 * n / top))}px'></span>{n}</td><td>{_e(_executed(f))}</td></tr>")
    if not rows:
        return ""
    flags = "".join(f"<p class='bad'>ptxas: {_e(k.replace('_', ' '))}</p>" for k in c.flags)
    return ("<table class='opcodes'><tr><th>requested</th><th>SASS opcode</th><th>static count</th>"
            "<th>at run time</th></tr>" + "".join(rows) + "</table>" + flags)


def _ran(f: FeatureView) -> str:
    if f.executed is not None:
        return f"executed {f.executed:,}" if f.executed or f.ran is not False else "NOT executed (0)"
    return "executed" if f.ran else "NOT executed"


def _executed(f: FeatureView) -> str:
    if f.ran is None and f.executed is None:
        return "not counted"
    share = f", share {f.share:.0%}" if f.share is not None and math.isfinite(f.share) else ""
    return f"{_ran(f)}{share}" + ("" if f.carries is None else ", carries" if f.carries else ", does not carry")


def _diff_html(diff: str) -> str:
    lines = []
    for line in diff.splitlines():
        cls = "hunk" if line.startswith("@@") else "add" if line.startswith("+") and not line.startswith("+++") \
            else "del" if line.startswith("-") and not line.startswith("---") else ""
        lines.append(f"<span class='{cls}'>{_e(line)}</span>" if cls else _e(line))
    return "<pre class='diff'>" + "\n".join(lines) + "</pre>"


def _retrieved(view: RunView) -> str:
    rows = [f"<tr><td>{t.turn}</td><td>{_e(s.doc)}</td><td>{_e(s.heading)}</td><td>{s.tokens}</td>"
            f"<td>{'sent' if s.sent else 'not newly sent'}</td><td>{_e(s.why)}</td></tr>"
            for t in view.turns for s in t.retrieved]
    if not rows:
        return f"<h2>Retrieved sections</h2><p class='na'>none (context arm {_e(view.context)})</p>"
    sent = sum(s.tokens for t in view.turns for s in t.retrieved if s.sent)
    return (f"<h2>Retrieved sections (context arm {_e(view.context)}; {sent:,} tokens of sections sent)</h2>"
            "<table class='retrieved'><tr><th>turn</th><th>doc</th><th>section</th><th>tokens</th><th>this turn</th>"
            "<th>why</th></tr>" + "".join(rows) + "</table>")


def write_html(view: RunView, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(view), encoding="utf-8")
    return out
