"""Audit: a provider failure in the middle of a best-of-N turn.

With --samples 2, sample 0 answered and sample 1 met an outage (retries ran out). The turn was
evaluated and counted with one sample of two: reports measured it at turn limits up to it as
if the model had had its N tries, and a resume found the turn finished, so the missing sample
was never asked for. A turn is a turn of N samples or not a turn: the run stops (model_error)
before the partial turn, and a resume finishes it, reusing the recorded answer of sample 0.
"""
from __future__ import annotations

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, events, probe_reply
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.run import SolveRequest, resume, solve
from agent.trajectory import Budget


def test_an_outage_in_sample_1_does_not_count_a_turn_of_one_sample(openai_server, tmp_path):
    openai_server.push(S.ok(probe_reply(), usage=(1000, 100)), *[S.status(503)] * 2)
    s = solve(SolveRequest(task=GEMM_TASK, model="openai/test-model", api_base=openai_server.base_url,
                           context="none", samples=2, budget=Budget(max_turns=1), executed_check=False,
                           model_options={"retry_base_s": 0.0, "max_retries": 1, "timeout_s": 5.0},
                           runs_dir=tmp_path), progress=False)
    run_dir = tmp_path / s.run_id
    assert s.stop_reason == "model_error"
    # the turn had one sample of two: not a measured turn
    assert s.turns == 0 and s.per_turn == []

    openai_server.push(S.ok(probe_reply(), usage=(1000, 100)))  # the outage is over
    r = resume(str(run_dir), progress=False)
    assert r.status == "finished" and r.stop_reason == "max_turns" and r.turns == 1
    assert [c.sample for c in r.per_turn[0].candidates] == [0, 1]
    assert len(openai_server.requests) == 4  # sample 0 once, sample 1 twice (failed), then once more
    assert [(e["turn"], e["sample"]) for e in events(run_dir, "llm_response")] == [(1, 0), (1, 1)]
    assert r.usage.llm_calls == 2 and r.usage.prompt_tokens == 2000


def test_a_human_out_of_replies_mid_turn_still_has_the_replies_judged(tmp_path):
    """A natural end (no reply file left) is no outage: the replies that came are judged."""
    replies = tmp_path / "replies"
    replies.mkdir()
    (replies / "1.md").write_text(probe_reply())
    s = solve(SolveRequest(task=GEMM_TASK, model="human", human_reply_file=str(replies), context="none", samples=2,
                           budget=Budget(max_turns=2), executed_check=False, runs_dir=tmp_path / "runs"),
              progress=False)
    assert s.stop_reason == "human_end" and s.turns == 1
    assert [c.sample for c in s.per_turn[0].candidates] == [0] and s.best_path == "candidates/1-0"
