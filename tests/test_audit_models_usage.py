"""Audit: usage a provider did not report is estimated and said to be, never taken as zero.

An OpenAI-compatible server that sends no `usage` (some proxies and local servers do) came back
through litellm as 0 prompt and 0 completion tokens: the run's summary said it used no tokens,
and a --max-tokens budget never ended it. Now the client counts the prompt and the reply
itself (litellm's tokenizer) and marks the usage `estimated`.
"""
from __future__ import annotations

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, events, probe_reply
import openai_server as server_module
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.models import get_model
from agent.run import SolveRequest, solve
from agent.trajectory import Budget

MESSAGES = [{"role": "system", "content": "You write PTX."}, {"role": "user", "content": "Write a GEMM. " * 50}]


@pytest.fixture
def no_usage(monkeypatch):
    """The server answers without a `usage` object (the body is otherwise OpenAI's)."""
    body = server_module._completion_body

    def without_usage(b, model):
        d = body(b, model)
        d.pop("usage")
        return d

    monkeypatch.setattr(server_module, "_completion_body", without_usage)


def test_missing_usage_is_estimated_and_marked(openai_server, no_usage):
    openai_server.push(S.ok("```cuda\n__global__ void k() {}\n```"))
    model = get_model("openai/test-model", api_base=openai_server.base_url, api_key="sk-test", max_retries=0)
    c = model.complete(MESSAGES)
    assert c.usage.prompt_tokens >= 100, c.usage  # 50 repeats of four words, not 0
    assert c.usage.completion_tokens > 0 and c.usage.estimated


def test_reported_usage_is_taken_as_reported(openai_server):
    openai_server.push(S.ok("hi", usage=(123, 45)))
    model = get_model("openai/test-model", api_base=openai_server.base_url, api_key="sk-test", max_retries=0)
    c = model.complete(MESSAGES)
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.estimated) == (123, 45, False)


def test_a_token_budget_ends_a_run_whose_server_reports_no_usage(openai_server, no_usage, tmp_path):
    openai_server.default = S.ok(probe_reply())
    s = solve(SolveRequest(task=GEMM_TASK, model="openai/test-model", api_base=openai_server.base_url, context="none",
                           budget=Budget(max_turns=3, max_tokens=500),
                           model_options={"retry_base_s": 0.0, "max_retries": 0, "timeout_s": 5.0},
                           runs_dir=tmp_path, executed_check=False), progress=False)
    assert s.usage.prompt_tokens > 500 and s.usage.completion_tokens > 0
    assert s.stop_reason == "max_tokens" and s.turns == 1 and len(openai_server.requests) == 1
    [resp] = events(tmp_path / s.run_id, "llm_response")
    assert resp["usage"]["estimated"] is True


def test_estimated_usage_of_a_priced_model_is_priced(openai_server, no_usage):
    openai_server.push(S.ok("a reply of several words"))
    model = get_model("openai/gpt-4o", api_base=openai_server.base_url, api_key="sk-test", max_retries=0)
    c = model.complete(MESSAGES)
    assert c.usage.estimated and c.usage.cost_usd > 0  # litellm's price on the counted tokens, not $0
