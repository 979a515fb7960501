"""Model clients against a real local OpenAI-compatible server, through the real litellm path."""
from __future__ import annotations

import json
import socket
import sys

import pytest
from openai_server import OpenAIServer as S
from openai_server import openai_server  # noqa: F401  (the fixture)

from agent.models import Completion, Fault, ModelError, ScriptedModel, Usage, get_model

MESSAGES = [{"role": "system", "content": "You write PTX."}, {"role": "user", "content": "Write a GEMM."}]


def model_for(server, **kw):
    kw = {"retry_base_s": 0.01, "retry_max_s": 0.05, "timeout_s": 5, **kw}
    return get_model("openai/test-model", api_base=server.base_url, api_key="sk-test", **kw)


def test_reply_usage_and_request(openai_server):
    openai_server.push(S.ok("```cuda\n__global__ void k() {}\n```", usage=(123, 45)))
    c = model_for(openai_server).complete(MESSAGES, max_tokens=100, temperature=0.5, seed=7)
    assert isinstance(c, Completion)
    assert c.text.startswith("```cuda") and c.attempts == 1 and c.faults == []
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (123, 45)
    assert c.usage.cost_usd is None  # litellm has no price for "test-model": None, not a crash
    assert c.model == "test-model" and c.raw["choices"][0]["finish_reason"] == "stop"
    json.dumps(c.raw)  # JSON-able, as the trajectory writes it
    [req] = openai_server.requests
    assert req.path == "/v1/chat/completions" and req.model == "test-model"
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.messages == MESSAGES
    assert (req.body["max_tokens"], req.body["temperature"], req.body["seed"]) == (100, 0.5, 7)


def test_rate_limit_then_success_retries_once(openai_server):
    openai_server.push(S.status(429, retry_after=0), S.ok("hi"))
    seen: list[Fault] = []
    c = model_for(openai_server).complete(MESSAGES, on_fault=seen.append)
    assert c.text == "hi" and c.attempts == 2 and len(openai_server.requests) == 2
    [f] = c.faults
    assert (f.kind, f.status, f.attempt) == ("rate_limit", 429, 1) and f.wait_s > 0
    assert seen == c.faults


def test_retry_after_is_honoured_within_the_bound(openai_server):
    openai_server.push(S.status(429, retry_after=30), S.ok("hi"))
    c = model_for(openai_server, retry_max_s=0.2).complete(MESSAGES)
    assert c.faults[0].wait_s == pytest.approx(0.2)  # asked for 30 s, capped at retry_max_s


HTML = "<html><body><h1>upstream went away</h1></body></html>"  # what a proxy in front sends


@pytest.mark.parametrize("status,html", [(500, False), (502, False), (503, False), (502, True)])
def test_server_errors_are_retried(openai_server, status, html):
    openai_server.push(S.status(status, raw_body=HTML if html else None), S.ok("fine"))
    c = model_for(openai_server).complete(MESSAGES)
    assert c.text == "fine" and c.attempts == 2
    assert [(f.kind, f.status) for f in c.faults] == [("server_error", status)]


def test_client_timeout_is_retried(openai_server):
    openai_server.push(S.delay(3), S.ok("on time"))
    c = model_for(openai_server, timeout_s=1).complete(MESSAGES)
    assert c.text == "on time" and c.attempts == 2
    assert [f.kind for f in c.faults] == ["timeout"]
    assert 1 <= c.latency_s < 2.5


@pytest.mark.parametrize("bad", [S.malformed_json(), S.no_choices()], ids=["invalid_json", "no_choices"])
def test_malformed_response_is_retried(openai_server, bad):
    openai_server.push(bad, S.ok("whole"))
    c = model_for(openai_server).complete(MESSAGES)
    assert c.text == "whole" and [f.kind for f in c.faults] == ["malformed"]


def test_refused_connection_is_retried_then_fails():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = get_model("openai/test-model", api_base=f"http://127.0.0.1:{port}/v1", api_key="sk-test",
                      max_retries=1, retry_base_s=0.01, timeout_s=5)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES)
    assert info.value.kind == "connection" and info.value.retryable
    assert [f.kind for f in info.value.faults] == ["connection", "connection"]


