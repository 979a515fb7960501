"""`agent solve`, `agent graph` as a user runs them: the real CLI in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, NO_CODE, REPO, agent_cli, probe_reply, write_script


def one_line_error(p, *words):
    assert p.returncode == 2, (p.returncode, p.stderr)
    # One message (rich may wrap it at the console width when stderr is not a terminal).
    message = " ".join(ln.strip() for ln in p.stderr.splitlines() if ln.strip())
    assert message.startswith("error:") and message.count("error:") == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    for w in words:
        assert w in message, (w, message)


def test_unknown_task_is_one_line(tmp_path):
    one_line_error(agent_cli("solve", "--task", "attn_bwdd", "--model", "human", "--runs-dir", str(tmp_path)),
                   "attn_bwdd")


def test_bad_model_spec_is_one_line(tmp_path):
    one_line_error(agent_cli("solve", "--task", "attn_bwd", "--model", "no-such-provider-model",
                             "--runs-dir", str(tmp_path)), "no-such-provider-model")
    one_line_error(agent_cli("solve", "--task", "attn_bwd", "--model", f"replay:{tmp_path / 'nothing'}",
                             "--runs-dir", str(tmp_path)), "replay")


def test_missing_api_key_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "PTXBENCH_API_KEY")}
    p = subprocess.run([sys.executable, "-m", "agent.cli", "solve", "--task", "attn_bwd", "--model", "openai/gpt-4o",
                        "--runs-dir", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    one_line_error(p, "OPENAI_API_KEY")
    assert not any(tmp_path.iterdir())


def test_dead_endpoint_is_one_line(tmp_path):
    one_line_error(agent_cli("solve", "--task", "attn_bwd", "--model", "openai/some-model",
                             "--api-base", "http://127.0.0.1:9/v1", "--runs-dir", str(tmp_path)),
                   "cannot reach", "127.0.0.1:9")
    assert not any(tmp_path.iterdir())  # nothing half-made


def test_resume_of_unknown_run_is_one_line(tmp_path):
    one_line_error(agent_cli("solve", "--resume", "nope", "--runs-dir", str(tmp_path)), "nope")


def test_json_prints_only_the_summary_on_stdout(tmp_path):
    model = write_script(tmp_path / "s.json", [NO_CODE, probe_reply()])
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", "none",
                  "--runs-dir", str(tmp_path / "runs"), "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)  # the whole of stdout is one JSON document
    assert summary["stop_reason"] == "max_turns" and summary["turns"] == 2
    assert summary["best_path"] == "candidates/2-0" and summary["best"]["verified"] is False
    assert summary["evaluation"].startswith("skipped: no GPU")
    # Progress went to stderr, and says what was skipped.
    assert "evaluation skipped: no GPU" in p.stderr and "turn 2/2" in p.stderr
    assert (tmp_path / "runs" / summary["run_id"] / "summary.json").exists()


def test_human_readable_result_and_default_runs_dir(tmp_path):
    model = write_script(tmp_path / "s.json", [probe_reply()])
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
                  "--quiet", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # --quiet
    assert "stopped by max_turns" in p.stdout and "unverified: correctness not checked" in p.stdout
    assert "evaluation: skipped: no GPU" in p.stdout
    [run_dir] = list((tmp_path / "runs").iterdir())  # ./runs by default
    assert (run_dir / "summary.json").exists() and (run_dir / "candidates" / "1-0" / "eval.json").exists()


def test_model_failure_exits_nonzero_with_the_reason(tmp_path):
    model = write_script(tmp_path / "s.json", [{"fault": "auth", "status": 401, "message": "invalid api key"}])
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--context", "none",
                  "--runs-dir", str(tmp_path / "runs"), "--quiet")
    assert p.returncode == 1
    assert "the model failed: auth: invalid api key" in p.stderr and "Traceback" not in p.stderr
    assert "stopped by model_error" in p.stdout


def test_graph_prints_mermaid():
    p = agent_cli("graph")
    assert p.returncode == 0 and p.stdout.lstrip().startswith("---") and "graph TD;" in p.stdout
    assert "retrieve_context --> draft" in p.stdout
