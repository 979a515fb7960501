"""Resume after a kill: `agent solve` in a subprocess is killed mid-run, then `--resume`d.

Finished LLM calls and evaluations must not be repeated; the scripted model must go on
with the next reply; nothing recorded before the kill may be lost.
"""
from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (GEMM_TASK, REPO, agent_cli, broken_probe_reply, cli_env, ctrl_c_reaches_it, events,
                                probe_reply, write_script)
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.trajectory import read_summary

TURNS = 4


def start_run(tmp_path, run_id="r1"):
    script = [probe_reply(), broken_probe_reply(), probe_reply(), broken_probe_reply()]
    model = write_script(tmp_path / "script.json", script)
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "agent.cli", "solve", "--task", GEMM_TASK, "--model", model, "--max-turns",
           str(TURNS), "--context", "docs", "--runs-dir", str(runs), "--run-id", run_id, "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, runs, runs / run_id, script


def wait_for_first_candidate(proc, run_dir, timeout=120):
    deadline = time.monotonic() + timeout
    path = run_dir / "events.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and '"type": "candidate"' in path.read_text():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    raise AssertionError("no candidate recorded in time")


def check_completed_without_repeats(run_dir, script, killed_before: int):
    summary = read_summary(run_dir)
    assert summary.status == "finished" and summary.stop_reason == "max_turns" and summary.turns == TURNS
    assert len(summary.decisions) == TURNS
    responses = events(run_dir, "llm_response")
    # One LLM call per turn in total: nothing answered before the kill was asked again.
    assert Counter(e["turn"] for e in responses) == {t: 1 for t in range(1, TURNS + 1)}
    # The scripted model went on where the run stopped: turn t got reply t.
    for t in range(1, TURNS + 1):
        assert (run_dir / "candidates" / f"{t}-0" / "reply.md").read_text() == script[t - 1]
    # No candidate was compiled twice.
    compiles = Counter(e["turn"] for e in events(run_dir, "compile"))
    assert all(n == 1 for n in compiles.values())
    reused = {e["turn"] for e in events(run_dir, "eval_reused")}
    assert set(compiles) | reused == set(range(1, TURNS + 1))
    # What was recorded before the kill is still there, in order.
    seqs = [e["seq"] for e in events(run_dir)]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    assert sum(e["type"] == "run_start" for e in events(run_dir)) == 2
    assert [e["resumed"] for e in events(run_dir, "run_start")] == [False, True]
    assert killed_before >= 1
    return summary


def test_resume_after_sigkill_repeats_nothing(tmp_path):
    proc, runs, run_dir, script = start_run(tmp_path)
    wait_for_first_candidate(proc, run_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = events(run_dir, "llm_response")
    killed_turns = len(before)
    assert proc.returncode == -signal.SIGKILL and killed_turns < TURNS  # it really died mid-run

    p = agent_cli("solve", "--resume", "r1", "--runs-dir", str(runs), "--json")
    assert p.returncode == 0, p.stderr
    summary = check_completed_without_repeats(run_dir, script, killed_turns)
    assert json.loads(p.stdout)["run_id"] == summary.run_id
    after = events(run_dir, "llm_response")
    assert after[:killed_turns] == before  # the old records are untouched


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_writes_a_resumable_summary(tmp_path, openai_server, sig):
    """The signal always lands mid-run: turn 2's LLM request hangs at a real local server until
    the run is stopped, so a run that ignored the signal never ends (and this test fails)."""
    script = [probe_reply(), broken_probe_reply(), probe_reply(), broken_probe_reply()]
    openai_server.push(S.ok(script[0]), S.delay(600, S.ok(script[1])), *(S.ok(r) for r in script[1:]))
    runs = tmp_path / "runs"
    run_dir = runs / "r1"
    cmd = [sys.executable, "-m", "agent.cli", "solve", "--task", GEMM_TASK, "--model", "openai/test-model",
           "--api-base", openai_server.base_url, "--max-turns", str(TURNS), "--context", "docs",
           "--runs-dir", str(runs), "--run-id", "r1", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    deadline = time.monotonic() + 120
    while len(openai_server.requests) < 2:  # turn 1 answered and judged; turn 2 waits for its reply
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "turn 2's request never came"
        time.sleep(0.01)
    assert [e["turn"] for e in events(run_dir, "candidate")] == [1]
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the run went on after {sig.name}: it must stop, write its summary and exit")
    summary = read_summary(run_dir)
    assert proc.returncode == 130, (proc.returncode, err)
    assert summary.status == "interrupted" and summary.stop_reason == "interrupted", (summary, err)
    assert summary.turns == 1 and len(openai_server.requests) == 2
    assert events(run_dir, "run_end")[-1]["status"] == "interrupted"
    # The printed hint works as printed, from anywhere (it names the run's folder, not its id).
    [hint] = [line for line in err.splitlines() if "resume with" in line]
    command = shlex.split(hint.split("resume with", 1)[1])
    assert command[:3] == ["agent", "solve", "--resume"] and summary.stop_detail.endswith(" ".join(command))
    p = agent_cli(*command[1:], "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    check_completed_without_repeats(run_dir, script, len(events(run_dir, "candidate")))
    assert len(openai_server.requests) == 2 + TURNS - 1  # turn 2 asked again (its reply never came), then 3 and 4


def test_resuming_a_finished_run_changes_nothing(tmp_path):
    model = write_script(tmp_path / "s.json", [probe_reply()])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
                  "--runs-dir", str(runs), "--run-id", "done", "--quiet")
    assert p.returncode == 0, p.stderr
    n_events = len(events(runs / "done"))
    p = agent_cli("solve", "--resume", "done", "--runs-dir", str(runs), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["status"] == "finished"
    assert len(events(runs / "done")) == n_events  # no new call, no new event
