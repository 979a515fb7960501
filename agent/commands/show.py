"""`agent show RUN`: one run as a timeline; `--turn N` one turn in full; `--html OUT` a page of it."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from agent.commands.common import console, fail, out_file, print_json
from agent.commands.common import table as make_table


def register(app: typer.Typer) -> None:
    app.command("show")(show)


def show(run: Annotated[Path, typer.Argument(help="a run folder (holding config.json)")],
         turn: Annotated[Optional[int], typer.Option(
             "--turn", help="print that turn in full: prompt, reply, feedback, the kernel's diff against the "
                            "kernel it answered")] = None,
         html: Annotated[Optional[Path], typer.Option(
             "--html", help="write the run as one self-contained page (no network) to this file")] = None,
         as_json: Annotated[bool, typer.Option("--json", help="the run (or the turn) as JSON")] = False) -> None:
    """Read one run as a researcher would: per turn and sample the action, verdicts, opcode counts,
    speedup, tokens and the feedback's gist; the best kernel marked."""
    from agent.show import ShowError, load_run, turn_details, write_html

    if not run.is_dir():
        fail(f"no such run folder: {run}")
    if html is not None:
        out_file(html, "--html")
    try:
        view = load_run(run)
        details = turn_details(view, turn) if turn is not None else None
    except (ShowError, ValueError, OSError) as exc:  # RunFolderError is a ValueError: one line
        fail(str(exc).splitlines()[0])
    if html is not None:
        path = write_html(view, html)
        if not as_json:
            console.print(f"wrote {path}", highlight=False)
    if as_json:
        print_json([d.model_dump(mode="json") for d in details] if details is not None else view)
        return
    if details is not None:
        _print_turn(view, details)
    elif html is None:
        _print_timeline(view)


def _mark(value: bool | None) -> str:
    return "[dim]n/a[/dim]" if value is None else "[green]yes[/green]" if value else "[red]no[/red]"


def _print_timeline(view) -> None:
    from agent.show import feature_text, speedup_text, tokens_text

    u = view.usage
    cost = "unknown" if u.cost_usd is None else f"${u.cost_usd:.4f}"
    console.print(f"[bold]{view.run_id}[/bold]: {view.task} on {view.arch}, model {view.model}, context "
                  f"{view.context}, {view.strategy}; requested {', '.join(view.requested_features) or 'nothing'}",
                  highlight=False)
    console.print(f"{view.status}" + (f" ({view.stop_reason}: {view.stop_detail})" if view.stop_reason else "")
                  + f"; evaluation {view.evaluation}; {u.llm_calls} LLM calls, {u.tokens:,} tokens, {cost}",
                  highlight=False)
    rows = []
    for t in view.turns:
        for c in t.candidates:
            name = f"{c.turn}" + (f"-{c.sample}" if view.samples > 1 else "") + (" ★ best" if c.best else "")
            verdicts = (f"compiled {_mark(c.compiled)}\nin SASS {_mark(c.arch_sass)}\ncorrect {_mark(c.correct)}"
                        f"\nheld-out {_mark(c.correct_held_out)}\ncorrect+arch {_mark(c.correct_with_arch)}")
            features = "\n".join(feature_text(f) for f in c.features) or "none requested"
            feedback = (t.feedback_gist or "") if c.chosen or len(t.candidates) == 1 else ""
            if not feedback and t.decision and t.decision.startswith("stop"):
                feedback = f"(none: {t.decision})"
            rows.append([name, f"{c.action}\n{c.outcome}", verdicts, features, speedup_text(c), tokens_text(c),
                         feedback or (c.error or "")])
    console.print(make_table(["turn", "action / outcome", "verdicts", "requested instructions", "speedup",
                              "tokens", "feedback"], rows))
    if view.best:
        console.print(f"best kernel: {view.best}" + (f" ({view.best_speedup:.3f}x)" if view.best_speedup else ""),
                      highlight=False)


def _print_turn(view, details) -> None:
    from rich.rule import Rule
    from rich.syntax import Syntax

    for d in details:
        console.print(Rule(f"turn {d.turn}" + (f", sample {d.sample}" if view.samples > 1 else "") + f" ({d.path})"))
        console.print("[bold]prompt[/bold]" + (f" (after {len(d.earlier_messages)} earlier messages: "
                                               f"{'; '.join(d.earlier_messages)})" if d.earlier_messages else ""),
                      highlight=False)
        console.print(d.prompt or "(none recorded)", markup=False, highlight=False)
        console.print("[bold]reply[/bold]")
        console.print(d.reply or "(none)", markup=False, highlight=False)
        console.print("[bold]feedback[/bold]")
        console.print(d.feedback or "(none: the run stopped after this turn, or another sample was chosen)",
                      markup=False, highlight=False)
        if d.diff is not None:
            console.print(f"[bold]kernel diff against {d.previous}[/bold]", highlight=False)
            console.print(Syntax(d.diff, "diff", theme="ansi_dark", word_wrap=True))
        elif d.kernel is None:
            console.print("[bold]kernel[/bold]: none extracted from the reply")
        else:
            console.print("[bold]kernel diff[/bold]: none (no earlier kernel to compare with)")
