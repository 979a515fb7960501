"""`agent sweep CONFIG` (a grid of runs) and `agent report RUNS...` (metrics, tables, plots)."""
from __future__ import annotations

import difflib
import functools
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from agent.commands.common import ExitCode, console, err_console, fail, out_folder, plural, print_json, wrap_items
from agent.trajectory import shipped_example


SWEEP_HELP = (
    "Run a grid of agent runs: models x tasks x arches x context modes x replicas.\n\n"
    "Run ids are <sweep>/<model>/<task>/<arch>/<context>/r<k> under the runs folder; running the same config "
    "again skips finished runs and resumes half-finished ones. LLM calls run concurrently; evaluations queue per "
    "GPU (on a machine without a GPU: compile + inspect only, and the runs say evaluation skipped). "
    "See docs/SWEEPS.md and docs/examples/sweep_*.toml.")
REPORT_HELP = (
    "Write report.md, report.html, report.csv and plots for runs or sweeps.\n\n"
    "Per model x task x arch x context and turn limit: compiled, arch (SASS), correct, correct with arch (static "
    "and executed), fast_p for p in 0, 0.5, 0.8, 1.0, and the geometric-mean speedup, with 95% intervals over "
    "replicas. Verdicts that were not checked (no GPU) are n/a, never a pass.")


def register(app: typer.Typer) -> None:
    app.command("sweep", help=SWEEP_HELP)(sweep)
    app.command("report", help=REPORT_HELP)(report)