@pytest.mark.parametrize("status,kind,html", [(401, "auth", False), (403, "auth", False), (401, "auth", True),
                                              (400, "bad_request", False), (404, "bad_request", False),
                                              (400, "bad_request", True)])
def test_client_errors_are_not_retried(openai_server, status, kind, html):
    openai_server.push(S.status(status, raw_body=HTML if html else None), S.ok("never sent"))
    seen = []
    with pytest.raises(ModelError) as info:
        model_for(openai_server).complete(MESSAGES, on_fault=seen.append)
    e = info.value
    assert (e.kind, e.retryable) == (kind, False)
    assert len(openai_server.requests) == 1
    assert [(f.kind, f.status, f.wait_s) for f in e.faults] == [(kind, status, 0.0)] and seen == e.faults


def test_missing_api_key_is_not_retried(openai_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = get_model("openai/test-model", api_base=openai_server.base_url, retry_base_s=0.01)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES)  # litellm reports this as a 500 although nothing was sent
    assert (info.value.kind, info.value.retryable, len(info.value.faults)) == ("auth", False, 1)
    assert openai_server.requests == []


def test_context_window_exceeded_is_its_own_kind(openai_server):
    # the prompt outgrew the window: the graph ends the run as context_exceeded, not a model error
    openai_server.push(S.context_window_exceeded())
    with pytest.raises(ModelError) as info:
        model_for(openai_server).complete(MESSAGES)
    assert info.value.kind == "context_exceeded" and not info.value.retryable
    assert "ContextWindowExceeded" in info.value.faults[0].message and len(openai_server.requests) == 1


def test_exhausted_retries_raise_with_every_fault(openai_server):
    openai_server.push(S.status(500), S.status(503), S.status(500), S.ok("too late"))
    with pytest.raises(ModelError) as info:
        model_for(openai_server, max_retries=2).complete(MESSAGES)
    e = info.value
    assert e.kind == "server_error" and e.retryable  # the kind is transient; our patience ran out
    assert [(f.status, f.attempt) for f in e.faults] == [(500, 1), (503, 2), (500, 3)]
    assert [f.wait_s > 0 for f in e.faults] == [True, True, False]
    assert len(openai_server.requests) == 3


def test_on_fault_sees_each_fault_in_order_as_it_happens(openai_server):
    openai_server.push(S.status(429, retry_after=0), S.status(500), S.malformed_json(), S.ok("done"))
    seen = []
    c = model_for(openai_server).complete(
        MESSAGES, on_fault=lambda f: seen.append((f.kind, len(openai_server.requests))))
    # each fault is reported before the next request goes out
    assert seen == [("rate_limit", 1), ("server_error", 2), ("malformed", 3)]
    assert [f.attempt for f in c.faults] == [1, 2, 3] and c.attempts == 4


def test_empty_or_prose_replies_are_replies_not_faults(openai_server):
    openai_server.push(S.ok("", usage=(50, 4096), finish_reason="length"), S.no_code_block())
    model = model_for(openai_server)
    empty = model.complete(MESSAGES)
    assert empty.text == "" and empty.faults == [] and empty.raw["choices"][0]["finish_reason"] == "length"
    prose = model.complete(MESSAGES)
    assert "```" not in prose.text and prose.attempts == 1


def test_cost_from_litellm_price_table():
    # mock_response goes through litellm's real response and cost path without a network
    c = get_model("openai/gpt-4o", extra={"mock_response": "hello"}).complete(MESSAGES)
    assert c.text == "hello" and c.usage.prompt_tokens > 0 and c.usage.cost_usd > 0


def test_unknown_provider_fails_at_construction():
    with pytest.raises(ValueError, match="provider"):
        get_model("test-model")


# ---- replay, scripted, human ----------------------------------------------------------------

