"""How near the "wgmma does >= 90% of all math" rule each shipped expert stands under the bound that
needs no list (tools.credit: every thread instruction of any pipe a multiply-add, the uniform
datapath's warp instructions one each, reductions in memory at their widest form; issue 42 items
1-2), on this machine's GPU: one evaluation per task, all workloads, credit on, in one worker.

Prints one line per workload: its wgmma share of all math and what the rest was (other tensor-pipe
math, thread instructions, uniform datapath, reductions, each as a fraction of wgmma's FLOPs).
`--old-pipes` also reads the per-pipe thread counters the rule charged before the bound (FMA, ALU,
FP64 and XU pipes; a 5th and 6th pass) and prints the share that rule gave (`old`), so a fixture can
be shown to pass the old rule and fail the new one from the same counted runs. `--fixtures` adds
attack kernels of tests/credit_fixtures.py (each on its own task). `--breakdown` also reads where the
thread instructions ran (per pipe, thread and warp level; the LSU's by operation: 11 passes) and prints
each pipe's part of the thread instructions the bound charges.

    python scripts/credit_margins.py [--tasks gemm_n7168_k5120,...] [--fixtures products_by_lookup]
        [--old-pipes] [--breakdown] [--time] [--budget-s 110] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# every shipped expert that requests wgmma (GDN decode asks for TMA alone), one per distinct kernel
EXPERTS = ("gdn_prefill_qk4_v8_d128_k_last", "gemm_n7168_k5120", "mha_bwd_d128", "mha_fwd_d128",
           "fp8_gemm_nt_1d2d_n4096_k7168", "gdn_prefill_qk8_v16_d128_k_last", "mha_fwd_d128_causal",
           "mha_bwd_d128_causal")
# the thread counters the rule read per pipe before the bound (2026-12-03, evening)
OLD_PIPES = {"sm__thread_inst_executed_pipe_fma_pred_on.sum": 2.0, "sm__thread_inst_executed_pipe_alu_pred_on.sum": 2.0,
             "sm__thread_inst_executed_pipe_fp64_pred_on.sum": 2.0, "sm__thread_inst_executed_pipe_xu_pred_on.sum": 2.0}

BREAKDOWN = (*(f"sm__thread_inst_executed_pipe_{p}_pred_on.sum" for p in ("fma", "alu", "fp64", "xu", "lsu", "ipa")),
             *(f"sm__inst_executed_pipe_{p}.sum" for p in ("lsu", "cbu", "adu", "uniform", "tma", "tensor", "fma", "alu",
                                                           "xu", "fp64")),
             *(f"smsp__inst_executed_op_{o}.sum" for o in ("shared_ld", "shared_st", "ldsm", "shared_stsm", "global_ld",
                                                          "global_st")),
             "smsp__inst_executed.sum", "smsp__thread_inst_executed.sum")

REDUCTION_COUNTERS = ("smsp__inst_executed_op_global_red.sum", "smsp__inst_executed_op_generic_atom_dot_alu.sum",
                      "smsp__inst_executed_op_shared_atom_dot_alu.sum", "smsp__inst_executed_op_redas.sum",
                      "l1tex__m_l1tex2xbar_write_bytes_mem_global_op_tma_red.sum",
                      "l1tex__m_l1tex2xbar_write_bytes_mem_dshared_op_tma_red.sum", "sm__inst_executed_pipe_uniform.sum")


def breakdown(raw: dict) -> str:
    """Each pipe's thread instructions as a part of every thread instruction (the bound's charge), the
    rest (no per-pipe thread counter: branches, tensor, TMA, uniform ...), and warp-level counts per pipe
    and LSU operation, each x32 over the thread total (how many lanes' worth)."""
    total = raw.get("smsp__thread_inst_executed_pred_on.sum")
    if not total:
        return ""
    parts = {p: raw.get(f"sm__thread_inst_executed_pipe_{p}_pred_on.sum") for p in ("fma", "alu", "fp64", "xu", "lsu", "ipa")}
    if any(v is None for v in parts.values()):
        return ""
    rest = total - sum(parts.values())
    warp = {k.split("__")[1].replace("inst_executed_", "").replace(".sum", ""): v for k, v in raw.items()
            if k in BREAKDOWN and not k.startswith("sm__thread")}
    return ("thread: " + " ".join(f"{p} {v / total:.3f}" for p, v in parts.items()) + f" rest {rest / total:.3f} | warp x32: "
            + " ".join(f"{k} {32 * v / total:.3f}" for k, v in sorted(warp.items())))


def raw_totals(credit: dict | None) -> dict[str, float]:
    """The counted run's raw counter values summed over its launches (the worker's `launches`)."""
    out: dict[str, float] = {}
    for launch in (credit or {}).get("launches") or []:
        for m, v in launch.get("metrics", {}).items():
            if isinstance(v, (int, float)) and v == v:
                out[m] = out.get(m, 0.0) + float(v)
    return out


def old_share(work: dict, raw: dict) -> float | None:
    """wgmma's share of all math under the per-pipe charge (before the bound), from the same counts."""
    from tools import credit

    if not all(m in raw for m in (*OLD_PIPES, credit.FP16_INST_METRIC)) or "wgmma_flops" not in work:
        return None
    simt = sum(raw[m] * w for m, w in OLD_PIPES.items()) + 4.0 * raw[credit.FP16_INST_METRIC]
    return work["wgmma_flops"] / max(work["wgmma_flops"] + work.get("other_tensor_flops", 0.0) + simt, 1.0)


def lines(task: str, r) -> list[dict]:
    out = []
    by = {x.workload: x for x in r.workloads}
    for w in r.executed.workloads if r.executed else []:
        work, raw = w.work, raw_totals((by.get(w.workload).credit if w.workload in by else None))
        g = work.get("wgmma_flops") or 0.0
        frac = {k: round(work.get(k, 0.0) / g, 5) if g else None
                for k in ("other_tensor_flops", "simt_flops", "uniform_flops", "reduction_flops")}
        out.append({"task": task, "workload": w.workload, "split": w.split, "status": w.status,
                    "correct": by[w.workload].status if w.workload in by else None,
                    "carries": w.carries, "notes": w.notes, "share": work.get("wgmma_of_all_math"),
                    "old": old_share(work, raw), "of_wgmma": frac, "work": work, "raw": raw,
                    "launches": (by[w.workload].credit or {}).get("launches") if w.workload in by else None})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(EXPERTS))
    ap.add_argument("--fixtures", default="", help="attack fixtures of tests/credit_fixtures.py, comma-separated")
    ap.add_argument("--old-pipes", action="store_true", help="also read the per-pipe counters of the old rule")
    ap.add_argument("--breakdown", action="store_true", help="also read where the thread instructions ran")
    ap.add_argument("--time", action="store_true", help="time the workloads too (the counted runs are then timed runs)")
    ap.add_argument("--budget-s", type=float, default=110.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from tests import credit_fixtures as fx

    tasks = [t for t in args.tasks.split(",") if t]
    fixtures = [f for f in args.fixtures.split(",") if f]
    unknown = [f for f in fixtures if f not in fx.FIXTURES] + [t for t in tasks if not (ROOT / "tasks" / t / "expert").is_dir()]
    if unknown:
        print(f"credit_margins: no expert or fixture named {', '.join(unknown)}", file=sys.stderr)
        return 2
    from tools import evaluator as evaluator_module
    from tools.credit import credit_metrics
    from tools.evaluator import Evaluator, require_gpu
    from tools.solution import Solution

    require_gpu(f"scripts/{Path(__file__).name}")
    extra = (*(OLD_PIPES if args.old_pipes else ()), *(BREAKDOWN if args.breakdown else ()))
    if extra:
        evaluator_module.credit_metrics = lambda: tuple(dict.fromkeys((*credit_metrics(), *extra)))
    start, rows = time.perf_counter(), []
    work_dir = Path("/tmp/ptxbench_credit_margins")
    plan = [(f, fx.TASKS.get(f, fx.TASK), lambda f=f: fx.FIXTURES[f](work_dir / f)) for f in fixtures]
    plan += [(t, t, lambda t=t: Solution.from_dir(ROOT / "tasks" / t / "expert")) for t in tasks]
    print(f"{'what':34} {'workload':>8} {'correct':>7} {'carries':22} {'share':>7} {'old':>7}  "
          "other tensor / thread / uniform / reductions (x wgmma)", flush=True)
    with Evaluator(cache_dir=Path("/tmp/ptxbench_credit_margins_cache")) as ev:
        for name, task, make in plan:
            if time.perf_counter() - start > args.budget_s:
                print(f"{name}: not run (budget)", flush=True)
                continue
            t0 = time.perf_counter()
            r = ev.evaluate(make(), task, "sm_90a", workloads="all", executed_check=True, time=args.time)
            for x in lines(name, r):
                rows.append(x)
                f = x["of_wgmma"]
                print(f"{name:34} {x['workload']:>8} {str(x['correct']):>7} {json.dumps(x['carries']):22} "
                      f"{x['share'] if x['share'] is None else round(x['share'], 4)!s:>7} "
                      f"{x['old'] if x['old'] is None else round(x['old'], 4)!s:>7}  "
                      f"{f['other_tensor_flops']} / {f['simt_flops']} / {f['uniform_flops']} / {f['reduction_flops']}"
                      + (f"  {x['notes']}" if x["notes"] else ""), flush=True)
                for launch in (x["launches"] or []) if name in fixtures else []:  # what each reduction counter read
                    red = {k.split("__")[1].replace(".sum", ""): v for k, v in launch.get("metrics", {}).items()
                           if k in REDUCTION_COUNTERS and v}
                    if red:
                        print(f"{'':34} {x['workload']:>8} {launch.get('name')}: {red}", flush=True)
                if args.breakdown and (b := breakdown(x["raw"])):
                    print(f"{'':34} {x['workload']:>8} {b}", flush=True)
            print(f"{name}: correct={r.correct} correct_with_arch={r.correct_with_arch} "
                  f"({time.perf_counter() - t0:.1f} s) {r.executed.reason if r.executed else ''}", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
