"""A sweep says what it costs: one evaluation's phases (agent/cost.py), a sweep's GPU seconds and
evaluations per GPU-minute from its recorded eval.json files, and `agent sweep --dry-run`'s
estimate from the recorded cost table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent.cost import GPU_PHASES, PHASES, estimate, evaluation_phases, family_of, gpu_seconds, load_table, sweep_cost
from tools.results import CompileResult, EvalResult, InspectResult, WorkloadResult

ROOT = Path(__file__).resolve().parents[1]


def _ev(workloads_s: float = 7.0, counted: float = 1.0) -> EvalResult:
    ev = EvalResult(task="gemm_n7168_k5120", arch="sm_90a", compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                    inspect=InspectResult(status="ok", arch="sm_90a"), run_status="ok")
    ev.phase_s = {"compile": 1.0, "inspect_wait": 0.1, "queue_wait": 2.0, "worker_start": 3.0,
                  "workloads": workloads_s, "counted_runs": counted, "executed": 0.05}
    for name in ("M1", "M2"):
        ev.workloads.append(WorkloadResult(workload=name, split="visible", axes={"M": 1}, status="passed",
                                           phase_s={"verify": 0.5, "baseline": 0.25, "timed": 2.0, "judge": 0.5}))
    return ev


def test_an_evaluations_phases_add_up_to_its_gpu_time():
    p = evaluation_phases(_ev())
    assert set(p) == set(PHASES)
    assert p["seeded_checks"] == 1.0 and p["library_setup"] == 0.5 and p["judging"] == 1.0
    assert p["timed_pairs"] == 3.0  # timed less the judging inside it
    assert p["other_gpu"] == 7.0 - 1.0 - 1.0 - 0.5 - 4.0  # the round trips beyond the worker's own phases
    # GPU seconds: worker start + the workloads' round trips (counted runs inside) + executed
    assert abs(gpu_seconds(p) - (3.0 + 7.0 + 0.05)) < 1e-6
    assert "compile" not in GPU_PHASES and "queue_wait" not in GPU_PHASES


def test_padding_inside_the_timed_phases_is_not_counted_twice():
    """The counted runs' padding is inside the timed phases' wall and in counted_runs: the parts never add
    up to more than the evaluation held the GPU (H200: 15.0 s of parts for a 13.2 s evaluation before)."""
    ev = _ev(workloads_s=5.0, counted=1.5)  # parts: 1.0 + 0.5 + 4.0 + 1.5 = 7.0, of which 2.0 counted twice
    p = evaluation_phases(ev)
    assert p["timed_pairs"] == 3.0 - 2.0 and p["counted_runs"] == 1.5 and p["other_gpu"] == 0.0
    assert abs(gpu_seconds(p) - (3.0 + 5.0 + 0.05)) < 1e-6


def test_a_sweeps_cost_reads_every_recorded_evaluation(tmp_path):
    for rid, n in (("s/a/r0", 2), ("s/b/r0", 1)):
        for k in range(n):
            d = tmp_path / rid / "candidates" / f"{k + 1}-0"
            d.mkdir(parents=True)
            (d / "eval.json").write_text(_ev(workloads_s=7.0).model_dump_json())
    (tmp_path / "s/b/r0/candidates/9-0").mkdir()
    (tmp_path / "s/b/r0/candidates/9-0/eval.json").write_text("{half written")
    cost = sweep_cost(tmp_path, ["s/a/r0", "s/b/r0", "s/missing/r0"])
    assert cost.evaluations == 3 and abs(cost.gpu_s - 3 * 10.05) < 0.01
    assert abs(cost.evals_per_gpu_minute - 60 * 3 / 30.15) < 0.01
    assert "3 evaluations in 30 GPU-s" in cost.line()
    assert sweep_cost(tmp_path, []).evals_per_gpu_minute is None


def test_the_estimate_uses_the_recorded_table():
    table = load_table()
    assert {"gemm", "attention_fwd", "attention_bwd"} <= set(table.gpu_s)
    assert family_of("mha_bwd_d128_causal") == "attention_bwd" and family_of("fp8_mha_with_lse_d64") == "fp8_attention"

    class Run:
        def __init__(self, task):
            self.task = task

    est = estimate([Run("gemm_n7168_k5120"), Run("mha_fwd_d128")], table, evals_of=lambda r: 8)
    gemm = sum(table.gpu_s["gemm"].values()) / 2 * 8
    fwd = sum(table.gpu_s["attention_fwd"].values()) / 2 * 8
    assert est.evaluations == 16 and abs(est.gpu_s - (gemm + fwd)) < 0.2


def test_dry_run_prints_the_estimate(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "agent.cli", "sweep", str(ROOT / "docs/examples/sweep_gpu_ray.toml"), "--dry-run",
           "--runs-dir", str(tmp_path)]
    text = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "8 runs" in text.stdout and "estimated GPU time: at most 16 evaluations" in text.stdout, text.stdout
    got = subprocess.run(cmd + ["--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    est = json.loads(got.stdout)["estimate"]
    assert est["evaluations"] == 16 and est["gpu_s"] > 0 and set(est["gpu_s_per_family"]) == {"gemm", "attention_fwd"}


def test_the_report_says_what_the_runs_cost(tmp_path):
    """agent report: evaluations per GPU-minute and GPU seconds per phase, in report.md and --json."""
    sys.path.insert(0, str(ROOT / "tests"))
    from trajectory_fixtures import GEMM, eval_result, kernel, reply_for, write_run

    from agent.report import report_json, write_report

    root = tmp_path / "runs" / "demo"

    def cand(tag):
        ev = eval_result("correct", task=GEMM, speedup=0.9)
        return kernel(tag), ev, reply_for(kernel(tag), tag)

    write_run(root, "m/gemm/docs/r0", [[cand("a0")], [cand("a1")]])
    for path in root.rglob("eval.json"):  # as an evaluation on a GPU records its phases
        ev = EvalResult.model_validate_json(path.read_text())
        ev.run_status, ev.phase_s = "ok", {"worker_start": 0.0, "workloads": 3.0, "counted_runs": 0.5}
        path.write_text(ev.model_dump_json())
    rep = write_report([root], tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    n = len(list(root.rglob("eval.json")))
    assert n >= 2 and f"GPU cost: {n} evaluations in {3 * n} GPU-s, 20.0 per GPU-minute" in md
    assert "GPU seconds per phase: worker_start 0.0, seeded_checks 0.0" in md and "counted_runs 1.0" in md
    assert report_json(rep)["cost"]["evaluations"] == n


def test_worker_start_and_queue_wait_are_apart(tmp_path, monkeypatch):
    """The first evaluation pays the worker's start; the next finds it up. Waiting for a GPU another
    evaluation holds is queue_wait, never worker_start (a sweep of 8 runs on one GPU once showed
    286 s of "worker start" that was the queue)."""
    import threading

    from test_evaluator_cpu import FIXTURES, small_gemm

    from tools.evaluator import Evaluator
    from tools.solution import Solution

    mode = tmp_path / "mode"
    mode.write_text("pass")
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(mode))
    sol = Solution.from_dir(FIXTURES / "good")
    with Evaluator(gpus=[0], worker_cmd=[sys.executable, str(ROOT / "tests" / "fake_worker.py")], timeout_s=30,
                   cache_dir=tmp_path) as ev:
        first = ev.evaluate(sol, small_gemm(), "sm_90a", time=False)
        second = ev.evaluate(sol, small_gemm(), "sm_90a", time=False)
        # a third waits while the test holds the GPU's worker for 0.5 s
        held = threading.Event()

        def hold():
            with ev._worker():
                held.set()
                import time as _t
                _t.sleep(0.5)

        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        third = ev.evaluate(sol, small_gemm(), "sm_90a", time=False)
        t.join()
    assert first.phase_s["worker_start"] > 0.05 and first.phase_s["queue_wait"] < 0.05
    assert second.phase_s["worker_start"] < 0.05
    assert third.phase_s["queue_wait"] >= 0.4 and third.phase_s["worker_start"] < 0.05
    assert evaluation_phases(third)["queue_wait"] >= 0.4 and gpu_seconds(evaluation_phases(third)) < 0.4
