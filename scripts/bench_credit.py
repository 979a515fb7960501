"""What the executed-instruction check costs (docs/BENCHMARKS.md): a warm evaluation of an expert
on all its workloads without the check and with it (in the worker, tools.cupti); with --ncu-arms
also with the Nsight Compute profile, and with the check by Nsight Compute (PTXBENCH_CREDIT=ncu), on a
GPU machine. Prints the evaluator's phases, each workload's credit and counted-run cost.
`--metric-sets` adds an arm per other counter set (the check then withholds credit for want of
counters; what the arm measures is the counted run's cost with fewer counters: is it the set, or
the kernels' replay?).

    python scripts/bench_credit.py [--tasks gemm_n7168_k5120,mha_bwd_d128] [--ncu-arms] [--one-cold]
        [--metric-sets no_sass,gmma_only,hw_one_pass,sass_one_pass] [--out runs/bench_credit]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import credit as ncu  # noqa: E402
from tools.evaluator import Evaluator  # noqa: E402
from tools.solution import Solution  # noqa: E402


def one(ev: Evaluator, sol: Solution, task: str, executed: bool, profile: bool = False) -> dict:
    t0 = time.perf_counter()
    r = ev.evaluate(sol, task, "sm_90a", workloads="all", executed_check=executed, profile=profile)
    row = {"wall_s": round(time.perf_counter() - t0, 3), "phase_s": {k: round(v, 3) for k, v in r.phase_s.items()},
           "correct": r.correct, "correct_held_out": r.split_correct("held_out"),
           "correct_with_arch": r.correct_with_arch, "speedup": r.speedup,
           # the timed medians (candidate, library) and the candidate's CV per workload
           "timed": {x.workload: [x.timing and round(x.timing.median_ms, 5), x.baseline and round(x.baseline.median_ms, 5),
                                  x.timing and round(x.timing.cv, 5)] for x in r.workloads},
           # where each workload's time went in the worker (verify, baseline, timed, credit): the
           # check's cost beside its own phase shows here
           "workload_phase_s": {x.workload: {k: round(v, 3) for k, v in x.phase_s.items()} for x in r.workloads}}
    if executed:
        row["executed"] = {"status": r.executed.status, "phase_s": r.executed.phase_s, "reason": r.executed.reason, "notes": r.executed.notes,
                           "workloads": [{"workload": w.workload, "split": w.split, "profiled_at": w.profiled_at,
                                          "counted_from": w.counted_from, "runs": w.runs, "kernel_ms": w.kernel_ms,
                                          "run_ms": w.run_ms, "instrumented_ms": w.instrumented_ms,
                                          "timed_ms": w.timed_ms, "shares": w.shares, "carries": w.carries}
                                         for w in r.executed.workloads],
                           "counted_runs": [{k: (x.credit or {}).get(k) for k in ("passes", "lead_runs", "profile_s", "own_s",
                                                                                  "profile_phase_s", "stops")}
                                            | {"workload": x.workload, "credit_s": x.phase_s.get("credit")}
                                            for x in r.workloads]}
    return row


CHECK_SET = tuple(ncu.CUPTI_METRICS)
METRIC_SETS = {  # the evaluator sends ncu.CUPTI_METRICS to the worker with every counted run
    "no_sass": tuple(m for m in CHECK_SET if "__sass_" not in m),  # no SASS-patched metrics: 5 passes
    "gmma_only": (ncu.GMMA_METRIC,),  # one hardware counter: 1 pass
    # the two halves a counted run could be split into, one pass each on GH100 (host API, 2026-12-02):
    # the hardware counters less the mma.sync ops, tf32 wgmma ops and LSU bytes; the SASS-patched ones
    "hw_one_pass": tuple(m for m in CHECK_SET if "__sass_" not in m and "hmma_src" not in m
                         and m not in (ncu.HGMMA_OPS_METRICS[2], ncu.OTHER_READ_METRICS[0])),
    "sass_one_pass": (*(m for m in CHECK_SET if "__sass_" in m), "sm__sass_data_bytes_mem_global_op_ld.sum",
                      "smsp__sass_inst_executed.sum"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="gemm_n7168_k5120,mha_bwd_d128")
    ap.add_argument("--kind", default="expert")
    ap.add_argument("--out", default="runs/bench_credit")
    ap.add_argument("--ncu-arms", action="store_true",
                    help="also time the check with the Nsight Compute profile, and the check by Nsight Compute")
    ap.add_argument("--one-cold", action="store_true",
                    help="one cold evaluation (check on) before the warm arms, not two (saves device time)")
    ap.add_argument("--metric-sets", default="", help=f"also the counted run with these sets: {', '.join(METRIC_SETS)}")
    args = ap.parse_args()
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    unknown = [m for m in args.metric_sets.split(",") if m and m not in METRIC_SETS]
    if unknown:
        ap.error(f"unknown metric set(s) {', '.join(unknown)}; known: {', '.join(METRIC_SETS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for task in [t for t in args.tasks.split(",") if t]:
        sol = Solution.from_dir(ROOT / "tasks" / task / args.kind)
        rows = report[task] = {}

        def arm(name: str, *a, **kw) -> None:  # written as it comes: a call killed at its limit keeps the arms done
            rows[name] = one(ev, sol, task, *a, **kw)
            (out / "bench_credit.json").write_text(json.dumps(report, indent=1) + "\n")
            print(f"{task} {name}: wall {rows[name]['wall_s']} s, cwa {rows[name]['correct_with_arch']}, "
                  f"timed {rows[name]['timed']}", flush=True)

        with Evaluator(cache_dir=out / "cache") as ev:
            if not args.one_cold:
                one(ev, sol, task, False)  # cold: worker start, library backend chosen
            one(ev, sol, task, True)  # cold counters: CUPTI's set-up, once per worker
            arm("off", False)
            arm("on", True)
            for name in [m for m in args.metric_sets.split(",") if m]:
                ncu.CUPTI_METRICS = METRIC_SETS[name]
                try:
                    arm(f"on_{name}", True)
                finally:
                    ncu.CUPTI_METRICS = CHECK_SET
            if args.ncu_arms:
                arm("on_profile", True, profile=True)  # + the Nsight Compute profile
                ev.in_process_credit = False  # the check as it was: a Nsight Compute process
                arm("on_ncu", True)
        for k, v in rows.items():
            print(f"{task} {k}: wall {v['wall_s']} s, phases {v['phase_s']}, correct_with_arch {v['correct_with_arch']}, "
                  f"check phases {(v.get('executed') or {}).get('phase_s')}")
            print(f"   per workload: {v['workload_phase_s']}")
            for w in (v.get("executed") or {}).get("workloads", []):
                runs = (f"counted {w['counted_from']}-{w['runs']}" if w["counted_from"] is not None
                        else f"run {w['profiled_at']}/{w['runs']}")
                print(f"   {w['workload']:>8} {w['split']:>8} {runs} kernel {w['kernel_ms']} runs {w['run_ms']} "
                      f"instrumented {w['instrumented_ms']} timed {w['timed_ms']} shares {w['shares']} "
                      f"carries {w['carries']}")
            if v.get("executed", {}).get("reason") or v.get("executed", {}).get("notes"):
                print("   executed:", v["executed"]["status"], v["executed"]["reason"], v["executed"]["notes"])
    (out / "bench_credit.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
