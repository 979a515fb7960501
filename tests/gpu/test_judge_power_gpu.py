"""The judge's power at full size on the GPU (issue 29), for every registered task:

- every library backend the evaluator may time (made as the worker makes it, on the workspace's
  own input tensors) passes its own task's judge on every workload, except a backend that says
  it computes below the task's precision (`Baseline.below_task`: on Hopper cuDNN's FP8 attention
  writes O in e4m3, the task's O is bf16). Such a backend is a timing reference, never an
  honest pass: its verdict is printed apart, and the test asserts what the label claims (its
  O fails on some workload of each FP8 attention task, its LSE passes on every one);
- every honest emulation of tests/judge_power.py (fp32 throughout, P and dS in bf16, the row sum
  of the rounded P, scaled e4m3 P on the FP8 tasks, GDN's chunked form with bf16 tensor-core
  operands and an fp32 state, tf32 MMA for MTP) passes on every workload, whole and on sampled rows;
- on one visible workload per task (GEMM: on every workload), every wrong variant of the catalogue fails.

The judge is the evaluator's (`Workspace.verdict` with the reference and term scales as the
worker computes them, on the GPU). Prints one line per task and output: the worst honest and
library margins (measured error / bound, the largest of the elementwise, per-row and aggregate
ratios) and the wrong variant that failed by the least (docs/METHODOLOGY.md quotes the table).

A second test evaluates the shipped expert solutions and one simple solution per family with the
evaluator (visible workloads, untimed) and prints their per-row and aggregate margins.

    python -m pytest -m gpu tests/gpu/test_judge_power_gpu.py -q -s
    python -m pytest -m gpu tests/gpu/test_judge_power_gpu.py -q -s -k sparse_faults   # issue 42, item 6

PTXBENCH_JUDGE_TASKS=name,name limits the tasks (shell patterns, e.g. gemm_*); tasks not reached
within PTXBENCH_JUDGE_BUDGET_S (540 s: one device command is 600 s at most) are listed as not run.
The catalogue runs on one visible workload per task (GEMM's on every workload: catalogue_workloads);
on the other workloads the library and the least precise honest variants (tests/judge_power.py,
LEAST_PRECISE).
"""
from __future__ import annotations

import fnmatch
import math
import os
import time

import pytest

from tasks.registry import TASKS, get_task
from tests.judge_power import judge_task, margins_table, sparse_table

pytestmark = pytest.mark.gpu


def selected() -> list[str]:
    """The tasks to run, one per family first (tests/test_judge_power.py), so that a spent time
    budget leaves out variants, never a family."""
    from tests.test_judge_power import REPRESENTATIVES

    pattern = os.environ.get("PTXBENCH_JUDGE_TASKS", "*")
    names = [n for n in TASKS if any(fnmatch.fnmatch(n, p.strip()) for p in pattern.split(","))]
    first = [n for n in REPRESENTATIVES.values() if n in names]
    return first + [n for n in names if n not in first]


def catalogue_workload(task) -> str:
    """The visible workload the whole catalogue runs at: the first, except for GDN prefill, whose
    8192-token workload makes each token-by-token fault a 2 s loop: its 959-token one."""
    visible = task.workloads_for("visible")
    if task.op_type == "gdn_prefill":
        return min(visible, key=lambda w: w.axes["total_seq_len"]).name
    return visible[0].name


def catalogue_workloads(task) -> list[str]:
    """Where the whole catalogue runs: GEMM at every workload (each fault is one fp32 GEMM, cheap at
    every M; and judged on term scales, each M's outputs that cancel are loosened alike, so each is
    proven), the other families at catalogue_workload's one."""
    if task.op_type == "gemm":
        return [w.name for w in task.workloads]
    return [catalogue_workload(task)]


