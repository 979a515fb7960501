"""The agent graph's nodes. Each is small, takes the state, returns the keys it changes,
and records what it did in the trajectory.

    retrieve_context  architecture docs for the next prompt (the context ablation)
    draft             the LLM writes N candidates (best-of-N); replies are extracted. What of the
                      chat is sent follows the history policy (full | latest), and a prompt that
                      does not fit the model's context window is not sent: the run ends
                      `context_exceeded`
    evaluate          compile -> inspect -> run per candidate (tools.evaluator)
    decide            pick the turn's best sample, update the best so far, check the budget,
                      choose the parent the next turn answers (that sample; for the evolve
                      strategy one drawn from the best `population` candidates) and
                      repair / optimise / stop by it
    repair, optimise  render the feedback the model sees next turn (evolve: a branch of
                      turn 1's prompt, the parent's reply and the parent's feedback)

Nodes are idempotent across a crash: a reply already in events.jsonl or an eval.json
already on disk is reused on resume, never asked for or computed again.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agent import feedback as fb
from agent import prompts
from agent.budget import Clock, Spent, exhausted
from agent.models import RETRYABLE, Fault, Model, ModelError, call_options
from agent.state import NOT_RUN, AgentState, Reply, summary_from_state
from agent.trajectory import (CandidateRecord, RunConfig, TrajectoryWriter, TurnRecord, candidate_relpath,
                              read_events, write_eval_json, write_text_atomic)
from tools.results import EvalResult
from tools.solution import Solution, SolutionError, extract_solution


# Model errors that end a run for good, and the stop reason each gives; any other is model_error,
# which a resume retries.
NATURAL_ENDS = {"replay_exhausted": "replay_end", "script_exhausted": "script_end", "human_exhausted": "human_end",
                "context_exceeded": "context_exceeded"}


class InfraFault(RuntimeError):
    """The toolchain, GPU worker or profiler failed on a candidate (EvalResult.infra_error):
    the run stops with stop_reason "infra_error" instead of blaming the model."""


@dataclass
class Deps:
    """What the nodes work with; rebuilt from config.json on resume."""

    config: RunConfig
    task: Any  # tasks.schema.Task
    task_text: str  # tasks.describe.render_task(task, arch, lang)
    model: Model
    evaluator: Any  # tools.evaluator.Evaluator
    writer: TrajectoryWriter
    clock: Clock
    retrieve: Callable | None = None  # knowledge.retriever.retrieve


class Nodes:
    """Node functions bound to their dependencies (deps=None is enough to draw the graph)."""

    names = ("retrieve_context", "draft", "evaluate", "decide", "repair", "optimise")

    def __init__(self, deps: Deps | None):
        self.deps = deps

    def node(self, name: str) -> Callable[[AgentState], dict]:
        fn = getattr(self, name)

        def run(state: AgentState) -> dict:
            w, t0 = self.deps.writer, time.monotonic()
            turn = state.get("turn", 0) + (1 if name in ("retrieve_context", "draft") else 0)
            w.event("node", node=name, phase="start", turn=turn, inputs=_brief(state, _READS[name]))
            update = fn(state)
            w.event("node", node=name, phase="end", turn=turn, seconds=round(time.monotonic() - t0, 3),
                    outputs=_brief(update, update.keys()))
            return update

        run.__name__ = name
        return run

    # -------------------------------------------------------------------------------
    def retrieve_context(self, state: AgentState) -> dict:
        """Docs for the next prompt. Turn 1 gets the retriever's whole selection; later turns,
        retrieved again with the feedback, get only the sections not yet in the chat."""
        d, cfg = self.deps, self.deps.config
        turn = state["turn"] + 1
        if (cfg.context == "none" and not cfg.hints) or d.retrieve is None:
            d.writer.event("retrieval", turn=turn, mode=cfg.context, sections=[], new_sections=[], tokens=0, added={})
            return {"context": ""}
        r = d.retrieve(**retrieval_call(d.task, cfg, state.get("feedback")))
        refs = [{"id": f"{s.doc}#{s.heading}", "doc": s.doc, "heading": s.heading, "tokens": s.tokens,
                 "why": s.why} for s in r.sections]
        seen = set(state.get("context_sections") or [])
        new = [x for x in refs if x["id"] not in seen]
        if turn > 1:  # a turn's feedback, not a new manual, is the point of turns 2+: only sections
            # ranked for the feedback's error class (its failing construct, its C75xx codes, the
            # pipeline of a feature that did not carry the work), each with its reason in `why`
            from knowledge.retriever import follows_feedback

            new = cap_sections([x for x in new if follows_feedback(x["why"])], cfg.context_turn_tokens)
        why = " and the last result" if turn > 1 else ""
        if turn == 1:
            block = prompts.context_block([r.text], why=why)  # exactly what the retriever rendered
        else:
            block = prompts.context_block(_section_texts([x["id"] for x in new]), why=why)
        d.writer.event("retrieval", turn=turn, mode=cfg.context, sections=refs, new_sections=[x["id"] for x in new],
                       tokens=r.tokens, prompt_tokens=_count(block, getattr(r, "tokenizer", "chars/4")),
                       tokenizer=getattr(r, "tokenizer", "chars/4"), truncated=getattr(r, "truncated", False),
                       focus=getattr(r, "focus", "none"),  # the feedback's error class (turns 2+)
                       # tokens and sections each layer of the arm added: all of them on turn 1, later
                       # turns add only new_sections (the header API and the example are sent once)
                       added=getattr(r, "parts", {}) if turn == 1 else {},
                       # docs+example: the example served, or why none (it solves other variants)
                       **({"example": r.example} if turn == 1 and getattr(r, "example", None) else {}))
        update = {"context": block, "context_sections": sorted(seen | {x["id"] for x in new})}
        if turn == 1:  # evolve starts every branch from turn 1's prompt, with these sections in it
            update["base_sections"] = update["context_sections"]
        return update

    # -------------------------------------------------------------------------------
    def draft(self, state: AgentState) -> dict:
        d, cfg = self.deps, self.deps.config
        turn = state["turn"] + 1
        messages = list(state["messages"])
        if not messages:
            messages = turn1_messages(cfg, d.task_text, state.get("context", ""))
        else:
            # new docs first, the feedback after them: the message ends with what to do next
            content = state.get("context", "").strip() + "\n\n" + (state.get("feedback") or "").strip()
            messages.append({"role": "user", "content": content.strip() + "\n"})
        spent = Spent(**state["spent"])
        recorded = _recorded_responses(d.writer.run_dir, turn)
        replies: list[Reply] = []
        answered: list[tuple[int, str, dict, str | None]] = []
        model_error = None
        faults = state.get("faults", 0)
        sent = prompts.history_view(messages, cfg.history)
        size = d.model.context_size(sent) if hasattr(d.model, "context_size") else None
        if size is not None and size.exceeded and len(recorded) < cfg.samples:
            # Sending it would fail (or be cut by the server); the arm or the policy outgrew the
            # model, which is a result about the setting, not a model error.
            model_error = {"kind": "context_exceeded", "message": f"turn {turn}: {size.describe()}", "retryable": False}
            d.writer.event("context_exceeded", turn=turn, prompt_tokens=size.prompt_tokens, window=size.window,
                           reserve=size.reserve, source=size.source, detail=model_error["message"])
            return {"turn": turn, "messages": messages, "replies": [], "spent": spent.model_dump(),
                    "model_error": model_error, "faults": faults}
        for sample in range(cfg.samples):
            if sample in recorded:  # answered before a crash: do not ask again
                ev = recorded[sample]
                d.writer.event("llm_response_reused", turn=turn, sample=sample, seq_of_response=ev["seq"])
                text, usage, finish = ev.get("text") or "", ev.get("usage") or {}, ev.get("finish_reason")
                faults += sum(1 for f in read_events(d.writer.run_dir, "fault")
                              if f.get("turn") == turn and f.get("sample") == sample)
            else:
                try:
                    text, usage, finish, n_faults = self._call(sent, turn, sample, size)
                    faults += n_faults
                except ModelError as exc:
                    faults += len(exc.faults)
                    model_error = {"kind": exc.kind, "message": exc.message or str(exc), "retryable": exc.retryable}
                    d.writer.event("llm_error", turn=turn, sample=sample, **model_error)
                    break
            answered.append((sample, text, usage, finish))
        # A turn with fewer samples than asked because the provider failed is no turn: it is neither
        # judged nor counted (a resume finishes it, reusing the answers recorded in events.jsonl,
        # and counts them then). At a natural end (a replay or a human out of replies) what came is judged.
        resumable = model_error is not None and model_error["kind"] not in NATURAL_ENDS
        for sample, text, usage, finish in ([] if resumable else answered):
            spent.llm_calls += 1
            spent.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            spent.completion_tokens += int(usage.get("completion_tokens") or 0)
            spent.add_cost(usage.get("cost_usd"))  # None (no price) makes the total unknown, never $0
            spent.cached_tokens += int(usage.get("cached_tokens") or 0)
            replies.append(self._extract(turn, sample, text, finish))
        spent.wall_s = d.clock.elapsed()
        return {"turn": turn, "messages": messages, "replies": replies, "spent": spent.model_dump(),
                "model_error": model_error, "faults": faults}

    def _call(self, messages: list[dict], turn: int, sample: int, size=None) -> tuple[str, dict, str | None, int]:
        d, cfg = self.deps, self.deps.config
        w = d.writer
        w.event("llm_request", turn=turn, sample=sample, model=cfg.model, messages=messages, history=cfg.history,
                context=dataclasses.asdict(size) if size is not None else None)

        def on_fault(f: Fault) -> None:
            w.event("fault", turn=turn, sample=sample, retryable=f.kind in RETRYABLE, **dataclasses.asdict(f))

        # the same options the sweep's model probe sends (agent.models.call_options)
        c = d.model.complete(messages, **call_options(cfg.temperature, cfg.seed, turn, sample), on_fault=on_fault,
                             grows=cfg.history == "full" and cfg.strategy != "evolve")
        usage = dataclasses.asdict(c.usage)
        finish = (c.raw or {}).get("finish_reason") or _finish_reason(c.raw)
        w.event("llm_response", turn=turn, sample=sample, model=c.model, text=c.text, usage=usage,
                latency_s=round(c.latency_s, 3), attempts=c.attempts, finish_reason=finish)
        return c.text, usage, finish, len(c.faults)

    def _extract(self, turn: int, sample: int, text: str, finish_reason: str | None = None) -> Reply:
        d = self.deps
        cdir = d.writer.candidate_dir(turn, sample)
        cdir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cdir / "reply.md", text)
        try:
            solution = extract_solution(text, d.config.lang)  # a kernel in the other language is a format error
        except SolutionError as exc:
            message = str(exc)
            if finish_reason == "length":  # the usual cause of a missing block: the reply was cut off
                message += "; the reply was cut off at the output-token limit, so keep the prose short"
            d.writer.event("format_error", turn=turn, sample=sample, message=message, finish_reason=finish_reason)
            return Reply(sample=sample, text=text, has_solution=False, format_error=message, note=None)
        solution.to_dir(cdir)
        ex = solution.extraction
        note = (ex.note or None) if ex is not None else None
        if note:
            d.writer.event("extraction", turn=turn, sample=sample, language=ex.language, note=note)
        return Reply(sample=sample, text=text, has_solution=True, format_error=None, note=note)

    # -------------------------------------------------------------------------------
    def evaluate(self, state: AgentState) -> dict:
        d = self.deps
        turn = state["turn"]
        records: list[CandidateRecord] = []
        evaluation = state.get("evaluation") or NOT_RUN
        for reply in state.get("replies") or []:
            sample, rel = reply["sample"], candidate_relpath(turn, reply["sample"])
            if not reply["has_solution"]:
                rec = fb.candidate_record(turn, sample, rel, None, reply["format_error"])
            else:
                ev = self._evaluate_one(turn, sample)
                rec = fb.candidate_record(turn, sample, rel, ev)
                rec.note = reply.get("note")
                if ev.compiled:  # "did not compile" says nothing about the evaluation itself
                    evaluation = "ok" if fb.ran(ev) else (
                        evaluation if evaluation == "ok" else f"skipped: {ev.run_reason or 'unknown reason'}")
            rec.parent = state.get("parent") if turn > 1 else None
            d.writer.event("candidate", turn=turn, sample=sample, path=rel, outcome=rec.outcome,
                           verdicts=rec.verdicts, verified=rec.verified, error=rec.error, parent=rec.parent)
            records.append(rec)
        current = [r.model_dump() for r in records]
        return {"current": current, "attempts": list(state.get("attempts") or []) + current, "evaluation": evaluation}

    def _evaluate_one(self, turn: int, sample: int) -> EvalResult:
        d, cfg = self.deps, self.deps.config
        w, cdir = d.writer, d.writer.candidate_dir(turn, sample)
        eval_path = cdir / "eval.json"
        if eval_path.exists():  # evaluated before a crash: do not evaluate again
            w.event("eval_reused", turn=turn, sample=sample)
            return EvalResult.model_validate_json(eval_path.read_text())
        solution = Solution.from_dir(cdir)
        ev = d.evaluator.evaluate(solution, d.task, cfg.arch, workloads="all", executed_check=cfg.executed_check,
                                  time=True, profile=cfg.executed_check and cfg.profile_feedback)
        d.clock.exclude(ev.phase_s.get("queue_wait", 0.0))  # the GPU another run held: not this run's time
        if ev.infra_error:  # the harness failed, not the kernel: no verdict, no feedback; resume redoes it
            w.event("infra_error", turn=turn, sample=sample, detail=ev.infra_error)
            raise InfraFault(ev.infra_error)
        if cfg.memcheck and (trigger := fb.memcheck_trigger(ev)):
            self._memcheck(ev, solution, turn, sample, trigger)
        write_eval_json(eval_path, ev)  # inf and NaN kept: a NaN-writing kernel's file must read back
        w.event("compile", turn=turn, sample=sample, result=ev.compile.model_dump(mode="json", exclude={"ptx"}))
        w.event("inspect", turn=turn, sample=sample, result=ev.inspect.model_dump(mode="json"))
        w.event("run", turn=turn, sample=sample, **run_summary(ev))
        return ev

    def _memcheck(self, ev: EvalResult, solution: Solution, turn: int, sample: int, trigger: str) -> None:
        """compute-sanitizer memcheck on a candidate whose visible workload crashed, hung or wrote
        out of bounds: the evaluator again, visible workloads only, untimed, with the sanitizer.
        Its result goes into `ev.sanitize` (and so into eval.json and the feedback)."""
        d, cfg = self.deps, self.deps.config
        checked = d.evaluator.evaluate(solution, d.task, cfg.arch, workloads="visible", executed_check=False,
                                       sanitize=True, time=False)
        d.clock.exclude(checked.phase_s.get("queue_wait", 0.0))
        san = checked.sanitize
        if san.status == "skipped" and san.reason == "not requested":  # the run stopped before the sanitizer
            san = san.model_copy(update={"reason": "the candidate did not reach the memcheck run"})
        ev.sanitize = san
        d.writer.event("memcheck", turn=turn, sample=sample, trigger=trigger, status=san.status, reason=san.reason,
                       errors=san.errors)

    # -------------------------------------------------------------------------------
    def decide(self, state: AgentState) -> dict:
        d, cfg = self.deps, self.deps.config
        turn = state["turn"]
        current = [CandidateRecord(**c) for c in state.get("current") or []]
        spent = Spent(**state["spent"])
        messages = list(state["messages"])
        per_turn = list(state.get("per_turn") or [])
        best = CandidateRecord(**state["best"]) if state.get("best") else None
        chosen = None
        asks = prompts.requires(cfg.require)
        if current:
            spent.turns += 1
            chosen = max(current, key=lambda c: fb.rank(c, asks))  # ties: the lowest sample
            for c in current:
                if fb.better_best(c, best, asks):
                    best = c
            reply = next(r for r in state["replies"] if r["sample"] == chosen.sample)
            messages.append({"role": "assistant", "content": reply["text"]})
        spent.wall_s = d.clock.elapsed()

        stop_reason = stop_detail = None
        if state.get("model_error"):
            err = state["model_error"]
            stop_reason = NATURAL_ENDS.get(err["kind"], "model_error")
            stop_detail = f"{err['kind']}: {err['message']}"
        elif (ended := exhausted(cfg.budget, spent)) is not None:
            stop_reason, stop_detail = ended
        # `basis`: the candidate the next turn answers, and so the action: this turn's best, or for
        # evolve a parent drawn from the best candidates so far
        basis, pop = chosen, []
        if cfg.strategy == "evolve" and not stop_reason:
            pop = fb.population([CandidateRecord(**c) for c in state.get("attempts") or []], cfg.population, asks)
            basis = fb.draw_parent(pop, cfg.seed, turn) if pop else chosen
        parent = basis.path if basis else state.get("parent")
        if stop_reason:
            action, why = "stop", stop_detail
        elif fb.best_eligible(basis, asks):
            action = "optimise"
            if not asks:  # the goal the model was told: correct (the instructions are judged, not asked)
                why = "correct" if basis.verified else "compiled; correctness unverified (" + state["evaluation"] + ")"
            elif basis.outcome == "correct_with_arch":
                why = "correct with the requested instructions"
            elif basis.verified:  # ran correct on the GPU; the executed-instruction check did not run
                why = "correct, the requested instructions in the SASS; their execution unverified"
            else:
                why = "compiled with the requested instructions; correctness unverified (" + state["evaluation"] + ")"
        else:
            action, why = "repair", basis.outcome.replace("_", " ")
        if pop:
            why = f"parent {parent}: {why}"

        if current:
            per_turn.append(TurnRecord(turn=turn, candidates=current, chosen=chosen.sample, action=action,
                                       best=best).model_dump())
        decisions = list(state.get("decisions") or []) + [action]
        d.writer.event("decision", turn=turn, action=action, outcome=chosen.outcome if chosen else None,
                       chosen=chosen.sample if chosen else None, reason=why,
                       best=best.path if best else None, best_speedup=best.verdicts.speedup if best else None,
                       best_verified=best.verified if best else None, parent=parent,
                       population=[c.path for c in pop] or None)
        d.writer.event("budget", turn=turn, spent=spent.model_dump(), limits=cfg.budget.model_dump())
        update = {"messages": messages, "per_turn": per_turn, "best": best.model_dump() if best else None,
                  "spent": spent.model_dump(), "action": action, "decisions": decisions, "parent": parent,
                  "stop_reason": stop_reason, "stop_detail": stop_detail}
        # A summary after every turn: a kill leaves an up-to-date one behind.
        d.writer.write_summary(summary_from_state(cfg, {**state, **update}, "running"))
        return update

    def repair(self, state: AgentState) -> dict:
        return self._feedback(state, "repair")

    def optimise(self, state: AgentState) -> dict:
        return self._feedback(state, "optimise")

    def _feedback(self, state: AgentState, action: str) -> dict:
        d, cfg = self.deps, self.deps.config
        if cfg.strategy == "evolve":
            return self._evolve_feedback(state, action)
        last = TurnRecord(**state["per_turn"][-1])
        chosen = next(c for c in last.candidates if c.sample == last.chosen)
        others = [c for c in last.candidates if c.sample != last.chosen]
        eval_path = d.writer.run_dir / chosen.path / "eval.json"
        ev = EvalResult.model_validate_json(eval_path.read_text()) if eval_path.exists() else None
        best = CandidateRecord(**state["best"]) if state.get("best") else None
        text = fb.render_feedback(last.turn, action, cfg.lang, chosen, ev, others, cfg.samples, best=best,
                                  profile=cfg.profile_feedback, max_turns=cfg.budget.max_turns,
                                  require=prompts.requires(cfg.require))
        d.writer.event("feedback", turn=last.turn, kind=action, outcome=chosen.outcome, text=text, parent=chosen.path)
        if cfg.history == "latest":  # docs sent with earlier feedback are no longer in the chat: they may come again
            return {"feedback": text, "context_sections": list(state.get("base_sections") or [])}
        return {"feedback": text}

    def _evolve_feedback(self, state: AgentState, action: str) -> dict:
        """The next turn's chat is a branch: turn 1's prompt, the parent's reply, its feedback.
        (The parent was drawn by `decide`; budgets still count every turn of every branch.)"""
        d, cfg = self.deps, self.deps.config
        parent = next(CandidateRecord(**c) for c in state["attempts"] if c["path"] == state["parent"])
        pdir = d.writer.run_dir / parent.path
        ev = EvalResult.model_validate_json((pdir / "eval.json").read_text()) if (pdir / "eval.json").exists() else None
        text = fb.render_feedback(parent.turn, action, cfg.lang, parent, ev, profile=cfg.profile_feedback,
                                  max_turns=cfg.budget.max_turns, next_turn=state["turn"] + 1,
                                  require=prompts.requires(cfg.require))
        reply = (pdir / "reply.md").read_text() if (pdir / "reply.md").exists() else ""
        d.writer.event("feedback", turn=state["turn"], kind=action, outcome=parent.outcome, text=text,
                       parent=parent.path)
        return {"feedback": text, "messages": list(state["messages"][:2]) + [{"role": "assistant", "content": reply}],
                "context_sections": list(state.get("base_sections") or [])}


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------
def route(state: AgentState) -> str:
    return state["action"]


def run_summary(ev: EvalResult) -> dict:
    """The run stage for events.jsonl: visible workloads in full, held-out ones as counts."""
    vis = [w.model_dump(mode="json") for w in ev.workloads if w.split == "visible"]
    held = [w for w in ev.workloads if w.split == "held_out"]
    return {"run_status": ev.run_status, "run_reason": ev.run_reason, "gpu": ev.gpu, "workloads": vis,
            "held_out": {"total": len(held), "passed": sum(w.status == "passed" for w in held),
                         "failed": sum(w.status == "failed" for w in held)},
            "speedup": ev.speedup, "executed": ev.executed.model_dump(mode="json"), "verdicts": ev.verdicts()}


def _recorded_responses(run_dir: Path, turn: int) -> dict[int, dict]:
    return {e["sample"]: e for e in read_events(run_dir, "llm_response") if e.get("turn") == turn}


def _finish_reason(raw: dict | None) -> str | None:
    try:
        return raw["choices"][0]["finish_reason"]
    except (TypeError, KeyError, IndexError):
        return None


def turn1_messages(cfg: RunConfig, task_text: str, context: str = "") -> list[dict]:
    """The chat a run opens with: the system prompt and the task prompt (statement, docs, budget),
    rendered with the run's prompt version and --require setting. `task_text` is
    agent.run.render_statement(task, cfg). The one place both are built (draft, Fixit's teacher repairs,
    the prompt tests)."""
    asks = prompts.requires(cfg.require)
    return [{"role": "system", "content": prompts.system_prompt(cfg.arch, cfg.lang, cfg.prompt_version, asks)},
            {"role": "user", "content": prompts.task_prompt(task_text, cfg.arch, context, cfg.prompt_version,
                                                            cfg.budget.max_turns, asks)}]


def retrieval_call(task: Any, cfg: RunConfig, feedback: str | None) -> dict:
    """The retriever's arguments for a run: the query is the task as a model reads it
    (description and op type), never its id, and the op type keeps other families' docs out.
    scripts/measure_context.py makes this same call for the token table in docs/BENCHMARKS.md."""
    from knowledge.retriever import task_query, task_variants

    return {"task": task_query(task.description or "", task.op_type, task.op_family), "arch": cfg.arch,
            "features": cfg.requested_features, "feedback": feedback, "mode": cfg.context,
            "token_budget": cfg.context_tokens, "op_type": task.op_type,
            # a held-out variant's recipe (a head dimension's) reaches only that variant's runs
            "variants": task_variants(task.name, task.tags),
            "model": cfg.model,  # the budget is in the model's own tokens where litellm knows its tokenizer
            "hints": list(cfg.hints)}  # --hint: pattern docs whole on top of the arm


def empty_arm(task: Any, cfg: RunConfig) -> str | None:
    """Why a run's context arm would send none of its docs on turn 1, or None. A docs arm whose
    `context_tokens` no section fits (a few hundred tokens) sends the none arm's prompt (docs+headers:
    the header API alone; docs+example: the example alone), recorded and reported under the arm's
    name: such a run is refused before it starts (agent.run._start, and a sweep for all its cells)."""
    if cfg.context == "none":
        return None
    from knowledge.retriever import retrieve

    parts = retrieve(**retrieval_call(task, cfg, None)).parts
    if sum(parts.get(layer, {}).get("sections", 0) for layer in ("docs", "full")):
        return None
    return (f"context {cfg.context!r} retrieves no docs section for task {task.name} on {cfg.arch} within "
            f"context_tokens {cfg.context_tokens} (--context-tokens): its runs would read no docs under the "
            f"{cfg.context!r} arm's name; raise context_tokens (6000 by default), or use context none")


def _count(text: str, tokenizer: str) -> int:
    from knowledge.retriever import count_tokens

    return count_tokens(text, tokenizer)


def cap_sections(sections: list[dict], cap: int) -> list[dict]:
    """Docs added on a turn after the first: whole sections, in the retriever's order, while they
    fit `cap` tokens. Those left out stay unseen, so a later turn may still add them."""
    out, used = [], 0
    for x in sections:
        if used + int(x.get("tokens") or 0) <= cap:
            out.append(x)
            used += int(x.get("tokens") or 0)
    return out


def _section_texts(ids: list[str]) -> list[str]:
    """The markdown of sections named "doc#heading" (their heading line included)."""
    from knowledge.retriever import load_docs

    by_id = {f"{s.doc}#{s.heading}": s for doc in load_docs() for s in doc.sections}
    return [f"(from {by_id[i].doc})\n{by_id[i].text.strip()}" for i in ids if i in by_id]


_READS = {
    "retrieve_context": ("turn", "feedback", "context_sections"),
    "draft": ("turn", "messages", "feedback", "context"),
    "evaluate": ("turn", "replies"),
    "decide": ("turn", "current", "best", "spent", "model_error"),
    "repair": ("turn", "per_turn", "parent"),
    "optimise": ("turn", "per_turn", "parent"),
}


def _brief(values: Any, keys) -> dict:
    """A short description of state values for node events (the full values are elsewhere)."""
    out = {}
    for k in keys:
        v = values.get(k) if isinstance(values, dict) else None
        if isinstance(v, str):
            out[k] = f"{len(v)} chars"
        elif isinstance(v, list):
            out[k] = f"{len(v)} items"
        elif isinstance(v, dict) and k == "best":
            out[k] = v.get("path")
        elif isinstance(v, dict) and k == "spent":
            out[k] = {x: v.get(x) for x in ("turns", "llm_calls", "cost_usd")}
        else:
            out[k] = v
    return out
