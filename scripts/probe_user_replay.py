"""How CUPTI's user replay walks its passes on this GPU (docs/BENCHMARKS.md, 2026-12-02): one
cuBLAS bf16 GEMM per pass inside a user range, the executed check's hardware counters, with the
configuration set once (NVIDIA's range_profiling sample) or again before every pass with the pass
index Stop returned. Prints, per arm, what each Stop returned (pass index, nesting level, all
passes submitted) and how many metrics came back finite.

    python scripts/probe_user_replay.py [--n 4096] [--max-passes 8]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from tools import cupti, ncu
    from tools.cupti import RPObject, Stop, _call

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--max-passes", type=int, default=8)
    args = ap.parse_args()
    torch.zeros(1, device="cuda")
    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    metrics = [m for m in ncu.credit_metrics(False) if not cupti.is_sass_patched(m)]
    prof = cupti.RangeProfiler(metrics, replay="user")
    host = prof.hosts[0]
    for arm in ("set_once", "set_per_pass"):
        stops = []
        obj, data = prof._set_user_config(host)
        try:
            for k in range(args.max_passes):
                _call("cuptiRangeProfilerStart", RPObject(pRangeProfilerObject=obj))
                with prof._ranged(obj, "gemm", []):
                    torch.matmul(a, b)
                torch.cuda.synchronize()
                stop = Stop(pRangeProfilerObject=obj)
                _call("cuptiRangeProfilerStop", stop)
                stops.append([int(stop.passIndex), int(stop.targetNestingLevel), int(stop.isAllPassSubmitted)])
                if stop.isAllPassSubmitted:
                    break
                if arm == "set_per_pass":
                    prof._user_pass_config(obj, host, data, int(stop.passIndex), max(1, int(stop.targetNestingLevel)))
            decoded = cupti.Decode(pRangeProfilerObject=obj)
            _call("cuptiRangeProfilerDecodeData", decoded)
            info = cupti.CounterDataInfo(pCounterDataImage=data, counterDataImageSize=len(data))
            _call("cuptiRangeProfilerGetCounterDataInfo", info)
            values = host.evaluate(data, 0) if info.numTotalRanges else {}
            finite = sum(1 for v in values.values() if math.isfinite(v))
            print(json.dumps({"arm": arm, "planned_passes": host.passes, "stops": stops, "ranges": info.numTotalRanges,
                              "finite": finite, "metrics": len(metrics),
                              "values": {m.split(".")[0][-40:]: v for m, v in values.items()}}), flush=True)
        except cupti.CuptiError as exc:
            print(json.dumps({"arm": arm, "stops": stops, "error": str(exc)}), flush=True)
        finally:
            prof._disable()
    prof.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
