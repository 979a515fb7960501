"""`agent solve` (run the agent on a task), `agent graph` (the loop as Mermaid),
`agent replay` (re-check a recorded run with today's tools or through the graph)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from agent.commands.common import CliError, console, err_console, print_json
from agent.trajectory import Budget, RunSummary


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_cmd)
    app.command("graph")(graph_cmd)
    app.command("replay")(replay_cmd)


def solve_cmd(
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task name or alias (e.g. mha_bwd_d128, attn_bwd)."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="litellm model (openai/<name>, anthropic/...), replay:<run dir>, human, "
                                             "scripted:<file>."),
    arch: str = typer.Option("sm_90a", help="Target: sm_90a (Hopper) or sm_100a (Blackwell)."),
    lang: str = typer.Option("cuda", help="Solution language: cuda (C++ with inline PTX) or ptx (raw PTX)."),
    context: str = typer.Option("docs", help="Architecture docs in the prompt: none | docs | docs+headers | full."),
    context_tokens: int = typer.Option(6000, help="Token budget for retrieved docs."),
    max_turns: int = typer.Option(8, help="Turns (draft rounds) at most."),
    max_tokens: Optional[int] = typer.Option(None, help="Prompt + completion tokens at most (checked per turn)."),
    max_cost: Optional[float] = typer.Option(None, help="USD at most (checked after each turn)."),
    max_time: Optional[float] = typer.Option(None, help="Active wall seconds at most (checked after each turn)."),
    samples: int = typer.Option(1, help="Candidates drafted per turn (best-of-N)."),
    api_base: Optional[str] = typer.Option(None, help="URL of an OpenAI-compatible server (vLLM, Ollama, ...)."),
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature (provider default if unset)."),
    seed: int = typer.Option(0, help="Base seed sent to the model (varied per turn and sample)."),
    max_retries: Optional[int] = typer.Option(None, help="Retries of a failed model request (default 6)."),
    retry_wait: Optional[float] = typer.Option(None, help="Base backoff seconds between retries (default 2)."),
    request_timeout: Optional[float] = typer.Option(None, help="Seconds one model request may take (default 600)."),
    executed_check: bool = typer.Option(False, help="Count executed instructions with Nsight Compute (GPU)."),
    human_reply_file: Optional[str] = typer.Option(None, help="For --model human: reply file, or a folder of them "
                                                              "(default $PTXBENCH_HUMAN_REPLY_FILE, else $EDITOR)."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where runs are written."),
    run_id: Optional[str] = typer.Option(None, help="Name the run (default: time-task-model-random)."),
    resume: Optional[str] = typer.Option(None, help="Resume this run id (or run folder) from its checkpoint."),
    json_out: bool = typer.Option(False, "--json", help="Print the RunSummary as JSON on stdout (nothing else)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress on stderr."),
) -> None:
    """Run the agent loop on one task: draft, compile, inspect, evaluate, feed back, within a budget."""
    from agent import run

    try:
        if resume:
            summary = run.resume(resume, runs_dir, progress=not quiet, human_reply_file=human_reply_file)
        else:
            if not task or not model:
                raise CliError("give --task and --model (or --resume <run id>)")
            options = {k: v for k, v in (("max_retries", max_retries), ("retry_base_s", retry_wait),
                                         ("timeout_s", request_timeout)) if v is not None}
            req = run.SolveRequest(
                task=task, model=model, arch=arch, lang=lang, context=context, context_tokens=context_tokens,
                budget=Budget(max_turns=max_turns, max_tokens=max_tokens, max_cost=max_cost, max_time_s=max_time),
                samples=samples, api_base=api_base, model_options=options, runs_dir=runs_dir, run_id=run_id,
                seed=seed, temperature=temperature, executed_check=executed_check,
                human_reply_file=human_reply_file, command=["agent", *sys.argv[1:]])
            summary = run.solve(req, progress=not quiet)
    except run.SolveError as exc:
        raise CliError(str(exc)) from None
    if json_out:
        print_json(summary)
    else:
        print_summary(summary, runs_dir)
    raise typer.Exit(exit_code(summary))


def exit_code(summary: RunSummary) -> int:
    if summary.status == "interrupted":
        return 130
    if summary.status == "failed" or summary.stop_reason == "model_error":
        return 1
    return 0


def print_summary(s: RunSummary, runs_dir: Path) -> None:
    out = console
    reason = f"{s.stop_reason}" + (f" ({s.stop_detail})" if s.stop_detail else "")
    out.print(f"[bold]run {s.run_id}[/bold]: {s.status}, stopped by {reason}", highlight=False, soft_wrap=True)
    out.print(f"task {s.task} on {s.arch}, model {s.model}, lang {s.lang}, context {s.context}, samples {s.samples}",
              highlight=False, soft_wrap=True)
    for t in s.per_turn:
        cands = ", ".join(f"{c.turn}-{c.sample} {c.outcome.replace('_', ' ')}"
                          + (f" {c.verdicts.speedup:.3g}x" if c.verdicts.speedup is not None else "")
                          for c in t.candidates)
        out.print(f"  turn {t.turn}: {cands} -> {t.action}", highlight=False, soft_wrap=True)
    if s.best:
        v = s.best.verdicts
        how = f"speedup {v.speedup:.3g}x" if v.speedup is not None else (
            "verified correct" if s.best.verified else "unverified: correctness not checked")
        out.print(f"best: {s.best_path} ({s.best.outcome.replace('_', ' ')}, {how})", highlight=False, soft_wrap=True)
    else:
        out.print("best: none (no candidate was correct with the requested instructions"
                  + ("" if s.evaluation == "ok" else ", nor compiled with them") + ")", highlight=False, soft_wrap=True)
    out.print(f"evaluation: {s.evaluation}", highlight=False, soft_wrap=True)
    u = s.usage
    out.print(f"spent: {u.llm_calls} LLM calls, {u.prompt_tokens + u.completion_tokens} tokens "
              f"({u.prompt_tokens} prompt, {u.completion_tokens} completion), ${u.cost_usd:.4f}, "
              f"{s.faults} faults, {s.wall_s:.1f} s", highlight=False, soft_wrap=True)
    out.print(f"folder: {Path(runs_dir) / s.run_id}", highlight=False, soft_wrap=True)
    if s.status == "interrupted":
        err_console.print(f"interrupted: resume with  agent solve --resume {s.run_id} --runs-dir {runs_dir}",
                          highlight=False, soft_wrap=True)
    elif s.stop_reason == "model_error":
        err_console.print(f"[red]error:[/red] the model failed: {s.stop_detail}", highlight=False, soft_wrap=True)
    elif s.status == "failed":
        err_console.print(f"[red]error:[/red] the run failed: {s.stop_detail} (traceback in events.jsonl; "
                          f"resumable with --resume {s.run_id})", highlight=False, soft_wrap=True)


def graph_cmd() -> None:
    """Print the agent loop as a Mermaid diagram."""
    from agent.graph import mermaid

    print(mermaid())


def replay_cmd(
    run_dir: Path = typer.Argument(..., help="A recorded run folder (runs/<id>)."),
    through_graph: bool = typer.Option(False, help="Drive the graph again with the recorded responses "
                                                   "(model replay:<dir>) and compare the decisions."),
    runs_dir: Optional[Path] = typer.Option(None, help="Where the --through-graph run is written "
                                                       "(default: a temporary folder)."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout."),
) -> None:
    """Re-evaluate every recorded candidate with today's tools and report what changed."""
    from agent import replay

    try:
        if through_graph:
            report = replay.through_graph(run_dir, runs_dir=runs_dir)
        else:
            report = replay.reevaluate(run_dir)
    except replay.ReplayError as exc:
        raise CliError(str(exc)) from None
    if json_out:
        print_json(report)
    else:
        replay.print_report(report, console)
    raise typer.Exit(0 if report.match else 1)
