"""Does timing a workload inside the executed check's profiler session change its times? (issue 42
item 3: the hardware passes' counted runs are timed runs, so every timed pair of an evaluation with
the check runs between CUPTI's start and stop.) Evaluates one solution alternately without the check
(timed as before) and with it, `--rounds` times each, and prints per workload the candidate's and
the library's timed medians and the speedup, each way, and the check's own cost.

    python scripts/ab_timed_in_session.py [--task gemm_n7168_k5120] [--solution expert] [--rounds 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="gemm_n7168_k5120")
    ap.add_argument("--solution", default="expert")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sol = Solution.from_dir(ROOT / "tasks" / args.task / args.solution)
    rows: dict[str, dict[str, list]] = {}
    with Evaluator(timeout_s=300, kernel_timeout_s=30) as ev:
        for r in range(args.rounds):
            for check in (False, True):
                res = ev.evaluate(sol, args.task, "sm_90a", workloads="all", executed_check=check)
                way = "session" if check else "plain"
                for w in res.workloads:
                    row = rows.setdefault(w.workload, {})
                    row.setdefault(f"{way}_ms", []).append(w.timing.median_ms if w.timing else None)
                    row.setdefault(f"{way}_lib_ms", []).append(w.baseline.median_ms if w.baseline else None)
                    row.setdefault(f"{way}_x", []).append(w.speedup)
                if check:
                    print(f"round {r}: counted_runs {res.phase_s.get('counted_runs', 0):.3f} s, "
                          f"correct_with_arch {res.correct_with_arch}, gaps",
                          {w.workload: (w.credit or {}).get("gaps_ms") for w in res.workloads})

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else float("nan")

    print(f"{'workload':>8} {'plain ms':>9} {'session ms':>10} {'ratio':>6} {'lib plain':>9} {'lib sess':>9} "
          f"{'x plain':>8} {'x session':>9}")
    for name, row in rows.items():
        p, s = med(row["plain_ms"]), med(row["session_ms"])
        print(f"{name:>8} {p:9.4f} {s:10.4f} {s / p:6.3f} {med(row['plain_lib_ms']):9.4f} "
              f"{med(row['session_lib_ms']):9.4f} {med(row['plain_x']):8.3f} {med(row['session_x']):9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
