"""Audit of the Fixit data card's numbers against the data written.

A dataset is built from run folders (a real `agent solve` run with scripted replies on this CPU,
and run folders written with the real TrajectoryWriter and hand-made GPU verdicts, as in
tests/trajectory_fixtures.py), then the card is checked against train.jsonl row by row:
- each failure carries its own class: a kernel that rewrote its read-only inputs is
  `input_modified`, one timed faster than the GPU's ceiling is `implausible` (neither crashed:
  calling them `runtime` counted and taught them as crashes);
- a failed kernel that failed two checks and was fixed by one later kernel is one example
  fixing both classes, counted under both (it was two identical examples, one of which was
  dropped as its own "near-duplicate", so the second class went uncounted);
- examples + dropped == pairs found; failed candidates == pairs found per class + unfixed.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli, broken_probe_reply, probe_reply, write_script
from trajectory_fixtures import eval_result, kernel, reply_for, write_run

from agent.fixit.build import BuildOptions, build, error_classes, find_pairs, load_attempts
from tools.results import FeatureVerdict, Timing


def _c(kind: str, tag: str, *, reason: str | None = None, nofeat: bool = False, speedup: float | None = None):
    """A candidate; `reason` replaces the failing workload's reason, `nofeat`: features absent too."""
    s, ev = kernel(tag), eval_result(kind, speedup=speedup)
    if reason is not None:
        ev.workloads[0].reason = reason
    if nofeat:
        ev.inspect.features = {f: FeatureVerdict(present=False) for f in ev.requested_features}
        ev.executed.executed = {f: False for f in ev.requested_features}
        ev.executed.carries = {f: False for f in ev.requested_features}
    if kind == "correct":
        ev.workloads[0].timing = Timing(median_ms=1.0, iqr_ms=0.01, cv=0.01, runs=10)
    return (s, ev, reply_for(s, f"Reasoning for {tag}."))


def _gpu_runs(root: Path) -> Path:
    # one kernel failing two checks (features absent, wrong numbers), fixed by one later kernel
    write_run(root, "two", [[_c("numerical", "t1", nofeat=True)], [_c("correct", "t2", speedup=1.1)]])
    # a kernel that rewrote its inputs, then one timed faster than the GPU can go, then a fix
    write_run(root, "cheat", [[_c("numerical", "c1", reason="input_modified")],
                              [_c("numerical", "c2", reason="implausible")], [_c("correct", "c3", speedup=0.9)]])
    # an out-of-bounds write (a runtime failure) and a hang, never fixed
    write_run(root, "crash", [[_c("runtime", "o1", reason="out_of_bounds_write")], [_c("timeout", "o2")]])
    return root


def _rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "train.jsonl").read_text().splitlines()]


def test_input_modified_and_implausible_are_their_own_classes(tmp_path):
    root = _gpu_runs(tmp_path / "runs")
    got = [error_classes(a) for a in load_attempts(root / "cheat")]
    assert got == [{"input_modified"}, {"implausible"}, set()]
    assert [error_classes(a) for a in load_attempts(root / "crash")] == [{"runtime"}, {"timeout"}]
    pairs, unfixed = find_pairs(load_attempts(root / "cheat"))
    assert sorted((p.error, p.failed.record.turn, p.fixed.record.turn) for p in pairs) == \
        [("implausible", 2, 3), ("input_modified", 1, 3)] and not unfixed


def test_an_implausibly_fast_kernel_is_not_fixed_by_an_untimed_one(tmp_path):
    """Being plausible is shown by a timing only: a correct kernel nobody timed fixes nothing of it."""
    root = tmp_path / "runs"
    untimed = _c("correct", "u2", speedup=None)
    untimed[1].workloads[0].timing = None
    write_run(root, "u", [[_c("numerical", "u1", reason="implausible")], [untimed]])
    pairs, unfixed = find_pairs(load_attempts(root / "u"))
    assert not pairs and [(a.record.turn, e) for a, e in unfixed] == [(1, "implausible")]


def test_card_counts_match_the_rows_written(tmp_path):
    root = _gpu_runs(tmp_path / "runs")
    # a real CPU run of the loop: a compile error, then the fix
    model = write_script(tmp_path / "s.json", [broken_probe_reply(), probe_reply()])
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", "none",
                  "--runs-dir", str(root), "--run-id", "real", "--quiet")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "data"
    p = agent_cli("fixit", "build", str(root), "--out", str(out), "--split", "all", "--json")
    assert p.returncode == 0, p.stderr
    card = json.loads(p.stdout)
    rows = _rows(out)
    assert card["examples"] == len(rows) == 4
    # each example counted under every class it fixes, as its row says
    from_rows = Counter(e for r in rows for e in r["meta"]["errors"])
    assert card["by_error"] == dict(sorted(from_rows.items())) == {
        "compile": 1, "features_missing": 1, "implausible": 1, "input_modified": 1, "numerical": 1}
    assert all(r["meta"]["error"] == r["meta"]["errors"][0] for r in rows)
    two = [r for r in rows if r["meta"]["run_id"] == "two"]
    assert len(two) == 1 and two[0]["meta"]["errors"] == ["features_missing", "numerical"]
    assert "near_duplicate" not in card["dropped"] or card["dropped"]["near_duplicate"] == 0
    assert card["examples"] + sum(card["dropped"].values()) == card["pairs_found"]
    # every failed candidate of every class is accounted for: fixed in an example's pair, or unfixed
    assert card["failed_candidates_by_error"] == {"compile": 1, "features_missing": 1, "implausible": 1,
                                                  "input_modified": 1, "numerical": 1, "runtime": 1, "timeout": 1}
    assert sum(card["failed_candidates_by_error"].values()) == sum(from_rows.values()) + card["unfixed_failures"]
    assert json.loads((out / "data_card.json").read_text()) == card


def test_cap_per_error_counts_every_class_of_an_example(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "two", [[_c("numerical", "t1", nofeat=True)], [_c("correct", "t2", speedup=1.1)]])
    write_run(root, "one", [[_c("numerical", "n1")], [_c("correct", "n2", speedup=1.0)]])
    res = build([root], tmp_path / "d", BuildOptions(cap_per_error=1, seed=0))
    rows = _rows(tmp_path / "d")
    counts = Counter(e for r in rows for e in r["meta"]["errors"])
    assert max(counts.values()) == 1 and res.card["by_error"] == dict(sorted(counts.items()))
