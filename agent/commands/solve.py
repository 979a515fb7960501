"""`agent solve` (run the agent on a task), `agent graph` (the loop as Mermaid),
`agent replay` (re-check a recorded run with today's tools or through the graph)."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from agent.commands.common import (CliError, ExitCode, InfraError, console, err_console, plural, print_json,
                                   wrap_items)
from agent.trajectory import EXECUTED_CHECK_DEFAULT, PROFILE_FEEDBACK_DEFAULT, Budget, RunSummary


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_cmd)
    app.command("graph")(graph_cmd)
    app.command("replay")(replay_cmd)


def solve_cmd(
    ctx: typer.Context,
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task name or alias (e.g. mha_bwd_d128, attn_bwd)."),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="litellm model (openai/<name>, anthropic/...), replay:<run>, human, "
                                             "scripted:<file>."),
    arch: str = typer.Option("sm_90a", help="Target: sm_90a (Hopper) or sm_100a (Blackwell)."),
    lang: str = typer.Option("cuda", help="Solution language: cuda (C++ with inline PTX) or ptx (raw PTX)."),
    context: str = typer.Option("docs", help="Architecture docs in the prompt: none | docs | docs+headers | full (nested arms), or docs+example (docs plus the family's worked kernel)."),
    context_tokens: int = typer.Option(6000, help="Token budget for retrieved docs."),
    max_turns: int = typer.Option(8, help="Turns (draft rounds) at most."),
    max_tokens: Optional[int] = typer.Option(None, help="Prompt + completion tokens at most (checked per turn)."),
    max_cost: Optional[float] = typer.Option(None, help="USD at most (checked after each turn)."),
    max_time: Optional[float] = typer.Option(
        None, help="Active wall seconds at most (checked after each turn; waits for a busy GPU not counted)."),
    samples: int = typer.Option(1, help="Candidates drafted per turn (best-of-N)."),
    strategy: Optional[str] = typer.Option(
        None, help="Search: linear (one chat, one candidate a turn) | best-of-n (--samples N a turn, continue from "
                   "the best) | evolve (improve a parent drawn from the best --population candidates). "
                   "Default: best-of-n with --samples > 1, else linear."),
    population: int = typer.Option(4, help="evolve: how many of the best candidates parents are drawn from."),
    profile_feedback: str = typer.Option(
        "on" if PROFILE_FEEDBACK_DEFAULT else "off", "--profile-feedback",
        help="on | off: show the model the Nsight Compute profile of its kernel (GPU + ncu; needs the executed "
             "check, which runs that pass)."),
    api_base: Optional[str] = typer.Option(None, help="URL of an OpenAI-compatible server (vLLM, Ollama, ...)."),
    evaluator_url: Optional[str] = typer.Option(
        None, "--evaluator", help="Evaluate on a remote `agent serve` (http://host:port; token from "
                                  "$PTXBENCH_EVALUATOR_TOKEN) instead of this machine's GPU."),
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature (provider default if unset)."),
    model_param: Optional[list[str]] = typer.Option(
        None, "--model-param", metavar="KEY=VALUE",
        help="key=value sent to the provider as given (repeatable; the value is JSON where it parses): "
             "reasoning_effort=high, max_tokens=32000, 'thinking={\"type\": \"enabled\", \"budget_tokens\": 16000}'. "
             "context_window=N and prompt_cache=true|false configure ptxbench's side only."),
    history: str = typer.Option("full", help="What each call sends: full (the whole chat) | latest (system, task, "
                                             "the last reply and its feedback)."),
    require: str = typer.Option(
        "on", "--require",
        help="on | off: ask for the task's architecture instructions and state the credit rules (on), or name "
             "them nowhere in the prompts and feedback (off); judged on them either way."),
    hint: Optional[list[str]] = typer.Option(
        None, "--hint", metavar="NAME",
        help="Add the named pattern doc whole on top of the --context arm, the none arm included (repeatable; "
             "agent knowledge hints lists them): the seed artifact's one-pattern-at-a-time variable."),
    context_turn_tokens: int = typer.Option(2000, help="Docs added on turns 2+ at most, per turn (tokens)."),
    memcheck: bool = typer.Option(True, "--memcheck/--no-memcheck",
                                  help="Run compute-sanitizer memcheck on a candidate that crashed, hung or wrote out "
                                       "of bounds on a visible workload, and show its first reports (GPU only)."),
    seed: int = typer.Option(0, help="Base seed sent to the model (varied per turn and sample)."),
    max_retries: Optional[int] = typer.Option(None, help="Retries of a failed model request (default 6)."),
    retry_wait: Optional[float] = typer.Option(None, help="Base backoff seconds between retries (default 2)."),
    request_timeout: Optional[float] = typer.Option(None, help="Seconds one model request may take (default 600)."),
    executed_check: bool = typer.Option(
        EXECUTED_CHECK_DEFAULT, "--executed/--no-executed", "--executed-check/--no-executed-check",
        help="Count executed instructions with the hardware counters (GPU only; skipped and said so elsewhere). "
             "Same default as eval and bench."),
    human_reply_file: Optional[str] = typer.Option(None, help="For --model human: reply file, or a folder of them "
                                                              "(default $PTXBENCH_HUMAN_REPLY_FILE, else $EDITOR)."),
    runs_dir: Path = typer.Option(Path("runs"), help="Where runs are written."),
    run_id: Optional[str] = typer.Option(None, help="Name the run (default: time-task-model-random)."),
    resume: Optional[str] = typer.Option(None, help="Resume this run (its folder, or its id under --runs-dir) from "
                                                    "its checkpoint, as recorded."),
    json_out: bool = typer.Option(False, "--json", help="Print the RunSummary as JSON on stdout (nothing else)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress on stderr."),
) -> None:
    """Run the agent loop on one task: draft, compile, inspect, evaluate, feed back, within a budget."""
    from agent import run

    evaluator = remote_evaluator(evaluator_url) if evaluator_url else None
    try:
        if resume:
            run_dir, config = run.load_resumable(resume, runs_dir)
            _refuse_changes_on_resume(ctx, config, task, model)
            if run.finished_summary(run_dir) is not None and not json_out:
                err_console.print(f"run {escape(config.run_id)} had already finished; nothing to resume (its "
                                  f"record is unchanged)", highlight=False, soft_wrap=True)
            summary = run.resume(run_dir, progress=not quiet, human_reply_file=human_reply_file, evaluator=evaluator)
        else:
            if not task or not model:
                raise CliError("give --task and --model (or --resume <run folder>)")
            if profile_feedback not in ("on", "off"):
                raise CliError(f"--profile-feedback must be on or off, not {profile_feedback!r}")
            if require not in ("on", "off"):
                raise CliError(f"--require must be on or off, not {require!r}")
            options = {k: v for k, v in (("max_retries", max_retries), ("retry_base_s", retry_wait),
                                         ("timeout_s", request_timeout)) if v is not None}
            params = model_params_from(model_param or [])
            req = run.SolveRequest(
                task=task, model=model, arch=arch, lang=lang, context=context, context_tokens=context_tokens,
                budget=Budget(max_turns=max_turns, max_tokens=max_tokens, max_cost=max_cost, max_time_s=max_time),
                samples=samples, strategy=strategy, population=population,
                profile_feedback=profile_feedback == "on",
                api_base=api_base, model_options=options, runs_dir=runs_dir, run_id=run_id,
                seed=seed, temperature=temperature, executed_check=executed_check,
                human_reply_file=human_reply_file, command=["agent", *sys.argv[1:]], history=history,
                require=require, hints=list(hint or []), model_params=params, context_turn_tokens=context_turn_tokens,
                memcheck=memcheck)
            mismatch = run.replay_mismatch(req)
            if mismatch:  # the run would record them as the model's answers to this task
                raise CliError(f"{mismatch}; to judge a recorded kernel on this task, agent eval "
                               f"<run>/candidates/<turn>-<sample> --task {task} --arch {arch}")
            summary = run.solve(req, progress=not quiet, evaluator=evaluator)
            run_dir = runs_dir / summary.run_id
    except run.SolveError as exc:
        raise CliError(str(exc)) from None
    finally:
        if evaluator is not None:
            evaluator.close()
    if json_out:
        print_json(summary)
    else:
        print_summary(summary, run_dir)
    raise typer.Exit(exit_code(summary))


def remote_evaluator(url: str):
    """--evaluator URL: a RemoteEvaluator (agent/client.py), or one line and exit 2."""
    from urllib.parse import urlparse

    from agent.client import RemoteEvaluator, ServiceError

    if urlparse(url).scheme not in ("http", "https") or not urlparse(url).hostname:
        raise CliError(f"--evaluator {url!r} is not an http(s) URL")
    try:
        return RemoteEvaluator(url)
    except ServiceError as exc:
        raise CliError(str(exc)) from None


def model_params_from(pairs: list[str]) -> dict:
    """--model-param key=value ... -> {key: value}; a key given twice is an error, not a silent override."""
    from agent.models import parse_model_param

    params: dict = {}
    for pair in pairs:
        try:
            key, value = parse_model_param(pair)
        except ValueError as exc:
            raise CliError(f"--model-param: {exc}") from None
        if key in params:
            raise CliError(f"--model-param {key} is given twice")
        params[key] = value
    return params


# What --resume takes from the command line; the run's own settings come from its config.json.
RESUME_OPTIONS = {"resume", "runs_dir", "json_out", "quiet", "human_reply_file"}


def _refuse_changes_on_resume(ctx: typer.Context, config, task: str | None, model: str | None) -> None:
    """--resume continues a run exactly as recorded: an option that would change it is an
    error, not silently ignored (repeating the recorded --task or --model is fine)."""
    from agent.run import anchor_spec
    from tasks import UnknownTask, get_task

    def same(name: str) -> bool:
        if name == "model":
            return model is not None and anchor_spec(model, Path.cwd()) == config.model
        if name == "task":
            try:
                return get_task(task).name == config.task
            except UnknownTask:
                return False
        if name == "require":  # the recorded setting repeated; another one would change the experiment
            return ctx.params.get("require") == config.require
        if name == "hint":  # the recorded hints repeated, in their order
            return list(ctx.params.get("hint") or []) == list(config.hints)
        return False

    changed = [p.opts[0] for p in ctx.command.params
               if p.name not in RESUME_OPTIONS and _given(ctx, p.name)
               and not same(p.name)]
    if changed:
        raise CliError(f"--resume continues run {config.run_id} as recorded (task {config.task}, model "
                       f"{config.model}) and cannot change {', '.join(changed)}; start a new run for that")


def _given(ctx: typer.Context, name: str) -> bool:
    """The option was typed on the command line (typer ships its own click: compare by name)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def exit_code(summary: RunSummary) -> int:
    """A finished run is 0 whatever its kernels did (the verdicts are the run's data)."""
    if summary.status == "interrupted":
        return ExitCode.INTERRUPTED
    if summary.stop_reason == "infra_error":
        return ExitCode.INFRA
    if summary.status == "failed" or summary.stop_reason == "model_error":
        return ExitCode.FAILED
    return ExitCode.OK


