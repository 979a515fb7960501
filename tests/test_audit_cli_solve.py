"""`agent solve`: settings that the run would not honour are refused up front, and what a run
records is what it did (real CLI in a subprocess, scripted replies, real ptxas, real SQLite)."""
from __future__ import annotations

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli, probe_reply, write_script

from agent.run import settings_problem


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
