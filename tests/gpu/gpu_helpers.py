"""Helpers of the GPU tests."""
from __future__ import annotations

from tools.results import EvalResult


def show(r: EvalResult) -> str:
    """An evaluation in one line, for an assertion's message."""
    rows = [f"{w.workload}/{w.split}: {w.status} {w.reason or ''} {w.detail or ''} baseline={w.baseline_name}"
            for w in r.workloads]
    return f"run {r.run_status} ({r.run_reason}); " + " | ".join(rows)