def print_summary(s: RunSummary, run_dir: Path) -> None:
    from agent.run import resume_command

    out = functools.partial(console.print, highlight=False)  # folded between words at the terminal's width
    reason = f"{s.stop_reason}" + (f" ({s.stop_detail})" if s.stop_detail else "")
    words = escape(reason).split(" ")  # "stopped by <reason>" stays on one line: people grep for it
    if s.stop_reason == s.status:  # "interrupted", not "interrupted, stopped by interrupted"
        wrap_items(f"[bold]run {s.run_id}[/bold]:", words, sep="")
    else:
        wrap_items(f"[bold]run {s.run_id}[/bold]:", [f"{s.status},", f"stopped by {words[0]}", *words[1:]], sep="")
    wrap_items(f"task {s.task} on {s.arch},", [f"model {escape(s.model)}", f"lang {s.lang}", f"context {s.context}",
                                                f"samples {s.samples}", f"strategy {s.strategy}",
                                                f"profile feedback {'on' if s.profile_feedback else 'off'}",
                                                f"history {s.history}", f"require {s.require}"])
    if s.model_params:
        out("model params: " + escape(", ".join(f"{k}={json.dumps(v)}" for k, v in s.model_params.items())))
    if s.strategy == "evolve":  # the search tree: each candidate under the one whose feedback it answered
        out("  candidates (each under its parent):")
        for line in candidate_tree(s):
            out(f"    {escape(line)}")
    else:
        for t in s.per_turn:
            cands = ", ".join(f"{c.turn}-{c.sample} {c.outcome.replace('_', ' ')}"
                              + (f" {c.verdicts.speedup:.3g}x" if c.verdicts.speedup is not None else "")
                              + (f" SOL {c.verdicts.sol_score:.2f}" if c.verdicts.sol_score is not None else "")
                              for c in t.candidates)
            out(f"  turn {t.turn}: {cands} -> {t.action}")
    unjudged = s.stop_reason == "infra_error" and not s.per_turn  # the toolchain stopped it before any verdict
    if s.best:
        out(f"best: {s.best_path} ({_best_status(s.best, s.require == 'on')})")
    elif unjudged:
        out("best: none (nothing was judged: the toolchain, GPU worker or profiler failed)")
    elif s.require == "off":
        out("best: none (no candidate was correct" + ("" if s.evaluation == "ok" else ", nor compiled") + ")")
    else:
        out("best: none (no candidate was correct with the requested instructions"
            + ("" if s.evaluation == "ok" else ", nor compiled with them") + ")")
    out(f"evaluation: {'not run: nothing was judged' if unjudged else escape(s.evaluation)}")
    u = s.usage
    out(f"spent: {plural(u.llm_calls, 'LLM call')}, {plural(u.prompt_tokens + u.completion_tokens, 'token')} "
        f"({u.prompt_tokens} prompt" + (f", {u.cached_tokens} of them cached" if u.cached_tokens else "")
        + f", {u.completion_tokens} completion), "
        + ("cost unknown (no price for the model), " if u.cost_usd is None else f"${u.cost_usd:.4f}, ")
        + f"{plural(s.faults, 'fault')}, {s.wall_s:.1f} s")
    console.print(f"folder: {run_dir}", highlight=False, soft_wrap=True)  # a path stays whole: it is copied
    err = functools.partial(err_console.print, highlight=False, soft_wrap=True)
    if s.status == "interrupted":
        err(f"interrupted: resume with  {escape(resume_command(run_dir))}")
    elif s.stop_reason == "model_error":
        err(f"[red]error:[/red] the model failed: {escape(s.stop_detail or '')}")
    elif s.stop_reason == "infra_error":  # the detail ends in the resume command
        err(f"[red]infrastructure error[/red] (not the model's kernel; nothing was judged): "
            f"{escape(s.stop_detail or '')}")
    elif s.status == "failed":
        err(f"[red]error:[/red] the run failed: {escape(s.stop_detail or '')} (traceback in events.jsonl; "
            f"resume with  {escape(resume_command(run_dir))})")


