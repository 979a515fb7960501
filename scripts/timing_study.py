"""How much does a speedup move between evaluations? (GPU; figures for docs/BENCHMARKS.md)

1. A/A noise floor: the same library op timed as candidate and baseline (true ratio 1.0),
   10 repeats, by the old method (ABBA rounds of k runs per side, ratio of the two medians)
   and by the paired method the evaluator uses (alternate every run, order flipped per
   pair, median of the per-pair ratios).
2. Each expert kernel re-evaluated N times in one worker, then once in each of P fresh
   worker processes: CV and range of the speedup, and the warm wall time per evaluation.

    python scripts/timing_study.py --out OUT [--repeats 10 --processes 3 --tasks ...]
Writes OUT/timing_study.jsonl as it goes (one JSON object per line) and a summary table.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXPERTS = ["gemm_n7168_k5120", "mha_fwd_d128", "mha_fwd_d128_causal", "mha_bwd_d128", "mha_bwd_d128_causal"]


class _State:
    """What tools.timing needs from a worker: an L2 flusher, the stream gate, events, a wait."""

    def __init__(self):
        import torch

        from tools.timing import L2Flusher, StreamGate

        self.flusher = L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size)
        self.gate = StreamGate()

    def event(self):
        import torch

        return torch.cuda.Event(enable_timing=True)

    def wait(self, limit_s: float) -> None:
        import torch

        torch.cuda.synchronize()


def _spread(xs: list[float]) -> dict:
    mean = statistics.fmean(xs)
    return {"values": xs, "cv": statistics.pstdev(xs) / mean, "range": (max(xs) - min(xs)) / mean}


def aa_test(repeats: int) -> list[dict]:
    import torch

    from tasks import get_task
    from tasks.families.baselines import make_baseline
    from tasks.generators import generate_inputs
    from tools.timing import Side, measure, paired

    state, rows = _State(), []
    for name, backend in (("gemm_n7168_k5120", "cublas"), ("mha_fwd_d128", "sdpa:cudnn")):
        task = get_task(name)
        x = generate_inputs(task, task.axis_values(task.workloads_for("visible")[0]), seed=1, device="cuda")
        run = make_baseline(task, x, backend).run
        a, b = Side("a", run), Side("b", run)
        old, new = [], []
        for r in range(repeats):
            ta: list[float] = []
            tb: list[float] = []
            for rnd in range(5):  # the previous method: ABBA rounds of 20 runs per side
                for s, acc in ((a, ta), (b, tb)) if rnd % 2 == 0 else ((b, tb), (a, ta)):
                    acc += measure(s, state, 20, 60)
            old.append(statistics.median(tb) / statistics.median(ta))
            times = paired(a, b, state, random.Random(r), lambda i, n: None, lambda i, n: None, budget_s=1.0)
            new.append(statistics.median(times.ratios))
        row = {"aa": name, "library": backend, "old_blocks": _spread(old), "paired": _spread(new)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    return rows


def expert_repeats(tasks: list[str], repeats: int, processes: int, cache: Path) -> list[dict]:
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    rows = []
    for task in tasks:
        sol = Solution.from_dir(ROOT / "tasks" / task / "expert")
        same, walls = [], []
        with Evaluator(cache_dir=cache) as ev:
            ev.evaluate(sol, task, "sm_90a", time=False)  # warm the worker
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = ev.evaluate(sol, task, "sm_90a")
                walls.append(time.perf_counter() - t0)
                same.append(r.speedup)
        fresh = []
        for _ in range(processes):
            with Evaluator(cache_dir=cache) as ev:
                fresh.append(ev.evaluate(sol, task, "sm_90a").speedup)
        ok = [s for s in same if s]
        okf = [s for s in fresh if s]
        row = {"task": task, "one_worker": _spread(ok) if len(ok) > 1 else {"values": same},
               "processes": _spread(okf) if len(okf) > 1 else {"values": fresh},
               "warm_wall_s": statistics.median(walls), "ci_last": list(r.speedup_ci or [])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/timing_study")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--tasks", default=",".join(EXPERTS))
    ap.add_argument("--skip-aa", action="store_true")
    args = ap.parse_args()
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "timing_study.jsonl").open("a")
    if not args.skip_aa:
        for row in aa_test(args.repeats):
            log.write(json.dumps(row) + "\n")
            log.flush()
    for row in expert_repeats([t for t in args.tasks.split(",") if t], args.repeats, args.processes, out / "cache"):
        log.write(json.dumps(row) + "\n")
        log.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
