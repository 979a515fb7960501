"""scripts/bench_cost.py without a GPU: which Evaluator each row runs in and how the row is labelled
(cold, "cold, worker up", warm), with a stand-in Evaluator that records its evaluations; and bad
arguments refused with exit 2."""
from __future__ import annotations

import json

import pytest

from scripts import bench_cost
from tools.results import CompileResult, EvalResult, InspectResult


class FakeEvaluator:
    made: list["FakeEvaluator"] = []

    def __init__(self, cache_dir=None):
        self.calls: list[tuple[str, str]] = []
        self.closed = False
        FakeEvaluator.made.append(self)

    def evaluate(self, sol, task, arch, workloads="all", executed_check=True):
        self.calls.append((task, arch))
        return EvalResult(task=task, arch=arch, compile=CompileResult(status="ok", arch=arch, language="cuda"),
                          inspect=InspectResult(status="ok", arch=arch), gpu="stand-in")

    def close(self):
        self.closed = True


@pytest.fixture
def fake(monkeypatch):
    import tools.evaluator

    FakeEvaluator.made = []
    monkeypatch.setattr(tools.evaluator, "Evaluator", FakeEvaluator)
    return FakeEvaluator


def rows(tmp_path, *flags) -> list[tuple[str, str, str]]:
    assert bench_cost.main(["--tasks", "gemm_n7168_k5120,mha_fwd_d128", "--solutions", "simple,expert",
                            "--modes", "cold,warm", "--out", str(tmp_path), *flags]) == 0
    data = json.loads((tmp_path / "bench_cost.json").read_text())
    return [(r["task"], r["solution"], r["mode"]) for r in data["rows"]]


def test_each_cold_row_starts_its_own_evaluator(fake, tmp_path):
    got = rows(tmp_path)
    assert [m for *_, m in got] == ["cold", "warm"] * 4
    assert len(fake.made) == 4 and all(e.closed for e in fake.made)


def test_share_worker_keeps_one_evaluator_per_task(fake, tmp_path):
    got = rows(tmp_path, "--share-worker")
    assert [m for *_, m in got] == ["cold", "warm", "cold, worker up", "warm"] * 2
    assert len(fake.made) == 2


def test_one_worker_keeps_one_evaluator_for_the_bench(fake, tmp_path):
    got = rows(tmp_path, "--one-worker")
    assert [m for *_, m in got] == ["cold", "warm"] + ["cold, worker up", "warm"] * 3
    assert len(fake.made) == 1 and fake.made[0].closed
    assert len(fake.made[0].calls) == 8


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert bench_cost.main(["--tasks", "no_such_task", "--out", str(tmp_path)]) == 2
    assert bench_cost.main(["--modes", "hot", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "bench_cost.json").exists()


def test_a_later_task_does_not_start_past_the_budget(fake, tmp_path, monkeypatch):
    """Each row "takes" 10 s of a 25 s budget: the first task's two rows run; the next task's first row
    is estimated from the longest so far and left out, not started blind."""
    now = [0.0]
    monkeypatch.setattr(bench_cost.time, "perf_counter", lambda: now[0])
    evaluate = FakeEvaluator.evaluate

    def slow(self, *a, **k):
        now[0] += 10.0
        return evaluate(self, *a, **k)

    monkeypatch.setattr(FakeEvaluator, "evaluate", slow)
    assert bench_cost.main(["--tasks", "gemm_n7168_k5120,mha_fwd_d128", "--solutions", "expert", "--modes",
                            "cold,warm", "--budget-s", "25", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_cost.json").read_text())
    gemm = "gemm_n7168_k5120"
    assert [(r["task"], r["mode"]) for r in data["rows"]] == [(gemm, "cold"), (gemm, "warm")]
    assert data["not_run"] == ["mha_fwd_d128/expert/cold", "mha_fwd_d128/expert/warm"]
