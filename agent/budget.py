"""The run's budget: turns, tokens, cost, wall time. Whichever runs out first ends the run.

Checked after every turn (the graph's decide node), so a run may overshoot a token or cost
limit by at most one turn's calls; a turn is never cut in half.
"""
from __future__ import annotations

import time

from pydantic import BaseModel

from agent.trajectory import Budget, StopReason


class Spent(BaseModel):
    turns: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # None: some call had no price (a self-hosted model litellm does not know): unknown, never $0
    cost_usd: float | None = 0.0
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    wall_s: float = 0.0  # active seconds; resumed segments add up, time spent dead or queued for a GPU does not

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add_cost(self, usd: float | None) -> None:
        """One call's cost; a call without one makes the run's cost unknown from then on."""
        self.cost_usd = None if self.cost_usd is None or usd is None else self.cost_usd + float(usd)


def exhausted(budget: Budget, spent: Spent) -> tuple[StopReason, str] | None:
    """(reason, one-line detail) for the first limit reached, else None."""
    if spent.turns >= budget.max_turns:
        return "max_turns", f"{spent.turns} of {budget.max_turns} turns used"
    if budget.max_tokens is not None and spent.tokens >= budget.max_tokens:
        return "max_tokens", f"{spent.tokens} tokens used, limit {budget.max_tokens}"
    if budget.max_cost is not None and spent.cost_usd is None:
        # refused up front (models.cost_cap_problem); a call priced at nothing after all stops the
        # run here rather than go on under a cap nobody can check
        return "max_cost", f"cost unknown (a call had no price), limit ${budget.max_cost:.4f}"
    if budget.max_cost is not None and spent.cost_usd >= budget.max_cost:
        return "max_cost", f"${spent.cost_usd:.4f} spent, limit ${budget.max_cost:.4f}"
    if budget.max_time_s is not None and spent.wall_s >= budget.max_time_s:
        return "max_time", f"{spent.wall_s:.0f} s used, limit {budget.max_time_s:.0f} s"
    return None


class Clock:
    """Active wall time of a run: `offset` carries what earlier segments (before a resume) used."""

    def __init__(self, offset: float = 0.0):
        self.offset, self._start = offset, time.monotonic()

    def elapsed(self) -> float:
        return self.offset + time.monotonic() - self._start

    def exclude(self, seconds: float) -> None:
        """Seconds the run spent waiting for a GPU another evaluation held (EvalResult.phase_s
        queue_wait): the harness's, not the run's. Counted, a sweep's concurrency would decide which
        runs `max_time_s` stops (and reports count as failures past that turn), not the model."""
        self.offset -= max(0.0, seconds)


def recursion_limit(budget: Budget) -> int:
    """LangGraph's step limit from the budget: five nodes a turn, plus slack."""
    return 5 * budget.max_turns + 10
