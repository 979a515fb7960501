"""Replaying a recorded run.

`reevaluate(run_dir)`: every recorded candidate is extracted again from its reply.md and
evaluated with today's tools; each verdict is compared with the recorded eval.json. The
recorded run is never modified.

`through_graph(run_dir)`: the graph runs again with the recorded responses
(model `replay:<run dir>`) and the same configuration; the decision sequence
(repair / optimise / stop per turn) must come out the same.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from agent import feedback as fb
from agent.trajectory import RunConfig, RunFolderError, RunSummary, Verdicts, read_config, read_events, read_summary

SPEEDUP_NOISE = 0.10  # relative change below which two speedups count as the same (timing noise)


class ReplayError(ValueError):
    """The folder is not a recorded run, or cannot be replayed; one line."""


class ReplayInfraError(ReplayError):
    """Today's toolchain or GPU worker failed on a candidate: no verdict to compare (exit 3)."""


class VerdictChange(BaseModel):
    verdict: str
    before: object = None
    after: object = None


class CandidateReplay(BaseModel):
    path: str
    before: str  # recorded outcome
    after: str  # outcome with today's tools
    changes: list[VerdictChange] = Field(default_factory=list)


class ReevaluateReport(BaseModel):
    kind: str = "reevaluate"
    run_dir: str
    task: str
    arch: str
    tools_then: dict[str, str] = Field(default_factory=dict)
    tools_now: dict[str, str] = Field(default_factory=dict)
    candidates: list[CandidateReplay] = Field(default_factory=list)
    evaluation: str = ""

    @property
    def match(self) -> bool:
        return all(not c.changes and c.before == c.after for c in self.candidates)


class TurnComparison(BaseModel):
    turn: int
    recorded: str | None  # "repair (compile_error)"
    replayed: str | None


class GraphReplayReport(BaseModel):
    kind: str = "through_graph"
    run_dir: str
    replay_run_dir: str
    recorded: list[str]
    replayed: list[str]
    turns: list[TurnComparison] = Field(default_factory=list)
    recorded_stop: str | None = None
    replayed_stop: str | None = None
    partial: bool = False  # the recorded run did not finish: only its decisions so far are compared
    match: bool = False


# ---------------------------------------------------------------------------------------
class Recorded(BaseModel):
    """A recorded run as read back: its config, its summary (None while it never ended) and
    its events. Only a consistent record is replayed: a damaged or cut log would otherwise
    replay as a shorter run and "match"."""

    config: RunConfig
    summary: RunSummary | None
    events: list[dict]


def load_recorded(run_dir: Path) -> Recorded:
    if not (run_dir / "config.json").exists() or not (run_dir / "events.jsonl").exists():
        raise ReplayError(f"{run_dir}: not a recorded run (needs config.json and events.jsonl)")
    try:
        rec = Recorded(config=read_config(run_dir), summary=read_summary(run_dir), events=list(read_events(run_dir)))
    except RunFolderError as exc:
        raise ReplayError(str(exc)) from None
    starts = [i for i, e in enumerate(rec.events) if e["type"] == "run_start"]
    if not starts:
        raise ReplayError(f"{run_dir}/events.jsonl records no run (no run_start event)")
    ended = any(e["type"] == "run_end" for e in rec.events[starts[-1]:])
    if rec.summary is not None and rec.summary.status != "running" and not ended:
        raise ReplayError(f"{run_dir}/events.jsonl stops before the run's end (summary.json says "
                          f"{rec.summary.status}): the log is cut short")
    for e in rec.events:
        if e["type"] == "candidate" and not (run_dir / str(e.get("path", ""))).is_dir():
            raise ReplayError(f"{run_dir}: events.jsonl records {e.get('path')} but that folder is missing")
    return rec