def sweep(
    config: Path = typer.Argument(..., help="sweep config, TOML or YAML (see docs/examples/sweep_*.toml)"),
    executor: Optional[str] = typer.Option(None, help="local | ray (overrides the config)"),
    ray_address: Optional[str] = typer.Option(
        None, "--address", "--ray-address",
        help="an existing Ray cluster (auto, host:6379, ray://host:10001); implies --executor ray"),
    evaluator_url: Optional[str] = typer.Option(
        None, "--evaluator", help="evaluate on a remote `agent serve` (http://host:port; token from "
                                  "$PTXBENCH_EVALUATOR_TOKEN) instead of the config's executor"),
    runs_dir: Optional[str] = typer.Option(None, help="where runs go (overrides the config)"),
    concurrency: Optional[int] = typer.Option(None, help="runs (LLM calls) in flight at once"),
    retry_failed: bool = typer.Option(
        False, help="resume runs that ended with a ptxbench error, or that their model's provider stopped (model_error)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the grid and each run's state; run nothing"),
    as_json: bool = typer.Option(False, "--json", help="print the sweep summary as JSON"),
) -> None:
    from agent.sweep import SweepError, check_models, load_sweep_config, models_to_run, plan, run_sweep

    if not config.is_file():
        fail(f"no sweep config at {config}")
    if executor not in (None, "local", "ray"):
        fail(f"unknown executor {executor!r}; choose local or ray")
    if evaluator_url and (executor or ray_address):
        fail("--evaluator (a remote agent serve) replaces --executor and --ray-address: give one of them")
    if ray_address and executor is None:  # an address only means something to Ray
        executor = "ray"
    try:
        cfg = load_sweep_config(config, executor=executor, ray_address=ray_address, runs_dir=runs_dir,
                                concurrency=concurrency)
        grid = plan(cfg)
    except Exception as exc:  # bad config or unknown task: one line
        fail(f"{config}: {_one_line(exc)}")
    if shipped_example(cfg.runs_dir):
        fail(f"runs_dir {cfg.runs_dir}: inside the shipped examples, which are read-only; write somewhere else")
    from agent.trajectory import folder_problem

    if (problem := folder_problem(cfg.runs_dir, "--runs-dir" if runs_dir else "runs_dir")):
        fail(problem)
    if dry_run:
        from agent.sweep import estimate_cost

        rows = [{"run_id": r.run_id, "state": grid.states[r.run_id]} for r in grid.runs]
        cost = estimate_cost(cfg, grid)
        if as_json:
            print_json({"sweep": cfg.name, "runs": rows, "estimate": cost.model_dump()})
        else:
            for row in rows:
                console.print(f"{row['state']:8} {row['run_id']}", highlight=False)
            console.print(plural(len(rows), "run"), highlight=False)
            console.print(cost.line(), highlight=False, soft_wrap=True)
        return

    try:  # once per model, before any run starts (and before the progress bar)
        checked = check_models(cfg, models_to_run(grid, retry_failed))
    except SweepError as exc:
        fail(f"{config}: {exc}")

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[last]}"),
                  console=err_console, transient=as_json) as bar:
        task_id = bar.add_task(cfg.name, total=len(grid.runs), last="")

        def on_run(outcome, done: int, total: int) -> None:
            bar.update(task_id, completed=done, last=f"{outcome.status}: {outcome.run_id}")

        def on_interrupt(in_flight: int) -> None:
            bar.console.print(f"stopping: {plural(in_flight, 'run')} in flight will end as interrupted after "
                              f"their current step (Ctrl-C again to quit now; they stay resumable either way)",
                              highlight=False)

        remote = None
        if evaluator_url:  # the service queues the GPU work; every run holds its one RemoteEvaluator
            from agent.client import RemoteExecutor
            from agent.commands.solve import remote_evaluator

            remote = RemoteExecutor.around(remote_evaluator(evaluator_url))
        try:
            result = run_sweep(cfg, remote, progress=on_run, retry_failed=retry_failed, models_checked=checked,
                               on_interrupt=on_interrupt)
        except RuntimeError as exc:  # e.g. ray not installed
            fail(str(exc))
        except KeyboardInterrupt:  # the second Ctrl-C: runs still in flight have no summary; resumed next time
            bar.stop()
            err_console.print(f"interrupted; run  agent sweep {escape(str(config))}  again to resume", highlight=False)
            sys.stdout.flush()
            os._exit(ExitCode.INTERRUPTED)  # their threads would hold the process until they end
        finally:
            if remote is not None:
                remote.close()
    say = functools.partial(console.print, highlight=False, soft_wrap=True)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    if as_json:
        print_json(result)
    else:
        wrap_items(f"sweep {result.sweep}: {plural(result.total, 'run')}",
                   [f"{result.skipped} already done", f"{result.ran} run now", f"{result.resumed} resumed",
                    f"{result.failed} failed", f"{result.succeeded} succeeded", f"{result.seconds:.0f}s"])
        wrap_items("  on", [escape(part) for part in result.executor.split("; ")], sep=";", indent="    ")
        if result.cost:
            from agent.cost import SweepCost

            say(escape(SweepCost.model_validate(result.cost).line()))
        for note in sorted({o.evaluation for o in result.outcomes if o.evaluation and o.evaluation != "ok"}):
            say(f"evaluation {escape(note)}")
        # The same failure in every run is one line with a count, not sixty.
        problems: dict[str, list[str]] = {}
        for o in result.outcomes:
            if not o.succeeded:  # a run skipped now: how it ended before (the counts above include it)
                why = o.error or (f"{o.stop_reason}: {o.stop_detail}" if o.stop_detail else o.stop_reason) or o.status
                status = o.status if o.status != "skipped" else f"{o.recorded_status} before"
                problems.setdefault(f"{status}, {why}", []).append(o.run_id)
        for why, ids in problems.items():
            more = f" and {plural(len(ids) - 1, 'other run')}" if len(ids) > 1 else ""
            say(f"[red]{escape(why)}[/red] ({escape(ids[0])}{more})")
        if result.succeeded:
            say(f"report: agent report {Path(result.runs_dir) / result.sweep}")
    err = functools.partial(err_console.print, highlight=False, soft_wrap=True)
    again = f"agent sweep {escape(str(config))}"
    if result.interrupted:
        err(f"interrupted: runs in flight were recorded as interrupted, {result.total - len(result.outcomes)} not "
            f"started; run  {again}  again to resume them")
        raise typer.Exit(ExitCode.INTERRUPTED)
    if result.infra_errors:
        err(f"[red]infrastructure error[/red] in {plural(result.infra_errors, 'run')} (toolchain, GPU worker or "
            f"profiler; not the models' kernels, no verdict recorded): fix it (agent doctor), then run  {again}  "
            f"again to resume them")
        raise typer.Exit(ExitCode.INFRA)
    if result.total and not result.succeeded:
        err(f"[red]error:[/red] no run of sweep {escape(result.sweep)} succeeded")
        raise typer.Exit(ExitCode.FAILED)
    if result.succeeded < result.total:
        err(f"[yellow]{plural(result.total - result.succeeded, 'run')} of {result.total} did not succeed[/yellow] "
            f"(--retry-failed redoes failed ones; --dry-run lists each run's state)")
        raise typer.Exit(ExitCode.FAILED)


