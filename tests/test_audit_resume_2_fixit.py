"""Audit of Fixit's classes: a kernel that passes every visible workload and fails a held-out one was
fitted to the sizes it was shown. That is a failure of its own (`held_out`): it is counted among the
failed candidates, paired with the later kernel that passes the held-out workloads too, and taught
with the feedback the model got, which names held-out workloads by count and kind, never by size.
(It had no class: never a failed example, never counted, and its fix taught nothing.)

Run folders written with the real TrajectoryWriter and hand-made GPU verdicts
(tests/trajectory_fixtures.py), built with the real `agent fixit build` CLI.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import agent_cli
from openai_server import openai_server  # noqa: F401  (the fixture)
from trajectory_fixtures import eval_result, kernel, reply_for, write_run

from agent.fixit.build import error_classes, find_pairs, load_attempts, passed_checks
from tools.results import Mismatch, Timing, WorkloadResult

HELD_M = 1234  # a held-out size no other text of an example holds


def _c(tag: str, *, visible: str = "correct", held: str | None = "passed", reason: str = "incorrect",
       speedup: float | None = 1.0):
    """A candidate that ran on the GPU: its visible workload as `visible`, a held-out workload
    passed, failed (with `reason`) or skipped (`held` None: none at all)."""
    s, ev = kernel(tag), eval_result(visible, speedup=speedup if visible == "correct" else None)
    if visible == "correct":
        ev.workloads[0].timing = Timing(median_ms=1.0, iqr_ms=0.01, cv=0.01, runs=10)
    if held is not None:
        ok = held == "passed"
        ev.workloads.append(WorkloadResult(
            workload=f"M{HELD_M}", split="held_out", axes={"M": HELD_M}, status=held,
            reason=None if held != "failed" else reason,
            detail=f"at M={HELD_M}" if held == "failed" else None,
            outputs=[Mismatch(output="C", max_abs_err=0.0 if ok else 3.0, max_rel_err=0.0 if ok else 1.0,
                              mismatch_frac=0.0 if ok else 0.5, passed=ok)] if held != "skipped" else []))
    return (s, ev, reply_for(s, f"Reasoning for {tag}."))


def _drop_feedback_events(run_dir: Path) -> None:
    """As a run whose feedback was not recorded: the build renders it from eval.json (agent.feedback)."""
    path = run_dir / "events.jsonl"
    kept = [x for x in path.read_text().splitlines() if json.loads(x)["type"] != "feedback"]
    path.write_text("\n".join(kept) + "\n")


def test_a_kernel_failing_only_held_out_workloads_is_a_held_out_failure(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "fit", [[_c("f1", held="failed")], [_c("f2", held="passed", speedup=1.2)]])
    first, second = load_attempts(root / "fit")
    assert error_classes(first) == {"held_out"} and error_classes(second) == set()
    assert "held_out" in passed_checks(second) and "held_out" not in passed_checks(first)
    pairs, unfixed = find_pairs([first, second])
    assert [(p.error, p.failed.record.turn, p.fixed.record.turn) for p in pairs] == [("held_out", 1, 2)]
    assert not unfixed


def test_held_out_is_not_shown_by_a_kernel_whose_held_out_workloads_did_not_run(tmp_path):
    """Passing held-out workloads is shown by running them: a kernel whose held-out run was skipped
    (or a task without any) fixes no held-out failure."""
    root = tmp_path / "runs"
    write_run(root, "skip", [[_c("s1", held="failed")], [_c("s2", held="skipped")], [_c("s3", held=None)]])
    attempts = load_attempts(root / "skip")
    assert [error_classes(a) for a in attempts] == [{"held_out"}, set(), set()]
    pairs, unfixed = find_pairs(attempts)
    assert not pairs and [(a.record.turn, e) for a, e in unfixed] == [(1, "held_out")]


def test_visible_failures_keep_their_own_class(tmp_path):
    """Wrong numbers on the visible size too: a numerical failure (the held-out ones are the same
    mistake), not a kernel fitted to the visible size."""
    root = tmp_path / "runs"
    write_run(root, "num", [[_c("n1", visible="numerical", held="failed")]])
    [a] = load_attempts(root / "num")
    assert error_classes(a) == {"numerical"}


def test_held_out_examples_are_counted_and_never_show_a_held_out_size(tmp_path):
    root = tmp_path / "runs"
    # fitted to the visible size, then fixed; a crash only at the held-out size, never fixed
    write_run(root, "fit", [[_c("f1", held="failed")], [_c("f2", held="passed", speedup=1.2)]])
    write_run(root, "crash", [[_c("c1", held="failed", reason="cuda_error")], [_c("c2", held="failed")]])
    for run in ("fit", "crash"):
        _drop_feedback_events(root / run)
    out = tmp_path / "data"
    p = agent_cli("fixit", "build", str(root), "--out", str(out), "--split", "all", "--json")
    assert p.returncode == 0, p.stderr
    card = json.loads(p.stdout)
    rows = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert card["examples"] == len(rows) == 1
    [row] = rows
    assert row["meta"]["errors"] == ["held_out"] and row["meta"]["failed_turn"] == 1
    assert card["failed_candidates_by_error"] == {"held_out": 3} and card["by_error"] == {"held_out": 1}
    from_rows = Counter(e for r in rows for e in r["meta"]["errors"])
    assert sum(card["failed_candidates_by_error"].values()) == sum(from_rows.values()) + card["unfixed_failures"]
    # the model is told that held-out workloads failed, and of which kind, never at which size
    user = row["messages"][1]["content"]
    assert "held-out workloads (sizes not shown): 0 of 1 passed; failed: 1 incorrect" in user, user
    text = json.dumps(row)
    assert str(HELD_M) not in text, [m["content"] for m in row["messages"] if str(HELD_M) in m["content"]]


# ---------------------------------------------------------------------------------------
# Teacher runs that did not end
# ---------------------------------------------------------------------------------------
def _student_with_a_compile_error(root: Path) -> None:
    from agent_loop_helpers import broken_probe_reply
    from tools.results import CompileResult, EvalResult, InspectResult
    from tools.solution import extract_solution

    broken = broken_probe_reply()
    for run in ("s1", "s2"):
        ev = EvalResult(task="gemm_n7168_k5120", arch="sm_90a", requested_features=["wgmma", "tma"],
                        run_reason="did not compile",
                        compile=CompileResult(status="failed", arch="sm_90a", language="cuda", error="nvrtc error"),
                        inspect=InspectResult(status="skipped", reason="did not compile", arch="sm_90a"))
        write_run(root, run, [[(extract_solution(broken), ev, broken)]], context="none")


def test_a_teacher_run_the_model_failed_is_asked_again_by_the_next_build(tmp_path):
    """The teacher's provider failed (here: no reply at all): the failure stays unfixed in this build,
    and the next build asks the teacher again. (The run was stamped as finished and reused by every
    later build: that failure never reached the teacher again.)"""
    from agent_loop_helpers import PROVIDER_FAILS, probe_reply

    from agent.fixit.build import TEACHER_STAMP, BuildOptions, build

    root = tmp_path / "runs"
    _student_with_a_compile_error(root)
    script = tmp_path / "teacher.json"
    script.write_text(json.dumps({"replies": [PROVIDER_FAILS]}))  # an outage: the teacher answers nothing
    options = BuildOptions(teacher=f"scripted:{script}", teacher_turns=1, split=None)
    first = build([root], tmp_path / "data", options)
    assert first.examples == 0 and first.card["unfixed_failures"] == 2
    teacher_run = tmp_path / "data/teacher_runs/teacher/s1/1-0"
    assert (teacher_run / "config.json").exists() and not (teacher_run / TEACHER_STAMP).exists()
    script.write_text(json.dumps({"replies": [probe_reply()]}))  # the provider is back (one reply a run)
    second = build([root], tmp_path / "data", options)
    # both repaired (the two students wrote the same kernel: one example, the other a near-duplicate)
    assert second.card["pairs_found"] == 2 and second.card["unfixed_failures"] == 0
    assert second.card["by_source"] == {"teacher": 1} and second.card["dropped"]["near_duplicate"] == 1
    assert (teacher_run / TEACHER_STAMP).exists()


def test_ctrl_c_during_a_teacher_run_stops_the_build(tmp_path, openai_server):
    """Ctrl-C while the teacher answers stops the build (exit 130), the next failure is not sent to
    the teacher, and the interrupted run is not kept as a finished one. (It was stamped finished, and
    the build went on to the next failure: Ctrl-C only cost the data of the run it landed in.)"""
    import subprocess
    import sys
    import time

    from agent_loop_helpers import REPO, cli_env, ctrl_c_reaches_it
    from openai_server import OpenAIServer as S

    from agent.fixit.build import TEACHER_STAMP

    root = tmp_path / "runs"
    _student_with_a_compile_error(root)
    openai_server.push(S.delay(600, S.ok("late")))
    out = tmp_path / "data"
    cmd = [sys.executable, "-m", "agent.cli", "fixit", "build", str(root), "--out", str(out), "--split", "all",
           "--teacher", "openai/test-model", "--teacher-api-base", openai_server.base_url, "--teacher-turns", "1"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    deadline = time.monotonic() + 120
    while not openai_server.requests:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the teacher's request never came"
        time.sleep(0.01)
    proc.send_signal(__import__("signal").SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 130, err
    assert len(openai_server.requests) == 1  # the second failure never went to the teacher
    assert not list((out / "teacher_runs").rglob(TEACHER_STAMP))
    assert not (out / "train.jsonl").exists()


# ---------------------------------------------------------------------------------------
# Which runs a build reads
# ---------------------------------------------------------------------------------------
def _real_fixed_run(tmp_path: Path, runs: Path, run_id: str = "real") -> Path:
    """A real CPU run of the loop: a compile error in turn 1, fixed in turn 2."""
    from agent_loop_helpers import GEMM_TASK, broken_probe_reply, probe_reply, write_script

    model = write_script(tmp_path / f"{run_id}.json", [broken_probe_reply(), probe_reply()])
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", "none",
                  "--runs-dir", str(runs), "--run-id", run_id, "--quiet")
    assert p.returncode == 0, p.stderr
    return runs / run_id


def test_a_run_killed_before_its_summary_still_gives_its_examples(tmp_path):
    """A run killed (SIGKILL, out of memory, a lost machine) has no summary.json, but its candidates,
    their eval.json and the events naming them are on disk: its mistakes and fixes are data like any
    run's. (It gave none, silently, while the card counted it among the runs read.)"""
    runs = tmp_path / "runs"
    run_dir = _real_fixed_run(tmp_path, runs)
    full = agent_cli("fixit", "build", str(runs), "--out", str(tmp_path / "full"), "--split", "all", "--json")
    (run_dir / "summary.json").unlink()  # as if killed before the summary was written
    p = agent_cli("fixit", "build", str(runs), "--out", str(tmp_path / "killed"), "--split", "all", "--json")
    assert p.returncode == 0 == full.returncode, p.stderr
    card, full_card = json.loads(p.stdout), json.loads(full.stdout)
    assert full_card["examples"] == 1 and full_card["failed_candidates_by_error"] == {"compile": 1}
    for key in ("examples", "failed_candidates_by_error", "pairs_found", "unfixed_failures", "by_error"):
        assert card[key] == full_card[key], key
    assert (tmp_path / "killed/train.jsonl").read_text() == (tmp_path / "full/train.jsonl").read_text()


