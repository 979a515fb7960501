"""The `agent` command. Thin: each command group lives in agent/commands/<area>.py and
registers itself here; library code stays out of this file."""
from __future__ import annotations

import os
import sys

# litellm fetches a cost map over the network at import unless told not to (FACTS.md).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import typer  # noqa: E402
from rich.markup import escape  # noqa: E402

from agent.commands import common  # noqa: E402

# plain click help (rich_markup_mode=None): it wraps every column at the terminal's width, where
# rich's boxes cut long flag names ("--executed,--execu…") and show flags as "<bool>"
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="ptxbench: benchmark and agent for architecture-specific PTX (wgmma/TMA, tcgen05/TMEM). "
                       + common.EXIT_CODES_HELP)


def _plain_metavars() -> None:
    """Help in the usual command-line words: `RUNS...` and `--out PATH`, not typer's `{runs}`,
    `runs... <list[Path]>` and `--out <path>` (a Python type is no word for a user)."""
    from typer.core import TyperArgument, TyperOption

    def word(param, ctx) -> str:
        label = str(param.display_type(ctx) or "").strip("<>")  # typer's "<list[Path]>", "<int>", "<a|b>"
        label = label.removeprefix("list[").removesuffix("]")
        if "|" in label:  # choices: the words themselves
            return label
        return {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "bool": "BOOLEAN"}.get(
            label.lower(), label.upper() or "VALUE")

    def argument_name(self) -> str:
        return (self.metavar or self.name.upper()) + ("..." if self.nargs != 1 else "")

    def argument_usage(self) -> str:
        return argument_name(self) if self.required else f"[{argument_name(self)}]"

    def option_type(self, ctx) -> str | None:
        if self.is_flag or self.count:
            return None
        return self.metavar or word(self, ctx) + ("..." if self.nargs != 1 else "")

    if all(hasattr(TyperArgument, m) for m in ("_rich_display_name", "_usage_display_name", "display_type_rich")):
        TyperArgument._rich_display_name = argument_name  # type: ignore[method-assign]
        TyperArgument._usage_display_name = argument_usage  # type: ignore[method-assign]
        TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]  # its name says it
    if hasattr(TyperOption, "display_type_rich"):
        TyperOption.display_type_rich = option_type  # type: ignore[method-assign]


_plain_metavars()


def _whole_phrases() -> None:
    """Help folded between phrases, never inside one: click's wrapper breaks at hyphens
    ("[default: no-retry-" / "failed]", "half-" / "finished") and between "[default:" and its
    value. Hyphenated words stay whole, and a short note ("[default: 6000]", "[required]",
    "(default 6)") is one unit: it moves to the next line whole."""
    try:
        from typer._click import _textwrap  # typer 0.2x carries its own click; older ones use click's
    except ImportError:
        from click import _textwrap  # type: ignore[no-redef]
    wrapper = _textwrap.TextWrapper
    if getattr(wrapper, "_ptxbench_whole", False):
        return
    split, closers = wrapper._split, {"[": "]", "(": ")"}

    def short(note: list[str]) -> bool:  # a note, not prose in brackets: folded by words as usual
        words = sum(1 for c in note if c.strip())
        return sum(map(len, note)) <= 40 and (note[0][0] == "[" or words <= 3)

    def whole_notes(self, text: str) -> list[str]:
        self.break_on_hyphens = False  # set per instance by TextWrapper.__init__
        out: list[str] = []
        note: list[str] = []
        for chunk in split(self, text):
            if not note and chunk[:1] in closers and closers[chunk[0]] not in chunk:
                note = [chunk]  # a note opens
            elif note:
                note.append(chunk)
                if closers[note[0][0]] in chunk or not short(note):
                    out.extend(["".join(note)] if short(note) else note)
                    note = []
            else:
                out.append(chunk)
        return out + note

    wrapper._split = whole_notes  # type: ignore[method-assign]
    wrapper._ptxbench_whole = True
    # A group's command list cut each summary to fit one line ("credentials; exit..."): the whole
    # first sentence, folded like the rest.
    try:
        from typer._click.core import Command
    except ImportError:
        from click.core import Command  # type: ignore[no-redef,assignment]
    short_help = Command.get_short_help_str
    Command.get_short_help_str = lambda self, limit=45: short_help(self, 10**6)  # type: ignore[method-assign]


_whole_phrases()


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"ptxbench {version('ptxbench')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("ptxbench (not installed: pip install -e .)")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print ptxbench's version and exit.")) -> None:
    """ptxbench: benchmark and agent for architecture-specific PTX (wgmma/TMA, tcgen05/TMEM)."""  # help: app's


def _register() -> None:
    from agent.commands import (bench, check, doctor, evaluate, fixit, knowledge, serve, show, solve,
                                sweep, tasks)
    for module in (doctor, tasks, check, evaluate, solve, knowledge, sweep, fixit, bench, show, serve):
        module.register(app)


def main() -> None:
    _register()
    try:
        app()
    except common.CliError as exc:
        # the message is text, not markup: "pip install -e '.[ray]'" must keep its [ray]
        common.err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        common.err_console.print("interrupted")
        sys.exit(common.ExitCode.INTERRUPTED)
    except BrokenPipeError:  # a plain print() to a closed pipe (`| head`)
        common.reader_left()


if __name__ == "__main__":
    main()
