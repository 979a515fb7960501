"""Does CUPTI's user replay work here as the executed check uses it (tools.cupti.profile_passes)?
One cuBLAS bf16 GEMM per pass inside a user range, the check's metric set (no mma.sync ops: three
passes on GH100), each pass timed with events. Prints what each Stop returned (pass index,
nesting level, all passes submitted), how many metrics came back finite, each pass's time and
the plain GEMM's: the last pass (SASS-patched) should be the slow one (docs/BENCHMARKS.md).

    python scripts/probe_user_replay.py [--n 4096] [--repeat 2] [--full] [--ranges K]

--full: with the mma.sync ops counters. --ranges K: K GEMMs a pass, each in a range of its own, as
one evaluation's counted runs make one range per workload; `range_s` is each range's host time
(push, GEMM, synchronize, pop) per pass: what a range costs beyond its kernel.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from tools import credit as ncu, cupti

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="the six-pass set (with the mma.sync ops counters)")
    ap.add_argument("--ranges", type=int, default=1, help="ranges a pass (one GEMM each)")
    args = ap.parse_args()
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    torch.zeros(1, device="cuda")
    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)

    def timed() -> float:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.matmul(a, b)
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1)

    plain = statistics.median(timed() for _ in range(20))
    prof = cupti.RangeProfiler(list(ncu.credit_metrics()), replay="user")
    for r in range(args.repeat):
        pass_ms: list[float] = []
        range_s: list[list[float]] = []

        def run_pass(i, ranged) -> None:
            range_s.append([])
            for k in range(args.ranges):
                t = time.perf_counter()
                with ranged(f"range_{k}"):
                    pass_ms.append(timed())
                range_s[-1].append(round(time.perf_counter() - t, 4))

        t0 = time.perf_counter()
        try:
            ranges = prof.profile_passes(run_pass, "range_0")
            values = ranges[0].metrics if ranges else {}
            row = {"ranges": [x.name for x in ranges], "finite": sum(math.isfinite(v) for v in values.values()),
                   "nan": [m for m, v in values.items() if not math.isfinite(v)]}
        except cupti.CuptiError as exc:
            row = {"error": str(exc)}
        print(json.dumps({"repeat": r, "passes": prof.passes, "instrumented": list(prof.instrumented_passes),
                          "metrics": len(prof.metrics), "stops": getattr(prof, "last_stops", None),
                          "pass_ms": [round(x, 4) for x in pass_ms], "range_s": range_s, "plain_ms": round(plain, 4),
                          "profile_s": round(time.perf_counter() - t0, 4),
                          "phase_s": {k: round(v, 4) for k, v in prof.last_phase_s.items()}, **row}), flush=True)
    prof.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
