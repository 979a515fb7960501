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


def _config_gpu(run_dir, gpu):
    import json

    path = run_dir / "config.json"
    config = json.loads(path.read_text())
    config["gpu"] = gpu
    path.write_text(json.dumps(config, indent=2))


def test_resume_on_another_gpu_or_none_is_refused(tmp_path):
    """A run's speedups are against the library on the GPU it was judged on (config.json `gpu`).
    Resumed on a machine with another GPU, or none, its later candidates were judged elsewhere (or
    left unjudged) beside its first ones, under the recorded GPU's name: refused, one line. A run
    whose worker could not start ("unavailable: ...") or that never had a GPU resumes anywhere."""
    from agent_loop_helpers import PROVIDER_FAILS, write_script

    script = tmp_path / "s.json"
    model = write_script(script, [probe_reply(), PROVIDER_FAILS])  # the provider refuses turn 2
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", "none",
                  "--runs-dir", str(runs), "--run-id", "r", "--quiet")
    assert p.returncode == 1, p.stderr  # model_error, resumable
    write_script(script, [probe_reply(), PROVIDER_FAILS, probe_reply()])
    n_events = len(events(runs / "r"))
    _config_gpu(runs / "r", "NVIDIA H200")  # as if turn 1 had been judged on the H200
    p = agent_cli("solve", "--resume", str(runs / "r"), "--json")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "NVIDIA H200" in p.stderr and len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""
    assert len(events(runs / "r")) == n_events
    _config_gpu(runs / "r", "unavailable: the GPU worker did not start")
    p = agent_cli("solve", "--resume", str(runs / "r"), "--json")
    assert p.returncode == 0, p.stderr
