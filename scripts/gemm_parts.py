"""Where the GEMM expert's time goes at small M (a development probe, GPU): the shipped kernel,
the kernel without the stream-K fix-up (DIAG=1: partial tiles neither written nor reduced), and
without the fix-up and the wgmmas (DIAG=2: the TMA stream alone), each timed cold (L2 flushed,
the counters' memset before every launch as the evaluator does, but outside the timed span),
beside cuBLAS and the memset alone. Results are wrong for DIAG > 0: timing only.

    python3 scripts/gemm_parts.py gemm_n7168_k5120:70 gemm_n4096_k4096:232 --reps 30
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXPERT = ROOT / "tasks" / "gemm_n7168_k5120" / "expert"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", help="TASK:M")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()

    import torch

    from tasks import get_task
    from tasks.generators import generate_inputs
    from tools.compile import compile_solution
    from tools.launch import Bound, DeviceLimits, Module, plan_launches
    from tools.solution import Solution
    from tools.workspace import Workspace

    torch.zeros(1, device="cuda")
    base = Solution.from_dir(EXPERT)
    mods = {}
    for diag in (0, 1, 2):
        sol = base.model_copy(update={"source": f"#define DIAG {diag}\n" + base.source})
        comp = compile_solution(sol, "sm_90a")
        assert comp.ok, comp.error
        mods[diag] = Module(comp.cubin, comp.symbols)
    props = torch.cuda.get_device_properties(0)
    limits = DeviceLimits(num_sms=props.multi_processor_count, max_smem_per_block=232448)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def timed(fn, before=None) -> float:
        ts = []
        for _ in range(args.reps):
            flush.fill_(1)
            if before:
                before()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) * 1000)
        return statistics.median(ts)

    for name, m in (c.partition(":")[::2] for c in args.cases):
        task = get_task(name)
        axes = task.axis_values({"M": int(m)})
        plan = plan_launches(base.manifest, task, axes, limits)
        ws = Workspace(task, plan)
        ws.load_inputs(generate_inputs(task, axes, 7, device="cuda", fast=True))
        A, B = ws.inputs["A"], ws.inputs["B"]
        row = {"cublas": timed(lambda: torch.matmul(A, B.T)), "memset": timed(ws.zero_scratch)}
        for diag, mod in mods.items():
            bound = Bound(plan, mod, ws.pointers())
            row[f"diag{diag}"] = timed(bound.launch, ws.zero_scratch)
            row[f"diag{diag}+memset"] = timed(lambda b=bound: (ws.zero_scratch(), b.launch()))
        lp = plan.launches[0]
        print(f"{name} M={m} grid {lp.grid[0]} sk_tiles {lp.args[-2].value} bn {lp.args[-1].value}: "
              + "  ".join(f"{k} {v:.1f}us" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
