"""Audit: what a run records as sent to the model is what reached the provider.

litellm's drop_params quietly removed a parameter the user asked for by name when litellm
believes the model only takes its default (gpt-5 and the o-series take temperature 1 only):
the run's config said temperature 0.2, the provider sampled at its default, and a temperature
comparison compared two identical settings. Asked for by name, a parameter is sent or the call
fails with the reason; only ptxbench's own default (the per-turn seed) is left out where the
provider takes none.
"""
from __future__ import annotations

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, agent_cli, events
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.models import ModelError, get_model
from agent.trajectory import read_summary

MESSAGES = [{"role": "system", "content": "You write PTX."}, {"role": "user", "content": "Write a GEMM."}]


def _model(server, spec="openai/gpt-5", **kw):
    return get_model(spec, api_base=server.base_url, api_key="sk-test", max_retries=0, timeout_s=5, **kw)


@pytest.mark.parametrize("how", ["model_param", "argument"])
def test_a_temperature_asked_for_is_never_dropped_silently(openai_server, how):
    openai_server.push(S.ok("fine"))
    if how == "model_param":
        model, kw = _model(openai_server, params={"temperature": 0.2}), {}
    else:
        model, kw = _model(openai_server), {"temperature": 0.2}
    try:
        model.complete(MESSAGES, seed=3, **kw)
    except ModelError as exc:  # refused, and said why: fine
        assert exc.kind == "bad_request" and "temperature" in str(exc)
        assert openai_server.requests == []
        return
    [req] = openai_server.requests
    assert req.body.get("temperature") == 0.2, f"sent {req.body} although temperature 0.2 was asked for"


def test_the_seed_is_still_sent_where_the_provider_takes_it(openai_server):
    _model(openai_server, spec="openai/gpt-4o").complete(MESSAGES, temperature=0.3, seed=7, max_tokens=50)
    [req] = openai_server.requests
    assert (req.body["seed"], req.body["temperature"], req.body["max_tokens"]) == (7, 0.3, 50)


def test_the_seed_is_left_out_where_the_provider_takes_none(openai_server):
    """Anthropic takes no seed; the request (to the local server, answered 404) goes out without it."""
    model = get_model("anthropic/claude-sonnet-4-5", api_base=openai_server.url, api_key="sk-test", max_retries=0)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES, seed=3, temperature=0.5)
    assert info.value.kind != "bad_request" or openai_server.requests, "refused before sending: the seed was not dropped"
    [req] = openai_server.requests
    assert req.path == "/v1/messages" and "seed" not in req.body and req.body["temperature"] == 0.5


def test_solve_with_a_temperature_the_model_cannot_take_is_not_recorded_as_sent(tmp_path, openai_server):
    """The real CLI: a run whose config says temperature 0.2 either sent 0.2 or stopped on it."""
    openai_server.push(S.no_code_block())
    r = agent_cli("solve", "--task", GEMM_TASK, "--model", "openai/gpt-5", "--api-base", openai_server.base_url,
                  "--temperature", "0.2", "--context", "none", "--max-turns", "1", "--runs-dir", str(tmp_path),
                  "--run-id", "t", "--no-executed")
    summary = read_summary(tmp_path / "t")
    if openai_server.requests:
        assert openai_server.requests[0].body.get("temperature") == 0.2
    else:
        assert r.returncode == 1 and summary.stop_reason == "model_error" and "temperature" in summary.stop_detail
        assert events(tmp_path / "t", "llm_error")[0]["kind"] == "bad_request"
