"""`agent tasks`: list the benchmark's tasks; `agent tasks show NAME`: what a model is told."""
from __future__ import annotations

from typing import Annotated

import typer

from agent.commands.common import console, fail, print_json
from agent.commands.common import table as make_table

ARCH_CHOICES = ("sm_90a", "sm_100a")
LANG_CHOICES = ("cuda", "ptx")


def _summary(task) -> dict:
    from tasks import aliases_of, task_split

    return {
        "name": task.name,
        "split": task_split(task.name),  # train, or held_out_tasks: no Fixit data comes from its runs
        "op_type": task.op_type,
        "aliases": aliases_of(task.name),
        "op_family": task.op_family,
        "family": task.family or None,
        "tags": task.tags,
        "requested_features": task.requested_features,
        "baseline": task.baseline,
        "workloads": {"visible": len(task.workloads_for("visible")), "held_out": len(task.workloads_for("held_out"))},
        "visible_workloads": [w.name for w in task.workloads_for("visible")],
        "tolerance": task.tolerance.model_dump(),
        "flops": task.flops,
    }


def listed() -> list[dict]:
    """What `agent tasks --json` prints (and `agent serve`'s GET /tasks): every task's summary, by family."""
    from tasks import list_tasks
    from tasks.schema import OP_FAMILIES

    order = list(dict.fromkeys(OP_FAMILIES.values()))
    tasks = sorted(list_tasks(), key=lambda t: (order.index(t.op_family) if t.op_family in order else len(order),
                                                "held_out_variant" in t.tags))
    return [_summary(t) for t in tasks]


def _load(name: str):
    from tasks import UnknownTask, get_task

    try:
        return get_task(name)
    except UnknownTask as exc:
        fail(str(exc))


def register(app: typer.Typer) -> None:
    tasks_app = typer.Typer(help="List the benchmark's tasks, or show one as a model sees it.",
                            invoke_without_command=True, no_args_is_help=False, rich_markup_mode=None)

    @tasks_app.callback()
    def tasks_list(ctx: typer.Context,
                   as_json: Annotated[bool, typer.Option("--json", help="machine-readable list")] = False) -> None:
        """List every task: name, op type, aliases, requested features per arch, workload counts."""
        if ctx.invoked_subcommand is not None:
            return
        rows = listed()
        if as_json:
            print_json(rows)
            return
        # grouped by family; op type and tags are in --json; held-out variants are marked under the name
        for family in dict.fromkeys(r["op_family"] for r in rows):
            table = make_table(("task", "aliases", "sm_90a", "sm_100a", "visible + held out"), [
                (r["name"] + ("\n[dim](held-out variant)[/dim]" if "held_out_variant" in r["tags"] else "")
                 + ("\n[dim](held-out task: no Fixit data)[/dim]" if r["split"] == "held_out_tasks" else ""),
                 ", ".join(r["aliases"]) or "-", ", ".join(r["requested_features"].get("sm_90a", [])) or "-",
                 ", ".join(r["requested_features"].get("sm_100a", [])) or "-",
                 f"{r['workloads']['visible']} + {r['workloads']['held_out']}") for r in rows if r["op_family"] == family],
                title=family)  # given here: a narrow terminal's block layout prints it too
            console.print(table)

    @tasks_app.command("show")
    def tasks_show(
        name: Annotated[str, typer.Argument(help="task name, alias, or a Definition JSON file")],
        arch: Annotated[str, typer.Option("--arch", help="sm_90a or sm_100a")] = "sm_90a",
        lang: Annotated[str, typer.Option("--lang", help="cuda or ptx")] = "cuda",
        as_json: Annotated[bool, typer.Option("--json", help="print the task definition as JSON instead")] = False,
    ) -> None:
        """Print the task exactly as a model is told it (markdown), visible workloads only."""
        if arch not in ARCH_CHOICES:
            fail(f"unknown arch {arch!r} (choose from {', '.join(ARCH_CHOICES)})")
        if lang not in LANG_CHOICES:
            fail(f"unknown language {lang!r} (choose from {', '.join(LANG_CHOICES)})")
        task = _load(name)
        if as_json:
            print_json(task)
            return
        from tasks.describe import render_task

        print(render_task(task, arch, lang), end="")

    app.add_typer(tasks_app, name="tasks")
