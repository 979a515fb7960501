"""`agent solve`: settings that the run would not honour are refused up front, and what a run
records is what it did (real CLI in a subprocess, scripted replies, real ptxas, real SQLite)."""
from __future__ import annotations

import json

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli, probe_reply, write_script
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.run import settings_problem
from agent.trajectory import read_events


def _one_line_error(p, *words):
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    message = " ".join(p.stderr.split())
    assert message.startswith("error:") and message.count("error:") == 1 and p.stdout == "", (p.stdout, p.stderr)
    for w in words:
        assert w in message, (w, message)


def test_profile_feedback_without_the_executed_check_is_refused(tmp_path):
    """The profile comes from the executed check's Nsight Compute pass: with --no-executed the
    model never sees one, yet the run would be recorded (config.json, summary.json, the sweep
    report's profile ablation) as profile feedback on."""
    model = write_script(tmp_path / "s.json", [probe_reply()])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
                  "--profile-feedback", "on", "--no-executed", "--runs-dir", str(runs), "--quiet")
    _one_line_error(p, "--profile-feedback", "--no-executed")
    assert not runs.exists()
    assert settings_problem(profile_feedback=True, executed_check=False) is not None
    assert settings_problem(profile_feedback=True, executed_check=True) is None
    assert settings_problem(profile_feedback=False, executed_check=False) is None


def test_a_reply_with_a_lone_surrogate_is_recorded_and_judged(tmp_path, openai_server):
    """A server may send a JSON string escape that is half of a UTF-16 pair ("\\ud83d": an emoji
    cut in two); Python decodes it to a lone surrogate that no UTF-8 file can hold. The reply was
    paid for and is the model's data: it is recorded (reply.md, events.jsonl) and judged, not a
    ptxbench crash that loses it and asks the model again on every resume."""
    openai_server.push(S.ok("Plan \ud83d: four wgmmas.\n" + probe_reply()))
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/test-model", "--api-base", openai_server.base_url,
                  "--max-turns", "1", "--context", "none", "--runs-dir", str(runs), "--run-id", "r", "--quiet",
                  "--json")
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    s = json.loads(p.stdout)
    assert (s["status"], s["stop_reason"]) == ("finished", "max_turns")
    assert s["per_turn"][0]["candidates"][0]["outcome"] in ("unverified", "correct_with_arch")
    reply_md = (runs / "r" / "candidates" / "1-0" / "reply.md").read_text(encoding="utf-8")
    assert reply_md.startswith("Plan \ufffd: four wgmmas.") and probe_reply() in reply_md
    [response] = [e for e in read_events(runs / "r") if e["type"] == "llm_response"]
    assert response["text"] == reply_md
