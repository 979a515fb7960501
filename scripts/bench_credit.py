"""What the executed-instruction check costs (docs/BENCHMARKS.md): a warm evaluation of an expert
on all its workloads without the check, with it, and with it but without the profile metrics,
on a GPU machine. Prints the evaluator's phases and each workload's credit.

    python scripts/bench_credit.py [--tasks gemm_n7168_k5120,mha_bwd_d128] [--out runs/bench_credit]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.evaluator import Evaluator  # noqa: E402
from tools.solution import Solution  # noqa: E402


def one(ev: Evaluator, sol: Solution, task: str, executed: bool) -> dict:
    t0 = time.perf_counter()
    r = ev.evaluate(sol, task, "sm_90a", workloads="all", executed_check=executed)
    row = {"wall_s": round(time.perf_counter() - t0, 3), "phase_s": {k: round(v, 3) for k, v in r.phase_s.items()},
           "correct": r.correct, "correct_held_out": r.split_correct("held_out"),
           "correct_with_arch": r.correct_with_arch, "speedup": r.speedup}
    if executed:
        row["executed"] = {"status": r.executed.status, "phase_s": r.executed.phase_s, "reason": r.executed.reason, "notes": r.executed.notes,
                           "workloads": [{"workload": w.workload, "split": w.split, "profiled_at": w.profiled_at,
                                          "runs": w.runs, "kernel_ms": w.kernel_ms, "timed_ms": w.timed_ms,
                                          "shares": w.shares, "carries": w.carries} for w in r.executed.workloads]}
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="gemm_n7168_k5120,mha_bwd_d128")
    ap.add_argument("--kind", default="expert")
    ap.add_argument("--out", default="runs/bench_credit")
    ap.add_argument("--no-profile-arm", action="store_true", help="also time the check without the profile metrics")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for task in [t for t in args.tasks.split(",") if t]:
        sol = Solution.from_dir(ROOT / "tasks" / task / args.kind)
        with Evaluator(cache_dir=out / "cache") as ev:
            one(ev, sol, task, False)  # cold: worker start, library backend chosen
            rows = {"off": one(ev, sol, task, False), "on": one(ev, sol, task, True)}
        if args.no_profile_arm:
            with Evaluator(cache_dir=out / "cache", profile_metrics=()) as ev:
                one(ev, sol, task, False)
                rows["on_no_profile"] = one(ev, sol, task, True)
        report[task] = rows
        for k, v in rows.items():
            print(f"{task} {k}: wall {v['wall_s']} s, phases {v['phase_s']}, correct_with_arch {v['correct_with_arch']}, "
                  f"check phases {(v.get('executed') or {}).get('phase_s')}")
            for w in (v.get("executed") or {}).get("workloads", []):
                print(f"   {w['workload']:>8} {w['split']:>8} run {w['profiled_at']}/{w['runs']} kernel {w['kernel_ms']} "
                      f"timed {w['timed_ms']} shares {w['shares']} carries {w['carries']}")
            if v.get("executed", {}).get("reason") or v.get("executed", {}).get("notes"):
                print("   executed:", v["executed"]["status"], v["executed"]["reason"], v["executed"]["notes"])
    (out / "bench_credit.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
