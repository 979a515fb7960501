"""Measure what knowledge retrieval costs: tokens added per mode and seed task, and latency.

    python -m knowledge.measure            # print the markdown table
    python -m knowledge.measure --write    # also replace "## Knowledge retrieval" in docs/BENCHMARKS.md

The task texts come from the `agent tasks` CLI (what a model is told), run as a
subprocess so that the knowledge package itself imports nothing of tasks/ or agent/.
Latency is the median of repeated in-process calls after one warm-up call (the first call
of a process also loads and indexes the docs; that cold time is reported separately).
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

from knowledge.retriever import MODES, _index, load_docs, retrieve

ARCHES = ("sm_90a", "sm_100a")
REPEATS = 50
BUDGET = 12000
SECTION = "## Knowledge retrieval"


def _cli(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], check=True, capture_output=True,
                          text=True).stdout


def seed_tasks() -> list[dict]:
    return [t for t in json.loads(_cli("tasks", "--json")) if "seed" in t.get("tags", [])]


def measure() -> tuple[list[dict], dict]:
    rows = []
    latencies: dict[str, list[float]] = {m: [] for m in MODES}
    t0 = time.perf_counter()
    load_docs.cache_clear()
    _index.cache_clear()
    retrieve("gemm", "sm_90a", ["wgmma"])
    cold_ms = (time.perf_counter() - t0) * 1e3
    for task in seed_tasks():
        for arch in ARCHES:
            text = _cli("tasks", "show", task["name"], "--arch", arch)
            feats = task["requested_features"].get(arch, [])
            row = {"task": task["name"], "arch": arch}
            for mode in MODES:
                retrieve(text, arch, feats, mode=mode, token_budget=BUDGET)  # warm
                times = []
                for _ in range(REPEATS):
                    t = time.perf_counter()
                    r = retrieve(text, arch, feats, mode=mode, token_budget=BUDGET)
                    times.append((time.perf_counter() - t) * 1e3)
                row[mode] = r.tokens
                row[f"{mode}_sections"] = len(r.sections)
                latencies[mode].append(statistics.median(times))
            rows.append(row)
    lat = {m: statistics.median(v) for m, v in latencies.items()}
    lat["cold_first_call"] = cold_ms
    return rows, lat


def render(rows: list[dict], lat: dict, date: str, machine: str, note: str = "") -> str:
    lines = [SECTION, "",
             f"Measured {date} on {machine} with `python -m knowledge.measure` (token budget {BUDGET}; "
             "tokens = ceil(chars / 4); the task text itself is not counted).", "",
             "Tokens added to the prompt per mode (sections in parentheses):", "",
             "| task | arch | none | docs | docs+headers | full |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[m]} ({r[m + '_sections']})" if m != "none" else str(r[m]) for m in MODES]
        lines.append(f"| {r['task']} | {r['arch']} | " + " | ".join(cells) + " |")
    lines += ["", "Retrieval latency (median over seed tasks of the median of "
              f"{REPEATS} calls, warm):", "", "| mode | ms |", "|---|---|"]
    lines += [f"| {m} | {lat[m]:.2f} |" for m in MODES]
    lines += [f"| first call in a process (load + index docs) | {lat['cold_first_call']:.1f} |", ""]
    if note:
        lines += [note, ""]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Replace (or append) only our section of docs/BENCHMARKS.md."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[nxt + 1:] if nxt >= 0 else "")
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="update docs/BENCHMARKS.md")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--note", default="", help="a line printed under the tables (e.g. machine load)")
    ap.add_argument("--machine", default=f"CPU dev box ({platform.processor() or platform.machine()}, "
                                         f"Python {platform.python_version()})")
    args = ap.parse_args()
    rows, lat = measure()
    section = render(rows, lat, args.date, args.machine, args.note)
    print(section)
    if args.write:
        write_section(Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md", section)


if __name__ == "__main__":
    main()
