"""The Fixit finding "diverse data beats more data" needs sets of equal size that differ only in how
widely they are drawn: `--max-examples N` keeps the first N of the balanced order (spread over tasks,
then error classes and turns), `--task` draws the same N from fewer tasks. Real run folders, the real
CLI, no GPU."""
from __future__ import annotations

import json
import subprocess
import sys

from test_fixit import _fixture_runs
from trajectory_fixtures import ATTN, GEMM

from agent.fixit.build import BuildOptions, build


def _rows(folder):
    return [json.loads(x) for x in (folder / "train.jsonl").read_text().splitlines()]


def test_a_capped_set_is_spread_over_tasks_and_errors(tmp_path):
    root = _fixture_runs(tmp_path / "runs")  # 5 GEMM pairs (five error classes), 2 attention pairs
    wide = build([root], tmp_path / "wide", BuildOptions(max_examples=4, seed=3))
    # tasks first: a task with five strata does not crowd out one with two
    assert wide.examples == 4 and wide.card["by_task"] == {ATTN: 2, GEMM: 2}, wide.card["by_task"]
    assert wide.card["dropped"]["over_max_examples"] == 3 and wide.card["options"]["max_examples"] == 4
    narrow = build([root], tmp_path / "narrow", BuildOptions(max_examples=4, tasks=(GEMM,), seed=3))
    assert narrow.examples == 4 and narrow.card["by_task"] == {GEMM: 4}
    assert len({r["meta"]["error"] for r in _rows(tmp_path / "narrow")}) == 4  # spread over its error classes
    # the attention pairs of runs c and d, before near-duplicates are dropped
    assert narrow.card["dropped"]["other_task"] == 4 and narrow.card["options"]["tasks"] == [GEMM]
    again = build([root], tmp_path / "again", BuildOptions(max_examples=4, seed=3))
    assert (tmp_path / "again/train.jsonl").read_text() == (tmp_path / "wide/train.jsonl").read_text()


def test_the_cli_takes_aliases_and_says_when_a_set_is_short(tmp_path):
    root = _fixture_runs(tmp_path / "runs")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "agent.cli", "fixit", "build", str(root), *args],
                              capture_output=True, text=True, timeout=300)

    p = cli("--out", str(tmp_path / "a"), "--task", GEMM, "--max-examples", "9", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["examples"] == 5
    assert "only 5 examples, fewer than --max-examples 9" in p.stderr
    p = cli("--out", str(tmp_path / "b"), "--task", "no_such_task")
    assert p.returncode == 2 and "no_such_task" in p.stderr and "Traceback" not in p.stderr
    p = cli("--out", str(tmp_path / "c"), "--max-examples", "0")
    assert p.returncode == 2 and "--max-examples must be at least 1" in p.stderr
