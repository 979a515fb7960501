"""Audit: a replay:<run> model answers as the recorded model did, finish_reason included.

A reply cut off at the output-token limit (finish_reason "length") was recorded as such, but
the replay model returned no finish_reason: the replayed run recorded None, its format error
lost "the reply was cut off", and the feedback it sent differed from the recorded run's.
"""
from __future__ import annotations

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, events
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.run import SolveRequest, solve
from agent.trajectory import Budget

CUT = "Here is the plan: a 128x256 tile with wgmma and TMA, then the kernel:\n\n```cuda\n__global__ void k("


def test_replay_keeps_a_cut_off_reply_s_finish_reason(openai_server, tmp_path):
    openai_server.push(S.ok(CUT, usage=(900, 4096), finish_reason="length"), S.ok("no code", finish_reason="stop"))
    common = dict(task=GEMM_TASK, context="none", budget=Budget(max_turns=2), executed_check=False)
    rec = solve(SolveRequest(model="openai/test-model", api_base=openai_server.base_url,
                             model_options={"max_retries": 0, "timeout_s": 5.0}, runs_dir=tmp_path / "rec", **common),
                progress=False)
    rec_dir = tmp_path / "rec" / rec.run_id
    rep = solve(SolveRequest(model=f"replay:{rec_dir}", runs_dir=tmp_path / "rep", **common), progress=False)
    rep_dir = tmp_path / "rep" / rep.run_id

    finish = lambda d: [e["finish_reason"] for e in events(d, "llm_response")]  # noqa: E731
    assert finish(rec_dir) == ["length", "stop"]
    assert finish(rep_dir) == finish(rec_dir)
    [cut] = [e for e in events(rep_dir, "format_error") if e["turn"] == 1]
    assert "cut off" in cut["message"]
    feedback = lambda d: [e["text"] for e in events(d, "feedback")]  # noqa: E731
    assert feedback(rep_dir) == feedback(rec_dir)
    assert rep.usage.completion_tokens == rec.usage.completion_tokens == 4096 + 5
