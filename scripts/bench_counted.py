"""Where the counted runs' cost goes (issue 42 item 7's cost), by arm, on this machine's GPU: warm
evaluations of the shipped expert of each task, all workloads, credit on, in one worker.

Arms (each a warm evaluation; the first evaluation of each task, cold, is recorded as `cold`):
  base   the check as it is
  nopad  the library's runs without the pause matched to CUPTI's push and pop (the worker skips the
         library side's tools.timing.Side.pad; the candidate's runs stay ranged, every one): what the
         matched pause costs in wall time, against what `counted_runs.padding` charges
  hw     the check's metrics plus any of the hardware counters of every math pipe by thread (alu,
         fma, fp16, fp64, xu) and cp.async (LDGSTS) instructions and bytes it lacks (on the tree of
         W1, 2026-12-03: what the experts read there, beside the SASS-patched counts the check then
         used; since the check reads hardware counters only, it adds the LDGSTS cached bytes alone)

    python scripts/bench_counted.py [--tasks gemm_n7168_k5120,mha_bwd_d128] [--arms base,nopad,hw]
                                    [--budget-s 85] [--json OUT]

Prints one line per evaluation (wall, counted_runs and its parts: tools.counted.COST_PARTS) and
writes every figure (per workload: padded runs, push/pop ms, timed pairs and seconds, raw counter
values) to --json after each evaluation.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NOPAD_FLAG = Path("/tmp/ptxbench_bench_counted_nopad")  # the worker skips the padding while it exists
HW_EXTRA = ("sm__thread_inst_executed_pipe_alu_pred_on.sum", "sm__thread_inst_executed_pipe_fma_pred_on.sum",
            "sm__thread_inst_executed_pipe_fma_type_fp16_pred_on.sum", "sm__thread_inst_executed_pipe_fp64_pred_on.sum",
            "sm__thread_inst_executed_pipe_xu_pred_on.sum", "smsp__inst_executed_op_ldgsts.sum",
            "l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts_cache_access.sum")


def worker() -> int:
    """tools.worker, with the library's matched pause skipped while NOPAD_FLAG exists (the nopad arm)."""
    from tools import timing, worker as w

    cold_run = timing._cold_run

    def maybe_unpadded(side, state):
        if NOPAD_FLAG.exists() and side.name != "candidate":  # the library's matched pause only
            side.pad = None
        return cold_run(side, state)

    timing._cold_run = maybe_unpadded
    return w.main([])


