"""How close the GEMM expert (and cuBLAS) come to the GEMM tasks' tolerance, and whether the
expert is deterministic: the probe behind the diagnosis of gemm_n5376_k21504 (NOTES.md of
tasks/gemm_n7168_k5120/expert, "Why gemm_n5376_k21504 failed") and the H200 margins of
docs/METHODOLOGY.md ("The judge's power").

On a GPU, for each task and M, on fresh stress inputs per seed (the evaluator's generator):
- the expert, launched twice on the same inputs through the project's own manifest and launch
  code: the two outputs compared bit for bit (the data-parallel path has a fixed summation
  order, so any difference is a race), and the first judged by the evaluator's own verdict;
- cuBLAS (torch.matmul in bf16, as the baseline) on the same inputs, judged the same way;
- for both, the margins of the task's three rules (> 1 fails; tools.correctness.compare):
  elementwise |C - ref| / (atol + rtol s) with s the task's scale (max(|ref|, rss) for
  scale "terms"), its worst element, the worst row's ratio and relative L2 over its bound; the
  elementwise margin against |ref| alone too (`ref_margin`, the rule before term scales); and
  on the worst elements the error of the fp32 reference itself, against fp64 dot products.

    python3 scripts/gemm_accuracy.py gemm_n5376_k21504:all:2 gemm_n7168_k5120:8192 --seeds 3 --json out.json
(M `all`: every workload of the task.)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXPERT = ROOT / "tasks" / "gemm_n7168_k5120" / "expert"  # the one GEMM expert (scripts/gemm_experts.py)


def margins(got, ref, tol, rss=None) -> dict:
    """The judge's three rules' margins (tools.correctness.compare; > 1 fails) and where the
    elementwise one peaks. `rss`: the term scale, for tasks judged with scale "terms"."""
    import torch

    from tools.correctness import row_ratios

    diff = (got.float() - ref).abs()
    s = ref.abs() if rss is None else torch.maximum(ref.abs(), rss)
    m = diff / (tol.atol + tol.rtol * s)
    flat = int(m.argmax())
    i, j = divmod(flat, m.shape[1])
    top = torch.topk(m.reshape(-1), 16).indices
    out = {"margin": float(m.reshape(-1)[flat]), "over_1": int((m > 1).sum()), "at": [i, j],
           "ref_at": float(ref[i, j]), "err_at": float(diff[i, j]), "max_abs_err": float(diff.max()),
           "ref_margin": float((diff / (tol.atol + tol.rtol * ref.abs())).max()),
           "rel_l2": float(diff.norm() / ref.norm()), "_top": top}
    if "C" in tol.rel_l2:
        out["rel_l2_margin"] = out["rel_l2"] / tol.rel_l2["C"]
    if "C" in tol.rows:
        out["row_margin"] = float(row_ratios(diff, s, tol.rows["C"], rss).max())
    return out


def fp64_check(A, B, C32, got, top, n_cols: int) -> dict:
    """On the worst elements: the fp32 reference's own error and the candidate's, against fp64."""
    rows, cols = top // n_cols, top % n_cols
    exact = (A[rows].double() * B[cols].double()).sum(-1)
    return {"ref32_err_max": float((C32.reshape(-1)[top].double() - exact).abs().max()),
            "err64_max": float((got.reshape(-1)[top].double() - exact).abs().max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", help="TASK:M[:SEEDS], e.g. gemm_n5376_k21504:8828:5 (M `all`: every workload)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--variants", default="shipped", help="expert_dev variants of the GEMM expert, comma-separated")
    args = ap.parse_args()
    cases = []
    for c in args.cases:
        parts = c.split(":")
        name, m, seeds = (parts + [str(args.seeds)])[:3] if len(parts) in (2, 3) else ("", "", "")
        if not name.startswith("gemm_n") or not (m.isdigit() or m == "all") or not seeds.isdigit():
            ap.error(f"{c!r}: give TASK:M[:SEEDS] with a gemm_n*_k* task (M a number or `all`)")
        if m == "all":
            from tasks import get_task
            from tasks.registry import UnknownTask

            try:
                ms = [int(w.axes["M"]) for w in get_task(name).workloads]
            except UnknownTask:
                ap.error(f"{c!r}: no task {name}")
        else:
            ms = [int(m)]
        cases += [(name, mm, int(seeds)) for mm in ms]

    import torch

    from tasks import get_task
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference, term_scales
    from tools.compile import compile_solution
    from tools.launch import Bound, DeviceLimits, Module, plan_launches
    from tools.workspace import Workspace

    sys.path.insert(0, str(ROOT / "scripts"))
    from expert_dev import variant

    torch.zeros(1, device="cuda")  # the primary context, before the module load
    props = torch.cuda.get_device_properties(0)
    limits = DeviceLimits(num_sms=props.multi_processor_count, max_smem_per_block=232448)
    rows_out = []
    tmp = Path(tempfile.mkdtemp(prefix="gemm-accuracy-"))
    built: dict[str, tuple] = {}
    for vname, (name, m, n_seeds) in [(v, c) for v in args.variants.split(",") for c in cases]:
        if vname not in built:
            sol = variant(EXPERT.parent.name, vname, tmp)
            comp = compile_solution(sol, "sm_90a")
            if not comp.ok:
                print(f"{vname}: compile failed: {comp.error}")
                return 1
            built[vname] = sol, Module(comp.cubin, comp.symbols)
        sol, module = built[vname]
        task = get_task(name)
        axes = task.axis_values({"M": m})
        plan = plan_launches(sol.manifest, task, axes, limits)
        ws = Workspace(task, plan)
        bound = Bound(plan, module, ws.pointers())
        for seed in range(1, n_seeds + 1):
            t0 = time.time()
            fresh = generate_inputs(task, axes, 1000 + seed, device="cuda", fast=True)
            outs = []
            for _ in range(2):
                ws.load_inputs(fresh)
                ws.reset()
                bound.launch()
                torch.cuda.synchronize()
                outs.append(ws.outputs["C"].clone())
            same = bool(torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)))
            ndiff = int((outs[0].view(torch.int16) != outs[1].view(torch.int16)).sum())
            ref = run_reference(task, fresh)["C"]
            rss = term_scales(task, fresh)["C"] if task.tolerance.scale == "terms" else None
            # the evaluator's verdict on the whole output, with the task's scales (ws holds run 2's output)
            reason, detail, _ = ws.verdict({"C": ref}, task.tolerance, None if rss is None else {"C": rss}, inputs=fresh)
            A, B = fresh["A"], fresh["B"]
            lib = torch.matmul(A, B.T)
            lib_m = margins(lib, ref, task.tolerance, rss)
            exp_m = margins(outs[0], ref, task.tolerance, rss)
            row = {"variant": vname, "task": name, "M": m, "seed": 1000 + seed, "deterministic": same, "elements_differing": ndiff,
                   "verdict": reason or "passed", "detail": detail,
                   "expert": {k: v for k, v in exp_m.items() if k != "_top"} | fp64_check(A, B, ref, outs[0], exp_m["_top"], task.shape("C", axes)[1]),
                   "cublas": {k: v for k, v in lib_m.items() if k != "_top"} | fp64_check(A, B, ref, lib, lib_m["_top"], task.shape("C", axes)[1]),
                   "seconds": round(time.time() - t0, 2)}
            rows_out.append(row)
            e, c = row["expert"], row["cublas"]
            print(f"{vname} {name} M={m} seed {1000 + seed}: {row['verdict']:<9} det={same} (diff {ndiff}) "
                  f"expert elem {e['margin']:.3f} (>1: {e['over_1']}, |ref| {abs(e['ref_at']):.3g}, err {e['err_at']:.3g}; "
                  f"vs |ref| alone {e['ref_margin']:.3f}) row {e.get('row_margin', 0):.3f} relL2 {e['rel_l2']:.2e} "
                  f"(fp64: exp {e['err64_max']:.3g} ref32 {e['ref32_err_max']:.3g}) | "
                  f"cuBLAS elem {c['margin']:.3f} (>1: {c['over_1']}; vs |ref| alone {c['ref_margin']:.3f}) "
                  f"row {c.get('row_margin', 0):.3f} relL2 {c['rel_l2']:.2e} [{row['seconds']} s]", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows_out, indent=1))
            del fresh, outs, ref, rss, lib, A, B
        del bound, ws
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
