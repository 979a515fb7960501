"""What issue 42 item 7's two remaining levers would make of the counted runs' cost, and what they cost the
timing, on this GPU (needs one; about 3 minutes for the defaults on the H200).

The counted runs of the GEMM expert cost 1.50 s an evaluation (H200, 2026-12-04 night): 0.98 s of padding
(CUPTI's push and pop around every candidate run, ~1.3 ms, and the library's matched pause as long) and 0.52 s
that no pair count changes (CUPTI's first Start after enabling, ~0.28 s; its set-up, decode and disable; the
later pass boundaries). So the target (0.5 s) needs both:

  fewer pairs when credit is on   the evaluator's `timing_budget_s` (1.0 s a workload today; the plan holds
                                  10-60 pairs plus a secret extra of up to half): 0.25 and 0.1 give ~30 and ~15
  the first Start once a worker   the profiler kept enabled between evaluations (tools.cupti.KEEP_ENABLED_ENV,
                                  an experiment: a kept-enabled profiler crashed a worker under kernel replay on
                                  2026-12-02; the check has used user replay since)

For each setting this runs `--evals` evaluations of the task's expert, credit on, every workload, in one worker
(one worker per keep-enabled setting: the environment is read when the worker starts), and prints, per
evaluation, the counted runs' cost and its parts, the pair count, correct_with_arch and each workload's speedup;
then, per setting, each workload's speedup spread over the evaluations (what fewer pairs cost the timing).

    python3 scripts/probe_credit_cost.py [--task gemm_n7168_k5120] [--evals 3] [--budgets 1.0,0.25,0.1]
                                         [--keep off,on] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("padding", "cupti", "pass_boundaries", "phase_finish", "other")


def summary(r) -> dict:
    """One evaluation's figures: the counted runs' cost (seconds) and parts, pairs, verdict, speedups."""
    phase = {k: round(v, 3) for k, v in (r.phase_s or {}).items()}
    return {"correct": bool(r.correct), "correct_with_arch": r.correct_with_arch,
            "counted_s": phase.get("counted_runs"),
            "parts": {p: phase.get(f"counted_runs.{p}") for p in PARTS},
            "pairs": {w.workload: w.timed_runs for w in r.workloads},
            "speedups": {w.workload: w.speedup for w in r.workloads},
            "failed": {w.workload: f"{w.reason}: {(w.detail or '')[:120]}" for w in r.workloads if w.status != "passed"}}


def spread(evals: list[dict]) -> dict:
    """Per workload: the speedups over the evaluations, their median and range (max/min - 1)."""
    out = {}
    for name in evals[0]["speedups"] if evals else ():
        xs = [e["speedups"].get(name) for e in evals if e["speedups"].get(name)]
        if xs:
            out[name] = {"median": round(statistics.median(xs), 4), "range": round(max(xs) / min(xs) - 1, 4),
                         "all": [round(x, 4) for x in xs]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="gemm_n7168_k5120")
    ap.add_argument("--evals", type=int, default=3, help="evaluations per setting")
    ap.add_argument("--budgets", default="1.0,0.25,0.1", help="timing_budget_s values (seconds a workload)")
    ap.add_argument("--keep", default="off,on", help="the profiler kept enabled between evaluations: off, on or both")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from tasks import get_task
    from tools import evaluator
    from tools.cupti import KEEP_ENABLED_ENV
    from tools.solution import Solution

    root = Path(__file__).resolve().parents[1]
    try:  # bad input: one line and exit 2, before any GPU is looked for
        budgets = [float(b) for b in args.budgets.split(",")]
        if not all(b > 0 for b in budgets) or args.evals < 1:
            raise ValueError(f"budgets must be > 0 and --evals >= 1 (got {args.budgets}, {args.evals})")
        if not set(args.keep.split(",")) <= {"off", "on"}:
            raise ValueError(f"--keep takes off, on or off,on (got {args.keep})")
        task = get_task(args.task)
        solution = Solution.from_dir(root / "tasks" / task.name / "expert")
    except Exception as exc:  # noqa: BLE001
        print(f"probe_credit_cost: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    figures: dict[str, dict] = {}
    before = os.environ.get(KEEP_ENABLED_ENV)
    for keep in args.keep.split(","):
        os.environ[KEEP_ENABLED_ENV] = "1" if keep == "on" else "0"  # read by the worker when it starts
        try:
            with evaluator.Evaluator() as ev:
                for budget in budgets:
                    ev.timing_budget_s = budget
                    runs = figures.setdefault(f"keep={keep} budget={budget}", {"evals": []})["evals"]
                    for i in range(args.evals):
                        r = ev.evaluate(solution, task, "sm_90a", workloads="all", executed_check=True)
                        runs.append(summary(r))
                        e = runs[-1]
                        print(f"keep={keep:<3} budget={budget:<5} eval {i}: counted {e['counted_s']} s {e['parts']} "
                              f"pairs {e['pairs']} correct_with_arch {e['correct_with_arch']} speedups "
                              f"{ {k: round(v, 4) for k, v in e['speedups'].items() if v} } {e['failed'] or ''}",
                              flush=True)
        except Exception as exc:  # noqa: BLE001 - a worker that died under a kept-enabled profiler is the finding
            figures.setdefault(f"keep={keep}", {})["error"] = f"{type(exc).__name__}: {exc}"
            print(f"keep={keep}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    if before is None:  # the caller's environment as it was
        os.environ.pop(KEEP_ENABLED_ENV, None)
    else:
        os.environ[KEEP_ENABLED_ENV] = before
    for name, f in figures.items():
        if f.get("evals"):
            f["spread"] = spread(f["evals"])
            costs = [e["counted_s"] for e in f["evals"] if e["counted_s"] is not None]
            print(f"{name}: counted runs {costs} s; speedups per workload {f['spread']}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
