"""Helpers of the GPU tests."""
from __future__ import annotations

from tasks import get_task, select_many
from tools.results import EvalResult

# Issue 27's tasks (PTXBench's other GEMM shapes, the causal head-dimension variants, GDN MTP): their
# simple solutions are judged on every workload and timed against the library by
# test_tasks_gpu.py, so test_evaluator_gpu.py's simple-solution check leaves them out.
PTXBENCH_SET = [n for n in select_many(["gemm:shape_variant", "attention:causal", "fp8_attention:causal", "gdn:mtp"])
                if "seed" not in get_task(n).tags]


def show(r: EvalResult) -> str:
    """An evaluation in one line, for an assertion's message."""
    rows = [f"{w.workload}/{w.split}: {w.status} {w.reason or ''} {w.detail or ''} baseline={w.baseline_name}"
            for w in r.workloads]
    return f"run {r.run_status} ({r.run_reason}); " + " | ".join(rows)
