"""Probe the in-process counters (tools/cupti.py) on this GPU: passes and cost of a metric set
per profiled cuBLAS GEMM (wgmma + TMA on Hopper), with the profiler enabled per profile or kept
enabled, and whether a kept-enabled profiler changes the time of launches it does not count.
`--launches K` profiles K GEMMs in one run (does the cost scale with the kernels profiled?); the
`no_sass` set is the check's without its SASS-patched metrics (smsp__sass_*, sm__sass_*), the
suspected per-kernel cost (docs/BENCHMARKS.md, 2026-12-02). The last repeat of each case prints
every metric of the first launch (e.g. what the HMMA-pipe counter reads on an HGMMA kernel).
Prints one JSON line per case.

    python scripts/probe_cupti.py [--sizes 512,8192] [--repeat 3] [--launches 1,3] [--sets credit,no_sass,one_pass]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ONE_PASS = ("smsp__inst_executed_pipe_tensor_op_gmma.sum", "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum",
            "sm__ops_path_tensor_src_fp8.sum", "gpu__time_duration.sum", "smsp__inst_executed_op_tma_ld.sum",
            "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum", "smsp__inst_executed_pipe_fma.sum")


def event_ms(torch, fn, n: int = 30) -> float:
    times = []
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); fn(); e1.record(); torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def main() -> int:
    import torch

    from tools import credit as ncu, cupti

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,8192")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--launches", default="1")
    ap.add_argument("--sets", default="credit,no_sass,one_pass")
    ap.add_argument("--keep", default="0,1", help="profiler enabled per profile (0), kept enabled (1)")
    args = ap.parse_args()
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    torch.zeros(1, device="cuda")
    sets = {"credit": list(ncu.CUPTI_METRICS), "one_pass": list(ONE_PASS),
            "no_sass": [m for m in ncu.CUPTI_METRICS if "__sass_" not in m]}
    for label in args.sets.split(","):
        metrics = sets[label]
        for keep in [bool(int(k)) for k in args.keep.split(",")]:
            t0 = time.perf_counter()
            try:
                prof = cupti.RangeProfiler(metrics, keep_enabled=keep)
            except cupti.CuptiError as exc:
                print(json.dumps({"set": label, "error": str(exc)}), flush=True)
                continue
            setup = time.perf_counter() - t0
            for n, k in [(int(x), int(y)) for x in args.sizes.split(",") for y in args.launches.split(",")]:
                a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
                plain = event_ms(torch, lambda: torch.matmul(a, b))
                for r in range(args.repeat):
                    t1 = time.perf_counter()
                    try:
                        launches = prof.profile(lambda: ([torch.matmul(a, b) for _ in range(k)], torch.cuda.synchronize()))
                    except cupti.CuptiError as exc:
                        print(json.dumps({"set": label, "keep": keep, "n": n, "error": str(exc)}), flush=True)
                        break
                    cost = time.perf_counter() - t1
                    row = {"set": label, "keep": keep, "passes": prof.passes, "init_s": round(setup, 3), "n": n, "launches": k,
                           "repeat": r, "profile_s": round(cost, 4),
                           "phase_s": {k: round(v, 4) for k, v in prof.last_phase_s.items()},
                           "ranges": len(launches), "gmma": launches[0].metrics.get(ncu.GMMA_METRIC) if launches else None,
                           "kernel_ms": launches[0].metrics.get(ncu.DURATION_METRIC, 0) / 1e6 if launches else None}
                    if r == args.repeat - 1:
                        row["plain_event_ms"] = round(plain, 4)
                        row["event_ms_while_enabled"] = round(event_ms(torch, lambda: torch.matmul(a, b)), 4)
                        row["first_launch"] = {"name": launches[0].name[:80], **launches[0].metrics} if launches else None
                    print(json.dumps(row), flush=True)
            prof.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
