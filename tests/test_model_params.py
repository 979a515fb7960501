"""Model parameters, prompt-cache markers and cached-token usage, against the real local
OpenAI-compatible server (tests/openai_server.py) through the real litellm path and the real CLI."""
from __future__ import annotations

import json

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli, events
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.models import ModelError, get_model, parse_model_param, with_cache_markers
from agent.run import SolveError, _get_model
from agent.sweep import SweepConfig, expand
from agent.trajectory import read_config, read_summary

MESSAGES = [{"role": "system", "content": "You write PTX."}, {"role": "user", "content": "Write a GEMM."}]


@pytest.mark.parametrize("text, expected", [
    ("temperature=0.2", ("temperature", 0.2)), ("reasoning_effort=high", ("reasoning_effort", "high")),
    ("max_tokens=32000", ("max_tokens", 32000)), ("prompt_cache=false", ("prompt_cache", False)),
    ('thinking={"type": "enabled", "budget_tokens": 1024}', ("thinking", {"type": "enabled", "budget_tokens": 1024})),
    ("stop=a=b", ("stop", "a=b"))])
def test_parse_model_param(text, expected):
    assert parse_model_param(text) == expected


def test_solve_passes_model_params_to_the_server_and_records_them(tmp_path, openai_server):
    openai_server.push(S.ok("no code here", usage=(1000, 20), cached_tokens=768))
    r = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/gpt-4o", "--api-base", openai_server.base_url,
                  "--model-param", "temperature=0.2", "--model-param", "max_tokens=900",
                  "--model-param", "reasoning_effort=high", "--model-param", 'extra_body={"top_k": 20}',
                  "--context", "none", "--max-turns", "1", "--runs-dir", str(tmp_path), "--run-id", "p",
                  "--no-executed")
    assert r.returncode == 0, r.stderr
    [req] = openai_server.requests
    body = req.body
    # reasoning_effort reached the server although litellm's drop_params would drop it for gpt-4o
    assert (body["temperature"], body["max_tokens"], body["reasoning_effort"], body["top_k"]) == (0.2, 900, "high", 20)
    assert "context_window" not in body and "prompt_cache" not in body
    params = {"temperature": 0.2, "max_tokens": 900, "reasoning_effort": "high", "extra_body": {"top_k": 20}}
    assert read_config(tmp_path / "p").model_params == params
    summary = read_summary(tmp_path / "p")
    assert summary.model_params == params and summary.usage.cached_tokens == 768
    [resp] = events(tmp_path / "p", "llm_response")
    assert resp["usage"]["cached_tokens"] == 768 and resp["usage"]["prompt_tokens"] == 1000
    assert resp["usage"]["cost_usd"] > 0  # litellm's price for gpt-4o
    assert "reasoning_effort=\"high\"" in r.stdout  # said in the summary


@pytest.mark.parametrize("args, message", [
    (["--model-param", "seed=3"], "use --seed"),
    (["--model-param", "temperature=0.1", "--temperature", "0.5"], "temperature is given twice"),
    (["--model-param", "context_window=big"], "context_window must be a positive number"),
    (["--model-param", "oops"], "expected key=value"),
    (["--model-param", "a=1", "--model-param", "a=2"], "given twice"),
])
def test_bad_model_params_are_one_line_errors(tmp_path, args, message):
    r = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/gpt-4o", *args, "--runs-dir", str(tmp_path))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_unknown_model_option_is_an_error_not_a_type_error():
    # options={'extra': ...} once raised "got multiple values for keyword argument 'extra'"
    with pytest.raises(SolveError, match="unknown model option 'extra'.*--model-param"):
        _get_model("openai/gpt-4o", None, {"extra": {"temperature": 0.1}}, None)


def test_sweep_params_per_model_reach_the_run(tmp_path):
    cfg = SweepConfig(name="p", tasks=[GEMM_TASK], contexts=["none"], models=[
        {"spec": "scripted:/x/a.json", "name": "a", "params": {"reasoning_effort": "high"}},
        {"spec": "scripted:/x/a.json", "name": "b"}])
    reqs = [r.request(cfg, tmp_path) for r in expand(cfg)]
    assert [q.model_params for q in reqs] == [{"reasoning_effort": "high"}, {}]
    with pytest.raises(ValueError, match="seed"):
        SweepConfig(name="p", tasks=[GEMM_TASK], models=[{"spec": "scripted:/x/a.json", "params": {"seed": 1}}])


def test_cache_markers_on_the_stable_prefix():
    chat = MESSAGES + [{"role": "assistant", "content": "r1"}, {"role": "user", "content": "f1"}]
    marked = with_cache_markers(chat)
    assert [isinstance(m["content"], list) for m in marked] == [True, True, True, False]
    assert marked[0]["content"][0] == {"type": "text", "text": "You write PTX.", "cache_control": {"type": "ephemeral"}}
    assert chat[0]["content"] == "You write PTX."  # the chat itself is not changed
    # the latest pair changes every turn: marking its reply would only pay for cache writes
    assert [isinstance(m["content"], list) for m in with_cache_markers(chat, grows=False)] == [True, True, False, False]


def test_claude_requests_carry_cache_control_and_thinking(openai_server):
    """Anthropic's API on the local server: it answers 404, but the request it received is the
    one litellm would send to Anthropic."""
    model = get_model("anthropic/claude-sonnet-4-5", api_base=openai_server.url, api_key="sk-test", max_retries=0,
                      params={"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 4096})
    with pytest.raises(ModelError):
        model.complete(MESSAGES)
    [req] = openai_server.requests
    assert req.path == "/v1/messages" and req.body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert req.body["max_tokens"] == 4096
    assert req.body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert req.body["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}


def test_openai_compatible_requests_carry_no_markers(openai_server):
    get_model("openai/test-model", api_base=openai_server.base_url, api_key="sk-test").complete(MESSAGES)
    assert "cache_control" not in json.dumps(openai_server.requests[0].body)


def test_context_size_uses_the_window_given_or_litellm_s_table():
    size = get_model("openai/gpt-4o").context_size(MESSAGES)
    assert size.window == 128000 and size.source == "litellm's model table" and 0 < size.prompt_tokens < 50
    small = get_model("openai/gpt-4o", params={"context_window": 10, "max_tokens": 5}).context_size(MESSAGES)
    assert small.exceeded and small.reserve == 5 and "model parameter" in small.describe()
    assert get_model("openai/some-local-model", api_base="http://127.0.0.1:9").context_size(MESSAGES).window is None
