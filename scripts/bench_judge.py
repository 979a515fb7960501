"""What judging one run costs on this GPU, piece by piece, for the attention tasks at full size
(issue 43: the seeded checks and the whole-output judging are most of an attention-backward
evaluation). Per task and workload, seconds (the least of --reps):

    gen_exact   the seeded checks' inputs (backward: O and LSE from the fp32 forward reference)
    gen_fast    the timed runs' inputs (backward: O and LSE from a bf16 flash forward)
    reference   the task's reference on them (fp32, TF32 off)
    term_scales the whole outputs' term scales (tasks.reference.term_scales)
    sampled     the sampled judge's reference rows (tasks.sampled.sample, rows_for(task) rows)
    judge_eager compare() of every output with the term scales given (their cost not included)
    judge_lazy  tools.correctness.judge_outputs (term scales only where needed), and which path it took

on the library's own outputs (cuDNN: P and dS in bf16, an honest FlashAttention-style answer), whose
verdicts the two judges must agree on.

    python scripts/bench_judge.py [--cases mha_bwd_d128:S8192,mha_fwd_d128:S8192] [--reps 2] [--json PATH]
    python scripts/bench_judge.py --timed-run [--cases ...]   # one timed run's judge, part by part (timed_run)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = "mha_bwd_d128:S8192,mha_bwd_d128:S4096,mha_fwd_d128:S8192,mha_bwd_d128_causal:S8192"


def timed(fn, reps: int):
    import torch

    best, out = float("inf"), None
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(reps):
        out = None
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return round(best, 4), out


def one(task_name: str, wl_name: str, reps: int) -> dict:
    import torch

    from tasks import get_task
    from tasks.families.baselines import make_baseline
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference, term_scales
    from tasks.sampled import rows_at, rows_for, sample
    from tools.correctness import compare, judge_outputs

    task = get_task(task_name)
    wl = next(w for w in task.workloads if w.name == wl_name)
    axes = task.axis_values(wl)
    row: dict = {"task": task_name, "workload": wl_name}
    row["gen_exact"], _ = timed(lambda: generate_inputs(task, axes, 7, device="cuda"), reps)
    row["gen_fast"], x = timed(lambda: generate_inputs(task, axes, 7, device="cuda", fast=True), reps)
    row["reference"], expected = timed(lambda: run_reference(task, x), reps)
    row["term_scales"], full = timed(lambda: term_scales(task, x), reps)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1)
    row["sampled"], _ = timed(lambda: sample(task, x, gen, rows_for(task)), reps)
    lib = make_baseline(task, {n: t.clone() for n, t in x.items()}, "sdpa:cudnn")
    answer = lib.run()  # the forward's library writes no LSE: the reference's stands in for it
    got = {n: (answer[n] if n in answer else expected[n]).float() for n in task.outputs}
    torch.cuda.synchronize()
    row["judge_eager"], eager = timed(lambda: [compare(n, got[n], expected[n], task.tolerance, full.get(n))
                                               for n in task.outputs], reps)
    calls = {"full": 0, "rows": []}

    def scales():
        calls["full"] += 1
        return term_scales(task, x)

    def row_scales(rows):
        calls["rows"].append({n: int(len(r)) for n, r in rows.items()})
        return {n: s.scale for n, s in rows_at(task, x, rows).items()}

    row["judge_lazy"], lazy = timed(lambda: judge_outputs(got, expected, task.tolerance, scales, row_scales), reps)
    plain = [compare(n, got[n], expected[n], task.tolerance) for n in task.outputs]
    row["plain_failing"] = {m.output: {"elements": round(m.mismatch_frac * got[m.output].numel()),
                                       "bad_rows": m.bad_rows} for m in plain if not m.passed}
    row["lazy_path"] = {"whole_term_scales": calls["full"] // reps, "rows_asked": calls["rows"][:1],
                        "judged_against": [m.judged_against for m in lazy]}
    row["verdicts_agree"] = [m.passed for m in lazy] == [m.passed for m in eager]
    row["library_passes"] = all(m.passed for m in eager)
    row["worst_row_ratio"] = {m.output: round(m.row_ratio or 0, 4) for m in eager}
    del x, expected, full, got
    torch.cuda.empty_cache()
    return row


RUN_CASES = "mha_bwd_d128:S77,mha_bwd_d128:S1024,mha_bwd_d128:S8192,gemm_n7168_k5120:M8192,gemm_n5376_k21504:M8828"


def timed_run(task_name: str, wl_name: str, reps: int, device: str = "cuda") -> dict:
    """One timed run's judge (tools.workspace.judge_run, sampled), part by part, on the library's answer
    for the run's inputs (seconds, the least of `reps`, the GPU synced after each part):

        regenerate   the run's inputs generated again from its seed (fast generator)
        copies       the harness's copy of the inputs held to that regeneration (tools.correctness.changed)
        scan         guards, inputs unchanged, poison and NaN of every output (tools.correctness.scan)
        rows_terms   the sampled rows' reference with their term scales (as before issue 43's judgecost)
        rows_plain   the same rows without the scales (what judge_run computes now)
        cmp_eager    compare() of each output's sampled rows with their scales
        cmp_lazy     judge_outputs on the sampled rows, scales only where needed (judge_run now)
        run_sampled  judge_run whole, sampled (what a timed run's judging costs)
        run_whole    judge_run whole, compared whole (one or two runs of a timed phase)
    """
    import random
    from types import SimpleNamespace

    import torch

    from tasks import get_task
    from tasks.families.baselines import list_backends, make_baseline
    from tasks.generators import generate_inputs
    from tasks.reference import run_reference
    from tasks.sampled import draw_rows, rows_at, rows_for, view_rows
    from tools.correctness import changed, compare, judge_outputs, scan
    from tools.workspace import SAMPLED_ROWS, Workspace, judge_run, lazy_sample_scales

    task = get_task(task_name)
    wl = next(w for w in task.workloads if w.name == wl_name)
    axes = task.axis_values(wl)
    seed = 7
    x = generate_inputs(task, axes, seed, device=device, fast=True)
    specs = {**task.inputs, **task.outputs}
    ws = Workspace(task, SimpleNamespace(tensors={n: (specs[n].dtype, tuple(task.shape(n, axes))) for n in specs},
                                         buffers=[]), device)
    ws.load_inputs(x)
    answer = {}
    if device == "cuda":
        lib = make_baseline(task, {n: t.clone() for n, t in x.items()}, list_backends(task)[0])
        lib.prepare()
        answer = lib.run()
    missing = [n for n in task.outputs if n not in answer]
    ref = run_reference(task, x) if missing else {}
    for n, t in ws.outputs.items():
        t.copy_((answer[n] if n in answer else ref[n]).to(t.dtype))
    del answer, ref
    rows = max(SAMPLED_ROWS, rows_for(task))
    row: dict = {"task": task_name, "workload": wl_name, "rows": rows}
    row["regenerate"], fresh = timed(lambda: generate_inputs(task, axes, seed, device=device, fast=True), reps)
    copies = {n: t.clone() for n, t in fresh.items()}
    row["copies"], _ = timed(lambda: changed(copies, fresh), reps)
    row["scan"], _ = timed(lambda: scan(ws.guarded, ws.inputs, fresh, ws.outputs), reps)
    gen = torch.Generator(device=device)
    gen.manual_seed(3)
    drawn = draw_rows(task, fresh, gen, rows)
    row["rows_terms"], with_terms = timed(lambda: rows_at(task, fresh, drawn, terms=True), reps)
    row["rows_plain"], plain = timed(lambda: rows_at(task, fresh, drawn, terms=False), reps)
    got = {n: view_rows(ws.outputs[n])[smp.rows] for n, smp in plain.items()}
    row["cmp_eager"], eager = timed(lambda: [compare(n, got[n], smp.expected, task.tolerance, smp.scale)
                                             for n, smp in with_terms.items()], reps)
    every, some = lazy_sample_scales(task, fresh, drawn)
    calls = {"every": 0, "some": 0}

    def every_counted():
        calls["every"] += 1
        return every()

    def some_counted(wanted):
        calls["some"] += 1
        return some(wanted)

    row["cmp_lazy"], lazy = timed(lambda: judge_outputs(got, {n: smp.expected for n, smp in plain.items()},
                                                        task.tolerance, every_counted if every else None,
                                                        some_counted if every else None), reps)
    row["lazy_path"] = {k: v // reps for k, v in calls.items()}
    row["verdicts_agree"] = [m.passed for m in lazy] == [m.passed for m in eager]
    row["library_passes"] = all(m.passed for m in eager)
    rng = random.Random(5)
    row["run_sampled"], _ = timed(lambda: judge_run(task, axes, ws, seed, rng, device, rows, False, "bench"), reps)
    row["run_whole"], _ = timed(lambda: judge_run(task, axes, ws, seed, rng, device, rows, True, "bench"), 1)
    del x, fresh, copies, ws, with_terms, plain, got
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=CASES, help="task:workload,...")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--timed-run", action="store_true",
                    help="one timed run's judge part by part instead (timed_run; default cases: RUN_CASES)")
    args = ap.parse_args(argv)
    if args.timed_run and args.cases == CASES:
        args.cases = RUN_CASES
    cases = [c.split(":") for c in args.cases.split(",") if c]
    if any(len(c) != 2 for c in cases) or args.reps < 1:
        print("bench_judge: --cases takes task:workload,... and --reps at least 1", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench_judge: skipped: no CUDA device", file=sys.stderr)
        return 2
    if args.timed_run:
        return _timed_runs(cases, args)
    rows = []
    for task_name, wl in cases:
        rows.append(one(task_name, wl, args.reps))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cols = ("gen_exact", "gen_fast", "reference", "term_scales", "sampled", "judge_eager", "judge_lazy")
    print(f"GPU: {torch.cuda.get_device_name()}\n")
    print("| task | workload | " + " | ".join(cols) + " | lazy path | agree |")
    print("|---" * (len(cols) + 4) + "|")
    for r in rows:
        path = "whole" if r["lazy_path"]["whole_term_scales"] else ",".join(r["lazy_path"]["judged_against"])
        print(f"| {r['task']} | {r['workload']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) +
              f" | {path} | {r['verdicts_agree']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _timed_runs(cases, args) -> int:
    import torch

    cols = ("regenerate", "copies", "scan", "rows_terms", "rows_plain", "cmp_eager", "cmp_lazy", "run_sampled",
            "run_whole")
    rows = []
    for task_name, wl in cases:
        rows.append(timed_run(task_name, wl, args.reps))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"GPU: {torch.cuda.get_device_name()}\n")
    print("| task | workload | " + " | ".join(cols) + " | lazy path | agree | library passes |")
    print("|---" * (len(cols) + 5) + "|")
    for r in rows:
        print(f"| {r['task']} | {r['workload']} | " + " | ".join(f"{1e3 * r[c]:.1f}" for c in cols) +
              f" | {r['lazy_path']} | {r['verdicts_agree']} | {r['library_passes']} |")
    print("\n(milliseconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
