"""GEMM expert measurements for one GPU window, in one process (one evaluator worker: each extra
process costs ~15 s of CUDA and torch start-up). Jobs run in the order given, most important first,
and every result is written as it comes (a window's slice may be killed):

  --ab TASK:VARIANT:W1,W2[:ROUNDS]   the same evaluation with the executed check (credit) off and on,
                                     ROUNDS times (order flipped each round): per workload the candidate's
                                     and the library's timed medians, the speedup, and with credit on
                                     every pair's times (`pair_ms`, warm-ups included), the counted runs'
                                     times and the library beside them, the padding and push/pop costs
  --check TASK:VARIANTS:WORKLOADS[:credit]
                                     expert_dev's variants (comma-separated) on those workloads
                                     (comma-separated names, or visible / all), credit on if `:credit`

    python3 scripts/gemm_window.py --out OUT --ab gemm_n7168_k5120:shipped:M70:3 \\
        --check gemm_n7168_k5120:shipped,bn64:M70,M8192 --check gemm_n2048_k4096:shipped:visible:credit

OUT/results.jsonl.txt: one JSON line per evaluation; a summary line per workload on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

CREDIT_KEYS = ("status", "reason", "run_ms", "pair_library_ms", "run_pairs", "pair_ms", "tie_band_ms", "gaps_ms",
               "push_pop_ms", "padded_runs", "padding_s", "instrumented_ms", "counted_pairs")


def _task(name: str, workloads: str):
    """The task, and the split to evaluate: named workloads become a task of those alone."""
    from tasks import get_task

    t = get_task(name)
    if workloads in ("visible", "held_out", "all"):
        return t, workloads
    wanted = workloads.split(",")
    return t.model_copy(update={"workloads": [w for w in t.workloads if w.name in wanted]}), "all"


def _row(job: str, task: str, variant: str, credit: bool, res, wall: float) -> dict:
    rows = []
    for w in res.workloads:
        row = {"workload": w.workload, "status": w.status, "reason": w.reason, "speedup": w.speedup,
               "ci": w.speedup_ci, "ms": w.timing.median_ms if w.timing else None,
               "cv": w.timing.cv if w.timing else None, "lib_ms": w.baseline.median_ms if w.baseline else None,
               "tflops": w.tflops, "timed_runs": w.timed_runs, "gpu_state": w.gpu_state,
               "detail": (w.detail or "")[:300]}
        if credit and w.credit:
            row["credit"] = {k: w.credit.get(k) for k in CREDIT_KEYS if k in w.credit}
        rows.append(row)
    executed = None
    if res.executed:
        executed = {x.workload: {"status": x.status, "reason": x.reason, "shares": x.shares, "carries": x.carries,
                                 "notes": x.notes, "kernel_ms": x.kernel_ms, "run_ms": x.run_ms, "timed_ms": x.timed_ms,
                                 "tie_band_ms": x.tie_band_ms, "work": x.work}
                    for x in res.executed.workloads}
    return {"job": job, "task": task, "variant": variant, "credit": credit, "wall_s": round(wall, 2),
            "correct": res.correct, "correct_with_arch": res.correct_with_arch if credit else None,
            "run_status": res.run_status, "run_reason": res.run_reason, "compile_error": res.compile.error,
            "workloads": rows, "executed": executed}


def _print(r: dict) -> None:
    tag = f"{r['task']:<20} {r['variant']:<9} credit {'on ' if r['credit'] else 'off'}"
    if not r["workloads"]:
        print(f"{tag} {r['run_status']}: {r['run_reason'] or ''} {r['compile_error'] or ''}", flush=True)
    for w in r["workloads"]:
        sp = f"{w['speedup']:.4f}" if w["speedup"] else "-"
        ms = f"{w['ms']:.5g}" if w["ms"] else "-"
        lib = f"{w['lib_ms']:.5g}" if w["lib_ms"] else "-"
        x = (r["executed"] or {}).get(w["workload"]) or {}
        share = (x.get("work") or {}).get("wgmma_of_all_math")
        cwa = (f" cwa {r['correct_with_arch']} wgmma/all {share:.4f}" if share is not None else
               f" cwa {r['correct_with_arch']} {x.get('reason') or ''}") if r["credit"] else ""
        print(f"{tag} {w['workload']:<6} {w['status']:<7} x {sp:<7} ms {ms:<9} lib {lib:<9}{cwa} "
              f"{w['reason'] or ''} {w['detail'][:120]}", flush=True)


def main() -> int:
    from expert_dev import variant
    from tools.evaluator import Evaluator, require_gpu

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ab", action="append", default=[], help="TASK:VARIANT:WORKLOADS[:ROUNDS]")
    ap.add_argument("--check", action="append", default=[], help="TASK:VARIANTS:WORKLOADS[:credit]")
    args = ap.parse_args()
    jobs = []
    for spec in args.ab:
        parts = spec.split(":")
        if len(parts) not in (3, 4) or (len(parts) == 4 and not parts[3].isdigit()):
            ap.error(f"--ab {spec!r}: want TASK:VARIANT:WORKLOADS[:ROUNDS]")
        jobs.append(("ab", parts[0], [parts[1]], parts[2], int(parts[3]) if len(parts) == 4 else 2))
    for spec in args.check:
        parts = spec.split(":")
        if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "credit"):
            ap.error(f"--check {spec!r}: want TASK:VARIANTS:WORKLOADS[:credit]")
        jobs.append(("check", parts[0], parts[1].split(","), parts[2], len(parts) == 4))
    from expert_dev import VARIANTS

    unknown = sorted({v for job in jobs for v in job[2]} - set(VARIANTS["gemm"]))
    if unknown:
        ap.error(f"unknown GEMM variant(s) {', '.join(unknown)} (expert_dev's VARIANTS['gemm'])")
    require_gpu("scripts/gemm_window.py")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "results.jsonl.txt", "a")
    # an 8 s watchdog: a variant that hangs must not eat the window (the largest visible workload runs 2.6 ms)
    with tempfile.TemporaryDirectory(prefix="gemm-window-") as tmp, Evaluator(timeout_s=300, kernel_timeout_s=8) as ev:
        for kind, task_name, variants, workloads, extra in jobs:
            task, split = _task(task_name, workloads)
            # ab: off, on; then on, off (the order flipped each round)
            plan = ([(variants[0], c) for r in range(extra) for c in ((False, True) if r % 2 == 0 else (True, False))]
                    if kind == "ab" else [(v, extra) for v in variants])
            for name, credit in plan:
                sol = variant(task_name, name, Path(tmp) / f"{task_name}-{name}")
                t0 = time.perf_counter()
                res = ev.evaluate(sol, task, "sm_90a", workloads=split, executed_check=credit)
                r = _row(kind, task_name, name, credit, res, time.perf_counter() - t0)
                log.write(json.dumps(r) + "\n")
                log.flush()
                _print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