def test_a_run_in_two_folders_is_refused(tmp_path):
    """A copy of a run (old runs moved aside, a sweep copied) read twice counted its failures twice in
    the card and its pairs twice (the second then dropped as a near-duplicate). Refused, as
    `agent report` refuses it, naming both folders."""
    import shutil

    runs = tmp_path / "runs"
    run_dir = _real_fixed_run(tmp_path, runs / "a")
    shutil.copytree(run_dir, runs / "b" / "real")
    p = agent_cli("fixit", "build", str(runs), "--out", str(tmp_path / "data"), "--split", "all", "--json")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "real" in p.stderr and "two folders" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "data" / "train.jsonl").exists()


def test_the_teacher_is_not_sent_the_students_model_settings(tmp_path):
    """A teacher run starts from the student's config; the student's model parameters (a local
    model's context window, provider options) and temperature are the student's, not the teacher's.
    (The teacher inherited them: a small student's context window stopped every teacher run before
    its first request, context_exceeded, and the failures stayed unfixed.)"""
    from agent_loop_helpers import probe_reply

    from agent.fixit.build import BuildOptions, build
    from agent.trajectory import read_config

    root = tmp_path / "runs"
    _student_with_a_compile_error(root)
    for run in ("s1", "s2"):
        path = root / run / "config.json"
        config = json.loads(path.read_text())
        config.update(model_params={"context_window": 1200, "top_k": 5}, temperature=1.3)
        path.write_text(json.dumps(config))
    script = tmp_path / "teacher.json"
    script.write_text(json.dumps({"replies": [probe_reply()]}))
    res = build([root], tmp_path / "data", BuildOptions(teacher=f"scripted:{script}", teacher_turns=1, split=None))
    assert res.card["pairs_found"] == 2 and res.card["unfixed_failures"] == 0
    teacher = read_config(tmp_path / "data/teacher_runs/teacher/s1/1-0")
    assert teacher.model_params == {} and teacher.temperature is None


