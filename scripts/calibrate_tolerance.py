"""Calibrate the aggregate correctness bound (Tolerance.rel_l2) on a GPU.

For every shipped solution (simple and expert) the evaluator's relative L2 error of each
output on the visible workload; for the library (cuDNN attention, a real bf16 kernel) the
same figure, and for deliberately wrong variants of the library's output (a constant bias
of 0.0099, uniform noise of +-0.0099, the small fifth of elements zeroed) what the seed's
elementwise rule and the rel-L2 bound each say.

    python scripts/calibrate_tolerance.py --out OUT
Writes OUT/calibration.json and prints a Markdown table (docs/METHODOLOGY.md quotes it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ATTENTION = ["mha_fwd_d128", "mha_fwd_d128_causal", "mha_bwd_d128", "mha_bwd_d128_causal", "mha_fwd_d64",
             "mha_bwd_d64", "mha_fwd_d96", "mha_bwd_d96"]


def wrong_variants(t):
    import torch

    small = t.abs() < 0.0099
    fifth = small & (torch.rand_like(t) < 0.2 * t.numel() / max(1, int(small.sum())))
    return {"bias": t + 0.0099, "noise": t + (torch.rand_like(t) * 2 - 1) * 0.0099,
            "zeros": torch.where(fifth, torch.zeros_like(t), t)}


def library_rows(names: list[str]) -> list[dict]:
    import torch

    from tasks import get_task
    from tasks.families.baselines import make_baseline
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference
    from tools.correctness import compare

    rows = []
    for name in names:
        task = get_task(name)
        axes = task.axis_values(task.workloads_for("visible")[0])
        inputs = generate_inputs(task, axes, seed=1234, device="cuda")
        ref = run_reference(task, inputs)
        got = make_baseline(task, inputs, "sdpa:cudnn").run()
        elementwise = task.tolerance.model_copy(update={"rel_l2": {}})
        for out, t in got.items():
            row = {"task": name, "output": out, "library_rel_l2": compare(out, t, ref[out], task.tolerance).rel_l2,
                   "median_abs_ref": float(ref[out].abs().median())}
            for kind, w in wrong_variants(t.float()).items():
                m_el = compare(out, w, ref[out], elementwise)
                m = compare(out, w, ref[out], task.tolerance)
                row[f"{kind}_rel_l2"] = m.rel_l2
                row[f"{kind}_passes_elementwise"] = m_el.passed
                row[f"{kind}_passes_with_bound"] = m.passed
            rows.append(row)
            print(json.dumps(row), flush=True)
        del inputs, ref, got
        torch.cuda.empty_cache()
    return rows


def solution_rows(cache: Path) -> list[dict]:
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    rows = []
    with Evaluator(cache_dir=cache) as ev:
        for folder in sorted((ROOT / "tasks").glob("*/*/launch.json")):
            sol_dir = folder.parent
            if sol_dir.name not in ("simple", "expert"):
                continue
            r = ev.evaluate(Solution.from_dir(sol_dir), sol_dir.parent.name, "sm_90a", workloads="visible", time=False)
            for w in r.workloads:
                for m in w.outputs:
                    rows.append({"task": sol_dir.parent.name, "solution": sol_dir.name, "workload": w.workload,
                                 "status": w.status, "output": m.output, "rel_l2": m.rel_l2, "bound": m.rel_l2_bound,
                                 "max_abs_err": m.max_abs_err})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/calibration")
    ap.add_argument("--tasks", default=",".join(ATTENTION))
    args = ap.parse_args()
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"library": library_rows([t for t in args.tasks.split(",") if t]),
              "solutions": solution_rows(out / "cache")}
    (out / "calibration.json").write_text(json.dumps(report, indent=1) + "\n")
    print("| task | output | library rel-L2 | bias rel-L2 | noise rel-L2 | zeros rel-L2 | wrong pass elementwise |")
    print("|---|---|---|---|---|---|---|")
    for r in report["library"]:
        passes = ", ".join(k for k in ("bias", "noise", "zeros") if r[f"{k}_passes_elementwise"])
        print(f"| {r['task']} | {r['output']} | {r['library_rel_l2']:.2e} | {r['bias_rel_l2']:.3f} | "
              f"{r['noise_rel_l2']:.3f} | {r['zeros_rel_l2']:.3f} | {passes or 'none'} |")
    worst: dict[str, float] = {}
    for r in report["solutions"]:
        key = f"{r['task']}:{r['output']}"
        worst[key] = max(worst.get(key, 0.0), r["rel_l2"] or 0.0)
    print("\nworst rel-L2 of a shipped solution per task and output:")
    for k, v in sorted(worst.items()):
        print(f"  {k}: {v:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
