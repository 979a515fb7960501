"""Where a run that did not finish as planned went (audit 7): a sweep's runs that never started, and
each run the metrics leave out, stand in their cells with why, so a cell's count is the replicas its
sweep planned. The real sweep (scripted replies, no GPU needed) and the real report."""
from __future__ import annotations

import csv
import json
import socket
import threading
from pathlib import Path

from agent_loop_helpers import NO_CODE

from agent.report import write_report
from agent.sweep import load_sweep_config, run_sweep

SWEEP = """\
name = "s"
models = [{{spec = "scripted:prose.json", name = "prose", api_base = "http://127.0.0.1:{port}"}}]
tasks = ["gemm"]
contexts = ["none", "docs"]
replicas = 3
check_models = false
concurrency = 1

[budget]
max_turns = 1
"""
CELL = "s/prose/gemm_n7168_k5120/sm_90a"


def _sweep_whose_endpoint_goes(tmp_path: Path):
    """The model's endpoint answers the sweep's check and the first run's, then goes away: the runs
    after it are refused before they write a folder (agent.run.solve: cannot reach it)."""
    endpoint = socket.create_server(("127.0.0.1", 0))

    def answer_twice() -> None:
        for _ in range(2):  # the sweep's model check, then the first run's start
            endpoint.accept()[0].close()
        endpoint.close()

    server = threading.Thread(target=answer_twice, daemon=True)
    server.start()
    (tmp_path / "prose.json").write_text(json.dumps({"replies": [NO_CODE]}))
    (tmp_path / "sweep.toml").write_text(SWEEP.format(port=endpoint.getsockname()[1]))
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    result = run_sweep(cfg)
    server.join(timeout=10)
    return result


def test_runs_a_sweep_planned_that_never_started_stand_in_their_cells(tmp_path):
    """Before: the report read run folders only, so the cell of the none arm showed its one run as
    all there was (2 runs planned missing, no word), and the docs arm, whose runs all went, had no row."""
    result = _sweep_whose_endpoint_goes(tmp_path)
    assert [o.status for o in result.outcomes] == ["finished"] + ["error"] * 5
    assert all("cannot reach" in o.error for o in result.outcomes[1:])
    assert not (tmp_path / "runs" / f"{CELL}/none/r1").exists()

    report = write_report([tmp_path / "runs" / "s"], tmp_path / "report", [1])
    rows = {r.key[3]: r for r in report.rows}
    assert (rows["none"].runs, rows["none"].unfinished, rows["none"].left_out) == (1, 2, {"not started": 2})
    assert (rows["docs"].runs, rows["docs"].unfinished, rows["docs"].left_out) == (0, 3, {"not started": 3})
    assert rows["docs"].metrics["compiled"].rate is None  # n/a, never a 0% over runs that were never asked
    assert (report.runs, report.unfinished) == (6, 5)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| 1 (+2 unfinished: 2 not started) |" in md and "| 0 (+3 unfinished: 3 not started) |" in md
    assert "5 of them planned by their sweep and never started" in md
    assert f"{CELL}/docs/r2 (not started: its sweep planned it, it has no run folder)" in md
    with open(tmp_path / "report" / "report.csv") as f:
        by_arm = {row["context"]: row for row in csv.DictReader(f)}
    assert (by_arm["none"]["runs"], by_arm["none"]["unfinished"], by_arm["none"]["unfinished_why"]) == (
        "1", "2", "2 not started")

    # the same from a folder inside the sweep: its sweep.json is above it, and only the runs under it count
    inside = write_report([tmp_path / "runs" / "s" / "prose" / "gemm_n7168_k5120" / "sm_90a" / "none"],
                          tmp_path / "inside", [1])
    assert [(r.key[3], r.runs, r.unfinished) for r in inside.rows] == [("none", 1, 2)]
    # a copy of its plan elsewhere (a folder given beside it) plans the same runs, counted once
    (tmp_path / "copy" / "s").mkdir(parents=True)
    (tmp_path / "copy" / "s" / "sweep.json").write_bytes((tmp_path / "runs" / "s" / "sweep.json").read_bytes())
    twice = write_report([tmp_path / "runs" / "s", tmp_path / "copy"], tmp_path / "twice", [1])
    assert [(r.key[3], r.runs, r.unfinished) for r in twice.rows] == [("docs", 0, 3), ("none", 1, 2)]
    # and from the sweep's folder moved elsewhere: its plan goes with it
    moved = (tmp_path / "runs" / "s").rename(tmp_path / "kept")
    assert [(r.key[3], r.runs, r.unfinished) for r in write_report([moved], tmp_path / "m", [1]).rows] == [
        ("docs", 0, 3), ("none", 1, 2)]


def test_a_plan_this_checkout_cannot_expand_is_a_note_with_its_count(tmp_path):
    """A sweep.json whose config no longer expands here (a task renamed since) cannot place its runs
    that never started in cells: the report says how many there are instead of dropping them."""
    _sweep_whose_endpoint_goes(tmp_path)
    plan = tmp_path / "runs" / "s" / "sweep.json"
    data = json.loads(plan.read_text())
    data["config"]["tasks"] = ["gemm_renamed_since"]
    plan.write_text(json.dumps(data))
    report = write_report([tmp_path / "runs" / "s"], tmp_path / "report", [1])
    assert [(r.key[3], r.runs, r.unfinished) for r in report.rows] == [("none", 1, 0)]
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"5 runs that {plan.resolve()} planned never started and are in no cell: unknown task" in md, md[:3000]
    plan.write_text("{")  # torn
    md = (write_report([tmp_path / "runs" / "s"], tmp_path / "report", [1]), (tmp_path / "report" / "report.md"))[1]
    assert f"{plan.resolve()} cannot be read" in md.read_text()
