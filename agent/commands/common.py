"""Helpers shared by the CLI commands: one-line errors, JSON output, consoles."""
from __future__ import annotations

import json
import math
import os
from enum import IntEnum
from pathlib import Path
from typing import Any, NoReturn, Sequence

from pydantic import BaseModel
from rich.console import Console

# pydantic's errors in the words a user reads: one table for the CLI's configs and launch.json
from tasks.validation_words import plain_validation_error  # noqa: F401


def reader_left() -> None:
    """stdout's reader is gone (`agent ... | head`): what it wanted, it has. Exit 0 quietly, with
    stdout on /dev/null so the interpreter's last flush cannot fail again (rich's own answer to
    a broken pipe is exit 1)."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise SystemExit(0)


console = Console()
console.on_broken_pipe = reader_left  # type: ignore[method-assign]
err_console = Console(stderr=True)


class ExitCode(IntEnum):
    """What `agent`'s exit status means, the same for every command (README, `agent --help`)."""

    OK = 0  # done; for eval/check: nothing failed (a stage that could not run is listed as skipped)
    FAILED = 1  # the kernel failed a check (eval, check), or a run/sweep ended without its result
    USAGE = 2  # bad input: an unknown task, a bad flag, a missing file
    INFRA = 3  # the toolchain, GPU worker or profiler failed: nothing was judged; fix it and run again
    INTERRUPTED = 130  # Ctrl-C (or SIGTERM); resumable


EXIT_CODES_HELP = ("Exit status: 0 done (eval/check: nothing failed); 1 the kernel failed a check, or a run or "
                   "sweep ended without its result; 2 bad input; 3 infrastructure fault (toolchain, GPU worker, "
                   "profiler): nothing judged; 130 interrupted (resumable).")


class CliError(Exception):
    """Raised by a command for bad input; `agent` prints it as one line and exits 2."""

    code = ExitCode.USAGE


class KernelFault(CliError):
    """The kernel (or its launch manifest) is wrong before anything could be judged: one line,
    exit 1, as for any check the kernel fails."""

    code = ExitCode.FAILED


class InfraError(CliError):
    """The toolchain, GPU worker or profiler cannot do what the command needs; exits 3."""

    code = ExitCode.INFRA


def fail(message: str) -> NoReturn:
    raise CliError(message)


def out_folder(path: Path, flag: str = "--out") -> Path:
    """A folder a command may write into: not an existing file, not inside a shipped example run."""
    from agent.trajectory import folder_problem, shipped_example

    if shipped_example(path):  # first: the probe below must not write there either
        fail(f"{flag} {path}: inside a shipped example run, which is read-only; write somewhere else")
    if (problem := folder_problem(path, flag)):  # a file, read-only, /proc, too long a name
        fail(problem)
    return path


def out_file(path: Path, flag: str = "--out") -> Path:
    """A file a command may (over)write: not a folder, not inside a shipped example run."""
    from agent.trajectory import folder_problem, shipped_example

    if shipped_example(path):  # first: the probe below must not write there either
        fail(f"{flag} {path}: inside a shipped example run, which is read-only; write somewhere else")
    if (problem := folder_problem(Path(path).parent, flag, shown=path)):  # before the work whose result it keeps
        fail(problem)
    if len(os.fsencode(Path(path).name)) > 255:
        fail(f"{flag}: the file name is longer than file systems allow (255 bytes)")
    if path.is_dir():
        fail(f"{flag} {path}: is a folder; give a file name")
    return path


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 run', '2 runs', '1 LLM call': counts as a person writes them."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None):
    """Rows for the terminal (cells may hold rich markup), never cut short.

    rich shrinks columns evenly and ends what does not fit in '…', so at 80 columns
    attn_fwd and attn_fwd_causal printed alike. Here each column keeps at least its longest
    word and the first one (the row's name) its whole text, and the spare width goes to
    the columns that want more. Where even that does not fit, each row is printed as a
    block of `column: value` lines instead."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def lines(cell: str) -> list[str]:
        return Text.from_markup(cell).plain.splitlines() or [""]

    cells = [list(columns)] + [list(r) for r in rows]
    longest = [max(len(line) for r in cells for line in lines(r[i])) for i in range(len(columns))]
    least = [longest[0]] + [max((len(w) for r in cells for line in lines(r[i]) for w in line.split()), default=1)
                            for i in range(1, len(columns))]
    spare = console.width - (3 * len(columns) + 1) - sum(least)  # the default box: borders and padding
    if spare < 0:
        blocks: list[Any] = [Text(title, style="italic")] if title else []
        for r in rows:
            blocks.append(Text.from_markup(f"[bold]{r[0]}[/bold]"))
            blocks += [Text.from_markup(f"  {col}: " + "; ".join(cell.splitlines())) for col, cell in
                       zip(columns[1:], r[1:]) if Text.from_markup(cell).plain.strip()]  # no empty "kernel ms: "
        return Group(*blocks)
    widths: list[int | None] = [None] * len(columns)
    if sum(longest) > sum(least) + spare:  # hand the spare width to the columns that want more
        widths = list(least)
        for n, i in enumerate(sorted(range(1, len(columns)), key=lambda i: longest[i] - least[i])):
            give = min(longest[i] - least[i], spare // (len(columns) - 1 - n))
            widths[i], spare = widths[i] + give, spare - give
    t = Table(title=title, title_justify="left")
    for i, col in enumerate(columns):
        t.add_column(col, no_wrap=i == 0, overflow="fold", width=widths[i])
    for r in rows:
        t.add_row(*r)
    return t


def wrap_items(head: str, items: Sequence[str], sep: str = ",", indent: str = "  ") -> None:
    """`head item, item, ...` folded at the terminal's width between items, never inside one
    (a verdict or an opcode list is one long line otherwise); sep="" folds prose by words."""
    from rich.text import Text

    lines, line = [], head
    for i, item in enumerate(items):
        piece = item + (sep if i < len(items) - 1 else "")
        width = len(Text.from_markup(line).plain) + 1 + len(Text.from_markup(piece).plain)
        if width > console.width and Text.from_markup(line).plain.strip():
            lines.append(line)
            line = indent + piece
        else:
            line += " " + piece
    for text in lines + [line]:
        console.print(text, highlight=False, soft_wrap=True)


def print_json(obj: Any) -> None:
    """JSON on stdout that any parser reads: a float that is not finite (a wrong kernel's inf
    error, a NaN it wrote) is null, as summary.json (pydantic) writes it; json.dumps would write
    the bare words Infinity and NaN, which jq, browsers and most languages refuse. (A run's
    eval.json keeps the words: it must read back as an EvalResult, trajectory.write_eval_json.)"""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    print(json.dumps(_finite(obj), indent=2, default=str, allow_nan=False))


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
