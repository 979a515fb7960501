"""The shipped example run (runs/examples/attn_bwd_human) shows what today's loop sends: its replies
driven through the loop again must send the very prompts it recorded, turn by turn (issue 41 item 11).
When the prompts, the task statement, the docs or the feedback change, this fails until the example
is re-recorded with scripts/rerecord_example.py (one command; commit its output)."""
from __future__ import annotations

import re

import pytest
from agent_loop_helpers import REPO, cpu_only  # noqa: F401  (autouse fixture: the example was recorded on CPU)

from agent.run import SolveRequest, solve
from agent.trajectory import Budget, read_config, read_events

EXAMPLE = REPO / "runs" / "examples" / "attn_bwd_human"
RERECORD = "PYTHONPATH=$PWD python scripts/rerecord_example.py"


def _requests(run_dir) -> list[list[dict]]:
    return [e["messages"] for e in read_events(run_dir, "llm_request")]


def test_example_prompts_are_what_the_loop_renders_today(tmp_path):
    config = read_config(EXAMPLE)
    s = solve(SolveRequest(task=config.task, model=f"replay:{EXAMPLE}", arch=config.arch, lang=config.lang,
                           context=config.context, context_tokens=config.context_tokens,
                           budget=Budget(max_turns=config.budget.max_turns), require=config.require,
                           runs_dir=tmp_path), progress=False)
    now, then = _requests(tmp_path / s.run_id), _requests(EXAMPLE)
    assert len(now) == len(then), f"{len(now)} turns sent now, {len(then)} recorded; re-record: {RERECORD}"
    for turn, (a, b) in enumerate(zip(now, then), 1):
        for i, (m, r) in enumerate(zip(a, b)):
            assert m == r, (f"turn {turn}, message {i} ({m['role']}) differs from the recorded example; "
                            f"re-record it: {RERECORD}")
        assert len(a) == len(b), f"turn {turn}: {len(a)} messages now, {len(b)} recorded; re-record: {RERECORD}"


def test_example_feedback_cites_no_kernel_line_beyond_its_length():
    """A line number under "lines refer to your kernel.cu" is a line of that file."""
    for fb in read_events(EXAMPLE, "feedback"):
        kernel = (EXAMPLE / fb["parent"] / "kernel.cu").read_text().splitlines()
        cited = [int(n) for n in re.findall(r"(?<!ptx )\bline (\d+)", fb["text"])]
        assert all(n <= len(kernel) for n in cited), (fb["turn"], cited, len(kernel))
