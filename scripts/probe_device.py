"""What the GPU machine offers, probed in one call (run by hand on the device):

1. versions of torch, triton, cuDNN and the optional libraries the task families use;
2. whether this ncu knows every metric the executed check and the profile block use
   (`ncu --query-metrics`);
3. one executed-check pass per listed solution with all of those metrics, printing each
   kernel's raw values and the pass's wall time with and without them.

    python scripts/probe_device.py --out OUT [--solutions tasks/gemm_n7168_k5120/simple,...]

Writes OUT/probe.json (and OUT/ncu_metrics.txt, the filtered query).
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name fragments worth seeing in the metric query (work shares, profile block)
QUERY_PATTERN = re.compile(r"tensor_op|ops_path|inst_executed_op_[fhd](fma|add|mul)|op_integer|issue_stalled|"
                           r"ldgsts|lsu_mem_global_op_ld|op_tma|dram__bytes|sector_hit_rate|occupancy_limit|"
                           r"warps_active|registers_per_thread|time_duration")


def candidates() -> list[str]:
    """The metrics the evaluator's one ncu pass asks for: the work shares (tools.credit) and the
    profile (tools.profile), so the probe checks exactly the names in use."""
    from tools.credit import WORK_METRICS
    from tools.profile import PROFILE_METRICS

    return list(dict.fromkeys(["gpu__time_duration.sum", *WORK_METRICS, *PROFILE_METRICS]))


def versions() -> dict:
    out = {}
    for mod in ("torch", "triton", "cuda.bindings", "fla", "cudnn", "pynvml"):
        try:
            m = importlib.import_module(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - a probe reports, never fails
            out[mod] = f"absent: {type(exc).__name__}: {str(exc)[:120]}"
    try:
        import torch

        out["cuda"], out["cudnn_version"] = torch.version.cuda, torch.backends.cudnn.version()
        out["gpu"] = torch.cuda.get_device_name()
    except Exception as exc:  # noqa: BLE001
        out["torch_cuda"] = str(exc)[:200]
    return out


def scaled_mm_probe() -> dict:
    """Does torch's scaled matmul take DeepSeek-style block scales (A 1x128, B 128x128) here?"""
    import torch

    out = {}
    m, n, k = 256, 512, 1024
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.rand(m, k // 128, device="cuda") + 0.5
    sb = torch.rand(n // 128, k // 128, device="cuda") + 0.5
    ref = (a.float() * sa.repeat_interleave(128, 1)) @ (b.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)).T
    tries = {
        "_scaled_mm(a, b.T, sa, sb) outer-dim-major": lambda: torch._scaled_mm(
            a, b.t(), scale_a=sa.t().contiguous().t(), scale_b=sb.t(), out_dtype=torch.bfloat16),
        "_scaled_mm(a, b.T, sa, sb.T)": lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb.t(),
                                                                 out_dtype=torch.bfloat16),
    }
    try:
        from torch.nn.functional import ScalingType, SwizzleType, scaled_mm  # torch >= 2.10

        tries["F.scaled_mm BlockWise1x128/128x128"] = lambda: scaled_mm(
            a, b.t(), sa, ScalingType.BlockWise1x128, sb, ScalingType.BlockWise128x128,
            swizzle_a=SwizzleType.NO_SWIZZLE, swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=torch.bfloat16)
    except Exception as exc:  # noqa: BLE001
        out["F.scaled_mm"] = f"absent: {exc}"
    for name, fn in tries.items():
        try:
            c = fn().float()
            err = ((c - ref).norm() / ref.norm()).item()
            out[name] = f"ran, rel L2 vs reference {err:.2e}"
        except Exception as exc:  # noqa: BLE001
            out[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out


def known_metrics(out: Path) -> set[str]:
    ncu = shutil.which("ncu")
    if not ncu:
        return set()
    text = subprocess.run([ncu, "--query-metrics", "--chip", "gh100"], capture_output=True, text=True).stdout
    lines = [ln for ln in text.splitlines() if QUERY_PATTERN.search(ln)]
    (out / "ncu_metrics.txt").write_text("\n".join(lines) + "\n")
    return {ln.split()[0] for ln in text.splitlines() if ln.strip() and "__" in ln.split()[0]}


def profile_solutions(solutions: list[str], metrics: list[str]) -> list[dict]:
    from tasks import get_task
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    rows = []
    for item in solutions:  # "tasks/NAME/simple" or "some/dir@TASK"
        path, _, name = item.partition("@")
        sol = Solution.from_dir(ROOT / path)
        task = get_task(name or Path(path).parts[1])
        for extra in ((), tuple(metrics)):
            with Evaluator(profile_metrics=extra, cache_dir="/tmp/ptxbench_probe") as ev:
                t0 = time.perf_counter()
                res = ev.evaluate(sol, task, "sm_90a", executed_check=True, time=False, profile=True)
                rows.append({"solution": path, "extra_metrics": len(extra), "wall_s": time.perf_counter() - t0,
                             "phase_s": res.phase_s, "executed": res.executed.model_dump(mode="json"),
                             "correct": res.correct})
                print(f"[probe] {path} extra={len(extra)}: executed {res.executed.status} "
                      f"{res.executed.reason or ''} shares {res.executed.shares} "
                      f"ncu {res.phase_s.get('executed', 0):.1f} s", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/probe")
    ap.add_argument("--solutions", default="tasks/gemm_n7168_k5120/simple,tasks/gemm_n7168_k5120/expert,"
                                           "tasks/mha_fwd_d128/expert,tasks/mha_bwd_d128/simple")
    args = ap.parse_args()
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"versions": versions()}
    print(json.dumps(report["versions"]), flush=True)
    try:
        report["scaled_mm"] = scaled_mm_probe()
    except Exception as exc:  # noqa: BLE001
        report["scaled_mm"] = {"error": str(exc)[:300]}
    print(json.dumps(report["scaled_mm"], indent=1), flush=True)
    known = known_metrics(out)
    base = lambda m: m.split(".")[0]  # noqa: E731 - the query lists base names
    report["metrics_known"] = [m for m in candidates() if base(m) in known]
    report["metrics_unknown"] = [m for m in candidates() if base(m) not in known]
    print("unknown metrics:", report["metrics_unknown"], flush=True)
    sols = [s for s in args.solutions.split(",") if s]
    report["profiles"] = profile_solutions(sols, report["metrics_known"])
    (out / "probe.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