def write_run(tmp_path):
    events = [
        {"type": "run_start", "config": {}},
        {"type": "llm_response", "text": "first", "model": "openai/gpt-x",
         "usage": {"prompt_tokens": 10, "completion_tokens": 20, "cost_usd": 0.5}},
        {"type": "eval", "verdict": "compile_error"},
        {"type": "llm_response", "text": "second", "usage": {"prompt_tokens": 30, "completion_tokens": 40,
                                                             "cost_usd": None}},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return tmp_path


def test_replay_returns_recorded_responses_in_order(tmp_path):
    model = get_model(f"replay:{write_run(tmp_path)}")
    a, b = model.complete(MESSAGES), model.complete(MESSAGES)
    assert (a.text, a.usage, a.model) == ("first", Usage(10, 20, 0.5), "openai/gpt-x")
    assert (b.text, b.usage) == ("second", Usage(30, 40, None))
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES)
    assert info.value.kind == "replay_exhausted" and not info.value.retryable


def test_replay_ignores_a_last_line_cut_short(tmp_path):
    run = write_run(tmp_path)
    with (run / "events.jsonl").open("a") as f:
        f.write('{"type": "llm_response", "text": "cut sh')
    model = get_model(f"replay:{run / 'events.jsonl'}")
    assert [model.complete(MESSAGES).text for _ in range(2)] == ["first", "second"]


def test_replay_of_a_missing_run_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="events.jsonl"):
        get_model(f"replay:{tmp_path / 'nope'}")


def test_scripted_faults_go_through_the_retry_loop():
    model = ScriptedModel(replies=[{"fault": "rate_limit"}, "kernel", {"text": "k2", "usage": {
        "prompt_tokens": 1, "completion_tokens": 2, "cost_usd": 0.25}}, {"fault": "auth"}])
    seen = []
    c = model.complete(MESSAGES, on_fault=seen.append)
    assert (c.text, c.attempts, [f.kind for f in seen]) == ("kernel", 2, ["rate_limit"])
    assert c.usage.prompt_tokens > 0 and c.usage.cost_usd == 0.0
    assert model.complete(MESSAGES).usage == Usage(1, 2, 0.25)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES)
    assert (info.value.kind, info.value.retryable) == ("auth", False)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES)
    assert info.value.kind == "script_exhausted"


def test_scripted_exhaustion_keeps_earlier_faults():
    with pytest.raises(ModelError) as info:
        ScriptedModel(replies=[{"fault": "server_error"}]).complete(MESSAGES)
    assert info.value.kind == "script_exhausted" and [f.kind for f in info.value.faults] == ["server_error"]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_scripted_from_file(tmp_path, suffix):
    path = tmp_path / f"script{suffix}"
    path.write_text(json.dumps(["a", {"text": "b"}]) if suffix == ".json" else "replies:\n  - a\n  - text: b\n")
    model = get_model(f"scripted:{path}")
    assert [model.complete(MESSAGES).text for _ in range(2)] == ["a", "b"]


def test_human_reply_from_a_folder_of_files(tmp_path, capsys):
    (tmp_path / "1.md").write_text("turn one")
    (tmp_path / "2.md").write_text("turn two")
    model = get_model("human", extra={"reply_file": str(tmp_path)})
    assert [model.complete(MESSAGES).text for _ in range(2)] == ["turn one", "turn two"]
    assert "Write a GEMM." in capsys.readouterr().err
    with pytest.raises(ModelError):
        model.complete(MESSAGES)


def test_human_reply_from_env_file(tmp_path, monkeypatch):
    (tmp_path / "reply.md").write_text("from env")
    monkeypatch.setenv("PTXBENCH_HUMAN_REPLY_FILE", str(tmp_path / "reply.md"))
    assert get_model("human").complete(MESSAGES).text == "from env"


def test_human_reply_from_editor(monkeypatch):
    # A real editor process: appends the reply below the template's marker line.
    script = "import sys; open(sys.argv[1], 'a').write('#include <cuda.h>\\nkernel text\\n')"
    monkeypatch.delenv("VISUAL", raising=False)
    monkeypatch.delenv("PTXBENCH_HUMAN_REPLY_FILE", raising=False)
    monkeypatch.setenv("EDITOR", f"{sys.executable} -c \"{script}\"")
    c = get_model("human").complete(MESSAGES)
    assert c.text == "#include <cuda.h>\nkernel text" and c.usage == Usage(0, 0, 0.0)
