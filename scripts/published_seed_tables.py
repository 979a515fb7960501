"""Build agent/published/ptxbench_seed.json from the seed study's published per-model tables.

The seed artifact (zhang677/PTXBench) publishes three tables under
benchmark/plot_viewer_v1/data/, one row per model x arch x task definition x evaluation run x
turn limit (1, 4, 8), each over its trajectories (12 in most, up to 24): correctness_rate_by_release_date.csv,
arch_instruction_correctness_by_release_date.csv and best_speedup_by_release_date.csv. This
script joins them into one list of rows and records where they came from (repository, commit,
paths, commit date). Facts only: numbers and names, none of that repository's code.

    git clone <the seed repository> /tmp/seed      # or any checkout of the commit below
    python scripts/published_seed_tables.py /tmp/seed [--commit SHA]

Run by hand; nothing in the package imports it.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import subprocess
import sys
from pathlib import Path

DATA = "benchmark/plot_viewer_v1/data"
TABLES = {"correct": "correctness_rate_by_release_date.csv",
          "cwa": "arch_instruction_correctness_by_release_date.csv",
          "speedup": "best_speedup_by_release_date.csv"}
ARCH = {"hopper": "sm_90a", "blackwell": "sm_100a"}
OUT = Path(__file__).resolve().parents[1] / "agent" / "published" / "ptxbench_seed.json"


def our_task(definition: str) -> str | None:
    """The seed's task definition as our task name, where we have that task (None: not ours)."""
    name = definition.replace("mha_with_lse_", "mha_fwd_", 1) if definition.startswith("mha_with_lse_") else definition
    return name if (Path(__file__).resolve().parents[1] / "tasks" / name).is_dir() else None


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path, help="a git checkout (or bare mirror) of the seed repository")
    ap.add_argument("--commit", default="HEAD")
    args = ap.parse_args()
    commit = _git(args.repo, "rev-parse", args.commit).strip()
    data_commit = _git(args.repo, "log", "-1", "--format=%H %cI", commit, "--", DATA).split()
    tables = {k: list(csv.DictReader(io.StringIO(_git(args.repo, "show", f"{commit}:{DATA}/{f}"))))
              for k, f in TABLES.items()}
    key = lambda r: (r["model"], r["arch"], r["definition"], r["workload"], r["exp_dir"], int(r["turn_limit"]))
    by = {k: {key(r): r for r in rows} for k, rows in tables.items()}
    if not (set(by["correct"]) == set(by["cwa"]) == set(by["speedup"])):
        print("the three tables do not cover the same rows", file=sys.stderr)
        return 1
    rows = []
    for k in sorted(by["correct"]):
        c, a, s = by["correct"][k], by["cwa"][k], by["speedup"][k]
        n = int(c["n_trajectories"])
        if not (n == int(a["n_trajectories"]) == int(s["n_trajectories"])):
            print(f"{k}: trajectory counts differ", file=sys.stderr)
            return 1
        rows.append({"model": k[0], "arch": ARCH[k[1]], "definition": k[2], "task": our_task(k[2]),
                     "workload": c["workload_name"], "experiment": Path(k[4]).name, "turn_limit": k[5],
                     "trajectories": n, "correct": int(c["correct"]), "correct_with_arch": int(a["correct_with_arch"]),
                     "arch_evidence": a["tag_evidence"], "best_speedup": float(s["best_speedup"])})
    doc = {
        "source": {
            "what": "the seed study's published per-model tables (its results viewer's data)",
            "repository": "zhang677/PTXBench", "commit": commit,
            "data_commit": data_commit[0], "data_commit_date": data_commit[1],
            "paths": [f"{DATA}/{f}" for f in TABLES.values()],
            "retrieved": dt.date.today().isoformat(),
            "harness": "the seed study's own (FIBServe + Nsight Compute), not ptxbench's",
            "fields": {
                "correct": "trajectories (of `trajectories`) with a correct kernel within `turn_limit` turns",
                "correct_with_arch": "of those, with a correct kernel whose requested instruction families "
                                     "(Hopper: GMMA/TMA; Blackwell: TCGEN/TMEM) were in the SASS and executed "
                                     "(arch_evidence dynamic_sass: Nsight Compute)",
                # read off the data: never falls as the turn limit grows, 0 exactly where `correct` is 0, and
                # above 0 in 24 rows whose correct_with_arch is 0
                "best_speedup": "the fastest correct kernel of the cell's trajectories within `turn_limit` turns, vs "
                                "the library; any correct kernel, with or without the requested instructions; 0 where "
                                "none was correct (a maximum over trajectories, not ptxbench's geomean over "
                                "correct-with-arch runs)",
                "experiment": "the evaluation run's folder name: a model has several for one task where the seed "
                              "study varied its prompt (hints, knowledge) or the model's checkpoint",
                "task": "our task of that definition (mha_with_lse_* is our mha_fwd_*); null: not one of ours",
            },
        },
        "rows": rows,
    }
    # the source block for people, then one row a line (a diff of a rebuild reads row by row)
    head = json.dumps({"source": doc["source"]}, indent=1)[:-2]
    body = ",\n".join("  " + json.dumps(r) for r in rows)
    OUT.write_text(f"{head},\n \"rows\": [\n{body}\n ]\n}}\n")
    print(f"{len(rows)} rows -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
