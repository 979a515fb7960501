"""Audit: `--model human` is shown what a model is told.

The human model showed only the newest user message: on the first turn the task, which ends
"in the reply format above", without the system prompt above it (the reply format, the
language rules, how instructions are credited). A human baseline was measured with less
information than every LLM it is compared with. Now the first call shows the whole chat, and
later calls the reply the feedback is about and the feedback.
"""
from __future__ import annotations

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli

from agent.models import get_model

CHAT = [{"role": "system", "content": "SYSTEM: reply format and credit rules."},
        {"role": "user", "content": "TASK: write a GEMM, in the reply format above."}]


def test_the_first_prompt_shows_the_system_prompt_too(tmp_path, capsys):
    (tmp_path / "1.md").write_text("one")
    (tmp_path / "2.md").write_text("two")
    model = get_model("human", extra={"reply_file": str(tmp_path)})
    model.complete(CHAT)
    first = capsys.readouterr().err
    assert "SYSTEM: reply format" in first and "TASK: write a GEMM" in first
    later = CHAT + [{"role": "assistant", "content": "MY REPLY"}, {"role": "user", "content": "FEEDBACK: compile error"}]
    model.complete(later)
    second = capsys.readouterr().err
    assert "FEEDBACK: compile error" in second and "MY REPLY" in second  # the reply the feedback is about
    assert "SYSTEM: reply format" not in second


def test_solve_with_a_human_shows_the_reply_format(tmp_path):
    replies = tmp_path / "replies"
    replies.mkdir()
    (replies / "1.md").write_text("no kernel today")
    r = agent_cli("solve", "--task", GEMM_TASK, "--model", "human", "--human-reply-file", str(replies),
                  "--context", "none", "--max-turns", "1", "--runs-dir", str(tmp_path / "runs"), "--run-id", "h",
                  "--no-executed")
    assert r.returncode == 0, r.stderr
    assert "Reply format (every turn, complete, never a diff)" in r.stderr
