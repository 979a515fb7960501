"""The worker's decisions behind every speedup and every timed verdict (tools/worker.py, tools/timed.py, tools/workspace.py), run on
CPU through its public entry (`run_workload`, the stand-in state of test_evaluator_cpu):

- the library baseline: every backend timed, the fastest kept (and cached), later evaluations
  time only the cached one. Issue 46's planted bug: the slowest chosen and cached, which
  inflates every speedup, fast_p and SOL score.
- the timed runs' judge: each sampled check compares `tasks.sampled.rows_for(task)` rows of each
  output (GEMM 1024, attention 256: docs/METHODOLOGY.md's catch table). Planted bug: 64 rows.
"""
from __future__ import annotations

import json
import random
import time

import pytest

from test_evaluator_cpu import FIXTURES, CpuState, gemm, small_gemm
from tasks import TASKS, get_task
from tasks.schema import Workload
from tools import worker, workspace
from tools.solution import Solution

# What each fake backend costs per run (s): busy-waited, so the order is real wall time.
COST = {"slow": 0.004, "fast": 0.0, "mid": 0.002}


def _request(task, cache=None) -> dict:
    sol = Solution.from_dir(FIXTURES / "good")
    req = {"cubin": b"", "manifest": sol.manifest.model_dump(mode="json"), "task": task.model_dump(mode="json"),
           "workload": task.workloads[0].model_dump(mode="json"), "seeds": [11, 12], "time": True,
           "timing_seed": 7, "timing_budget_s": 0.01}
    if cache is not None:
        req["baseline_cache"] = str(cache)
    return req


@pytest.fixture
def backends(monkeypatch):
    """Three library backends of known cost, listed slowest first; records which ran."""
    import tasks.families.baselines as B

    ran: list[str] = []

    def make(task, inputs, name=None):
        def run():
            ran.append(name)
            t = time.perf_counter()
            while time.perf_counter() - t < COST[name]:
                pass
            return {}
        return B.Baseline(name, run, f"fake {name}")

    monkeypatch.setattr(B, "list_backends", lambda task: ["slow", "mid", "fast"])
    monkeypatch.setattr(B, "make_baseline", make)
    return ran


def test_the_fastest_library_backend_is_chosen_cached_and_reused(backends, tmp_path):
    cache = tmp_path / "baselines.json"
    result, fatal = worker.run_workload(CpuState(gemm), _request(small_gemm(), cache))
    assert not fatal and result["status"] == "passed", result
    assert result["baseline_name"] == "fast"
    (entry,) = json.loads(cache.read_text()).values()
    assert entry["best"] == "fast" and set(entry["backends"]) == set(COST)
    assert entry["backends"]["fast"] < entry["backends"]["mid"] < entry["backends"]["slow"]
    # a later evaluation of the same workload times only the cached backend
    backends.clear()
    result, _ = worker.run_workload(CpuState(gemm), _request(small_gemm(), cache))
    assert result["baseline_name"] == "fast" and set(backends) == {"fast"}


def test_without_a_cache_the_fastest_backend_is_still_the_one_timed(backends):
    result, _ = worker.run_workload(CpuState(gemm), _request(small_gemm()))
    assert result["baseline_name"] == "fast"


def test_a_cached_backend_is_trusted_only_while_the_task_still_lists_it(backends, tmp_path):
    """A cache naming a backend the task no longer lists is ignored: every backend is timed again."""
    cache = tmp_path / "baselines.json"
    worker.run_workload(CpuState(gemm), _request(small_gemm(), cache))
    data = json.loads(cache.read_text())
    for entry in data.values():
        entry["best"] = "gone"
    cache.write_text(json.dumps(data))
    backends.clear()
    result, _ = worker.run_workload(CpuState(gemm), _request(small_gemm(), cache))
    assert result["baseline_name"] == "fast" and set(backends) == set(COST)


def test_every_timed_run_of_a_gemm_is_judged_on_1024_rows(monkeypatch):
    """The rows each sampled check draws, seen where they are drawn (tasks.sampled.sample), on a
    GEMM with 2048 rows so that 1024 is a real draw and not the whole output."""
    import tasks.sampled as S

    drawn: list[int] = []
    real = S.sample

    def spy(task, inputs, gen, rows):
        out = real(task, inputs, gen, rows)
        drawn.extend(len(s.rows) for s in out.values())
        return out

    monkeypatch.setattr(S, "sample", spy)
    task = small_gemm()
    task.workloads = [Workload(name="M2048", axes={"M": 2048})]
    result, _ = worker.run_workload(CpuState(gemm), _request(task))
    assert result["status"] == "passed", result
    sampled = result["timed_runs"] + result["warmup_runs"] - result["full_checks"]
    # at least 10 timed pairs, 1-2 of them judged whole; no warm-up where the first pair is slow (CPU)
    assert sampled >= 8 and drawn == [1024] * sampled


def test_the_timed_judge_draws_the_rows_its_task_declares():
    """GEMMs 1024 rows, attention 256 (its rows gather a head's S x D keys and values, in chunks),
    every other family judged whole on every run, so its row count is never used (64)."""
    expected = {"gemm": 1024, "fp8_gemm": 1024, "mha_fwd": 256, "fp8_mha_fwd": 256, "mha_bwd": 256}
    for name, task in TASKS.items():
        judge = workspace.TimedJudge(task, {}, None, random.Random(0), "cpu")
        assert judge.rows == expected.get(task.op_type, workspace.SAMPLED_ROWS), name
        assert judge.sampled == (task.op_type in expected), name
    assert workspace.SAMPLED_ROWS == 64
    assert workspace.TimedJudge(get_task("mha_bwd_d128"), {}, None, random.Random(0), "cpu", rows=8).rows == 8
