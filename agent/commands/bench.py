"""`agent bench --model expert|simple`: evaluate every shipped solution of one kind and
print one table. On a CPU machine it is an offline demo of the harness (compile + SASS
verdicts, correctness and timing skipped and said so); on an H100/H200 it is the
benchmark's expert row."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from agent.commands.common import CliError, ExitCode, console, err_console, out_file, plural, print_json, table
from agent.commands.evaluate import WORKLOADS
from agent.trajectory import EXECUTED_CHECK_DEFAULT
from tools.toolchain import ARCHES


def _mark(value) -> str:
    return {True: "[green]yes[/green]", False: "[red]no[/red]", None: "[dim]n/a[/dim]"}.get(value, str(value))


TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
KINDS = ("expert", "simple")


def solution_dir(task_name: str, kind: str, arch: str) -> Path | None:
    """tasks/<task>/<kind>_<arch without "_">/ if it exists (e.g. expert_sm100a), else
    tasks/<task>/<kind>/ for sm_90a (and for `simple`, whose SIMT kernels build for every arch)."""
    specific = TASKS_DIR / task_name / f"{kind}_{arch.replace('_', '')}"
    if specific.is_dir():
        return specific
    generic = TASKS_DIR / task_name / kind
    if generic.is_dir() and (arch == "sm_90a" or kind == "simple"):
        return generic
    return None


def _row(result) -> dict:
    """One solution's row: `arch` is the target architecture, `arch_sass` the static verdict."""
    v = result.verdicts()
    baselines = sorted({w.baseline_name for w in result.workloads if w.baseline_name})
    return {
        "task": result.task, "arch": result.arch, **v,
        "serialized": result.inspect.flags.get("wgmma_serialized", False),
        "baseline": ",".join(baselines) or None,
        "run": result.run_status, "run_reason": result.run_reason,
        # the toolchain or GPU worker failed: nothing judged (compiled=false then says nothing of the kernel)
        "infra_error": result.infra_error,
        "workloads": [{"workload": w.workload, "split": w.split, "status": w.status, "reason": w.reason,
                       "ms": w.timing.median_ms if w.timing else None,
                       "baseline_ms": w.baseline.median_ms if w.baseline else None,
                       "speedup": w.speedup, "tflops": w.tflops} for w in result.workloads],
    }


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench_cmd(
        model: Annotated[str, typer.Option("--model", help="which shipped solutions: expert or simple")] = "expert",
        arch: Annotated[str, typer.Option("--arch", help="sm_90a or sm_100a")] = "sm_90a",
        task: Annotated[list[str] | None, typer.Option(
            "--task", help="only these tasks or groups, e.g. gemm:*, attention:causal (repeatable)")] = None,
        workloads: Annotated[str, typer.Option("--workloads", help="visible, held_out or all")] = "all",
        executed: Annotated[bool, typer.Option(
            "--executed/--no-executed", help="count executed instructions with the hardware counters (GPU only)")
        ] = EXECUTED_CHECK_DEFAULT,
        out: Annotated[Path | None, typer.Option("--out", help="also write the rows as JSON here")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
    ) -> None:
        """Evaluate every shipped expert (or simple) solution and print the table."""
        from tasks import UnknownTask, get_task, list_tasks, select_many
        from tools.evaluator import Evaluator
        from tools.solution import Solution, SolutionError

        if model not in KINDS:
            raise CliError(f"--model must be one of {', '.join(KINDS)} (shipped solutions), not {model!r}")
        if arch not in ARCHES:
            raise CliError(f"unknown arch {arch!r} (known: {', '.join(ARCHES)})")
        if workloads not in WORKLOADS:
            raise CliError(f"--workloads must be one of {', '.join(WORKLOADS)}, not {workloads!r}")
        if out is not None:
            out_file(out)
        try:
            chosen = [get_task(t) for t in select_many(task)] if task else list_tasks()
        except UnknownTask as exc:
            raise CliError(str(exc)) from None
        todo = [(t, d) for t in chosen if (d := solution_dir(t.name, model, arch))]
        if not todo:
            raise CliError(f"no {model} solutions for {arch} among {', '.join(t.name for t in chosen)}")
        rows, status = [], ExitCode.OK
        # One line per solution on stderr (each takes seconds to minutes; stdout keeps the table or JSON).
        say = lambda text: err_console.print(text, highlight=False, soft_wrap=True)  # noqa: E731
        say(f"bench: {plural(len(todo), f'{model} solution')} on {arch}, {workloads} workloads")
        with Evaluator() as ev:
            for n, (t, d) in enumerate(todo, 1):
                start = time.monotonic()
                try:
                    sol = Solution.from_dir(d)
                except SolutionError as exc:  # a broken shipped solution is a row, not a crash
                    rows.append({"task": t.name, "arch": arch, "compiled": False, "run": "failed",
                                 "run_reason": f"bad solution: {exc}"})
                    status = max(status, ExitCode.FAILED)
                else:
                    res = ev.evaluate(sol, t, arch, workloads=workloads, executed_check=executed)
                    rows.append(_row(res))
                    status = max(status, _exit_code(res, model))
                r = rows[-1]
                if r.get("infra_error"):
                    say(f"[{n}/{len(todo)}] {t.name}: infrastructure error, nothing judged: {escape(r['infra_error'])}")
                    continue
                say(f"[{n}/{len(todo)}] {t.name}: compiled {_word(r.get('compiled'))}, "
                    f"features in SASS {_word(r.get('arch_sass'))}, correct {_word(r.get('correct'))}"
                    + (f", speedup {r['speedup']:.3f}" if r.get("speedup") else "")
                    + f" ({time.monotonic() - start:.1f} s)")
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(rows, indent=2) + "\n")
        if as_json:
            print_json(rows)
            raise typer.Exit(status)
        unjudged = ("[yellow]not judged[/yellow]",) * 5 + ("",)  # the harness failed: no "no" for the kernel
        console.print(table(
            ("task", "compiled", "in SASS", "executed", "correct", "held out", "speedup"),
            [(r["task"], *(unjudged if r.get("infra_error") else (
                _mark(r.get("compiled")), _mark(r.get("arch_sass")), _mark(r.get("arch_executed")),
                _mark(r.get("correct")), _mark(r.get("correct_held_out")),
                f"{r['speedup']:.3f}" if r.get("speedup") else ""))) for r in rows],
            title=f"{model} solutions, {arch}"))
        baselines = [f"{r['task']} vs {r['baseline']}" for r in rows if r.get("speedup") and r.get("baseline")]
        if baselines:
            console.print("speedup: " + "; ".join(baselines), highlight=False, soft_wrap=True)
        for reason in sorted({r["run_reason"] for r in rows
                              if r.get("run") != "ok" and r.get("run_reason") and not r.get("infra_error")}):
            console.print(f"[yellow]correctness and timing skipped[/yellow]: {escape(reason)}", highlight=False,
                          soft_wrap=True)
        raise typer.Exit(status)


def _exit_code(res, kind: str) -> int:
    """3: the toolchain or GPU worker failed; 1: a shipped solution did not compile, or ran wrong
    or crashed, or an expert lacks its requested instructions (missing from the SASS, wgmma
    serialized, or not executed carrying the work), which is the credit it ships for; a simple
    solution without them is what it is: not a failure."""
    if res.infra_error:
        return ExitCode.INFRA
    if not res.compiled or res.run_status == "failed" or res.correct is False or res.split_correct("held_out") is False:
        return ExitCode.FAILED
    if kind == "expert" and ((res.inspect.status == "ok" and not res.arch_ok) or res.arch_executed is False):
        return ExitCode.FAILED
    return ExitCode.OK


def _word(value) -> str:
    return {True: "yes", False: "no", None: "n/a"}.get(value, str(value))