def report(
    runs: List[Path] = typer.Argument(..., help="run folders or sweep folders (searched for runs)"),
    out: Optional[Path] = typer.Option(None, help="output folder (default: <first path>/report)"),
    turn_limits: Optional[str] = typer.Option(None, help="comma-separated, e.g. 1,4,8 (default: the sweep's)"),
    task: Optional[List[str]] = typer.Option(
        None, "--task", help="only runs of these tasks or groups, e.g. gemm:*, ptxbench:held_out_tasks (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON"),
    published: bool = typer.Option(False, "--published", help="add the seed study's published rows (its own "
                                   "harness) for the same tasks, archs and turn limits, marked as such"),
) -> None:
    from agent.report import report_json, write_report
    from tasks import UnknownTask, select_many

    try:
        select_many(task or [])  # an unknown name or group fails here, in one line
    except UnknownTask as exc:
        fail(str(exc))

    missing = [str(p) for p in runs if not p.exists()]
    if missing:
        fail(f"no such run or sweep folder: {missing[0]}")
    limits = None
    if turn_limits:
        try:
            limits = [int(x) for x in turn_limits.split(",") if x.strip()]
        except ValueError:
            limits = []
        if not limits or min(limits) < 1:
            fail(f"--turn-limits must be turn counts of at least 1 separated by commas (e.g. 1,4,8), "
                 f"not {turn_limits!r}")
    else:
        limits = _sweep_turn_limits(runs)
    if out is None and shipped_example(runs[0]):
        fail(f"{runs[0]} is a shipped example run, which is read-only: give --out DIR for the report")
    out_dir = out_folder(out or (runs[0] / "report"))
    try:
        result = write_report(runs, out_dir, limits, task or None, published=published)
    except (ValueError, OSError) as exc:
        fail(_one_line(exc))
    if as_json:
        print_json(report_json(result))
        return
    console.print(f"{plural(result.runs, 'run')} ({result.unfinished} unfinished) -> {result.files['md']}, "
                  f"{result.files['html']}, {result.files['csv']}", highlight=False)


def _one_line(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":  # a misspelt key: name it and its likely spelling
            from agent.sweep import ModelEntry, SweepConfig

            fields = SweepConfig.model_fields if len(e["loc"]) == 1 else ModelEntry.model_fields
            close = difflib.get_close_matches(str(e["loc"][-1]), list(fields), n=1)
            return f"unknown key {where!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
        from agent.commands.common import plain_validation_error

        return plain_validation_error(e)
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sweep_turn_limits(paths: List[Path]) -> list[int] | None:
    """The turn limits a sweep config asked for (sweep.json in a given folder), if any."""
    for p in paths:
        f = p / "sweep.json"
        if f.is_file():
            try:
                limits = json.loads(f.read_text()).get("config", {}).get("turn_limits")
                return [int(x) for x in limits] if limits else None
            except (OSError, ValueError, TypeError, AttributeError):  # unreadable: the report's defaults
                return None
    return None
