"""agent report: metrics at turn limits with intervals, n/a for unchecked verdicts, files and plots."""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest
from trajectory_fixtures import ATTN, GEMM, eval_result, kernel, reply_for, write_run

from agent.report import (PLOTS, Proportion, bootstrap_geomean_ci, load_runs, run_metrics, summarise,
                          write_report)


def _c(kind: str, tag: str, speedup: float | None = None, task: str = GEMM):
    s = kernel(tag)
    return (s, eval_result(kind, task=task, speedup=speedup), reply_for(s, f"attempt {tag}"))


@pytest.fixture()
def runs(tmp_path):
    root = tmp_path / "runs" / "demo"
    # A GPU cell: three replicas of one model on GEMM with docs.
    write_run(root, "good/gemm/docs/r0", [[_c("compile", "a0")], [_c("correct", "a1", 0.9)]])
    write_run(root, "good/gemm/docs/r1", [[_c("correct", "b0", 1.2)], [_c("correct", "b1", 1.1)]])
    write_run(root, "good/gemm/docs/r2", [[_c("numerical", "c0")], [_c("runtime", "c1")]])
    # A CPU cell: nothing could be run, correctness unknown.
    write_run(root, "good/gemm/none/r0", [[_c("compile", "d0")], [_c("unverified", "d1")]], context="none",
              evaluation="skipped: no GPU")
    write_run(root, "good/gemm/none/r1", [[_c("nofeat", "e0")], [_c("unverified", "e1")]], context="none",
              evaluation="skipped: no GPU")
    # A run that never finished is counted apart, not in the metrics.
    write_run(root, "good/attn/docs/r0", [[_c("correct", "f0", 2.0, task=ATTN)]], task=ATTN, status="running")
    return root


def test_run_metrics_follow_turn_limits(runs):
    by_id = {r.config.run_id: r for r in load_runs([runs])}
    r0 = by_id["good/gemm/docs/r0"].summary
    at1, at2 = run_metrics(r0, 1), run_metrics(r0, 2)
    assert at1.values["compiled"] is False and at1.values["correct"] is False and at1.speedup is None
    assert at2.values["cwa"] is True and at2.values["fast_0.8"] is True and at2.values["fast_1"] is False
    assert at2.speedup == 0.9
    # Best speedup within the limit, not the last one.
    assert run_metrics(by_id["good/gemm/docs/r1"].summary, 2).speedup == 1.2
    cpu = run_metrics(by_id["good/gemm/none/r0"].summary, 2)
    assert cpu.values["compiled"] is True and cpu.values["arch_sass"] is True
    assert cpu.values["correct"] is None and cpu.values["cwa"] is None and cpu.values["fast_0"] is None
    # A compile failure is settled as "not correct" even without a GPU.
    assert run_metrics(by_id["good/gemm/none/r0"].summary, 1).values["correct"] is False


def test_cells_proportions_and_unknowns(runs):
    rows = {(r.key, r.turn_limit): r for r in summarise(load_runs([runs]), [1, 2])}
    gpu1 = rows[(("scripted:weak", GEMM, "sm_90a", "docs", "linear", "off", "full", "on"), 1)]
    assert gpu1.runs == 3
    assert (gpu1.metrics["compiled"].successes, gpu1.metrics["compiled"].n) == (2, 3)
    assert (gpu1.metrics["cwa"].successes, gpu1.metrics["cwa"].n) == (1, 3)
    assert gpu1.speedups == [1.2]
    gpu2 = rows[(("scripted:weak", GEMM, "sm_90a", "docs", "linear", "off", "full", "on"), 2)]
    assert (gpu2.metrics["correct"].successes, gpu2.metrics["fast_1"].successes) == (2, 1)
    assert gpu2.speedup == pytest.approx(math.sqrt(0.9 * 1.2))
    cpu = rows[(("scripted:weak", GEMM, "sm_90a", "none", "linear", "off", "full", "on"), 2)]
    assert cpu.metrics["correct"].rate is None and cpu.metrics["correct"].unknown == 2
    assert cpu.metrics["arch_sass"].rate == 1.0
    unfinished = rows[(("scripted:weak", ATTN, "sm_90a", "docs", "linear", "off", "full", "on"), 1)]
    assert unfinished.runs == 0 and unfinished.unfinished == 1 and unfinished.metrics["cwa"].rate is None


