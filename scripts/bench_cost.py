"""Where an evaluation's time goes, per phase: the shipped simple and expert solution of each seed
task, cold (a new Evaluator: its worker starts, the library backend is chosen where the cache has
none) then warm (the same Evaluator again), credit on, all workloads, on this machine's GPU.

    python scripts/bench_cost.py [--tasks gemm_n7168_k5120,mha_fwd_d128] [--solutions simple,expert]
                                 [--modes cold,warm] [--share-worker | --one-worker] [--budget-s 200] [--out DIR]
                                 [--json]

Phases (agent/cost.py): compile, inspect_wait, queue_wait, worker_start, seeded_checks,
library_setup, timed_pairs, judging, counted_runs (the credit op; by pass in the JSON, and by part: where
the counted runs' cost went, tools.counted.COST_PARTS, in the table's last columns and the JSON's
`counted_parts`, with each workload's padded runs and CUPTI push/pop times in `counted_detail`),
executed_other, other_gpu. Each row also gives the workloads' timing stops (planned / interval /
cap: tools.timing) and the verdict. --budget-s: no evaluation starts once the next one (estimated
from the last of that task and mode) would end past it, so the bench fits one device call; rows it did
not reach are listed as not run. Writes DIR/bench_cost.json (after every row) and DIR/bench_cost.md when
--out is given. --share-worker keeps one Evaluator per task, so that a later solution's cold row starts
with the worker up and the library chosen (its mode reads "cold, worker up"): more rows in one call.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.cost import PHASES, evaluation_phases, gpu_seconds  # noqa: E402

SEED_TASKS = "gemm_n7168_k5120,mha_fwd_d128,mha_fwd_d128_causal,mha_bwd_d128,mha_bwd_d128_causal"
SHORT = {"compile": "comp", "inspect_wait": "insp", "queue_wait": "queue", "worker_start": "start",
         "seeded_checks": "seeded", "library_setup": "lib", "timed_pairs": "timed", "judging": "judge",
         "counted_runs": "counted", "executed_other": "exec", "other_gpu": "other"}


# what each workload's counted runs record of their cost (tools.counted: the session, its padding)
CREDIT_KEYS = ("status", "reason", "profile_s", "profile_phase_s", "own_s", "padded_runs", "ranged_runs")


def counted_by_pass(ev) -> list[float]:
    """Seconds of the counted runs by pass, summed over workloads (tools.worker: pass_s rows are
    [prepare, run, judge] per counted run)."""
    by: list[float] = []
    for w in ev.workloads:
        for i, row in enumerate((w.credit or {}).get("pass_s") or []):
            by.extend([0.0] * (i + 1 - len(by)))
            by[i] += sum(row)
    return [round(x, 3) for x in by]


def counted_parts(ev) -> dict[str, float]:
    """Where the counted runs' cost went (tools.counted.COST_PARTS, seconds), from the evaluation's phase_s."""
    return {k.split(".", 1)[1]: round(v, 4) for k, v in ev.phase_s.items() if k.startswith("counted_runs.")}


def counted_detail(ev) -> dict:
    """Per workload: its padded runs, CUPTI's push and pop around each counted run (ms), its own
    counted-run seconds; and each pass's Start and Stop (s)."""
    out: dict = {}
    for w in ev.workloads:
        c = w.credit or {}
        if c.get("pass_start_stop_s"):
            out["pass_start_stop_s"] = c["pass_start_stop_s"]
        out[w.workload] = {"padded_runs": c.get("padded_runs", 0), "push_pop_ms": c.get("push_pop_ms"),
                           "own_s": c.get("own_s"), "run_ms": c.get("run_ms"),
                           "instrumented_ms": c.get("instrumented_ms"), "timed_runs": w.timed_runs}
    return out