def reevaluate(run_dir: str | Path) -> ReevaluateReport:
    from tasks import UnknownTask, get_task
    from tools.evaluator import Evaluator
    from tools.results import EvalResult
    from tools.solution import SolutionError, extract_solution

    from agent.run import tool_versions

    run_dir = Path(run_dir)
    config = load_recorded(run_dir).config
    try:
        task = get_task(config.task)
    except UnknownTask as exc:
        raise ReplayError(str(exc)) from None
    report = ReevaluateReport(run_dir=str(run_dir), task=config.task, arch=config.arch,
                              tools_then=config.tool_versions, tools_now=tool_versions())
    evaluator = Evaluator()
    try:
        for cdir in _candidate_dirs(run_dir):
            turn, sample = (int(x) for x in cdir.name.split("-"))
            rel = f"candidates/{cdir.name}"
            eval_path = cdir / "eval.json"
            if eval_path.exists():
                before = fb.candidate_record(turn, sample, rel, EvalResult.model_validate_json(eval_path.read_text()))
            else:
                before = fb.candidate_record(turn, sample, rel, None, "no solution extracted")
            reply = (cdir / "reply.md").read_text() if (cdir / "reply.md").exists() else ""
            try:
                solution = extract_solution(reply, config.lang)  # the run's language, as the loop enforced it
            except SolutionError as exc:
                after = fb.candidate_record(turn, sample, rel, None, str(exc))
            else:
                ev = evaluator.evaluate(solution, task, config.arch, workloads="all",
                                        executed_check=config.executed_check, time=True,
                                        profile=config.executed_check and config.profile_feedback)
                if ev.infra_error:  # today's tools could not judge it: no verdict to compare
                    raise ReplayInfraError(f"{rel}: infrastructure error, nothing compared: {ev.infra_error}")
                after = fb.candidate_record(turn, sample, rel, ev)
                report.evaluation = "ok" if fb.ran(ev) else f"skipped: {ev.run_reason}"
            report.candidates.append(CandidateReplay(path=rel, before=before.outcome, after=after.outcome,
                                                     changes=_changes(before.verdicts, after.verdicts)))
    finally:
        close = getattr(evaluator, "close", None)
        if callable(close):
            close()
    return report


def _candidate_dirs(run_dir: Path) -> list[Path]:
    dirs = [p for p in (run_dir / "candidates").glob("*-*") if p.is_dir()]
    return sorted(dirs, key=lambda p: tuple(int(x) for x in p.name.split("-")))


def _changes(before: Verdicts, after: Verdicts) -> list[VerdictChange]:
    out = []
    for name in Verdicts.model_fields:
        a, b = getattr(before, name), getattr(after, name)
        if name == "speedup" and a is not None and b is not None:
            if abs(b - a) <= SPEEDUP_NOISE * max(abs(a), 1e-12):
                continue
        if a != b:
            out.append(VerdictChange(verdict=name, before=a, after=b))
    return out


# ---------------------------------------------------------------------------------------
def through_graph(run_dir: str | Path, runs_dir: str | Path | None = None) -> GraphReplayReport:
    from agent.run import SolveRequest, solve

    run_dir = Path(run_dir)
    if runs_dir is not None:
        from agent.trajectory import folder_problem

        if (problem := folder_problem(runs_dir, "--runs-dir")):
            raise ReplayError(problem)
    rec = load_recorded(run_dir)
    config, recorded_summary = rec.config, rec.summary
    decisions = [e for e in rec.events if e["type"] == "decision"]
    recorded = recorded_summary.decisions if recorded_summary else [e["action"] for e in decisions]
    with_parents = any("parent" in e for e in decisions)  # recorded since parents were: the tree is compared too
    tree = config.strategy == "evolve"  # only there does the parent differ from the last turn's pick
    recorded_outcomes = {e["turn"]: _decided(e, tree) for e in decisions}
    finished = bool(recorded_summary and recorded_summary.status == "finished")
    # Same configuration; wall time is not reproducible, so a run stopped by max_time
    # replays exactly the turns it had.
    budget = config.budget.model_copy(update={"max_time_s": None})
    if recorded_summary and recorded_summary.stop_reason == "max_time":
        budget.max_turns = recorded_summary.turns
    out_root = Path(runs_dir) if runs_dir else Path(tempfile.mkdtemp(prefix="ptxbench-replay-"))
    req = SolveRequest(task=config.task, model=f"replay:{run_dir}", arch=config.arch, lang=config.lang,
                       context=config.context, context_tokens=config.context_tokens, budget=budget,
                       samples=config.samples, strategy=config.strategy, population=config.population,
                       profile_feedback=config.profile_feedback,
                       runs_dir=out_root, seed=config.seed, temperature=config.temperature,
                       executed_check=config.executed_check, history=config.history, require=config.require,
                       model_params=dict(config.model_params), context_turn_tokens=config.context_turn_tokens,
                       memcheck=config.memcheck, hints=list(config.hints),
                       command=["agent", "replay", "--through-graph", str(run_dir)])
    summary = solve(req, progress=False)
    replay_dir = out_root / summary.run_id
    replayed = summary.decisions
    replayed_outcomes = {e["turn"]: _decided(e, tree) for e in read_events(replay_dir, "decision")}
    turns = []
    for i in range(max(len(recorded), len(replayed))):  # one decision per turn
        r = _decision_text(recorded[i], recorded_outcomes.get(i + 1)) if i < len(recorded) else None
        p = _decision_text(replayed[i], replayed_outcomes.get(i + 1)) if i < len(replayed) else None
        turns.append(TurnComparison(turn=i + 1, recorded=r, replayed=p))
    # evolve's parents make a tree: a replay must draw the same parents (outcomes may differ
    # with the machine, e.g. unverified on a CPU; the decisions and the tree may not)
    replayed_parents = {e["turn"]: e.get("parent") for e in read_events(replay_dir, "decision")}
    same_tree = not with_parents or all(replayed_parents.get(e["turn"]) == e.get("parent") for e in decisions)
    match = (recorded == replayed if finished else replayed[:len(recorded)] == recorded) and same_tree
    return GraphReplayReport(
        run_dir=str(run_dir), replay_run_dir=str(replay_dir), recorded=recorded, replayed=replayed, turns=turns,
        recorded_stop=recorded_summary.stop_reason if recorded_summary else None, replayed_stop=summary.stop_reason,
        partial=not finished, match=match)


