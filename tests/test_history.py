"""The history policy and the context-window check, through the real loop (real NVRTC/ptxas,
SQLite, the real `agent` CLI and a real local OpenAI-compatible server); the model's replies
are scripted.

The stated size: an 8-turn replay of attention backward (the repo's SIMT kernel as every
reply, docs arm) with `--history latest` sends at most LATEST_8_TURN_LIMIT tokens in any
request (gpt-4o's tokenizer; measured 16.0k-17.8k on 2026-12-01 as the docs changed), flat
from turn 2 on (within a few tokens: the feedback's figures), where the full history grows by
~3.7k tokens a turn (38.2k at turn 8). The bound is what the policy guarantees: the system
prompt, the task with turn 1's docs (--context-tokens 6000), one reply, one feedback and at most
--context-turn-tokens (2000) of new docs.
"""
from __future__ import annotations

import json
import os

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (GEMM_TASK, agent_cli, broken_probe_reply, events, probe_reply,
                                simple_attn_bwd_reply, write_script)
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent import prompts
from agent.run import SolveRequest, solve
from agent.sweep import SweepConfig, expand
from agent.trajectory import Budget, read_config, read_summary

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
LATEST_8_TURN_LIMIT = 20_000  # tokens (gpt-4o's tokenizer) in any one request; see the module docstring


def _tokens(messages: list[dict]) -> int:
    import litellm

    return litellm.token_counter(model="gpt-4o", messages=messages)


def test_history_view_keeps_system_task_and_the_latest_pair():
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for t in range(1, 5):
        chat += [{"role": "assistant", "content": f"reply {t}"}, {"role": "user", "content": f"feedback {t}"}]
    assert prompts.history_view(chat, "full") == chat
    assert [m["content"] for m in prompts.history_view(chat, "latest")] == ["s", "task", "reply 4", "feedback 4"]
    assert prompts.history_view(chat[:4], "latest") == chat[:4]  # turn 2: nothing to drop yet


def test_eight_turn_replay_with_latest_history_stays_flat_and_under_the_stated_size(tmp_path):
    model = write_script(tmp_path / "script.json", [simple_attn_bwd_reply()] * 8)
    summary = solve(SolveRequest(task="attn_bwd", model=model, runs_dir=tmp_path / "runs", context="docs",
                                 budget=Budget(max_turns=8), history="latest"), progress=False)
    run_dir = tmp_path / "runs" / summary.run_id
    assert summary.status == "finished" and summary.stop_reason == "max_turns" and summary.turns == 8
    assert summary.history == "latest" and read_config(run_dir).history == "latest"
    requests = events(run_dir, "llm_request")
    assert [r["turn"] for r in requests] == list(range(1, 9)) and all(r["history"] == "latest" for r in requests)
    sizes = [_tokens(r["messages"]) for r in requests]
    assert max(sizes) <= LATEST_8_TURN_LIMIT, sizes
    assert max(sizes[1:]) - min(sizes[1:]) <= 0.01 * sizes[1], sizes  # turns 2..8: system, task, one pair
    for r in requests[1:]:
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["system", "user", "assistant", "user"]
        # the docs a turn adds come first; the message ends with the next step and the budget
        assert f"This is turn {r['turn']} of 8" in r["messages"][-1]["content"].splitlines()[-1]
    # the recorded size is what the context check measured
    assert all(r["context"]["prompt_tokens"] > 0 and r["context"]["window"] is None for r in requests)


def test_docs_added_after_turn_one_are_capped_per_turn(tmp_path):
    model = write_script(tmp_path / "script.json", [broken_probe_reply(), probe_reply()])
    summary = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp_path / "runs", context="docs",
                                 budget=Budget(max_turns=2), context_turn_tokens=300), progress=False)
    run_dir = tmp_path / "runs" / summary.run_id
    [r1, r2] = events(run_dir, "retrieval")
    by_id = {s["id"]: s["tokens"] for s in r2["sections"]}
    assert sum(by_id[i] for i in r2["new_sections"]) <= 300
    assert read_config(run_dir).context_turn_tokens == 300


