"""Synthetic trajectories for report and fixit tests, written with the real TrajectoryWriter.

GPU verdicts (runtime errors, wrong numbers, speedups) cannot be produced on a CPU
machine, so the EvalResults here are built by hand, one per kind of outcome; each run's
CandidateRecords come from agent.feedback.candidate_record, as in the agent loop.
"""
from __future__ import annotations

from pathlib import Path

from agent.feedback import candidate_record
from agent.trajectory import (Budget, RunConfig, RunSummary, TrajectoryWriter, TurnRecord, candidate_relpath)
from tools.results import (CompileResult, EvalResult, ExecutedCheck, FeatureVerdict, InspectResult, Mismatch,
                           WorkloadResult)
from tools.solution import LaunchManifest, Solution

GEMM = "gemm_n7168_k5120"
ATTN = "mha_fwd_d128"
FEATURES = ["wgmma", "tma"]

KINDS = ("compile", "nofeat", "unverified", "runtime", "numerical", "timeout", "correct", "correct_nofeat")


def eval_result(kind: str, task: str = GEMM, arch: str = "sm_90a", speedup: float | None = None) -> EvalResult:
    """An EvalResult of one kind: compile | nofeat | unverified (CPU) | runtime | numerical |
    timeout | correct | correct_nofeat | correct_unchecked (GPU). A GPU kernel that ran to the end
    has the executed check's verdict (its features counted doing the work where it has them),
    but correct_unchecked: correct with the features in its SASS, the executed check not run."""
    if kind == "compile":
        comp = CompileResult(status="failed", arch=arch, language="cuda", error="nvrtc: expected a ';'")
        return EvalResult(task=task, arch=arch, compile=comp, requested_features=FEATURES, run_reason="did not compile",
                          inspect=InspectResult(status="skipped", reason="did not compile", arch=arch))
    comp = CompileResult(status="ok", arch=arch, language="cuda")
    has = kind not in ("nofeat", "correct_nofeat")
    insp = InspectResult(status="ok", arch=arch, features={f: FeatureVerdict(present=has) for f in FEATURES})
    ev = EvalResult(task=task, arch=arch, compile=comp, inspect=insp, requested_features=FEATURES)
    if kind in ("nofeat", "unverified"):
        ev.run_status, ev.run_reason = "skipped", "no GPU: nvidia-smi not found"
        return ev
    ok = kind in ("correct", "correct_nofeat", "correct_unchecked")
    reason = {"runtime": "cuda_error", "numerical": "incorrect", "timeout": "timeout"}.get(kind)
    ev.run_status = "ok" if kind != "runtime" else "failed"
    ev.workloads = [WorkloadResult(
        workload="w0", split="visible", axes={"M": 128}, status="passed" if ok else "failed", reason=reason,
        outputs=[Mismatch(output="C", max_abs_err=0.0 if ok else 3.0, max_rel_err=0.0 if ok else 1.0,
                          mismatch_frac=0.0 if ok else 0.5, passed=ok)],
        speedup=speedup if ok else None)]
    ev.speedup = speedup if ok else None
    if kind in ("correct", "correct_nofeat", "numerical"):
        ev.executed = ExecutedCheck(status="ok", executed={f: has for f in FEATURES}, carries={f: has for f in FEATURES})
    return ev


def kernel(tag: str, body: str = "") -> Solution:
    """A small distinct kernel per tag (distinct enough not to count as near-duplicates)."""
    words = " ".join(f"v_{tag}_{i} = v_{tag}_{i} * {i + 3} + {len(tag) + i};" for i in range(12))
    src = (f'extern "C" __global__ void k_{tag}(float* out) {{\n  float v_{tag}_0 = out[0];\n'
           + "".join(f"  float v_{tag}_{i} = v_{tag}_{i - 1};\n" for i in range(1, 12))
           + f"  {words}\n  {body}\n  out[threadIdx.x] = v_{tag}_11;\n}}\n")
    return Solution(language="cuda", source=src,
                    manifest=LaunchManifest.model_validate({"launches": [{"kernel": f"k_{tag}", "grid": [1],
                                                                          "block": [32], "args": []}]}))


def reply_for(solution: Solution, reasoning: str) -> str:
    return (f"{reasoning}\n\n```cuda\n{solution.source}```\n\n```json\n"
            f"{solution.manifest.model_dump_json(indent=2, exclude_defaults=True)}\n```\n")


def write_run(runs_dir: Path, run_id: str, turns: list[list[tuple]], *, task: str = GEMM, arch: str = "sm_90a",
              model: str = "scripted:weak", context: str = "docs", status: str = "finished",
              evaluation: str = "ok") -> Path:
    """turns: per turn, a list of samples (solution | None, EvalResult | None, reply text)."""
    run_dir = runs_dir / run_id
    w = TrajectoryWriter(run_dir)
    w.write_config(RunConfig(run_id=run_id, task=task, arch=arch, model=model, context=context,
                             budget=Budget(max_turns=max(1, len(turns))), requested_features=FEATURES))
    per_turn, best = [], None
    for t, samples in enumerate(turns, 1):
        records = []
        for s, (solution, ev, reply) in enumerate(samples):
            cdir = w.candidate_dir(t, s)
            cdir.mkdir(parents=True, exist_ok=True)
            (cdir / "reply.md").write_text(reply)
            if solution is not None:
                solution.to_dir(cdir)
            if ev is not None:
                (cdir / "eval.json").write_text(ev.model_dump_json(indent=2))
            rec = candidate_record(t, s, candidate_relpath(t, s), ev,
                                   None if solution is not None else "no fenced code block")
            records.append(rec)
            if rec.outcome in ("correct_with_arch", "unverified") and best is None:
                best = rec
        w.event("feedback", turn=t, kind="repair", text=f"## Result of turn {t}\n\nfeedback for turn {t}\n")
        per_turn.append(TurnRecord(turn=t, candidates=records, chosen=0, action="repair", best=best))
    w.write_summary(RunSummary(run_id=run_id, task=task, arch=arch, model=model, context=context, status=status,
                               stop_reason="max_turns", turns=len(turns), per_turn=per_turn, best=best,
                               evaluation=evaluation))
    return run_dir
