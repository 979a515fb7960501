"""scripts/probe_credit_cost.py (issue 42 item 7's two levers, measured on a GPU) on CPU stand-ins: bad input
is one line and exit 2; the whole path (each keep-enabled setting in a worker of its own, started with the
environment variable the worker reads, each budget, the summaries, the spreads, the JSON) runs, so the GPU
call that runs it cannot end in a typo."""
from __future__ import annotations

import importlib.util
import json
import os
from types import SimpleNamespace

import pytest

from script_cli import ROOT, assert_refused


def probe():
    spec = importlib.util.spec_from_file_location("probe_credit_cost", ROOT / "scripts" / "probe_credit_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("args", [["--budgets", "1.0,x"], ["--budgets", "0"], ["--evals", "0"], ["--keep", "maybe"],
                                  ["--task", "no_such_task"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    out = tmp_path / "probe.json"
    assert_refused("probe_credit_cost.py", [*args, "--json", str(out)], out)


class StandIn:
    """An Evaluator whose worker 'starts' in __enter__ (where the real one reads the environment)."""

    def __init__(self):
        self.timing_budget_s = 1.0

    def __enter__(self):
        from tools.cupti import KEEP_ENABLED_ENV

        self.keep = os.environ.get(KEEP_ENABLED_ENV)
        return self

    def __exit__(self, *exc):
        return False


def test_the_probe_runs_end_to_end_on_stand_ins(monkeypatch, tmp_path, capsys):
    from tools import evaluator
    from tools.cupti import KEEP_ENABLED_ENV

    seen = []

    class Evaluates(StandIn):
        def evaluate(self, solution, task, arch, workloads="visible", executed_check=False):
            assert workloads == "all" and executed_check and arch == "sm_90a"
            seen.append((self.keep, self.timing_budget_s))
            n = len(seen)
            cost = 1.5 if self.keep == "0" else 1.2
            return SimpleNamespace(
                correct=True, correct_with_arch=True,
                phase_s={"counted_runs": cost * self.timing_budget_s, "counted_runs.padding": 0.9,
                         "counted_runs.pass_boundaries": 0.38 if self.keep == "0" else 0.1},
                workloads=[SimpleNamespace(workload=w, timed_runs=int(60 * self.timing_budget_s), speedup=s + n / 1000,
                                           status="passed", reason=None, detail=None)
                           for w, s in (("M8192", 1.0), ("M70", 0.9))])

    monkeypatch.setattr(evaluator, "Evaluator", Evaluates)
    monkeypatch.setenv(KEEP_ENABLED_ENV, "as before")
    out = tmp_path / "probe.json"
    assert probe().main(["--evals", "2", "--budgets", "1.0,0.25", "--json", str(out)]) == 0
    assert seen == [("0", 1.0), ("0", 1.0), ("0", 0.25), ("0", 0.25), ("1", 1.0), ("1", 1.0), ("1", 0.25), ("1", 0.25)]
    figures = json.loads(out.read_text())
    assert sorted(figures) == ["keep=off budget=0.25", "keep=off budget=1.0", "keep=on budget=0.25", "keep=on budget=1.0"]
    one = figures["keep=on budget=0.25"]
    assert [e["counted_s"] for e in one["evals"]] == [0.3, 0.3] and one["evals"][0]["parts"]["pass_boundaries"] == 0.1
    assert one["evals"][0]["pairs"] == {"M8192": 15, "M70": 15}
    assert one["spread"]["M70"] == {"median": 0.9075, "range": round(0.908 / 0.907 - 1, 4), "all": [0.907, 0.908]}
    assert "keep=on budget=0.25: counted runs [0.3, 0.3] s" in capsys.readouterr().out
    assert os.environ[KEEP_ENABLED_ENV] == "as before"  # the probe's setting ends with it


def test_a_worker_that_dies_is_the_finding_and_the_rest_still_runs(monkeypatch, tmp_path):
    from tools import evaluator
    from tools.cupti import KEEP_ENABLED_ENV

    class Dies(StandIn):
        def evaluate(self, *a, **k):
            if self.keep == "1":
                raise RuntimeError("the worker died (stand-in)")
            return SimpleNamespace(correct=True, correct_with_arch=True, phase_s={"counted_runs": 1.5},
                                   workloads=[SimpleNamespace(workload="M70", timed_runs=60, speedup=0.9,
                                                              status="passed", reason=None, detail=None)])

    monkeypatch.setattr(evaluator, "Evaluator", Dies)
    monkeypatch.delenv(KEEP_ENABLED_ENV, raising=False)
    out = tmp_path / "probe.json"
    assert probe().main(["--evals", "1", "--budgets", "1.0", "--keep", "on,off", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["keep=on"]["error"] == "RuntimeError: the worker died (stand-in)"
    assert figures["keep=off budget=1.0"]["evals"][0]["counted_s"] == 1.5
    assert KEEP_ENABLED_ENV not in os.environ
