"""What evaluations cost on the GPU: one evaluation's phases, a sweep's totals, and a sweep's
estimate before it runs.

    evaluation_phases(ev) -> dict[str, float]   where one evaluation's wall time went
    sweep_cost(runs_dir, run_ids) -> SweepCost  every recorded evaluation of those runs
    estimate(runs, table) -> CostEstimate        GPU time of runs not yet made, from a cost table

GPU seconds are the time an evaluation held its GPU's worker: starting it (where it was not up),
every workload's round trip (seeded checks, library set-up, timed pairs and their judging,
counted runs), the executed check's and memcheck's own stages. Compile, inspection and queue wait
hold no GPU; they are reported beside. The cost table (agent/cost_table.json) holds measured
GPU seconds per evaluation by task family and solution kind (docs/SWEEPS.md says how to refresh it
from `scripts/bench_cost.py --json`).
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

COST_TABLE = Path(__file__).with_name("cost_table.json")

# Evaluation phases, in the order a candidate meets them; "gpu" ones hold the GPU.
PHASES = ("compile", "inspect_wait", "queue_wait", "worker_start", "seeded_checks", "library_setup", "timed_pairs",
          "judging", "counted_runs", "executed_other", "other_gpu")
GPU_PHASES = ("worker_start", "seeded_checks", "library_setup", "timed_pairs", "judging", "counted_runs",
              "executed_other", "other_gpu")


def evaluation_phases(ev) -> dict[str, float]:
    """Where one evaluation's (tools.results.EvalResult) wall time went, by PHASES. The worker's
    own phases (per workload: verify, baseline, timed with judge inside) are summed over the
    workloads; what the workloads' round trips took beyond them (transfer, restore, the verdict
    messages) is other_gpu."""
    p = ev.phase_s
    w = {"verify": 0.0, "baseline": 0.0, "timed": 0.0, "judge": 0.0}
    for x in ev.workloads:
        for k in w:
            w[k] += float(x.phase_s.get(k, 0.0))
    counted = float(p.get("counted_runs", 0.0))
    workloads = float(p.get("workloads", 0.0))
    # The counted runs' padding (tools.counted: every other candidate run of a timed phase waits as long
    # as CUPTI's push and pop) happens inside the timed phases' wall and is charged to counted_runs, which
    # the credit op reports less the phases' own seconds: no second may be counted twice, so what the
    # parts add up to beyond the workloads' wall comes out of the timed pairs (H200, attention backward
    # expert: 1.9 s of 13.2 s, issue 43)
    twice = max(0.0, w["verify"] + w["baseline"] + w["timed"] + counted - workloads) if "workloads" in p else 0.0
    out = {"compile": float(p.get("compile", 0.0)), "inspect_wait": float(p.get("inspect_wait", 0.0)),
           "queue_wait": float(p.get("queue_wait", 0.0)), "worker_start": float(p.get("worker_start", 0.0)),
           "seeded_checks": w["verify"], "library_setup": w["baseline"],
           "timed_pairs": max(0.0, w["timed"] - w["judge"] - twice), "judging": w["judge"], "counted_runs": counted,
           "executed_other": max(0.0, float(p.get("executed", 0.0))) + float(p.get("sanitize", 0.0)),
           "other_gpu": max(0.0, workloads - counted - w["verify"] - w["baseline"] - w["timed"])}
    return {k: round(v, 4) for k, v in out.items()}


def gpu_seconds(phases: dict[str, float]) -> float:
    return sum(phases.get(k, 0.0) for k in GPU_PHASES)


class SweepCost(BaseModel):
    """A sweep's recorded GPU cost (every candidate's eval.json under its runs)."""

    evaluations: int = 0
    gpu_s: float = 0.0
    evals_per_gpu_minute: float | None = None  # None: nothing was evaluated on a GPU
    phase_s: dict[str, float] = Field(default_factory=dict)  # PHASES, summed

    def line(self) -> str:
        if not self.evaluations or not self.gpu_s:
            return f"GPU cost: {self.evaluations} evaluations, none on a GPU"
        top = sorted(((v, k) for k, v in self.phase_s.items() if k in GPU_PHASES), reverse=True)[:3]
        return (f"GPU cost: {self.evaluations} evaluations in {self.gpu_s:.0f} GPU-s, "
                f"{self.evals_per_gpu_minute:.1f} per GPU-minute (most in " +
                ", ".join(f"{k} {v:.0f} s" for v, k in top) + ")")

    def phases_line(self) -> str:
        """GPU seconds per phase, every phase."""
        return "GPU seconds per phase: " + ", ".join(f"{k} {self.phase_s.get(k, 0.0):.1f}" for k in GPU_PHASES)


def sweep_cost(runs_dir: str | Path, run_ids: list[str]) -> SweepCost:
    return runs_cost([Path(runs_dir) / rid for rid in run_ids])


def runs_cost(run_dirs: list[Path]) -> SweepCost:
    """Every recorded evaluation (candidates/*/eval.json) of these run folders."""
    from tools.results import EvalResult

    cost = SweepCost(phase_s={k: 0.0 for k in PHASES})
    for run_dir in run_dirs:
        for path in sorted((Path(run_dir) / "candidates").glob("*/eval.json")):
            try:
                ev = EvalResult.model_validate_json(path.read_text())
            except (OSError, ValueError):
                continue  # a half-written file of an interrupted run: resumed later, counted then
            if ev.run_status != "ok":
                continue  # nothing ran on a GPU (no GPU, did not compile)
            phases = evaluation_phases(ev)
            cost.evaluations += 1
            cost.gpu_s += gpu_seconds(phases)
            for k, v in phases.items():
                cost.phase_s[k] += v
    cost.phase_s = {k: round(v, 2) for k, v in cost.phase_s.items()}
    cost.gpu_s = round(cost.gpu_s, 2)
    cost.evals_per_gpu_minute = round(60 * cost.evaluations / cost.gpu_s, 2) if cost.gpu_s else None
    return cost


class CostTable(BaseModel):
    """Measured GPU seconds per evaluation (credit on, all workloads, warm), by task family and
    solution kind ("simple": far from the library, "expert": near it), and where they came from."""

    measured: str  # date, GPU, tree
    gpu_s: dict[str, dict[str, float]]  # family -> {"simple": s, "expert": s}
    worker_start_s: float = 0.0  # a cold worker, once per GPU


def load_table(path: str | Path = COST_TABLE) -> CostTable:
    return CostTable.model_validate_json(Path(path).read_text())


def family_of(task_name: str) -> str:
    """The cost table's family of a task (its name's op prefix)."""
    for prefix, family in (("fp8_gemm", "fp8_gemm"), ("fp8_mha", "fp8_attention"), ("gemm", "gemm"),
                           ("mha_fwd", "attention_fwd"), ("mha_bwd", "attention_bwd"), ("gdn", "gdn")):
        if task_name.startswith(prefix):
            return family
    return "other"


class CostEstimate(BaseModel):
    runs: int
    evaluations: int  # at most: every turn of every run, every sample
    gpu_s: float
    gpu_s_per_family: dict[str, float]
    table: str  # where the figures came from
    assumption: str

    def line(self, gpus: int = 1) -> str:
        hours = self.gpu_s / 3600 / max(1, gpus)
        on = f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"
        return (f"estimated GPU time: at most {self.evaluations} evaluations, {self.gpu_s / 60:.1f} GPU-minutes "
                f"({on} on {max(1, gpus)} GPU{'s' if gpus > 1 else ''}); "
                f"{self.assumption}; cost table: {self.table}")


def estimate(runs, table: CostTable, task_of=lambda r: r.task, evals_of=None) -> CostEstimate:
    """GPU time of `runs` (agent.sweep.SweepRun) if every run uses its whole turn budget: each
    evaluation costs the mean of its family's simple and expert figures (a sweep's candidates range
    from slow first drafts to kernels near the library), a family not in the table the mean of all."""
    per_family: dict[str, float] = {}
    allv = [v for kinds in table.gpu_s.values() for v in kinds.values()]
    fallback = sum(allv) / len(allv) if allv else 0.0
    n = 0
    for r in runs:
        k = evals_of(r) if evals_of else r.evaluations()
        fam = family_of(task_of(r))
        kinds = table.gpu_s.get(fam)
        each = sum(kinds.values()) / len(kinds) if kinds else fallback
        per_family[fam] = per_family.get(fam, 0.0) + k * each
        n += k
    total = sum(per_family.values())
    return CostEstimate(runs=len(runs), evaluations=n, gpu_s=round(total, 1),
                        gpu_s_per_family={k: round(v, 1) for k, v in per_family.items()}, table=table.measured,
                        assumption="each evaluation the mean of its family's simple and expert solutions, warm, "
                                   "credit on, all workloads")


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())
