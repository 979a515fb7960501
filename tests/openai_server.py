"""A real local HTTP server speaking the OpenAI chat completions API, with fault injection.

Tests queue behaviours (a reply, an HTTP error, a delay, a malformed body) and point a real
client (litellm, the openai SDK) at `server.base_url`. Every request is recorded so tests can
assert what the client sent. Loopback only; it stops itself after `lifetime_s` even if a test
forgets to stop it.

    from openai_server import OpenAIServer, openai_server  # the fixture, in a test module
    def test_x(openai_server):
        openai_server.push(OpenAIServer.status(429, retry_after=0), OpenAIServer.ok("hi"))
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout", 429: "rate_limit_error"}


@dataclass
class Behaviour:
    """What the server does for one request."""

    kind: str  # "ok" | "status" | "delay" | "malformed_json" | "no_choices"
    text: str = ""
    usage: tuple[int, int] = (10, 5)
    cached_tokens: int | None = None  # prompt tokens the server says came from its prompt cache
    finish_reason: str = "stop"
    status: int = 200
    message: str = ""
    code: str | None = None
    retry_after: float | None = None
    raw_body: str | None = None  # sent as is instead of OpenAI's error JSON (an HTML page from a proxy)
    delay_s: float = 0.0
    then: "Behaviour | None" = None  # what a delayed request answers, if the client still waits


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None

    @property
    def messages(self) -> list[dict]:
        return (self.body or {}).get("messages", [])

    @property
    def model(self) -> str | None:
        return (self.body or {}).get("model")


@dataclass
class OpenAIServer:
    default: Behaviour = field(default_factory=lambda: OpenAIServer.ok("ok"))
    lifetime_s: float = 300.0
    queue: deque = field(default_factory=deque)
    requests: list[Request] = field(default_factory=list)
    # request fields this "model" refuses with a 400, as OpenAI refuses temperature for gpt-5 and the o-series
    refuse_params: tuple[str, ...] = ()

    # ---- behaviours -------------------------------------------------------------------
    @staticmethod
    def ok(text: str = "ok", usage: tuple[int, int] = (10, 5), finish_reason: str = "stop",
           cached_tokens: int | None = None) -> Behaviour:
        return Behaviour("ok", text=text, usage=usage, finish_reason=finish_reason, cached_tokens=cached_tokens)

    @staticmethod
    def status(code: int, message: str | None = None, *, retry_after: float | None = None,
               error_code: str | None = None, raw_body: str | None = None) -> Behaviour:
        return Behaviour("status", status=code, message=message or f"injected HTTP {code}",
                         retry_after=retry_after, code=error_code, raw_body=raw_body)

    @staticmethod
    def context_window_exceeded() -> Behaviour:
        return OpenAIServer.status(
            400, "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages.",
            error_code="context_length_exceeded")

    @staticmethod
    def delay(seconds: float, then: Behaviour | None = None) -> Behaviour:
        return Behaviour("delay", delay_s=seconds, then=then or OpenAIServer.ok("late"))

    @staticmethod
    def malformed_json() -> Behaviour:
        return Behaviour("malformed_json")

    @staticmethod
    def no_choices() -> Behaviour:
        return Behaviour("no_choices")

    @staticmethod
    def no_code_block() -> Behaviour:
        return OpenAIServer.ok("I would use wgmma with a 128x256 tile, but here is only prose, no code.")

    # ---- control ----------------------------------------------------------------------
    def push(self, *behaviours: Behaviour) -> "OpenAIServer":
        self.queue.extend(behaviours)
        return self

    def start(self) -> "OpenAIServer":
        self._stopping = threading.Event()
        self._connections: set = set()  # open keep-alive sockets, closed on stop
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="openai-test-server", daemon=True)
        self._thread.start()
        # Stops itself: a forgotten server never outlives the test session by much.
        self._reaper = threading.Timer(self.lifetime_s, self.stop)
        self._reaper.daemon = True
        self._reaper.start()
        return self

    def stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()  # wakes delayed handlers
        self._reaper.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()
        for conn in list(self._connections):  # handler threads blocked on a keep-alive read end now
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def _next(self) -> Behaviour:
        try:
            return self.queue.popleft()
        except IndexError:
            return self.default


def _completion_body(b: Behaviour, model: str | None) -> dict:
    prompt, completion = b.usage
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if b.cached_tokens is not None:  # OpenAI's shape for a prompt-cache hit
        usage["prompt_tokens_details"] = {"cached_tokens": b.cached_tokens}
    return {
        "id": f"chatcmpl-test-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
        "model": model or "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": b.text},
                     "finish_reason": b.finish_reason}],
        "usage": usage,
    }


def _make_handler(server: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def setup(self) -> None:
            super().setup()
            server._connections.add(self.connection)

        def finish(self) -> None:
            server._connections.discard(self.connection)
            super().finish()

        def do_GET(self) -> None:
            self._send(404, {"error": {"message": "not found", "type": "not_found_error"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            server.requests.append(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found_error"}})
                return
            refused = [k for k in server.refuse_params if k in (body or {})]
            if refused:
                self._answer(OpenAIServer.status(400, f"Unsupported parameter: '{refused[0]}' is not supported with "
                                                      f"this model.", error_code="unsupported_parameter"), body)
                return
            self._answer(server._next(), body)

        def _answer(self, b: Behaviour, body: dict | None) -> None:
            model = (body or {}).get("model")
            if b.kind == "delay":
                if server._stopping.wait(b.delay_s):
                    return
                self._answer(b.then, body)
            elif b.kind == "ok":
                self._send(200, _completion_body(b, model))
            elif b.kind == "status":
                headers = {} if b.retry_after is None else {"Retry-After": f"{b.retry_after:g}"}
                error = {"message": b.message, "type": _ERROR_TYPES.get(b.status, "server_error"),
                         "param": None, "code": b.code}
                if b.raw_body is not None:
                    self._send_bytes(b.status, b.raw_body.encode(), headers, content_type="text/html")
                else:
                    self._send(b.status, {"error": error}, headers)
            elif b.kind == "malformed_json":
                self._send_bytes(200, b'{"id": "chatcmpl-broken", "choices": [{"message": ')
            elif b.kind == "no_choices":
                self._send(200, {"id": "chatcmpl-empty", "object": "chat.completion", "model": model,
                                 "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 0,
                                                          "total_tokens": 3}})
            else:
                raise ValueError(f"unknown behaviour {b.kind}")

        def _send(self, status: int, obj: dict, headers: dict[str, str] | None = None) -> None:
            self._send_bytes(status, json.dumps(obj).encode(), headers)

        def _send_bytes(self, status: int, data: bytes, headers: dict[str, str] | None = None,
                        content_type: str = "application/json") -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to tell it

    return Handler


@pytest.fixture
def openai_server():
    with OpenAIServer() as server:
        yield server