def test_a_prompt_over_the_window_ends_the_run_as_context_exceeded(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"replies": [broken_probe_reply(), probe_reply(), probe_reply()],
                                  "context_window": 9000}))  # turn 1 fits (~7k), turn 2 does not
    summary = solve(SolveRequest(task=GEMM_TASK, model=f"scripted:{script}", runs_dir=tmp_path / "runs",
                                 context="docs", budget=Budget(max_turns=3)), progress=False)
    run_dir = tmp_path / "runs" / summary.run_id
    assert summary.status == "finished" and summary.stop_reason == "context_exceeded"
    assert summary.turns == 1 and "turn 2:" in summary.stop_detail and "context window of 9000" in summary.stop_detail
    [ex] = events(run_dir, "context_exceeded")
    assert ex["turn"] == 2 and ex["window"] == 9000 and ex["prompt_tokens"] > 9000
    assert [r["turn"] for r in events(run_dir, "llm_request")] == [1]  # nothing was sent on turn 2
    assert not events(run_dir, "llm_error")


def test_latest_history_fits_where_full_does_not(tmp_path):
    """The arm must not decide the outcome: with the same window, the latest pair keeps going."""
    replies = [broken_probe_reply()] * 4
    free = solve(SolveRequest(task=GEMM_TASK, model=write_script(tmp_path / "free.json", replies),
                              runs_dir=tmp_path / "free", context="none", budget=Budget(max_turns=4)), progress=False)
    sizes = [r["context"]["prompt_tokens"] for r in events(tmp_path / "free" / free.run_id, "llm_request")]
    assert sizes == sorted(sizes) and sizes[2] > sizes[1]  # the full chat grows
    window = (sizes[1] + sizes[2]) // 2  # turn 2's prompt fits, turn 3's full chat does not
    outcomes = {}
    for history in ("full", "latest"):
        script = tmp_path / f"{history}.json"
        script.write_text(json.dumps({"replies": replies, "context_window": window}))
        s = solve(SolveRequest(task=GEMM_TASK, model=f"scripted:{script}", runs_dir=tmp_path / history,
                               context="none", budget=Budget(max_turns=4), history=history), progress=False)
        outcomes[history] = (s.stop_reason, s.turns)
    assert outcomes["latest"] == ("max_turns", 4)
    assert outcomes["full"] == ("context_exceeded", 2)


def test_cli_window_from_a_model_param_and_from_the_server(tmp_path, openai_server):
    # --model-param context_window: the check runs before anything is sent
    r = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/test-model", "--api-base", openai_server.base_url,
                  "--model-param", "context_window=500", "--context", "none", "--max-turns", "2",
                  "--runs-dir", str(tmp_path / "a"), "--run-id", "small", "--no-executed")
    assert r.returncode == 0, r.stderr
    s = read_summary(tmp_path / "a" / "small")
    assert s.stop_reason == "context_exceeded" and "model parameter context_window" in s.stop_detail
    assert openai_server.requests == [] and s.model_params == {"context_window": 500}
    # the server refuses the size itself: also context_exceeded, never a model error
    openai_server.push(S.context_window_exceeded())
    r = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/test-model", "--api-base", openai_server.base_url,
                  "--context", "none", "--max-turns", "2", "--runs-dir", str(tmp_path / "b"), "--run-id", "srv",
                  "--no-executed")
    s = read_summary(tmp_path / "b" / "srv")
    assert s.stop_reason == "context_exceeded" and "maximum context length" in s.stop_detail, r.stderr
    assert len(openai_server.requests) == 1  # not retried


def test_history_is_a_sweep_axis_with_its_own_run_ids():
    cfg = SweepConfig(name="h", models=["scripted:/x/a.json"], tasks=[GEMM_TASK], contexts=["none"],
                      histories=["full", "latest"])
    runs = expand(cfg)
    assert [r.run_id.split("/")[-2:] for r in runs] == [["none", "r0"], ["latest", "r0"]]
    assert [r.request(cfg, "runs").history for r in runs] == ["full", "latest"]
    with pytest.raises(ValueError, match="histories"):
        SweepConfig(name="h", models=["scripted:/x/a.json"], tasks=[GEMM_TASK], histories=["some"])