def test_wilson_and_bootstrap():
    lo, hi = Proportion(8, 10, 0).wilson()
    assert (round(lo, 3), round(hi, 3)) == (0.49, 0.943)
    assert Proportion(0, 5, 0).wilson()[0] == 0.0
    assert Proportion(0, 0, 3).wilson() is None
    ci = bootstrap_geomean_ci([0.5, 1.0, 2.0, 1.5])
    assert ci[0] < 1.0 < ci[1] and bootstrap_geomean_ci([0.5, 1.0, 2.0, 1.5]) == ci  # seeded
    assert bootstrap_geomean_ci([1.0]) is None


def test_report_files_and_cli(runs, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "report", str(runs), "--out", str(out),
                           "--turn-limits", "1,2", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["runs"] == 6 and data["unfinished"] == 1
    for name in ("report.md", "report.html", "report.csv", "fast_p.png", "speedup_by_turn.png", "context.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "fast_p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(open(out / "report.csv")))
    assert len(rows) == 3 * 2  # three cells x two turn limits
    cpu = next(r for r in rows if r["context"] == "none" and r["turn_limit"] == "2")
    assert cpu["correct"] == "n/a" and cpu["cwa"] == "n/a" and cpu["speedup_geomean"] == "n/a"
    assert cpu["compiled"] == "1.0" and cpu["correct_unknown"] == "2"
    gpu = next(r for r in rows if r["context"] == "docs" and r["task"] == GEMM and r["turn_limit"] == "2")
    assert float(gpu["correct"]) == pytest.approx(2 / 3, abs=1e-4) and gpu["correct_n"] == "3"
    md = (out / "report.md").read_text()
    assert "![fast_p](fast_p.png)" in md and "n/a" in md and "## Turn limit 2" in md
    html = (out / "report.html").read_text()
    # the runs vary the context, not the profile feedback: no profile plot (issue 23)
    assert html.count("data:image/png;base64,") == 3 and len(PLOTS) == 5 and "class='na'" in html
    assert not (out / "profile.png").exists() and "profile.png" not in md


def test_report_refuses_empty(tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        write_report([tmp_path], tmp_path / "out")


def test_speed_is_credited_only_where_the_instructions_were_counted_doing_the_work(tmp_path):
    """A correct kernel with wgmma + TMA in its SASS whose executed check did not run buys the
    static correct+arch column, never fast_p or a speedup: those are unknown (n/a), not a pass."""
    root = tmp_path / "runs"
    write_run(root, "m/gemm/docs/r0", [[_c("correct_unchecked", "u0", 3.0)]])
    write_run(root, "m/gemm/docs/r1", [[_c("correct", "v0", 1.5)]])
    by_id = {r.config.run_id: r for r in load_runs([root])}
    unchecked = run_metrics(by_id["m/gemm/docs/r0"].summary, 1)
    assert unchecked.values["cwa"] is True and unchecked.values["cwa_executed"] is None
    assert unchecked.values["fast_0"] is None and unchecked.values["fast_1"] is None and unchecked.speedup is None
    checked = run_metrics(by_id["m/gemm/docs/r1"].summary, 1)
    assert checked.values["cwa_executed"] is True and checked.values["fast_1"] is True and checked.speedup == 1.5
    [row] = [r for r in summarise(list(by_id.values()), [1])]
    assert row.metrics["fast_1"].n == 1 and row.metrics["fast_1"].successes == 1  # the unchecked run is not counted
    assert row.speedup == pytest.approx(1.5)


def test_held_out_sizes_are_a_column_of_their_own(tmp_path):
    """A kernel right on the visible sizes and wrong on the held-out ones counts as correct, not
    as correct on the held-out sizes too (the generalisation question)."""
    from tools.results import WorkloadResult

    def with_held_out(passed: bool):
        s = kernel(f"h{passed}")
        ev = eval_result("correct", speedup=1.0)
        ev.workloads.append(WorkloadResult(workload="w1", split="held_out", axes={"M": 77},
                                           status="passed" if passed else "failed",
                                           reason=None if passed else "incorrect"))
        return (s, ev, reply_for(s, "attempt"))

    root = tmp_path / "runs"
    write_run(root, "m/gemm/docs/r0", [[with_held_out(False)]])
    write_run(root, "m/gemm/docs/r1", [[with_held_out(True)]])
    by_id = {r.config.run_id: r for r in load_runs([root])}
    fitted, general = (run_metrics(by_id[f"m/gemm/docs/r{i}"].summary, 1) for i in (0, 1))
    assert fitted.values["correct"] is True and fitted.values["correct_held_out"] is False
    assert general.values["correct_held_out"] is True
    [row] = summarise(list(by_id.values()), [1])
    assert (row.metrics["correct_held_out"].successes, row.metrics["correct_held_out"].n) == (1, 2)
    report = write_report([root], tmp_path / "report", [1])
    assert "correct held-out too" in report.files["md"].read_text()
