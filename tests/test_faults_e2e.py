"""The litellm path end to end through the graph, against a real local OpenAI-compatible
server that injects faults: 429, 500, a timeout, a malformed body, a reply without code,
an auth error, retries running out. Retries happen, every fault is in events.jsonl, the
run carries on or stops with a clear reason, and nothing recorded is lost."""
from __future__ import annotations

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, events, probe_reply
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.run import SolveRequest, solve
from agent.trajectory import Budget, read_summary

FAST_RETRIES = {"retry_base_s": 0.0, "max_retries": 4, "timeout_s": 1.0}


def run(server, tmp_path, max_turns, **options):
    s = solve(SolveRequest(task=GEMM_TASK, model="openai/test-model", api_base=server.base_url, context="none",
                           budget=Budget(max_turns=max_turns), model_options={**FAST_RETRIES, **options},
                           runs_dir=tmp_path), progress=False)
    return s, tmp_path / s.run_id


def test_transport_faults_are_retried_and_recorded_and_the_run_goes_on(openai_server, tmp_path):
    openai_server.push(S.status(429, retry_after=0), S.status(500), S.delay(3), S.malformed_json(),
                       S.ok(probe_reply(), usage=(1000, 400)),
                       S.no_code_block(),
                       S.ok(probe_reply(), usage=(1500, 400)))
    summary, run_dir = run(openai_server, tmp_path, max_turns=3)

    faults = events(run_dir, "fault")
    assert [f["kind"] for f in faults] == ["rate_limit", "server_error", "timeout", "malformed"]
    assert all(f["retryable"] and f["turn"] == 1 and f["sample"] == 0 for f in faults)
    assert [f["attempt"] for f in faults] == [1, 2, 3, 4] and faults[0]["status"] == 429
    assert summary.faults == 4
    [r1, r2, r3] = events(run_dir, "llm_response")
    assert r1["attempts"] == 5 and r1["usage"]["prompt_tokens"] == 1000 and r2["attempts"] == 1

    # The reply without code counted as a turn, and the model was asked for the format.
    assert [t.candidates[0].outcome for t in summary.per_turn] == ["unverified", "format_error", "unverified"]
    assert summary.decisions == ["optimise", "repair", "stop"] and summary.stop_reason == "max_turns"
    last_request = openai_server.requests[-1].messages
    assert "could not be used" in last_request[-1]["content"] and "```json```" in last_request[-1]["content"]
    assert last_request[-2] == {"role": "assistant", "content": S.no_code_block().text}

    # Nothing lost: 7 requests reached the server, 3 answered, all 3 answers recorded with their usage.
    assert len(openai_server.requests) == 7
    assert summary.usage.llm_calls == 3 and summary.usage.prompt_tokens == 1000 + 10 + 1500
    assert summary.best_path == "candidates/1-0" and read_summary(run_dir) == summary
    for t in (1, 2, 3):
        assert (run_dir / "candidates" / f"{t}-0" / "reply.md").exists()


def test_auth_error_stops_at_once_with_the_reason(openai_server, tmp_path):
    openai_server.push(S.status(401, "Incorrect API key provided"))
    summary, run_dir = run(openai_server, tmp_path, max_turns=3)
    assert len(openai_server.requests) == 1  # an auth error is not retried
    assert summary.status == "finished" and summary.stop_reason == "model_error" and summary.turns == 0
    assert summary.stop_detail.startswith("auth:") and "Incorrect API key" in summary.stop_detail
    assert read_summary(run_dir) == summary
    [fault] = events(run_dir, "fault")
    assert fault["kind"] == "auth" and fault["status"] == 401 and not fault["retryable"]
    assert events(run_dir, "llm_error")[0]["kind"] == "auth"
    assert events(run_dir, "run_end")[0]["stop_reason"] == "model_error"


def test_retries_exhausted_ends_with_the_best_so_far(openai_server, tmp_path):
    openai_server.push(S.ok(probe_reply()), *[S.status(500)] * 3)
    summary, run_dir = run(openai_server, tmp_path, max_turns=5, max_retries=2)
    assert summary.stop_reason == "model_error" and "server_error" in summary.stop_detail
    assert summary.turns == 1 and summary.best_path == "candidates/1-0"
    assert len(openai_server.requests) == 4  # one answer, then 1 try + 2 retries
    assert [f["kind"] for f in events(run_dir, "fault")] == ["server_error"] * 3
    assert summary.faults == 3 and summary.decisions == ["optimise", "stop"]


def test_a_run_stopped_by_the_model_resumes_with_the_failed_turn(openai_server, tmp_path):
    from agent.run import resume

    openai_server.push(S.ok(probe_reply()), *[S.status(503)] * 2)
    summary, run_dir = run(openai_server, tmp_path, max_turns=2, max_retries=1)
    assert summary.stop_reason == "model_error" and summary.turns == 1
    openai_server.push(S.ok(probe_reply()))  # the outage is over
    resumed = resume(str(run_dir), progress=False)
    assert resumed.status == "finished" and resumed.stop_reason == "max_turns" and resumed.turns == 2
    assert resumed.decisions == ["optimise", "stop"]
    assert [e["turn"] for e in events(run_dir, "llm_response")] == [1, 2]
    assert events(run_dir, "run_start")[-1]["retried_turn"] == 2
    turn2 = openai_server.requests[-1].messages
    assert [m["role"] for m in turn2] == ["system", "user", "assistant", "user"]  # turn 2's prompt, once
