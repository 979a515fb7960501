"""`agent check` and `agent inspect`: compile a kernel file with NVRTC/ptxas, read its
SASS, and say what it uses. `check` judges it against a task's requested features;
`inspect` prints the raw facts (JSON for scripts)."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from agent.commands.common import CliError, ExitCode, InfraError, KernelFault, console, print_json, wrap_items
from tools.compile import compile_source
from tools.features import SENSING_FLAGS
from tools.results import CompileResult, InspectResult
from tools.sass import inspect as inspect_sass
from tools.solution import ManifestError, Solution, SolutionError
from tools.toolchain import ARCHES, ToolchainError, find_toolchain

# long paths and messages stay on one line each (rich would wrap them at 80 columns in a pipe)
say = functools.partial(console.print, highlight=False, soft_wrap=True)
LANGUAGES = {".cu": "cuda", ".cuh": "cuda", ".ptx": "ptx"}

ArchOpt = Annotated[str, typer.Option("--arch", help=f"target architecture: {', '.join(ARCHES)}")]
LangOpt = Annotated[Optional[str], typer.Option("--lang", help="cuda or ptx (default: from the file suffix)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def load_source(path: Path, lang: str | None, arch: str) -> tuple[str, str, list[str] | None]:
    """A kernel file (or a solution folder) -> (source, language, launched kernels: a folder's
    manifest names them, a bare file has none); CliError for anything unusable."""
    if arch not in ARCHES:
        raise CliError(f"unknown arch {arch!r} (known: {', '.join(ARCHES)})")
    if lang is not None and lang not in ("cuda", "ptx"):
        raise CliError(f"unknown language {lang!r} (use cuda or ptx)")
    if path.is_dir():
        try:
            sol = Solution.from_dir(path)
        except ManifestError as exc:  # the manifest is the kernel's: its errors are a failed check
            raise KernelFault(str(exc)) from None
        except SolutionError as exc:
            raise CliError(str(exc)) from None
        source, language = sol.source, lang or sol.language
        launched = [launch.kernel for launch in sol.manifest.launches]
    else:
        launched = None
        if not path.is_file():
            raise CliError(f"{path}: no such file")
        language = lang or LANGUAGES.get(path.suffix.lower())
        if language is None:
            raise CliError(f"{path}: cannot tell the language from the suffix {path.suffix!r}; pass --lang cuda or --lang ptx")
        try:
            source = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise CliError(f"{path}: not UTF-8 text") from None
    if not source.strip():
        raise CliError(f"{path}: the kernel source is empty")
    if language == "ptx" and not source.isascii():
        line = next(i for i, text in enumerate(source.splitlines(), 1) if not text.isascii())
        raise CliError(f"{path}: PTX must be ASCII; line {line} has non-ASCII characters")
    tc = find_toolchain()
    try:
        tc.require("ptxas")
        if language == "cuda":
            tc.require("nvrtc")
    except ToolchainError as exc:  # the machine's fault, not the kernel's: exit 3
        raise InfraError(f"{exc} (see `agent doctor`)") from None
    return source, language, launched


def report(compiled: CompileResult, info: InspectResult) -> dict:
    """The JSON both commands print: compile facts, per-kernel SASS facts, features, flags."""
    kernels = {name: res.model_dump() for name, res in compiled.kernels.items()}
    for name, k in info.kernels.items():
        kernels[name] = k.model_dump()
    return {
        "compiled": compiled.ok,
        "arch": compiled.arch,
        "language": compiled.language,
        "error": compiled.error,
        "diagnostics": [d.model_dump() for d in compiled.diagnostics],
        "kernels": kernels,
        "symbols": compiled.symbols,
        "inspect": {"status": info.status, "reason": info.reason, "tool": info.tool},
        "features": {name: v.present for name, v in info.features.items()},
        "feature_opcodes": {name: v.opcodes for name, v in info.features.items() if v.present},
        "flags": info.flags,
        "flag_evidence": info.flag_evidence,
        "seconds": compiled.seconds,
        "toolchain": compiled.toolchain,
    }


def _compile_and_inspect(source: str, language: str, arch: str,
                         launched: list[str] | None) -> tuple[CompileResult, InspectResult]:
    compiled = compile_source(source, language, arch)
    return compiled, inspect_sass(compiled, kernels=launched)


def _yes(ok: bool) -> str:
    return "[green]yes[/green]" if ok else "[red]no[/red]"


def _show(compiled: CompileResult, info: InspectResult, requested: list[str]) -> None:
    secs = ", ".join(f"{k} {v:.2f} s" for k, v in compiled.seconds.items())
    # a toolchain that could not run judged nothing: no "no" for the kernel (issue 45 item 1)
    verdict = "[yellow]not judged[/yellow]" if compiled.infra_error else _yes(compiled.ok)
    say(f"compiled: {verdict} ({compiled.arch}, {compiled.language}{', ' + secs if secs else ''})")
    # errors and warnings, and the info lines ptxas gives a code (C7515 serialized wgmma, C7508 ...);
    # the plain -v chatter is summarised in the kernel table instead
    # (an unrolled loop repeats a message per copy: show each once, with a count)
    shown: dict[str, list] = {}
    for d in compiled.diagnostics:
        if d.severity != "info" or d.code:
            shown.setdefault(d.render(), [d, 0])[1] += 1
    for text, (d, n) in shown.items():
        colour = {"error": "red", "warning": "yellow"}.get(d.severity, "cyan")
        say(f"  [{colour}]{escape(text)}[/{colour}]" + (f" (x{n})" if n > 1 else ""))
    if not compiled.ok:
        if compiled.infra_error:
            say(f"[red]infrastructure error[/red] (not the kernel's fault): {escape(compiled.infra_error)}")
        elif not any(d.severity == "error" for d in compiled.diagnostics):  # else printed just above
            say(f"[red]{escape(compiled.error or 'did not compile')}[/red]")
        return
    for name, k in (info.kernels or compiled.kernels).items():
        alias = next((plain for plain, sym in compiled.symbols.items() if sym == name), None)
        wrap_items(f"kernel {name}{f' ({alias})' if alias else ''}:",
                   [f"{k.registers} registers", f"{k.shared_bytes} B static smem", f"{k.stack_frame} B stack",
                    f"spills {k.spill_stores}/{k.spill_loads} B store/load"])
    if info.status != "ok":
        say(f"[yellow]SASS inspection {info.status}: {info.reason}[/yellow]")
        return
    if info.uncounted_kernels:
        say(f"  not counted (launch.json never launches them): {', '.join(info.uncounted_kernels)}")
    for f in requested:
        v = info.features.get(f)
        if v is None:
            say(f"  requested {f}: [red]does not exist on {compiled.arch}[/red]")
        else:
            ops = ", ".join(f"{op}x{n}" for op, n in v.opcodes.items())
            say(f"  requested {f}: {'[green]found[/green] (' + ops + ')' if v.present else '[red]missing[/red]'}")
    others = [f for f, v in info.features.items() if v.present and f not in requested]
    if others or not requested:
        say(f"  {'also present' if requested else 'features present'}: {', '.join(others) or 'none'}")
    for flag, raised in info.flags.items():
        if flag in SENSING_FLAGS and not raised:  # audit flags: shown when raised
            continue
        line = f"  {flag}: {'[red]yes[/red]' if raised else 'no'}"
        say(line + (f" -- {info.flag_evidence[flag]}" if raised else ""))


def check(
    source: Annotated[Path, typer.Argument(help="kernel file (.cu, .ptx) or solution folder")],
    task: Annotated[Optional[str], typer.Option("--task", help="task whose requested features to check")] = None,
    arch: ArchOpt = "sm_90a",
    lang: LangOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Compile a kernel, inspect its SASS and check the task's requested features (and, for a solution
    folder with --task, its launch.json as eval would without a GPU).

    Exit status: 0 nothing failed; 1 did not compile, a requested feature is missing, or the manifest is
    wrong; 2 bad input; 3 the toolchain failed."""
    text, language, launched = load_source(source, lang, arch)
    requested: list[str] = []
    if task is not None:
        from tasks import UnknownTask, get_task

        try:
            requested = get_task(task).features_for(arch)
        except UnknownTask as exc:
            raise CliError(str(exc)) from None
    compiled, info = _compile_and_inspect(text, language, arch, launched)
    # null where the SASS could not be read (did not compile, no disassembler): not checked, not missing
    missing = info.missing(requested) if info.status == "ok" else None
    manifest = (manifest_problems(Solution.from_dir(source), compiled, task, arch)
                if task is not None and source.is_dir() else [])
    if json_out:
        print_json({**report(compiled, info), "task": task, "requested": requested, "missing": missing,
                    "manifest_errors": manifest})
    else:
        _show(compiled, info, requested)
        for problem in manifest:
            say(f"[red]launch.json[/red]: {escape(problem)}")
    raise typer.Exit(_exit_code(compiled, info, requested, manifest))


