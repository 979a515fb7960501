"""The seed study's published figures, shipped as data (agent/published/ptxbench_seed.json, built by
scripts/published_seed_tables.py from its public repository; the file records the commit and paths).

`agent report --published` shows them beside a sweep's rows at the same tasks, archs and turn limits,
marked "published, other harness": they were measured by the seed study's harness (its prompts, its
judge, its timing, its GPUs), so they sit next to ours for orientation, never pooled with them. Only
the figures both sides define are filled: correct (any trajectory correct within T turns) and
correct with arch executed (their dynamic SASS evidence; our cwa_executed). Their best speedup is the
fastest correct kernel of all trajectories, with or without the requested instructions, where ours
is the geometric mean over correct-with-arch runs: it gets a column cell of its own words.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from pydantic import BaseModel

DATA = Path(__file__).resolve().parent / "published" / "ptxbench_seed.json"
MARK = "published, other harness"


class PublishedRow(BaseModel):
    model: str
    arch: str  # sm_90a | sm_100a
    definition: str  # the seed study's task name
    task: str | None  # ours (mha_with_lse_* is mha_fwd_*); None: not one of our tasks
    workload: str
    experiment: str  # the seed study's evaluation run (several per model and task: prompt variants)
    turn_limit: int
    trajectories: int
    correct: int
    correct_with_arch: int
    arch_evidence: str
    best_speedup: float


class Published(BaseModel):
    source: dict
    rows: list[PublishedRow]

    def source_line(self) -> str:
        s = self.source
        return (f"{s['repository']} at {s['commit'][:12]} ({', '.join(Path(p).name for p in s['paths'])}; data "
                f"committed {s['data_commit_date'][:10]}, retrieved {s['retrieved']})")


@lru_cache(maxsize=1)
def load_published() -> Published:
    return Published.model_validate_json(DATA.read_bytes())


def rows_for(tasks_archs: set[tuple[str, str]], turn_limit: int) -> list[PublishedRow]:
    """The published rows of these (task, arch) pairs at this turn limit (none where it published none)."""
    return [r for r in load_published().rows
            if r.task is not None and (r.task, r.arch) in tasks_archs and r.turn_limit == turn_limit]


def table_row(r: PublishedRow, head: Sequence[str]) -> list[str]:
    """A report table's row (agent/report.py's columns) for one published row; '-' where the seed study
    published no such figure."""
    cells = {"model": f"{r.model} [{r.experiment}] ({MARK})", "task": r.task or r.definition, "arch": r.arch,
             "runs": f"{r.trajectories} trajectories",
             "correct": f"{r.correct / r.trajectories:.0%} ({r.correct}/{r.trajectories})",
             "correct+arch executed": f"{r.correct_with_arch / r.trajectories:.0%} "
                                      f"({r.correct_with_arch}/{r.trajectories})",
             "speedup (geomean)": "none correct" if not r.correct else
             f"best {r.best_speedup:.3f}x (fastest correct kernel, arch or not; not a geomean)"}
    return [cells.get(h, "-") for h in head]


def csv_row(r: PublishedRow) -> dict[str, object]:
    return {"source": MARK, **r.model_dump()}


def note() -> str:
    return (f"rows marked '{MARK}': the seed study's published figures ({load_published().source_line()}), "
            "measured by its own harness (prompts, judge, timing, GPUs); shown beside these runs, never pooled "
            "with them; '-' where it published no such figure; its speedup is its fastest correct kernel, with "
            "or without the requested instructions")