def row(task: str, arm: str, ev, wall: float) -> dict:
    from agent.cost import evaluation_phases

    phases = evaluation_phases(ev)
    wls = {}
    for x in ev.workloads:
        c = x.credit or {}
        wls[x.workload] = {
            "status": x.status, "speedup": x.speedup, "timed_runs": x.timed_runs, "warmup": x.warmup_runs,
            "timed_s": round(x.phase_s.get("timed", 0.0), 4), "judge_s": round(x.phase_s.get("judge", 0.0), 4),
            "median_ms": x.timing.median_ms if x.timing else None, "cv": x.timing.cv if x.timing else None,
            "iqr_ms": x.timing.iqr_ms if x.timing else None, "ranged_runs": c.get("ranged_runs"),
            "pass_ms": c.get("pass_ms"), "pass_band_ms": c.get("pass_band_ms"),
            "tie_notes": None, "padded_runs": c.get("padded_runs", 0),
            "padding_s": c.get("padding_s"),
            "push_pop_ms": c.get("push_pop_ms"), "pass_s": c.get("pass_s"), "own_s": c.get("own_s"),
            "run_ms": c.get("run_ms"), "instrumented_ms": c.get("instrumented_ms"), "gaps_ms": c.get("gaps_ms"),
            "pass_start_stop_s": c.get("pass_start_stop_s"), "profile_phase_s": c.get("profile_phase_s"),
            "metrics": (c.get("launches") or [{}])[0].get("metrics")}
    work = {w.workload: w.work for w in (ev.executed.workloads if ev.executed else [])}
    for w in (ev.executed.workloads if ev.executed else []):  # why a workload withheld credit (the tie ...)
        if w.workload in wls and w.notes:
            wls[w.workload]["tie_notes"] = w.notes
    return {"task": task, "arm": arm, "wall_s": round(wall, 3), "phases": phases, "correct": ev.correct,
            "correct_with_arch": ev.correct_with_arch,
            "counted_parts": {k.split(".", 1)[1]: round(v, 4) for k, v in ev.phase_s.items()
                              if k.startswith("counted_runs.")},
            "executed": ev.executed.reason if ev.executed else None, "work": work, "workloads": wls}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="gemm_n7168_k5120,mha_bwd_d128")
    ap.add_argument("--arms", default="base,nopad,hw")
    ap.add_argument("--budget-s", type=float, default=85.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker()
    arms = [a for a in args.arms.split(",") if a]
    if not set(arms) <= {"base", "nopad", "hw"}:
        print(f"bench_counted: --arms takes base,nopad,hw (got {args.arms!r})", file=sys.stderr)
        return 2
    from tools import evaluator as evaluator_module
    from tools.counted import COST_PARTS
    from tools.credit import credit_metrics
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    start = time.perf_counter()
    rows: list[dict] = []
    last: dict[str, float] = {}
    NOPAD_FLAG.unlink(missing_ok=True)
    base_metrics = evaluator_module.credit_metrics

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - start, 1)},
                                                  indent=1, default=str) + "\n")

    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    tasks = [t for t in args.tasks.split(",") if t]
    with Evaluator(cache_dir=Path("/tmp/ptxbench_bench_counted"), worker_cmd=cmd) as ev:
        # the cold evaluations first, then each arm on every task: a budget cut loses the last arms, not a task
        plan = [(t, "cold") for t in tasks[:1]] + [(t, "base") for t in tasks[:1]] + [
            (t, "cold") for t in tasks[1:]] + [(t, "base") for t in tasks[1:]] + [
            (t, a) for a in arms if a != "base" for t in tasks]
        for task, arm in plan:
            left = args.budget_s - (time.perf_counter() - start)
            if left < 1.15 * last.get(task, 0.0):
                print(f"[counted] {task}/{arm}: not run ({left:.0f} s left)", flush=True)
                continue
            sol = Solution.from_dir(ROOT / "tasks" / task / "expert")
            evaluator_module.credit_metrics = ((lambda: tuple(dict.fromkeys((*credit_metrics(), *HW_EXTRA)))) if arm == "hw"
                                               else base_metrics)
            if arm == "nopad":
                NOPAD_FLAG.write_text("1")
            t0 = time.perf_counter()
            try:
                r = ev.evaluate(sol, task, "sm_90a", workloads="all", executed_check=True)
            finally:
                NOPAD_FLAG.unlink(missing_ok=True)
                evaluator_module.credit_metrics = base_metrics
            wall = time.perf_counter() - t0
            if arm != "cold":
                last[task] = max(last.get(task, 0.0), wall)
            rows.append(row(task, arm, r, wall))
            x = rows[-1]
            pads = sum(w["padded_runs"] for w in x["workloads"].values())
            pp = [p for w in x["workloads"].values() for p in (w["push_pop_ms"] or [])]
            pp = [round(statistics.median(p[k] for p in pp), 3) for k in (0, 1)] if pp else []  # push, pop: medians
            ranged = sum(len(w["run_ms"] or []) for w in x["workloads"].values())
            speedups = {k: round(w["speedup"], 4) for k, w in x["workloads"].items() if w["speedup"]}
            hid = sum((w["padding_s"] or [0, 0])[1] for w in x["workloads"].values())
            shares = {k: (v or {}).get("wgmma_of_all_math") for k, v in x["work"].items()}
            print(f"[counted] {task}/{arm}: wall {wall:.2f} s cwa={x['correct_with_arch']} counted "
                  f"{x['phases']['counted_runs']:.3f} s timed {x['phases']['timed_pairs']:.2f} judge "
                  f"{x['phases']['judging']:.2f} ranged {ranged} padded {pads} (hidden {hid:.3f} s) wgmma of all math "
                  f"{shares} push/pop ms (median) {pp} speedups {speedups} | " +
                  " ".join(f"{k}={x['counted_parts'].get(k, 0.0):.3f}" for k in COST_PARTS), flush=True)
            save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