def _exit_code(compiled: CompileResult, info: InspectResult, requested: list[str], manifest: list[str]) -> int:
    """3: the toolchain failed; 1: did not compile, a requested feature is missing from the SASS
    (or wgmma is serialized), or the manifest is wrong; 0: nothing failed (an inspection that
    could not run is said above, not counted as a pass or a failure)."""
    if compiled.infra_error or info.infra_error:
        return ExitCode.INFRA
    if not compiled.ok or manifest:
        return ExitCode.FAILED
    if info.status == "ok" and (info.missing(requested) or (requested and info.flags.get("wgmma_serialized"))):
        return ExitCode.FAILED
    return ExitCode.OK


def manifest_problems(solution: Solution, compiled: CompileResult, task_name: str, arch: str) -> list[str]:
    """What `agent eval` would find wrong with a solution's launch.json without a GPU
    (tools.evaluator.static_check: names, expressions, shapes, nominal limits, kernels missing
    from the module, the argument count and sizes from the PTX signature), on the visible
    workloads; one line per distinct problem."""
    from tasks import get_task
    from tools.evaluator import static_check
    from tools.launch import NOMINAL_LIMITS

    if not compiled.ok:
        return []
    task = get_task(task_name)
    found: dict[str, None] = {}
    for w in task.workloads_for("visible"):
        err = static_check(solution, compiled, task, task.axis_values(w), NOMINAL_LIMITS[arch])
        if err is not None:
            found.setdefault(f"{err} (workload {w.name})" if len(task.workloads_for("visible")) > 1 else str(err))
    return list(found)


def inspect(
    file: Annotated[Path, typer.Argument(help="kernel file (.cu, .ptx) or solution folder")],
    arch: ArchOpt = "sm_90a",
    lang: LangOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Compile a kernel and report its SASS: opcodes, resources, features, flags."""
    text, language, launched = load_source(file, lang, arch)
    compiled, info = _compile_and_inspect(text, language, arch, launched)
    if json_out:
        print_json(report(compiled, info))
    else:
        _show(compiled, info, [])
        for name, k in info.kernels.items():
            wrap_items(f"{name} opcodes:", [f"{op} {n}" for op, n in k.opcodes.items()])
    if compiled.infra_error or info.infra_error:
        raise typer.Exit(ExitCode.INFRA)
    if not compiled.ok:
        raise typer.Exit(ExitCode.FAILED)


def register(app: typer.Typer) -> None:
    app.command("check")(check)
    app.command("inspect")(inspect)
