"""Measure the evaluator itself on a GPU machine (run by scripts/gpu_suite.sh).

1. Wall time of one candidate evaluation per task: cold (new Evaluator, worker start
   included) and warm (same Evaluator again).
2. Timing spread: the same kernel measured repeatedly (one evaluation = one interleaved
   measurement): medians of the candidate and of cuBLAS over N evaluations, their CV, and
   the spread of the speedup.
3. Our baseline figures beside triton.testing.do_bench on the same workloads.

Writes OUT/bench.json and OUT/bench.md.
    python scripts/bench_harness.py --out runs/gpu_suite [--tasks gemm_n7168_k5120,mha_bwd_d128] [--repeats 8]
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

from tools.evaluator import Evaluator  # noqa: E402
from tools.solution import Solution  # noqa: E402


def _solution(task: str, kind: str) -> Solution:
    """A shipped solution: "simple" or "expert"."""
    return Solution.from_dir(ROOT / "tasks" / task / kind)


def wall_times(tasks: list[str], cache: Path, kind: str, executed: bool = False) -> list[dict]:
    """Cold and warm evaluation of each task's shipped solution. executed: the warm one also runs
    the executed check, and the row gets the profiled run's kernel time beside the timed median
    (tools.credit.SAME_RUN_RATIO: the tie that credit needs)."""
    rows = []
    for task in tasks:
        sol = _solution(task, kind)
        t0 = time.perf_counter()
        with Evaluator(cache_dir=cache) as ev:
            cold = ev.evaluate(sol, task, "sm_90a")
            t1 = time.perf_counter()
            warm = ev.evaluate(sol, task, "sm_90a", executed_check=executed)
            t2 = time.perf_counter()
        w = warm.workloads[0] if warm.workloads else None
        rows.append({"task": task, "gpu": warm.gpu, "cold_s": t1 - t0, "warm_s": t2 - t1,
                     "correct": warm.correct if cold.correct == warm.correct else f"cold {cold.correct}, warm {warm.correct}",
                     "compile_s": sum(warm.compile.seconds.values()),
                     "kernel_ms": w.timing.median_ms if w and w.timing else None,
                     "baseline": w.baseline_name if w else None,
                     "baseline_ms": w.baseline.median_ms if w and w.baseline else None,
                     "speedup": warm.speedup, "detail": w.detail if w else warm.run_reason,
                     # where the warm evaluation's time went (evaluator stages; worker phases of workload 1)
                     "phase_s": warm.phase_s, "worker_phase_s": w.phase_s if w else {},
                     "timed_runs": w.timed_runs if w else 0})
        if executed:
            ex = warm.executed
            profiled, timed = ex.metrics.get("kernel_ms"), ex.timed_ms
            rows[-1].update(executed_status=ex.status, executed_reason=ex.reason, carries=ex.carries,
                            notes=ex.notes, profiled_ms=profiled, timed_ms=timed,
                            profiled_over_timed=profiled / timed if profiled and timed else None)
            print(f"[tie] {task}: profiled {profiled} ms, timed {timed} ms, carries {ex.carries} {ex.reason or ''}",
                  flush=True)
        print(f"[wall] {task}: cold {t1 - t0:.1f} s, warm {t2 - t1:.1f} s, correct={warm.correct}, "
              f"stages {_fmt_phases(warm.phase_s)}, worker {_fmt_phases(w.phase_s if w else {})}", flush=True)
    return rows


def _fmt_phases(phases: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.2f}" for k, v in phases.items()) or "-"


def spread(task: str, repeats: int, cache: Path, kind: str) -> dict:
    sol = _solution(task, kind)
    cand, base, speed, states = [], [], [], []
    with Evaluator(cache_dir=cache) as ev:
        for _ in range(repeats):
            r = ev.evaluate(sol, task, "sm_90a")
            w = r.workloads[0]
            if w.timing and w.baseline:
                cand.append(w.timing.median_ms)
                base.append(w.baseline.median_ms)
                speed.append(w.speedup)
                states.append(w.gpu_state)  # clock/temperature/power at start and end: is a drift thermal?
    def cv(xs):
        return statistics.pstdev(xs) / statistics.fmean(xs) if len(xs) > 1 else None
    out = {"task": task, "repeats": repeats, "kernel_medians_ms": cand, "baseline_medians_ms": base,
           "speedups": speed, "gpu_states": states, "kernel_cv": cv(cand), "baseline_cv": cv(base), "speedup_cv": cv(speed)}
    print(f"[spread] {task}: kernel CV {out['kernel_cv']}, baseline CV {out['baseline_cv']}, "
          f"speedup CV {out['speedup_cv']}", flush=True)
    return out


def do_bench_baselines(tasks: list[str], ours: dict[str, float | None]) -> list[dict]:
    """triton's do_bench on the library baseline, in this process (after the evaluators closed)."""
    import torch

    from tasks import get_task
    from tasks.families.baselines import list_backends, make_baseline
    from tasks.generators import generate_inputs

    try:
        from triton.testing import do_bench
    except ImportError as exc:
        return [{"error": f"triton not importable: {exc}"}]
    rows = []
    for name in tasks:
        task = get_task(name)
        wl = task.workloads_for("visible")[0]
        inputs = generate_inputs(task, task.axis_values(wl), seed=1, device="cuda")
        for backend in list_backends(task):
            try:
                run = make_baseline(task, inputs, backend).run
                ms = do_bench(run, warmup=25, rep=200, return_mode="median")
            except Exception as exc:  # noqa: BLE001
                rows.append({"task": name, "backend": backend, "error": str(exc)[:200]})
                continue
            flops = task.flop_count(task.axis_values(wl))
            rows.append({"task": name, "workload": wl.name, "backend": backend, "do_bench_ms": ms,
                         "do_bench_tflops": flops / ms / 1e9, "ours_ms": ours.get(f"{name}|{backend}")})
        del inputs
        torch.cuda.empty_cache()
    return rows