def judge_all(plans, device: str, budget_s: float = math.inf) -> tuple[list, list[str]]:
    """plans: (task, [(workload name, axes)], catalogue workload name or names). Returns every Verdicts and
    the problems (an honest variant or library that fails, a wrong variant that passes, an error,
    a task not reached within `budget_s`)."""
    import torch

    results, problems, start = [], [], time.perf_counter()
    for task, workloads, catalogue_at in plans:
        t0 = time.perf_counter()
        if t0 - start > budget_s:
            problems.append(f"{task.name}: not run, the time budget ({budget_s:.0f}s) is spent "
                            "(PTXBENCH_JUDGE_TASKS runs the rest)")
            continue
        try:
            verdicts = judge_task(task, device, workloads, catalogue_at)
        except Exception as exc:  # noqa: BLE001 - one task's failure is reported with the others
            problems.append(f"{task.name}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"{task.name}: ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            if device != "cpu":
                torch.cuda.empty_cache()
            continue
        results += verdicts
        for v in verdicts:
            problems += [f"{task.name} @ {v.workload}: honest or library FAILS: {p}" for p in v.honest_failed()]
            problems += [f"{task.name} @ {v.workload}: wrong PASSES: {p}" for p in v.wrong_passed()]
        libs = sorted({f"{r[1]}{'' if r[0] == 'library' else ' (' + r[0] + ')'}" for v in verdicts for r in v.rows
                       if r[0].startswith("library") or r[0] == "unavailable"})
        print(f"{task.name}: {time.perf_counter() - t0:.1f}s, {sum(len(v.rows) for v in verdicts)} verdicts; "
              f"{', '.join(libs) or 'no library'}", flush=True)
    return results, problems


def report(results, seconds: float) -> str:
    lines = [f"margins (measured error / bound; > 1 fails), {seconds:.0f}s in all:", margins_table(results)]
    first: dict[str, str] = {}
    for v in results:  # what each library backend is (first workload), and any that could not run
        if first.setdefault(v.task.name, v.workload) != v.workload:
            continue
        for kind, variant, _, _, why in v.rows:
            if kind.startswith("library") or kind == "unavailable":
                tag = {"unavailable": "unavailable: ", "library_own_inputs": "(its own O and LSE, not judged) ",
                       "library_below_task": "(below the task's precision: a timing reference, judged apart) "}
                lines.append(f"  {v.task.name} {variant}: {tag.get(kind, '')}{why}")
    below = below_task_verdicts(results)
    if below:
        lines.append("libraries below the task's precision (timing references; their judge verdicts):")
        lines += [f"  {task} {variant} @ {workload}: {'passed' if passed else 'FAILED'} "
                  f"({', '.join(f'{o} {m:.3g}' for o, m in margins.items()) or 'no margins'})"
                  for task, workload, variant, passed, margins in below]
    return "\n".join(lines)


def below_task_verdicts(results) -> list[tuple[str, str, str, bool, dict[str, float]]]:
    """(task, workload, backend, passed, margins) of every library judged as below its task's precision."""
    return [(v.task.name, v.workload, variant, passed, margins) for v in results
            for kind, variant, passed, margins, _ in v.rows if kind == "library_below_task"]


def below_task_problems(results) -> list[str]:
    """What a below-precision label claims, checked: such a library's outputs other than O are within
    their bounds on every workload (the shortfall is in O alone), and cuDNN's FP8 attention, where it
    is labelled (an e4m3 O), fails its task's O bound on at least one workload (else the label, and
    METHODOLOGY's account of it, is wrong). A label is only ever on the FP8 attention baselines."""
    problems, o_failed = [], {}
    for task, workload, variant, passed, margins in below_task_verdicts(results):
        if get_task(task).op_type != "fp8_mha_fwd":
            problems.append(f"{task} {variant}: labelled below the task's precision, outside FP8 attention")
        problems += [f"{task} @ {workload} {variant}: {o} fails ({m:.3g}), the label names O only"
                     for o, m in margins.items() if o != "O" and m > 1]
        if variant == "library:cudnn_fp8":
            o_failed[task] = o_failed.get(task, False) or margins.get("O", 0.0) > 1
    problems += [f"{task} library:cudnn_fp8: its e4m3 O passed on every workload; the label (and METHODOLOGY) "
                 "says it fails" for task, failed in o_failed.items() if not failed]
    return problems


def test_judge_power_full_size():
    import torch

    assert torch.cuda.is_available(), "needs a GPU"
    torch.set_float32_matmul_precision("highest")  # the emulations are fp32 where they say so (no TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.perf_counter()
    plans = []
    for name in selected():
        task = get_task(name)
        plans.append((task, [(w.name, task.axis_values(w)) for w in task.workloads], catalogue_workloads(task)))
    results, problems = judge_all(plans, "cuda", float(os.environ.get("PTXBENCH_JUDGE_BUDGET_S", 540)))
    print("\n" + report(results, time.perf_counter() - t0))
    # one wrong row chosen where it is least visible (issue 42, item 6): measured, not asserted
    print("\n" + sparse_table(results))
    problems += below_task_problems(results)
    # cuDNN's FP8 attention is judged on every FP8 attention task reached, as an honest library (a bf16
    # O: Blackwell) or labelled below the task's precision (an e4m3 O: Hopper), never left out.
    for name in {v.task.name for v in results if v.task.op_type == "fp8_mha_fwd"}:
        kinds = {kind for v in results if v.task.name == name for kind, variant, *_ in v.rows
                 if variant == "library:cudnn_fp8"}
        if not kinds & {"library", "library_below_task"}:
            problems.append(f"{name}: cuDNN's FP8 attention was not judged ({', '.join(sorted(kinds)) or 'absent'})")
    assert not problems, "\n".join(problems)


# The shipped kernels judged by the evaluator itself, visible workloads: the experts and, for one
# task per family, the simple solution. Their margins (per-row and aggregate; the evaluator's
# Mismatch carries both) go beside the emulations' in docs/METHODOLOGY.md.
SHIPPED = [("gemm_n7168_k5120", "expert"), ("mha_fwd_d128", "expert"), ("mha_fwd_d128_causal", "expert"),
           ("mha_bwd_d128", "expert"), ("mha_bwd_d128_causal", "expert"), ("gemm_n7168_k5120", "simple"),
           ("fp8_gemm_nt_1d2d_n4096_k7168", "simple"), ("mha_fwd_d128", "simple"), ("mha_bwd_d128", "simple"),
           ("fp8_mha_with_lse_d128", "simple"), ("gdn_decode_qk4_v8_d128_k_last", "simple"),
           ("gdn_prefill_qk4_v8_d128_k_last", "simple"), ("gdn_mtp_qk4_v8_d128_k_last", "simple")]


def test_shipped_solutions_margins(evaluator):
    from pathlib import Path

    from gpu_helpers import show
    from tools.solution import Solution

    root = Path(__file__).resolve().parents[2] / "tasks"
    lines, failed = ["shipped kernels (evaluator, visible workloads): per-row and aggregate margins"], []
    for name, kind in SHIPPED:
        if not (root / name / kind).is_dir():
            continue
        r = evaluator.evaluate(Solution.from_dir(root / name / kind), name, "sm_90a", workloads="visible", time=False)
        if r.correct is not True:
            failed.append(f"{name}/{kind}: {show(r)}")
        for w in r.workloads:
            for m in w.outputs:
                aggregate = (m.rel_l2 or 0.0) / m.rel_l2_bound if m.rel_l2_bound else 0.0
                lines.append(f"  {name:34s} {kind:7s} {w.workload:10s} {m.output:10s} row {m.row_ratio or 0:.3f}  "
                             f"aggregate {aggregate:.3f}  {'passed' if m.passed else 'FAILED'}")
    print("\n" + "\n".join(lines))
    assert not failed, "\n".join(failed)


# One task per sampled family at full size: what the sampled check of a timed run costs at its r
# (tasks.sampled.rows_for) and at 4r, against the library's own time (docs/METHODOLOGY.md, "What a
# cheating kernel faces": raise r where this is cheap).
SAMPLED_COST = ["gemm_n7168_k5120", "fp8_gemm_nt_1d2d_n4096_k7168", "mha_fwd_d128", "mha_bwd_d128",
                "fp8_mha_with_lse_d128"]


def _gpu_ms(fn, runs: int = 3) -> float:
    import statistics

    import torch

    fn()  # first call: allocator and kernel selection
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def test_sampled_check_cost():
    import torch

    from tasks.families.baselines import BaselineUnavailable, first_available
    from tasks.generators import generate_inputs
    from tasks.sampled import rows_for, sample
    from tools.workspace import SAMPLED_ROWS

    lines = ["sampled check of one timed run (ms, GPU time) against the library's run:"]
    for name in SAMPLED_COST:
        task = get_task(name)
        wl = task.workloads_for("visible")[0]
        x = generate_inputs(task, task.axis_values(wl), seed=3, device="cuda")
        try:
            base = first_available(task, x)
            base.prepare()
            library = f"{base.name} {_gpu_ms(base.run):.3f}"
        except BaselineUnavailable as exc:
            library = f"unavailable ({str(exc)[:80]})"
        r = max(SAMPLED_ROWS, rows_for(task))
        gen = torch.Generator(device="cuda")
        cost = {rows: _gpu_ms(lambda: sample(task, x, gen.manual_seed(1), rows)) for rows in (r, 4 * r)}
        lines.append(f"  {name:32s} {wl.name:10s} r={r}: {cost[r]:.3f}  4r={cost[4 * r]:.3f}  library {library}")
        assert all(math.isfinite(c) and c > 0 for c in cost.values()), cost
        del x
        torch.cuda.empty_cache()
    print("\n" + "\n".join(lines))


# The three sparse faults of issue 42 (item 6): one zeroed GDN prefill output row, one plausible wrong GDN
# state row, one FP8 attention LSE row swapped for a plausible value. Each row fault of the catalogue (zeroed,
# stale: the row computed from other inputs, copied from another position) and each element fault, on EVERY
# workload of these tasks at full size, beside the library and the least precise honest variant there.
SPARSE_TASKS = ["gdn_prefill_qk8_v16_d128_k_last", "gdn_prefill_qk4_v8_d128_k_last", "fp8_mha_with_lse_d128",
                "fp8_mha_with_lse_d128_causal", "fp8_mha_with_lse_d64", "fp8_mha_with_lse_d256_causal"]


def test_sparse_faults_fail_on_every_workload():
    import torch

    from tests.judge_power import library_verdicts, run_catalogue

    assert torch.cuda.is_available(), "needs a GPU"
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    pattern = os.environ.get("PTXBENCH_JUDGE_TASKS", "*")
    names = [n for n in SPARSE_TASKS if any(fnmatch.fnmatch(n, p.strip()) for p in pattern.split(","))]
    budget, start = float(os.environ.get("PTXBENCH_JUDGE_BUDGET_S", 540)), time.perf_counter()
    results, problems = [], []
    for name in names:
        task = get_task(name)
        for w in sorted(task.workloads, key=lambda w: w.axes.get("total_seq_len", w.axes.get("L", 0))):
            if time.perf_counter() - start > budget:
                problems.append(f"{name} @ {w.name}: not run, the time budget ({budget:.0f}s) is spent")
                continue
            t0 = time.perf_counter()
            v = run_catalogue(task, task.axis_values(w), "cuda", seed=7, workload=w.name, computed=False,
                              library_hook=library_verdicts)
            results.append(v)
            problems += [f"{name} @ {w.name}: honest or library FAILS: {p}" for p in v.honest_failed()]
            problems += [f"{name} @ {w.name}: wrong PASSES: {p}" for p in v.wrong_passed()]
            worst = ", ".join(f"{o} {m:.3g} ({h})" for o, (m, h) in v.worst_honest().items())
            least = {}
            for kind, variant, passed, margins, _ in v.rows:
                if kind == "wrong" and variant.split(":")[1] in ("zeroed_row", "stale_row", "row_from_another"):
                    out = variant.split(":")[0]
                    least[variant] = margins.get(out, math.inf)
            print(f"{name} @ {w.name}: {time.perf_counter() - t0:.1f}s; honest/library worst {worst}; row faults "
                  + ", ".join(f"{k} {m:.3g}" for k, m in least.items()), flush=True)
            torch.cuda.empty_cache()
    print("\n" + sparse_table(results), flush=True)
    print("\n" + report(results, time.perf_counter() - start), flush=True)
    problems += [p for p in below_task_problems(results) if "passed on every workload" not in p]
    assert not problems, "\n".join(problems)
