"""Probe the in-process counters (tools/cupti.py) on this GPU: passes, cost and values of the
executed check's metric sets on cuBLAS GEMMs (which use wgmma + TMA on Hopper), beside the
same launches under no profiler. Prints one JSON line per case.

    python scripts/probe_cupti.py [--sizes 512,4096,8192]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from tools import cupti, ncu

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,4096,8192")
    args = ap.parse_args()
    torch.zeros(1, device="cuda")
    sets = {"credit": list(ncu.CUPTI_METRICS) if hasattr(ncu, "CUPTI_METRICS") else [ncu.GMMA_METRIC, *ncu.WORK_METRICS],
            "full_ncu_set": [ncu.GMMA_METRIC, *ncu.WORK_METRICS]}
    for label, metrics in sets.items():
        t0 = time.perf_counter()
        try:
            prof = cupti.RangeProfiler(metrics)
        except cupti.CuptiError as exc:
            print(json.dumps({"set": label, "error": str(exc)}), flush=True)
            continue
        setup = time.perf_counter() - t0
        for n in [int(s) for s in args.sizes.split(",")]:
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                torch.matmul(a, b)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); torch.matmul(a, b); e1.record(); torch.cuda.synchronize()
            t1 = time.perf_counter()
            launches = prof.profile(lambda: (torch.matmul(a, b), torch.cuda.synchronize()))
            cost = time.perf_counter() - t1
            flops = 2 * n ** 3
            print(json.dumps({"set": label, "passes": prof.passes, "setup_s": round(setup, 3), "n": n,
                              "profile_s": round(cost, 4), "event_ms": round(e0.elapsed_time(e1), 4),
                              "launches": [{"name": l.name[:80], **{k: v for k, v in l.metrics.items()}} for l in launches],
                              "task_flops": flops}), flush=True)
        prof.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