def markdown(report: dict) -> str:
    lines = ["# Evaluator benchmark", "", f"GPU: {report.get('gpu')}", "",
             "## Wall time per evaluation (visible workloads, timing on)", "",
             "| task | cold s | warm s | stages s | worker phases s (timed runs) | kernel ms | baseline | baseline ms | "
             "speedup | correct |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda x, d=3: "" if x is None else (f"{x:.{d}f}" if isinstance(x, float) else str(x))  # noqa: E731
    for r in report["wall"]:
        lines.append(f"| {r['task']} | {f(r['cold_s'], 1)} | {f(r['warm_s'], 1)} | {_fmt_phases(r['phase_s'])} | "
                     f"{_fmt_phases(r['worker_phase_s'])} ({r['timed_runs']}) | {f(r['kernel_ms'])} | {r['baseline']} | {f(r['baseline_ms'])} | {f(r['speedup'])} | {r['correct']} |")
    if any("profiled_ms" in r for r in report["wall"]):
        lines += ["", "## The profiled run against the timed runs (executed check, warm evaluation)", "",
                  "| task | profiled kernels ms | timed median ms | profiled / timed | carries |", "|---|---|---|---|---|"]
        lines += [f"| {r['task']} | {f(r['profiled_ms'], 4)} | {f(r['timed_ms'], 4)} | {f(r['profiled_over_timed'])} | "
                  f"{r['carries'] or r['executed_reason']} |" for r in report["wall"] if "profiled_ms" in r]
    s = report["spread"]
    if s:
        lines += ["", f"## Timing spread: {s['task']}, {s['repeats']} evaluations", "",
                  f"- kernel medians (ms): {', '.join(f'{x:.3f}' for x in s['kernel_medians_ms'])} (CV {f(s['kernel_cv'], 4)})",
                  f"- baseline medians (ms): {', '.join(f'{x:.4f}' for x in s['baseline_medians_ms'])} "
                  f"(CV {f(s['baseline_cv'], 4)})",
                  f"- speedups: {', '.join(f'{x:.4f}' for x in s['speedups'])} (CV {f(s['speedup_cv'], 4)})",
                  "- GPU at start → end (SM MHz, °C, W): " + "; ".join(
                      " → ".join(f"{g.get('sm_mhz', 0):.0f}/{g.get('temp_c', 0):.0f}/{g.get('power_w', 0):.0f}"
                                 for g in (st.get("start", {}), st.get("end", {}))) for st in s.get("gpu_states", []))]
    lines += [
              "", "## Our baseline timing vs triton do_bench (median)", "",
              "| task | backend | ours ms (cold L2) | do_bench ms | do_bench TFLOP/s |", "|---|---|---|---|---|"]
    for r in report["do_bench"]:
        if "error" in r:
            lines.append(f"| {r.get('task')} | {r.get('backend')} | error: {r['error']} | | |")
        else:
            lines.append(f"| {r['task']} | {r['backend']} | {f(r['ours_ms'], 4)} | {f(r['do_bench_ms'], 4)} | "
                         f"{f(r['do_bench_tflops'], 0)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/gpu_suite")
    ap.add_argument("--tasks", default="gemm_n7168_k5120,mha_fwd_d128,mha_fwd_d128_causal,mha_bwd_d128,mha_bwd_d128_causal")
    ap.add_argument("--spread-task", default="gemm_n7168_k5120", help='"" for none')
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--cache", default=None, help="evaluator cache folder (worker logs, baseline cache)")
    ap.add_argument("--solution", default="simple", choices=["simple", "expert"])
    ap.add_argument("--skip-do-bench", action="store_true")
    ap.add_argument("--executed-check", action="store_true", help="warm evaluations also run Nsight Compute")
    args = ap.parse_args()
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache) if args.cache else out / "cache"
    tasks = [t for t in args.tasks.split(",") if t]
    report: dict = {"tasks": tasks}
    report["wall"] = wall_times(tasks, cache, args.solution, args.executed_check)
    report["gpu"] = next((r["gpu"] for r in report["wall"] if r.get("gpu")), None)
    report["spread"] = spread(args.spread_task, args.repeats, cache, args.solution) if args.spread_task else None
    ours = {f"{r['task']}|{r['baseline']}": r["baseline_ms"] for r in report["wall"] if r.get("baseline")}
    report["do_bench"] = ([] if args.skip_do_bench else
                          do_bench_baselines(list(dict.fromkeys(tasks + ["mha_bwd_d128"])), ours))
    (out / "bench.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "bench.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
