"""Can counted runs sit inside the timed sequence (issue 42 item 3)? What a user-replay pass does
to the launches around its one counted range, on this GPU.

Each pass runs K cuBLAS bf16 GEMMs, cold-ish (inputs rewritten before each, events around the GEMM
only), as a timed sequence would; one of them, at a position drawn per pass, inside the pass's
user range. Prints, per pass: each GEMM's time (ranged or not) against the same GEMM with the
profiler disabled, the host gap between consecutive launches (what push/pop add beside a run),
the host time of CUPTI's Start and Stop, and the counted range's tensor ops against 2*n^3:
whether launches outside the range leave the range's counts alone, whether the SASS-patched
pass slows launches outside its range too, and what a pass boundary costs.

    python scripts/probe_started_pass.py [--n 4096] [--k 8] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from tools import credit, cupti

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=8, help="GEMMs a pass (one of them counted)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.zeros(1, device="cuda")
    n = args.n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    rng = random.Random(7)
    clock = time.perf_counter

    def one(ranged=None) -> tuple[float, float]:
        """(GEMM ms by events, host seconds at its launch)."""
        a.normal_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = clock()
        if ranged is not None:
            with ranged():
                e0.record()
                torch.matmul(a, b)
                e1.record()
                torch.cuda.synchronize()
        else:
            e0.record()
            torch.matmul(a, b)
            e1.record()
            torch.cuda.synchronize()
        return e0.elapsed_time(e1), t

    for _ in range(5):
        one()
    plain = [one() for _ in range(args.k * 3)]
    plain_ms = statistics.median(x[0] for x in plain)
    plain_gaps = [y[1] - x[1] for x, y in zip(plain, plain[1:])]
    t0 = clock()
    prof = cupti.RangeProfiler(list(credit.credit_metrics()), replay="user")
    build_s = clock() - t0
    passes: list[dict] = []
    orig_call = cupti._call
    host: dict[str, list[float]] = {"cuptiRangeProfilerStart": [], "cuptiRangeProfilerStop": [],
                                    "cuptiRangeProfilerPushRange": [], "cuptiRangeProfilerPopRange": []}

    def timed_call(fn, params):  # CUPTI's host time per entry point
        t = clock()
        try:
            return orig_call(fn, params)
        finally:
            if fn in host:
                host[fn].append(clock() - t)

    cupti._call = timed_call

    def run_pass(i, ranged) -> None:
        at = rng.randrange(args.k)
        runs = [one(ranged if j == at else None) for j in range(args.k)]
        passes.append({"pass": i, "instrumented": i in prof.instrumented_passes, "counted_at": at,
                       "ms": [round(r[0], 4) for r in runs],
                       "gaps_s": [round(y[1] - x[1], 5) for x, y in zip(runs, runs[1:])]})

    t0 = clock()
    launches = prof.profile_passes(run_pass, "gemm")
    total_s = clock() - t0
    cupti._call = orig_call
    metrics = launches[0].metrics if launches else {}
    tensor_ops = sum(metrics.get(m, 0.0) or 0.0 for m in credit.HGMMA_OPS_METRICS)
    out = {"n": n, "k": args.k, "plain_ms": round(plain_ms, 4), "plain_gap_s": round(statistics.median(plain_gaps), 5),
           "build_s": round(build_s, 4), "profile_s": round(total_s, 4), "phase_s": prof.last_phase_s,
           "stops": prof.last_stops, "passes": passes,
           "host_s": {k.removeprefix("cuptiRangeProfiler"): [round(x, 5) for x in v] for k, v in host.items()},
           "ranges": [x.name for x in launches], "hgmma_ops": tensor_ops, "expected_ops": 2.0 * n ** 3,
           "gmma_inst": metrics.get(credit.GMMA_METRIC)}
    print(json.dumps(out, indent=1))
    print(f"plain {plain_ms:.3f} ms, gap {statistics.median(plain_gaps) * 1e3:.2f} ms")
    for p in passes:
        others = [m for j, m in enumerate(p["ms"]) if j != p["counted_at"]]
        print(f"pass {p['pass']} {'instrumented' if p['instrumented'] else 'hardware':>12}: counted run "
              f"{p['ms'][p['counted_at']]:.3f} ms at {p['counted_at']}, others median {statistics.median(others):.3f} ms "
              f"(x{statistics.median(others) / plain_ms:.3f} of plain); gaps ms "
              f"{[round(g * 1e3, 2) for g in p['gaps_s']]}")
    print(f"Start s {out['host_s']['Start']}, Stop s {out['host_s']['Stop']}, push/pop s "
          f"{out['host_s']['PushRange']} {out['host_s']['PopRange']}")
    print(f"counted range ops {tensor_ops:.4g} vs 2n^3 {2.0 * n ** 3:.4g} (x{tensor_ops / (2.0 * n ** 3):.4f})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
