"""Helpers shared by the CLI commands: one-line errors, JSON output, consoles."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn, Sequence

from pydantic import BaseModel
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


class CliError(Exception):
    """Raised by a command for bad input; `agent` prints it as one line and exits 2."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


def out_folder(path: Path, flag: str = "--out") -> Path:
    """A folder a command may write into: not an existing file, not inside a shipped example run."""
    from agent.trajectory import shipped_example

    if path.exists() and not path.is_dir():
        fail(f"{flag} {path}: exists and is not a folder")
    if shipped_example(path):
        fail(f"{flag} {path}: inside a shipped example run, which is read-only; write somewhere else")
    return path


def out_file(path: Path, flag: str = "--out") -> Path:
    """A file a command may (over)write: not a folder, not inside a shipped example run."""
    from agent.trajectory import shipped_example

    if path.is_dir():
        fail(f"{flag} {path}: is a folder; give a file name")
    if shipped_example(path):
        fail(f"{flag} {path}: inside a shipped example run, which is read-only; write somewhere else")
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
                       zip(columns[1:], r[1:])]
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


def print_json(obj: Any) -> None:
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    print(json.dumps(obj, indent=2, default=str))