def _decided(decision: dict, with_parent: bool) -> str:
    """A decision's outcome, and for evolve the candidate the next turn answers (its drawn parent)."""
    parent = decision.get("parent") if with_parent and decision.get("action") != "stop" else None
    return f"{decision.get('outcome')}" + (f" -> next from {parent}" if parent else "")


# ---------------------------------------------------------------------------------------
def print_report(report, console) -> None:
    from agent.commands.common import plural

    p = lambda s: console.print(s, highlight=False, soft_wrap=True)  # noqa: E731
    if isinstance(report, ReevaluateReport):
        p(f"re-evaluated {plural(len(report.candidates), 'candidate')} of {report.run_dir} "
          f"({report.task}, {report.arch})")
        then, now = report.tools_then, report.tools_now
        def version(v) -> str:  # a tool or rule set the recording had no version of: words, not None
            return "not recorded" if v is None else str(v)

        diff = [f"{k} {version(then.get(k))} -> {version(now.get(k))}" for k in sorted(set(then) | set(now))
                if then.get(k) != now.get(k)]
        p("tools: " + ("; ".join(diff) if diff else "same versions as recorded"))
        if report.evaluation:
            p(f"evaluation: {report.evaluation}")
        for c in report.candidates:
            if not c.changes and c.before == c.after:
                p(f"  {c.path}: same ({c.after.replace('_', ' ')})")
                continue
            p(f"  {c.path}: CHANGED {c.before} -> {c.after}")
            for ch in c.changes:
                p(f"      {ch.verdict}: {'not checked' if ch.before is None else ch.before} -> "
                  f"{'not checked' if ch.after is None else ch.after}")
        if not report.candidates:
            p("result: nothing to compare (the run recorded no candidate)")
        else:
            p("result: " + ("no verdict changed" if report.match else "verdicts changed"))
    else:
        p(f"replayed {report.run_dir} through the graph -> {report.replay_run_dir}")
        for t in report.turns:
            # an unfinished recorded run has no decision for later turns: nothing to differ from
            mark = ("same" if t.recorded == t.replayed else
                    "not recorded" if t.recorded is None and report.partial else "DIFFERENT")
            p(f"  turn {t.turn}: recorded {t.recorded or '-'}  replayed {t.replayed or '-'}  {mark}")
        p(f"stop: recorded {report.recorded_stop or '- (unfinished)'}, replayed {report.replayed_stop or '-'}")
        note = " (recorded run unfinished: its decisions so far compared)" if report.partial else ""
        p(("match" if report.match else "MISMATCH") + ": decision sequence " +
          ("reproduced" if report.match else "differs") + note)


def _decision_text(action: str, outcome: str | None) -> str:
    """"repair (compile_error)"; a turn without a candidate (the model gave no reply) says so."""
    return f"{action} ({outcome or 'no reply'})"
