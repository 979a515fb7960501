"""Measure what knowledge retrieval costs: tokens added per arm and seed task, and latency.

    python scripts/measure_context.py            # print the markdown table
    python scripts/measure_context.py --write    # also add a dated "## Knowledge retrieval" section to docs/BENCHMARKS.md
    python scripts/measure_context.py --model gpt-4o --adds --tasks gemm_n7168_k5120,mha_bwd_d128
        # METHODOLOGY's table: what each arm adds to the one it nests in, in gpt-4o's tokens

The retriever's arguments are the agent's own: a subprocess asks agent.nodes.retrieval_call
for every (task, arch, arm) with the run defaults (the context budget of `agent solve`), so
the table describes what a run sends (this script lives in scripts/: the knowledge package
itself imports nothing of tasks/ or agent/). Latency is the median of repeated in-process calls after one warm-up call
(the first call of a process also loads and indexes the docs; that cold time is reported
separately).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from knowledge.retriever import HEADER_BUDGET, MODES, _index, header_api, load_docs, retrieve

ARCHES = ("sm_90a", "sm_100a")
REPEATS = 50
SECTION = "## Knowledge retrieval"

# Runs in a subprocess: the agent's retrieve_context arguments for every seed task x arch x arm.
_CALLS = """
import json
from agent.nodes import retrieval_call
from agent.trajectory import RunConfig
from tasks import list_tasks
out = []
for t in list_tasks():
    if not ({tasks!r} and t.name in {tasks!r} or not {tasks!r} and "seed" in t.tags):
        continue
    for arch in {arches!r}:
        for mode in {modes!r}:
            cfg = RunConfig(run_id="measure", task=t.name, model={model!r}, arch=arch, context=mode,
                            requested_features=t.features_for(arch))
            out.append({{"task": t.name, "arch": arch, "mode": mode, "call": retrieval_call(t, cfg, None)}})
print(json.dumps(out))
"""


def agent_calls(model: str = "scripted", tasks: tuple[str, ...] = ()) -> list[dict]:
    code = _CALLS.format(arches=ARCHES, modes=MODES, model=model, tasks=tasks)
    return json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                     cwd=str(ROOT)).stdout)


def measure(model: str = "scripted", tasks: tuple[str, ...] = ()) -> tuple[list[dict], dict, int]:
    calls = agent_calls(model, tasks)
    latencies: dict[str, list[float]] = {m: [] for m in MODES}
    t0 = time.perf_counter()
    load_docs.cache_clear()
    _index.cache_clear()
    header_api.cache_clear()
    retrieve(**next(c["call"] for c in calls if c["mode"] == "full"))
    cold_ms = (time.perf_counter() - t0) * 1e3
    rows: dict[tuple[str, str], dict] = {}
    for c in calls:
        kwargs = c["call"]
        retrieve(**kwargs)  # warm
        times = []
        for _ in range(REPEATS):
            t = time.perf_counter()
            r = retrieve(**kwargs)
            times.append((time.perf_counter() - t) * 1e3)
        row = rows.setdefault((c["task"], c["arch"]), {"task": c["task"], "arch": c["arch"]})
        row[c["mode"]] = r.tokens
        row[f"{c['mode']}_sections"] = len(r.sections)
        row[f"{c['mode']}_parts"] = r.parts
        latencies[c["mode"]].append(statistics.median(times))
    lat = {m: statistics.median(v) for m, v in latencies.items() if v}
    lat["cold_first_call"] = cold_ms
    return list(rows.values()), lat, calls[0]["call"]["token_budget"]


def render(rows: list[dict], lat: dict, date: str, machine: str, budget: int, note: str = "") -> str:
    lines = [f"{SECTION} ({date})", "",
             f"Measured {date} on {machine} with `python scripts/measure_context.py`: the agent's own retrieval call "
             f"(agent.nodes.retrieval_call: query = the task's description, family and op type; docs of the "
             f"task's family only; context budget {budget} as `agent solve` defaults; header API budget "
             f"{HEADER_BUDGET}). Tokens = ceil(chars / 4); the task statement itself is not counted.", "",
             "Tokens added to the prompt per arm (sections in parentheses; the header API counts one section per "
             "header, a worked example one). none ⊂ docs ⊂ docs+headers ⊂ full are the nested arms; docs+example "
             "(docs plus the family's worked kernel, sm_90a gemm / attention only) measures copying, apart:", "",
             "| task | arch | " + " | ".join(MODES) + " |", "|---|---|" + "---|" * len(MODES)]
    for r in rows:
        cells = []
        for m in MODES:
            if m == "none":
                cells.append(str(r[m]))
                continue
            n = sum(p["sections"] for p in r[m + "_parts"].values())
            cells.append(f"{r[m]} ({n})")
        lines.append(f"| {r['task']} | {r['arch']} | " + " | ".join(cells) + " |")
    lines += ["", "Retrieval latency (median over seed tasks of the median of "
              f"{REPEATS} calls, warm):", "", "| mode | ms |", "|---|---|"]
    lines += [f"| {m} | {lat[m]:.2f} |" for m in MODES if m in lat]
    lines += [f"| first call in a process (load + index docs) | {lat['cold_first_call']:.1f} |", ""]
    if note:
        lines += [note, ""]
    return "\n".join(lines) + "\n"


def render_adds(rows: list[dict], model: str) -> str:
    """What each arm adds to the arm it nests in (docs+example: to docs), as METHODOLOGY's table."""
    def cell(r: dict, m: str, base: str | None) -> str:
        n = sum(p["sections"] for p in r[m + "_parts"].values())
        nb = sum(p["sections"] for p in r[base + "_parts"].values()) if base else 0
        return f"{r[m] - (r[base] if base else 0):,} ({n - nb} sections)"
    lines = [f"Tokens each arm adds on turn 1 ({model}'s tokenizer):", "",
             "| task | arch | docs adds | +headers adds | full adds (beyond docs+headers) | docs+example adds |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['arch']} | {cell(r, 'docs', None)} | {cell(r, 'docs+headers', 'docs')} | "
                     f"{cell(r, 'full', 'docs+headers')} | {cell(r, 'docs+example', 'docs')} |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Append the dated section to docs/BENCHMARKS.md, after the earlier measurements (history stays)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    path.write_text(text.rstrip("\n") + "\n\n" + section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="update docs/BENCHMARKS.md")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--note", default="", help="a line printed under the tables (e.g. machine load)")
    ap.add_argument("--machine", default=f"CPU dev box ({platform.processor() or platform.machine()}, "
                                         f"Python {platform.python_version()})")
    ap.add_argument("--model", default="scripted", help="count in this model's tokenizer (e.g. gpt-4o; default chars/4)")
    ap.add_argument("--tasks", default="", help="comma-separated task names (default: the seed tasks)")
    ap.add_argument("--adds", action="store_true", help="print what each arm adds to the one it nests in")
    args = ap.parse_args()
    tasks = tuple(t for t in args.tasks.split(",") if t)
    rows, lat, budget = measure(args.model, tasks)
    if args.adds:
        print(render_adds(rows, args.model))
        return
    section = render(rows, lat, args.date, args.machine, budget, args.note)
    print(section)
    if args.write:
        write_section(ROOT / "docs" / "BENCHMARKS.md", section)


if __name__ == "__main__":
    main()