def row_of(task: str, kind: str, mode: str, ev, wall: float) -> dict:
    phases = evaluation_phases(ev)
    return {"task": task, "solution": kind, "mode": mode, "wall_s": round(wall, 2), "gpu_s": round(gpu_seconds(phases), 2),
            "phases": phases, "counted_by_pass": counted_by_pass(ev), "counted_parts": counted_parts(ev),
            "counted_detail": counted_detail(ev), "correct": ev.correct,
            "correct_with_arch": ev.correct_with_arch, "speedup": ev.speedup,
            "executed": ev.executed.reason if ev.executed else None,
            "workloads": [{"workload": w.workload, "status": w.status, "reason": w.reason, "speedup": w.speedup,
                           "speedup_ci": w.speedup_ci, "timed": w.timed_runs, "planned": w.planned_runs,
                           "warmup": w.warmup_runs, "full_checks": w.full_checks,
                           "stop": w.timing_stop, "phase_s": {k: round(v, 3) for k, v in w.phase_s.items()},
                           "credit": {k: (w.credit or {}).get(k) for k in CREDIT_KEYS}}
                          for w in ev.workloads]}


def markdown(rows: list[dict], skipped: list[str], gpu: str | None) -> str:
    from tools.counted import COST_PARTS

    cols = [SHORT[p] for p in PHASES]
    lines = [f"GPU: {gpu}", "", "| task | solution | mode | wall s | GPU s | " + " | ".join(cols) +
             " | counted by pass | stops | verdict |", "|---" * (8 + len(cols)) + "|"]
    parts = [r for r in rows if r.get("counted_parts")]
    for r in rows:
        stops = ",".join(f"{w['stop'] or '-'}{w['timed']}" for w in r["workloads"])
        verdict = "cwa" if r["correct_with_arch"] else ("correct" if r["correct"] else f"correct={r['correct']}")
        lines.append(f"| {r['task']} | {r['solution']} | {r['mode']} | {r['wall_s']:.1f} | {r['gpu_s']:.1f} | " +
                     " | ".join(f"{r['phases'][p]:.2f}" for p in PHASES) +
                     f" | {'/'.join(f'{x:.2f}' for x in r['counted_by_pass']) or '-'} | {stops} | {verdict} |")
    if parts:  # where the counted runs' cost went
        lines += ["", "| task | solution | mode | counted | " + " | ".join(COST_PARTS) + " |",
                  "|---" * (4 + len(COST_PARTS)) + "|"]
        for r in parts:
            lines.append(f"| {r['task']} | {r['solution']} | {r['mode']} | {r['phases']['counted_runs']:.3f} | " +
                         " | ".join(f"{r['counted_parts'].get(k, 0.0):.3f}" for k in COST_PARTS) + " |")
    if skipped:
        lines += ["", "not run (budget): " + ", ".join(skipped)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=SEED_TASKS)
    ap.add_argument("--solutions", default="simple,expert")
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall seconds for the whole bench (one device call)")
    ap.add_argument("--cache", default=None, help="evaluator cache folder (default: a fresh one under --out or /tmp)")
    ap.add_argument("--share-worker", action="store_true",
                    help="one Evaluator per task across solutions: a later solution's cold row starts with the worker up "
                         "and the library chosen (its mode reads 'cold, worker up')")
    ap.add_argument("--one-worker", action="store_true",
                    help="one Evaluator for the whole bench (implies --share-worker): only the first row starts the "
                         "worker; every later task's first row reads 'cold, worker up' (more rows in one device call)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    args.share_worker = args.share_worker or args.one_worker
    from tasks import UnknownTask, get_task

    tasks = [t for t in args.tasks.split(",") if t]
    kinds = [k for k in args.solutions.split(",") if k]
    modes = [m for m in args.modes.split(",") if m]
    try:
        for t in tasks:
            get_task(t)
    except UnknownTask as exc:
        print(f"bench_cost: {exc}", file=sys.stderr)
        return 2
    bad = [k for k in kinds if not (ROOT / "tasks" / tasks[0] / k).is_dir()] if tasks else []
    if bad or not set(modes) <= {"cold", "warm"} or not modes:
        print(f"bench_cost: --solutions takes simple,expert and --modes cold,warm (got {args.solutions!r}, "
              f"{args.modes!r})", file=sys.stderr)
        return 2
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    out = Path(args.out) if args.out else None
    cache = Path(args.cache) if args.cache else (out / "cache" if out else Path("/tmp/ptxbench_bench_cost"))
    start = time.perf_counter()
    rows: list[dict] = []
    skipped: list[str] = []
    gpu = None
    # (task, mode) -> the longest evaluation of that kind so far: the next one's estimate (a warm one
    # before any warm: 0.7 x the cold; a task's first row: the longest row so far, so that a later task
    # does not start past the budget)
    last: dict[tuple[str, str], float] = {}

    def save() -> None:
        if out:  # after every row: a bench cut by its device call's limit keeps what it measured
            out.mkdir(parents=True, exist_ok=True)
            (out / "bench_cost.json").write_text(json.dumps(
                {"gpu": gpu, "budget_s": args.budget_s, "seconds": round(time.perf_counter() - start, 1),
                 "rows": rows, "not_run": skipped}, indent=1, default=str) + "\n")

    ev_ctx, seen = None, set()  # seen: the (task, solution)s this Evaluator has evaluated (compiled, first calls made)
    for task in tasks:
        for kind in kinds:
            sol = Solution.from_dir(ROOT / "tasks" / task / kind)
            for mode in modes:
                label = f"{task}/{kind}/{mode}"
                left = args.budget_s - (time.perf_counter() - start)
                guess = last.get((task, mode), 0.7 * last.get((task, "cold"), 0.0)) or max(last.values(), default=0.0)
                if left < guess * 1.2 or left <= 0:
                    skipped.append(label)
                    continue
                shared = args.share_worker and ev_ctx is not None
                if ev_ctx is None or (mode == "cold" and not shared):
                    if ev_ctx is not None:
                        ev_ctx.close()
                    ev_ctx, seen = Evaluator(cache_dir=cache), set()
                # what the row really was: "warm" only once this Evaluator has evaluated the solution
                # (a skipped cold row leaves the next one a first evaluation)
                ran_as = "warm" if (task, kind) in seen else ("cold, worker up" if shared else "cold")
                seen.add((task, kind))
                t0 = time.perf_counter()
                ev = ev_ctx.evaluate(sol, task, "sm_90a", workloads="all", executed_check=True)
                wall = time.perf_counter() - t0
                last[(task, mode)] = max(last.get((task, mode), 0.0), wall)
                gpu = gpu or ev.gpu
                rows.append(row_of(task, kind, ran_as, ev, wall))
                r = rows[-1]
                print(f"[cost] {label}: {wall:.1f} s (GPU {r['gpu_s']:.1f} s) " +
                      " ".join(f"{SHORT[k]}={v:.2f}" for k, v in r["phases"].items() if v >= 0.005) +
                      f" stops={[w['stop'] for w in r['workloads']]} cwa={r['correct_with_arch']}"
                      f" counted parts={r['counted_parts']}",
                      file=sys.stderr, flush=True)
                save()
            if ev_ctx is not None and not args.share_worker:
                ev_ctx.close()
                ev_ctx, seen = None, set()
        if ev_ctx is not None and not args.one_worker:
            ev_ctx.close()
            ev_ctx, seen = None, set()
    if ev_ctx is not None:
        ev_ctx.close()
    report = {"gpu": gpu, "budget_s": args.budget_s, "seconds": round(time.perf_counter() - start, 1),
              "rows": rows, "not_run": skipped}
    text = markdown(rows, skipped, gpu)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_cost.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (out / "bench_cost.md").write_text(text)
    print(json.dumps(report, indent=1, default=str) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
