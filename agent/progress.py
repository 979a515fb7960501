"""Live progress of a run on stderr: turn, stage, last verdict, best speedup, tokens, cost.

Fed by the trajectory's events (TrajectoryWriter.subscribe), so what is shown is exactly
what was recorded. On a terminal it is a rich Live panel; elsewhere (logs, CI, pipes) one
plain line per turn. stdout is left alone (`--json` prints there).
"""
from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table

from agent.trajectory import RunConfig

_STAGES = {"retrieve_context": "retrieving docs", "draft": "waiting for the model",
           "evaluate": "compile + inspect + run", "decide": "deciding", "repair": "writing feedback",
           "optimise": "writing feedback"}


def fold(pieces: list[str], width: int) -> str:
    """Pieces joined by spaces, a new indented line where the next would pass `width` (logs
    are read at 80 columns too)."""
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if len(lines[-1]) + 1 + len(piece) > width:
            lines.append("  " + piece)
        else:
            lines[-1] += " " + piece
    return "\n".join(lines)


class RunProgress:
    def __init__(self, config: RunConfig, *, enabled: bool = True, live: bool = True, console: Console | None = None,
                 spent: dict | None = None):
        """`spent`: what the run had spent before (a resumed run's checkpoint): the counters go on from there."""
        self.config, self.enabled = config, enabled
        # A person answering as the model (--model human) needs the terminal: plain lines then.
        self.live = live and config.model != "human"
        self.console = console or Console(stderr=True)
        self.turn, self.stage, self.last, self.best = 0, "starting", "-", "none yet"
        self.tokens, self.faults, self.evaluation = 0, 0, None
        self.cost: float | None = 0.0
        if spent:
            self.tokens = int(spent.get("prompt_tokens") or 0) + int(spent.get("completion_tokens") or 0)
            self.cost = spent.get("cost_usd", 0.0)  # None stays None: a call before had no price
        self._live: Live | None = None

    def __enter__(self) -> "RunProgress":
        if self.enabled and self.live and self.console.is_terminal:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()
        elif self.enabled:
            c = self.config
            self.console.print(fold([f"run {c.run_id}:", f"{c.task} on {c.arch}", f"with {c.model}",
                                     f"(lang {c.lang}, context {c.context}, {c.budget.max_turns} turns max)"],
                                    self.console.width), highlight=False, soft_wrap=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
            self._live = None

    def on_event(self, e: dict) -> None:
        t = e["type"]
        if t == "node" and e.get("phase") == "start":
            self.turn = max(self.turn, e.get("turn") or 0)
            self.stage = _STAGES.get(e["node"], e["node"])
        elif t == "llm_response":
            u = e.get("usage") or {}
            self.tokens += int(u.get("prompt_tokens") or 0) + int(u.get("completion_tokens") or 0)
            cost = u.get("cost_usd")  # None: the model has no price; the total is unknown from then on
            self.cost = None if self.cost is None or cost is None else self.cost + float(cost)
        elif t == "fault":
            self.faults += 1
            self.stage = f"model fault ({e.get('kind')}), attempt {e.get('attempt')}"
        elif t == "candidate":
            self.last = f"{e['path']}: {e['outcome'].replace('_', ' ')}"
        elif (t == "run" and e.get("run_status") == "skipped" and (e.get("verdicts") or {}).get("compiled")
              and self.evaluation is None):
            self.evaluation = f"evaluation skipped: {e.get('run_reason') or 'unknown reason'} (compile + inspect only)"
            if self._live is None and self.enabled:
                self.console.print(self.evaluation, highlight=False, soft_wrap=True)
        elif t == "decision":
            if e.get("outcome") is None:
                self.last = "no reply"
            if e.get("best"):
                sp = e.get("best_speedup")
                self.best = e["best"] + (f" ({sp:.3g}x)" if sp is not None else
                                         "" if e.get("best_verified") else " (unverified)")
            self.stage = f"decided: {e['action']}"
            if self._live is None and self.enabled:
                why = f" ({e['reason']})" if e.get("reason") else ""
                head = f"turn {e['turn']}/{self.config.budget.max_turns}: {self.last} -> {e['action']}{why}"
                tail = f"best: {self.best} | {self.tokens} tokens, {self._cost()}"
                # one line where it fits, else the totals on a second (logs are read at 80 columns too)
                self.console.print(fold([head, f"| {tail}"], self.console.width), highlight=False, soft_wrap=True)
        elif t == "run_end":
            self.stage = f"{e.get('status')} ({e.get('stop_reason')})"
        if self._live is not None:
            self._live.update(self._render())

    def _cost(self) -> str:
        return "cost unknown" if self.cost is None else f"${self.cost:.4f}"

    def _render(self) -> Table:
        c = self.config
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("run", f"{c.run_id}  ({c.task}, {c.arch}, {c.model})")
        table.add_row("turn", f"{self.turn} / {c.budget.max_turns}   samples {c.samples}")
        table.add_row("stage", self.stage)
        table.add_row("last", self.last)
        table.add_row("best", self.best)
        faults = f", {self.faults} faults" if self.faults else ""
        table.add_row("spent", f"{self.tokens} tokens, {self._cost()}{faults}")
        if self.evaluation:
            table.add_row("note", self.evaluation)
        return table
