"""`agent eval SOLUTION_DIR --task NAME`: the whole verdict for one solution folder:
compile, requested features (static and executed), per-workload correctness and time
against the library baseline, speedup. On a machine without a GPU it says plainly that
correctness and timing were skipped, and why."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import math

import typer
from rich.markup import escape

from agent.commands.common import CliError, ExitCode, KernelFault, console, print_json, table, wrap_items
from agent.trajectory import EXECUTED_CHECK_DEFAULT
from tools.results import EvalResult
from tools.toolchain import ARCHES

# folded at the terminal's width between words (a reason can be a long sentence)
say = functools.partial(console.print, highlight=False)
WORKLOADS = ("visible", "held_out", "all")


def _mark(value) -> str:
    return {True: "[green]yes[/green]", False: "[red]no[/red]", None: "[dim]not checked[/dim]"}.get(value, str(value))


def _ms(t) -> str:
    return f"{t.median_ms:.4g} ± {t.iqr_ms / 2:.2g}" if t else ""


def render(r: EvalResult, profile_asked: bool = False) -> None:
    c = r.compile
    secs = ", ".join(f"{k} {v:.2f} s" for k, v in c.seconds.items())
    say(f"[bold]{r.task}[/bold] on {r.arch}" + (f" — {r.gpu}" if r.gpu else ""))
    if r.infra_error:  # the harness failed: no verdict to show (a "compiled no" would blame the kernel)
        stage = "[yellow]not judged[/yellow]" if c.infra_error else _mark(c.ok)
        say(f"compile: {stage}" + (f" ({secs})" if secs else ""))
        say(f"[red]infrastructure error[/red] (not the kernel's fault; nothing was judged): {escape(r.infra_error)}")
        return
    say(f"compile: {_mark(c.ok)}" + (f" ({secs})" if secs else "") + (f" — {escape(c.error)}" if c.error else ""))
    for d in [d for d in c.diagnostics if d.severity != "info" or d.code in ("C7515", "C7508")][:8]:
        say(f"  {escape(d.render())}")
    for name, k in c.kernels.items():
        say(f"  kernel {escape(name)}: {k.registers} registers, {k.shared_bytes} B static smem, "
            f"{k.spill_stores + k.spill_loads} spill ops")
    if r.requested_features:
        rows = []
        for f in r.requested_features:
            v = r.inspect.features.get(f)
            ex = (f"{_mark(r.executed.executed.get(f))} ({r.executed.counts.get(f, 0)})"
                  if r.executed.status == "ok" else f"[dim]{r.executed.status}[/dim]")
            rows.append((f, _mark(v.present if v else None),
                         ", ".join(f"{o}×{n}" for o, n in (v.opcodes if v else {}).items()), ex))
        console.print(table(("feature", "in SASS", "SASS opcodes", "executed"), rows,
                            title="requested features"))
    for flag, on in r.inspect.flags.items():
        if on:
            say(f"[yellow]{flag}[/yellow]: {escape(r.inspect.flag_evidence.get(flag, ''))}")
    if r.executed.status != "ok":
        say(f"executed-instruction check: {r.executed.status} ({escape(r.executed.reason or '')})")
    else:
        for f, why in r.executed.notes.items():  # executed, but credit withheld: why
            say(f"[yellow]{f} does not carry the work[/yellow]: {escape(why)}")
        for w in r.executed.workloads:  # credit needs every counted run to be the timed kernel
            ran = ", ".join(f"{ms:.4g}" for ms in w.run_ms) or (f"{w.kernel_ms:.4g}" if w.kernel_ms else "")
            if ran and w.timed_ms:
                which = (f"counted runs {w.counted_from}-{w.runs}" if w.counted_from is not None
                         else f"profiled run {w.profiled_at} of {w.runs}")
                say(f"workload {escape(w.workload)}: {which} {ran} ms, timed median {w.timed_ms:.4g} ms")
    if r.sanitize.status != "skipped" or r.sanitize.reason != "not requested":
        say(f"compute-sanitizer: {r.sanitize.status} {escape(r.sanitize.reason or '')}")
        for e in r.sanitize.errors[:5]:
            say(f"  {escape(e)}")
    if r.run_status == "skipped":
        say(f"[yellow]correctness and timing were skipped[/yellow]: {escape(r.run_reason or '')}")
    if r.workloads and (r.run_status != "skipped" or any(w.status != "skipped" for w in r.workloads)):
        rows = []
        for w in r.workloads:
            status = {"passed": "[green]passed[/green]", "failed": f"[red]{w.reason}[/red]"}.get(w.status, w.status)
            err = max((m.max_abs_err for m in w.outputs), default=None)
            rows.append((escape(w.workload), w.split, status, "" if err is None else f"{err:.3g}", _ms(w.timing),
                         escape(w.baseline_name or ""), _ms(w.baseline), f"{w.speedup:.3f}" if w.speedup else "",
                         f"{w.tflops:.0f}" if w.tflops else "",
                         f"{w.sol_ms:.4g} ({w.roofline_bound})" if w.sol_ms is not None else "",
                         f"{w.sol_score:.3f}" if w.sol_score is not None else ""))
        console.print(table(("workload", "split", "result", "max abs err", "kernel ms", "baseline", "baseline ms",
                             "speedup", "TFLOP/s", "roofline ms", "SOL score"), rows, title="workloads"))
        for w in r.workloads:
            if w.detail and w.status != "passed":
                say(f"  {w.workload}: {escape(w.detail)}")
    elif r.run_status == "failed":
        say(f"[red]run failed[/red]: {escape(r.run_reason or '')}")
    timed = next((w for w in r.workloads if w.gpu_state.get("start")), None)
    if timed:  # drift is visible in every result: the GPU before and after the timed runs
        st, en = timed.gpu_state["start"], timed.gpu_state.get("end", {})
        say(f"GPU during {timed.workload}: SM {st.get('sm_mhz', 0):.0f}->{en.get('sm_mhz', 0):.0f} MHz, "
            f"{st.get('temp_c', 0):.0f}->{en.get('temp_c', 0):.0f} °C, {st.get('power_w', 0):.0f}->"
            f"{en.get('power_w', 0):.0f} W; {timed.timed_runs} paired runs, {timed.full_checks} judged whole")
    if r.executed.shares:
        say("work carried: " + ", ".join(f"{f} {s:.0%}" if s is not None else f"{f} unmeasured"
                                         for f, s in r.executed.shares.items()))
    if r.executed.profile is not None and r.executed.profile.status == "ok":  # the Nsight Compute profile
        from tools.profile import render as render_profile

        say("[bold]profile[/bold] (Nsight Compute, first visible workload):")
        say(escape(render_profile(r.executed.profile)))
    elif profile_asked:  # asked for and not made: say why, never leave it out silently
        why = (r.executed.profile.reason if r.executed.profile is not None and r.executed.profile.reason
               else "--profile needs --executed" if r.executed.reason == "not requested"
               else r.executed.reason if r.executed.status != "ok" and r.executed.reason else "no profile was made")
        say(f"profile: [dim]skipped[/dim] ({escape(why)})")

    def shown(x) -> str:
        if isinstance(x, float):
            return f"{x:.3f}"
        if isinstance(x, list):
            return "[" + ", ".join(f"{y:.3f}" for y in x) + "]"
        return _mark(x)

    v = r.verdicts()
    parts = [f"{k} {shown(x)}" for k, x in v.items() if not (x is None and k.startswith("speedup"))]
    if r.speedup_spread:
        parts.append(f"spread ×{r.speedup_spread:.3f}")
    wrap_items("verdict:", parts + [f"{r.seconds:.1f} s"])
    failed = failures(r)
    say("result: " + (f"[red]failed[/red]: {escape('; '.join(failed))}" if failed else
                      "[green]nothing failed[/green]" + (" (stages that could not run are marked skipped or "
                                                         "not checked)" if r.run_status == "skipped" else "")))


def failures(r: EvalResult) -> list[str]:
    """What the kernel failed, in words ([] when nothing did). A stage that could not run is
    not a failure (nor a pass): it shows as skipped / not checked above. An infrastructure fault
    judged nothing: no failure of the kernel's either (--json's `failures` says so too)."""
    if r.infra_error:
        return []
    out = []
    if not r.compiled:
        return [f"did not compile ({r.compile.error})" if r.compile.error else "did not compile"]
    # launch.json launches no kernel the module has: the SASS of "the launched kernels" is empty, so
    # a missing-feature line would name an effect; the cause is the manifest's kernel name
    unlaunchable = bool(r.inspect.status == "ok" and r.inspect.kernels
                        and set(r.inspect.uncounted_kernels) >= set(r.inspect.kernels))
    if unlaunchable:
        named = next((w.detail for w in r.workloads if w.reason == "manifest_error" and w.detail), None)
        out.append("launch.json launches no kernel of the compiled module"
                   + (f" ({named})" if named else f" (its kernels: {', '.join(sorted(r.inspect.kernels))})"))
    if r.inspect.status == "ok" and not unlaunchable:
        if missing := r.inspect.missing(r.requested_features):
            out.append(f"requested features missing from the SASS: {', '.join(missing)}")
        if r.inspect.flags.get("wgmma_serialized"):
            out.append("wgmma serialized")
    if r.run_status == "failed" and not any(w.status == "failed" for w in r.workloads):
        out.append(f"run failed: {r.run_reason}")
    bad = [w for w in r.workloads if w.status == "failed" and not (unlaunchable and w.reason == "manifest_error")]
    if bad:
        out.append(f"{len(bad)} of {len(r.workloads)} workloads failed ({bad[0].workload}: {bad[0].reason})")
    if r.arch_executed is False:
        out.append("a requested feature did not execute carrying the work")
    return out


def eval_json(r: EvalResult) -> dict:
    """What `agent eval --json` prints (and `agent serve`'s GET /jobs/{id} answers): the EvalResult
    without its PTX text (it would drown the verdict; `agent check --json` prints it), plus the
    verdicts, the infrastructure error and the failures in words."""
    return {**r.model_dump(mode="json", exclude={"compile": {"ptx"}}), "verdicts": r.verdicts(),
            "infra_error": r.infra_error, "failures": failures(r)}


def exit_code(r: EvalResult) -> int:
    return ExitCode.INFRA if r.infra_error else ExitCode.FAILED if failures(r) else ExitCode.OK


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_cmd(
        solution_dir: Annotated[Path, typer.Argument(help="folder with kernel.cu or kernel.ptx + launch.json")],
        task: Annotated[str, typer.Option("--task", help="task name, alias or Definition JSON path")],
        arch: Annotated[str, typer.Option("--arch", help="sm_90a or sm_100a")] = "sm_90a",
        workloads: Annotated[str, typer.Option("--workloads", help="visible, held_out or all")] = "visible",
        executed: Annotated[bool, typer.Option(
            "--executed/--no-executed", help="count executed instructions in the worker (CUPTI; GPU only)")
        ] = EXECUTED_CHECK_DEFAULT,
        profile: Annotated[bool, typer.Option(
            "--profile", help="with --executed: also the Nsight Compute profile (a process of its own; GPU + ncu)")
        ] = False,
        sanitize: Annotated[bool, typer.Option("--sanitize", help="also run compute-sanitizer memcheck")] = False,
        no_time: Annotated[bool, typer.Option("--no-time", help="check correctness only")] = False,
        timeout: Annotated[float, typer.Option("--timeout", help="seconds per workload before the worker is killed")] = 180.0,
        as_json: Annotated[bool, typer.Option("--json", help="print the EvalResult as JSON")] = False,
    ) -> None:
        """Compile, inspect, check and time one solution folder against a task.

        Exit status: 0 nothing failed (stages that could not run, e.g. without a GPU, say so);
        1 the kernel failed (compile, manifest, correctness, requested features); 2 bad input;
        3 infrastructure fault (toolchain, GPU worker): nothing was judged."""
        from tasks import UnknownTask, get_task
        from tools.evaluator import Evaluator
        from tools.solution import ManifestError, Solution, SolutionError

        if arch not in ARCHES:
            raise CliError(f"unknown arch {arch!r} (known: {', '.join(ARCHES)})")
        if workloads not in WORKLOADS:
            raise CliError(f"--workloads must be one of {', '.join(WORKLOADS)}, not {workloads!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise CliError(f"--timeout must be a positive number of seconds, not {timeout}")
        try:
            t = get_task(task)
            sol = Solution.from_dir(solution_dir)
        except ManifestError as exc:  # the manifest is the kernel's: its errors are a failed check
            raise KernelFault(str(exc)) from None
        except (SolutionError, UnknownTask) as exc:
            raise CliError(str(exc)) from None
        with Evaluator(timeout_s=timeout) as ev:
            result = ev.evaluate(sol, t, arch, workloads=workloads, executed_check=executed, sanitize=sanitize,
                                 time=not no_time, profile=executed and profile)
        if as_json:
            print_json(eval_json(result))
        else:
            render(result, profile_asked=profile)
        raise typer.Exit(exit_code(result))
