"""`agent knowledge search "QUERY"`: what the retriever would give a model; `agent knowledge list`: the docs;
`agent knowledge hints`: the named pattern docs --hint adds."""
from __future__ import annotations

from typing import Annotated

import typer

from agent.commands.common import console, fail, print_json

ARCH_CHOICES = ("sm_90a", "sm_100a")


def register(app: typer.Typer) -> None:
    kn = typer.Typer(help="Architecture docs: search them as the agent does, or list them.", no_args_is_help=True,
                     rich_markup_mode=None)

    @kn.command("search")
    def search(query: Annotated[str, typer.Argument(help="task text, features or a compiler message")],
               arch: Annotated[str, typer.Option("--arch", help="sm_90a or sm_100a")] = "sm_90a",
               mode: Annotated[str, typer.Option("--mode", help="none | docs | docs+headers | full")] = "docs",
               features: Annotated[str, typer.Option("--features", help="comma-separated, e.g. wgmma,tma")] = "",
               feedback: Annotated[str, typer.Option("--feedback", help="compiler/evaluator feedback text")] = "",
               budget: Annotated[int, typer.Option("--budget", help="token budget")] = 12000,
               as_json: Annotated[bool, typer.Option("--json", help="sections, scores and text as JSON")] = False,
               text: Annotated[bool, typer.Option("--text", help="print the retrieved text itself")] = False) -> None:
        """Rank doc sections for QUERY the way the agent's retrieve step does."""
        from knowledge.retriever import MODES, retrieve

        if arch not in ARCH_CHOICES:
            fail(f"unknown arch {arch!r} (use {', '.join(ARCH_CHOICES)})")
        if mode not in MODES:
            fail(f"unknown mode {mode!r} (use {', '.join(MODES)})")
        if budget < 0:
            fail("--budget must be >= 0")
        if not query.strip():  # an empty query ranks nothing: an empty table would look like "no docs"
            fail("QUERY is empty: give task text, features or a compiler message to search for")
        from tools.features import FEATURES

        feats = [f.strip() for f in features.split(",") if f.strip()]
        unknown = [f for f in feats if f not in FEATURES]
        if unknown:  # an unknown name would silently rank nothing higher
            fail(f"unknown feature {unknown[0]!r} in --features (known: {', '.join(FEATURES)})")
        r = retrieve(query, arch, feats, feedback or None, mode=mode, token_budget=budget)
        if as_json:
            print_json({"mode": r.mode, "tokens": r.tokens, "truncated": r.truncated,
                        "sections": [vars(s) for s in r.sections], "text": r.text})
            return
        if text:
            print(r.text)
            return
        from rich.table import Table

        table = Table()
        for col in ("#", "doc", "section", "tokens", "score", "why"):
            table.add_column(col)
        for i, s in enumerate(r.sections, 1):
            table.add_row(str(i), s.doc, s.heading, str(s.tokens), f"{s.score:.3f}", s.why)
        console.print(table)
        console.print(f"{r.tokens} tokens (mode {r.mode}{', truncated to the budget' if r.truncated else ''})")

    @kn.command("list")
    def list_docs(as_json: Annotated[bool, typer.Option("--json", help="machine-readable list")] = False) -> None:
        """Every doc: arch, title, features, sections and tokens."""
        from knowledge.retriever import load_docs

        rows = [{"doc": d.path, "arch": d.arch, "title": d.title, "features": list(d.features),
                 "sections": len(d.sections), "tokens": sum(s.tokens for s in d.sections)} for d in load_docs()]
        if as_json:
            print_json(rows)
            return
        from rich.table import Table

        table = Table()
        for col in ("doc", "arch", "title", "features", "sections", "tokens"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["doc"], r["arch"], r["title"], ", ".join(r["features"]), str(r["sections"]), str(r["tokens"]))
        console.print(table)

    @kn.command("hints")
    def list_hints(as_json: Annotated[bool, typer.Option("--json", help="machine-readable list")] = False) -> None:
        """The named pattern docs `agent solve --hint NAME` adds whole on top of any arm."""
        from knowledge.retriever import count_tokens, load_hints

        rows = [{"name": h.name, "arch": list(h.arches), "title": h.title, "tokens": count_tokens(h.text)}
                for h in load_hints().values()]
        if as_json:
            print_json(rows)
            return
        from rich.table import Table

        table = Table()
        for col in ("name", "arch", "title", "tokens (chars/4)"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["name"], ", ".join(r["arch"]), r["title"], str(r["tokens"]))
        console.print(table)

    app.add_typer(kn, name="knowledge")
