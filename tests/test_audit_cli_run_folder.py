"""One run folder, one process: `agent solve --resume` (or a second `agent solve --run-id` of
the same id) while the run is still going in another process must be refused, not drive the
same checkpoint and events log twice (two LLM calls for one turn, interleaved events, a summary
written under the live run).

Real processes, a real local HTTP server holding the first run's LLM request, real SQLite."""
from __future__ import annotations

import subprocess
import sys
import time

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, REPO, agent_cli, cli_env, events, probe_reply
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)


def _start_held_run(tmp_path, server):
    """A run whose turn-1 request hangs at the server until the test lets it go (kills it)."""
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "agent.cli", "solve", "--task", GEMM_TASK, "--model", "openai/test-model",
           "--api-base", server.base_url, "--max-turns", "1", "--context", "none", "--runs-dir", str(runs),
           "--run-id", "r1", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not server.requests:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first run's request never came"
        time.sleep(0.01)
    return proc, runs


def test_resume_of_a_run_still_going_is_refused(tmp_path, openai_server):
    openai_server.push(S.delay(600, S.ok(probe_reply())), S.ok(probe_reply()))
    proc, runs = _start_held_run(tmp_path, openai_server)
    try:
        n_events = len(events(runs / "r1"))
        p = agent_cli("solve", "--resume", "r1", "--runs-dir", str(runs), "--json")
        # bad input (the run is busy), one line; nothing asked of the model, nothing written
        assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
        assert "in use" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert len(openai_server.requests) == 1
        assert len(events(runs / "r1")) == n_events
        assert not (runs / "r1" / "summary.json").exists()
        # a second start under the same id is refused as well
        p = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/test-model", "--api-base",
                      openai_server.base_url, "--max-turns", "1", "--context", "none", "--runs-dir", str(runs),
                      "--run-id", "r1", "--quiet")
        assert p.returncode == 2 and len(openai_server.requests) == 1, (p.stdout, p.stderr)
    finally:
        proc.kill()
        proc.communicate()
    # once the first process is gone (killed: no summary), the run resumes as usual
    p = agent_cli("solve", "--resume", "r1", "--runs-dir", str(runs), "--json")
    assert p.returncode == 0, p.stderr
    assert len(events(runs / "r1", "llm_response")) == 1 and len(openai_server.requests) == 2