def candidate_tree(s: RunSummary) -> list[str]:
    """The run's candidates as an indented tree, children under their parent, in turn order."""
    cands = [c for t in s.per_turn for c in t.candidates]
    children: dict[str | None, list] = {}
    for c in cands:
        children.setdefault(c.parent, []).append(c)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for c in children.get(parent, []):
            speed = f" {c.verdicts.speedup:.3g}x" if c.verdicts.speedup is not None else ""
            sol = f" SOL {c.verdicts.sol_score:.2f}" if c.verdicts.sol_score is not None else ""
            lines.append("  " * depth + f"{c.turn}-{c.sample} {c.outcome.replace('_', ' ')}{speed}{sol}")
            walk(c.path, depth + 1)

    walk(None, 0)
    return lines


def _best_status(c, require: bool = True) -> str:
    """How far the best candidate is known to be good, in words (under --require off the best is
    the best correct one, with or without the instructions: say which)."""
    v = c.verdicts
    if not require and c.outcome != "correct_with_arch":
        if v.correct is True:
            return "correct, without the requested instructions credited" + (
                f", speedup {v.speedup:.3g}x" if v.speedup is not None else "")
        return "unverified: correctness not checked"
    if c.outcome == "correct_with_arch":
        return "correct with arch" + (f", speedup {v.speedup:.3g}x" if v.speedup is not None else "")
    if c.verified:  # correct on the GPU, but the executed-instruction check did not run
        return ("unverified: correct, but the executed-instruction check did not run"
                + (f"; speedup {v.speedup:.3g}x" if v.speedup is not None else ""))
    return "unverified: correctness not checked"


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
    except replay.ReplayInfraError as exc:
        raise InfraError(str(exc)) from None
    except replay.ReplayError as exc:
        raise CliError(str(exc)) from None
    if json_out:
        print_json(report)
    else:
        replay.print_report(report, console)
    raise typer.Exit(0 if report.match else 1)