def test_a_run_killed_mid_turn_keeps_the_candidates_its_summary_had_not_reached(tmp_path):
    """The summary is written after each turn's decision; a run killed while a later turn was being
    judged or decided (the long step) has that turn's candidates on disk, evaluated, and in its events.
    A fix among them is a fix. (They were left out: the summary of the turn before was all that was read.)"""
    runs = tmp_path / "runs"
    run_dir = _real_fixed_run(tmp_path, runs)
    full = agent_cli("fixit", "build", str(runs), "--out", str(tmp_path / "full"), "--split", "all", "--json")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.update(status="running", stop_reason=None, turns=1, per_turn=summary["per_turn"][:1])
    (run_dir / "summary.json").write_text(json.dumps(summary))  # as turn 1's decision left it
    p = agent_cli("fixit", "build", str(runs), "--out", str(tmp_path / "killed"), "--split", "all", "--json")
    assert p.returncode == 0 == full.returncode, p.stderr
    card = json.loads(p.stdout)
    assert card["examples"] == json.loads(full.stdout)["examples"] == 1 and card["unfixed_failures"] == 0
    row = json.loads((tmp_path / "killed/train.jsonl").read_text())
    assert (row["meta"]["failed_turn"], row["meta"]["fixed_turn"]) == (1, 2)
