"""The agent graph's state, as LangGraph checkpoints it (plain JSON-able values only).

Nodes return the keys they change; lists are replaced whole (no reducers), which keeps
every node's effect visible in its return value.
"""
from __future__ import annotations

from typing import Any, TypedDict

from agent.budget import Spent
from agent.trajectory import CandidateRecord, RunConfig, RunSummary, TurnRecord, Usage, utc_now


NOT_RUN = "not run: no candidate compiled"


class Reply(TypedDict):
    sample: int
    text: str
    has_solution: bool
    format_error: str | None
    note: str | None  # which blocks of a reply with several were used (tools.solution.Extraction.note)


class AgentState(TypedDict, total=False):
    turn: int  # the turn being worked on (0 before the first draft)
    messages: list[dict]  # the chat: system, task, then (reply, feedback) pairs
    feedback: str | None  # the next user message, from repair/optimise
    context: str  # documentation block to add to the next user message ("" if none)
    context_sections: list[str]  # ids of sections already in the chat
    base_sections: list[str]  # ids of turn 1's sections (evolve starts every branch from turn 1's prompt)
    replies: list[Reply]  # this turn's replies, one per sample
    current: list[dict]  # this turn's CandidateRecords
    attempts: list[dict]  # every CandidateRecord so far
    per_turn: list[dict]  # TurnRecord per finished turn
    best: dict | None  # best CandidateRecord (correct-with-arch, or on CPU unverified)
    parent: str | None  # path of the candidate whose feedback the next turn answers
    spent: dict  # Spent
    action: str | None  # last decision: repair | optimise | stop
    decisions: list[str]
    # {kind, message, retryable} when no reply came: the model failed for good, or (kind
    # "context_exceeded") the prompt did not fit the model's context window and was not sent
    model_error: dict | None
    stop_reason: str | None
    stop_detail: str | None
    evaluation: str  # "ok" or "skipped: <reason>"
    faults: int


def initial_state() -> AgentState:
    return AgentState(turn=0, messages=[], feedback=None, context="", context_sections=[], base_sections=[],
                      replies=[], current=[], attempts=[], per_turn=[], best=None, parent=None, spent=Spent().model_dump(), action=None, decisions=[],
                      model_error=None, stop_reason=None, stop_detail=None, evaluation=NOT_RUN, faults=0)


def summary_from_state(config: RunConfig, state: dict[str, Any], status: str, *,
                       stop_reason: str | None = None, stop_detail: str | None = None) -> RunSummary:
    spent = Spent(**(state.get("spent") or {}))
    best = CandidateRecord(**state["best"]) if state.get("best") else None
    return RunSummary(
        run_id=config.run_id, task=config.task, arch=config.arch, model=config.model, lang=config.lang,
        context=config.context, samples=config.samples, strategy=config.strategy,
        profile_feedback=config.profile_feedback, history=config.history, require=config.require, hints=list(config.hints), model_params=dict(config.model_params),
        status=status,
        stop_reason=stop_reason or state.get("stop_reason"), stop_detail=stop_detail or state.get("stop_detail"),
        turns=spent.turns, per_turn=[TurnRecord(**t) for t in state.get("per_turn") or []],
        best=best, best_path=best.path if best else None, best_speedup=best.verdicts.speedup if best else None,
        evaluation=state.get("evaluation") or NOT_RUN,
        usage=Usage(llm_calls=spent.llm_calls, prompt_tokens=spent.prompt_tokens,
                    completion_tokens=spent.completion_tokens, cost_usd=spent.cost_usd,
                    cached_tokens=spent.cached_tokens),
        faults=state.get("faults") or 0, wall_s=round(spent.wall_s, 3), decisions=list(state.get("decisions") or []),
        created=config.created, finished=utc_now() if status != "running" else None)
