"""Model clients: any litellm model, a replay of a recorded run, a human at the terminal, a script.

`get_model(spec)` picks one; every client answers `complete(messages) -> Completion`.
Model parameters (`--model-param key=value`: reasoning_effort, thinking, max_tokens, ...)
go to the provider as given, never dropped silently; two of them configure ptxbench's side
only (LOCAL_PARAMS). `context_size(messages)` says how large a prompt is against the model's
context window, so the graph can end a run as `context_exceeded` before sending it.
Transport faults (rate limits, 5xx, timeouts, dropped connections, malformed bodies) are
retried here with exponential backoff and jitter; authentication and bad-request errors
are not (repeating them cannot help). Each fault is handed to `on_fault` the moment it
happens, so a trajectory records it even if the run dies later. An empty reply is not a
fault: it is returned, and the graph decides what it means.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

import tenacity

RETRYABLE = {"rate_limit", "server_error", "timeout", "connection", "malformed"}

# Model parameters that configure ptxbench's side of a call; never sent to the provider.
LOCAL_PARAMS = {
    "context_window": "the model's context window in tokens (prompt + max_tokens must fit); overrides litellm's table",
    "prompt_cache": "true | false: mark the stable prefix of the chat for prompt caching (default: on where the "
                    "provider takes cache_control markers, i.e. Anthropic's Claude models)",
    "cost_per_mtok": "[input, output]: the model's price in USD per million tokens (cached prompt tokens at the "
                     "input price), used instead of litellm's; a model litellm has no price for (self-hosted, new) "
                     "needs it for --max-cost",
}
# Request fields ptxbench sets itself: a model parameter may not set them.
RESERVED_PARAMS = ("model", "messages", "api_base", "base_url", "api_key", "timeout", "num_retries", "stream", "n",
                   "seed", "mock_response")


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None = None
    cached_tokens: int = 0  # prompt tokens read from the provider's prompt cache (included in prompt_tokens)
    cache_write_tokens: int = 0  # prompt tokens written to the cache this call (Anthropic bills them extra)
    estimated: bool = False  # the provider reported no token counts: ptxbench counted them itself


def parse_model_param(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, value): the value as JSON where it parses (0.2, true, {"type": "enabled"}),
    else the string itself (high)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"model parameter {text!r}: expected key=value, e.g. reasoning_effort=high")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def model_params_problem(params: dict, temperature: float | None = None) -> str | None:
    """What is wrong with a run's model parameters, in one line, or None."""
    if not isinstance(params, dict) or not all(isinstance(k, str) and k for k in params):
        return "model parameters must be a table of name = value"
    for key in params:
        if key in RESERVED_PARAMS:
            why = "use --seed (it varies per turn and sample)" if key == "seed" else "ptxbench sets it"
            return f"model parameter {key!r} cannot be set: {why}"
    if "temperature" in params and temperature is not None:
        return "temperature is given twice (--temperature and --model-param temperature=...): give it once"
    window = params.get("context_window")
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
        return f"model parameter context_window must be a positive number of tokens, not {window!r}"
    if "prompt_cache" in params and not isinstance(params["prompt_cache"], bool):
        return f"model parameter prompt_cache must be true or false, not {params['prompt_cache']!r}"
    if "cost_per_mtok" in params and _price(params) is None:
        return (f"model parameter cost_per_mtok must be [input, output] USD per million tokens (two numbers >= 0), "
                f"not {params['cost_per_mtok']!r}")
    return None


def _price(params: dict) -> tuple[float, float] | None:
    """The cost_per_mtok model parameter as (input, output) USD per million tokens; None if absent or malformed."""
    price = params.get("cost_per_mtok")
    if not (isinstance(price, (list, tuple)) and len(price) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in price)):
        return None
    return float(price[0]), float(price[1])


def _cost_at(usage: "Usage", price: tuple[float, float]) -> float:
    """A call's cost in USD at a price of (input, output) USD per million tokens."""
    return (usage.prompt_tokens * price[0] + usage.completion_tokens * price[1]) / 1e6


def call_options(temperature: float | None, seed: int | None, turn: int = 1, sample: int = 0) -> dict:
    """What a run sends with a call besides the model's own parameters (which the model adds):
    the temperature and the per-call seed. The sweep's model probe sends these for turn 1,
    sample 0, so a provider that refuses them fails the probe, not every run."""
    return {"temperature": temperature,
            "seed": None if seed is None else seed + 1000 * turn + sample}  # samples and turns must differ


def cost_cap_problem(model: "Model") -> str | None:
    """Why a --max-cost cap cannot hold for this model (it has no price), in one line, or None."""
    if model.priced():
        return None
    return (f"--max-cost cannot hold for model {model.name}: it has no price (litellm has none for it, or a "
            f"recorded call had none), so every call would count as $0; give its price with --model-param "
            f"cost_per_mtok=[input,output] (USD per million tokens; params.cost_per_mtok in a sweep), or drop "
            f"--max-cost (max_cost in a sweep's budget)")


@dataclass
class ContextSize:
    """A prompt's size against the model's context window, before it is sent."""

    prompt_tokens: int
    window: int | None  # None: unknown (no check)
    reserve: int = 0  # output tokens the request asks room for (max_tokens), when it says
    source: str = "unknown"  # where the window comes from

    @property
    def exceeded(self) -> bool:
        return self.window is not None and self.prompt_tokens + self.reserve > self.window

    def describe(self) -> str:
        need = f"{self.prompt_tokens} prompt tokens" + (f" + {self.reserve} for the reply" if self.reserve else "")
        if self.window is None:
            return f"{need}; context window unknown"
        return f"{need} against a context window of {self.window} ({self.source})"


@dataclass
class Fault:
    kind: str  # rate_limit | server_error | timeout | connection | malformed | auth | bad_request | unknown
    status: int | None  # the HTTP status the server sent, None when there was none
    message: str
    attempt: int  # 1-based attempt that failed
    wait_s: float = 0.0  # backoff before the next attempt; 0 when none followed


@dataclass
class Completion:
    text: str
    model: str
    usage: Usage
    latency_s: float  # wall time of complete(), retries and backoff included
    attempts: int
    faults: list[Fault] = field(default_factory=list)
    raw: dict | None = None  # the provider's response as a JSON-able dict (finish_reason inside)


class ModelError(Exception):
    """No reply: the error is not retryable, or retries ran out (then `retryable` stays True)."""

    def __init__(self, kind: str, message: str = "", *, retryable: bool = False, faults: list[Fault] | None = None):
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind, self.message, self.retryable, self.faults = kind, message, retryable, list(faults or [])


class Model(Protocol):
    name: str
    params: dict  # model parameters as given (LOCAL_PARAMS included)

    def complete(self, messages: list[dict], *, max_tokens: int | None = None, temperature: float | None = None,
                 seed: int | None = None, on_fault: Callable[[Fault], None] | None = None,
                 grows: bool = True) -> Completion: ...

    def context_size(self, messages: list[dict]) -> ContextSize: ...

    def priced(self) -> bool: ...  # every call's cost is known (a --max-cost cap can hold)


class _AttemptFailed(Exception):
    """One attempt failed; carries the classified fault and, for 429s, the server's Retry-After."""

    def __init__(self, fault: Fault, retry_after: float | None = None):
        super().__init__(fault.message)
        self.fault, self.retry_after = fault, retry_after


class _RetryingModel:
    """The retry loop shared by every client; subclasses implement one attempt."""

    name = "model"
    params: dict = {}

    def __init__(self, *, max_retries: int = 6, retry_base_s: float = 2.0, retry_max_s: float = 60.0):
        self.max_retries, self.retry_base_s, self.retry_max_s = max_retries, retry_base_s, retry_max_s
        # base * 2^(n-1) plus up to `base` of jitter, so concurrent runs do not retry in lockstep
        self._backoff = (tenacity.wait_exponential(multiplier=retry_base_s, max=retry_max_s)
                         + tenacity.wait_random(0, retry_base_s))

    def _attempt(self, messages: list[dict], attempt: int, **params) -> tuple[str, str, Usage, dict | None]:
        raise NotImplementedError  # -> (text, model, usage, raw) or raise _AttemptFailed

    def count_tokens(self, messages: list[dict]) -> int:
        return sum(_estimate_tokens(_content_text(m.get("content"))) for m in messages)

    def priced(self) -> bool:
        return True  # scripted replies carry their own usage; a person's time is not billed

    def window(self) -> tuple[int | None, str]:
        """The context window in tokens and where it comes from; (None, ...) when unknown."""
        if self.params.get("context_window"):
            return int(self.params["context_window"]), "model parameter context_window"
        return None, "unknown"

    def context_size(self, messages: list[dict]) -> ContextSize:
        window, source = self.window()
        reserve = self.params.get("max_tokens") or self.params.get("max_completion_tokens") or 0
        # litellm's table gives the input limit; an explicit window is the whole one, the reply included
        reserve = int(reserve) if source == "model parameter context_window" else 0
        return ContextSize(self.count_tokens(messages), window, reserve, source)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        # Honour the server's Retry-After when it asks for longer than our backoff, within the bound.
        retry_after = getattr(state.outcome.exception(), "retry_after", None) or 0.0
        return min(max(self._backoff(state), retry_after), self.retry_max_s)

    def complete(self, messages: list[dict], *, max_tokens: int | None = None, temperature: float | None = None,
                 seed: int | None = None, on_fault: Callable[[Fault], None] | None = None,
                 grows: bool = True) -> Completion:
        """`grows`: the next call will send these messages again with more after them (the full
        history), so all of them but the newest are worth a prompt-cache mark."""
        start, faults, attempts = time.monotonic(), [], 0

        def report(fault: Fault) -> None:
            faults.append(fault)
            if on_fault is not None:
                on_fault(fault)

        def one_attempt():
            nonlocal attempts
            attempts += 1
            return self._attempt(messages, attempts, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                 grows=grows)

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_retries + 1), wait=self._wait, reraise=True,
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, _AttemptFailed) and e.fault.kind in RETRYABLE),
            before_sleep=lambda s: report(replace(s.outcome.exception().fault, wait_s=s.next_action.sleep)))
        try:
            text, model, usage, raw = retrying(one_attempt)
        except ModelError as e:  # raised by an attempt itself (a recording or script ran out)
            e.faults = faults + e.faults
            raise
        except _AttemptFailed as e:
            report(e.fault)
            raise ModelError(e.fault.kind, e.fault.message, retryable=e.fault.kind in RETRYABLE, faults=faults) from e
        # a lone UTF-16 surrogate (a JSON escape of half an emoji) fits no UTF-8 file: U+FFFD, so the
        # reply is recorded and judged instead of failing the run at the first write
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return Completion(text, model, usage, time.monotonic() - start, attempts, faults, raw)


# ---- litellm ------------------------------------------------------------------------------

def _import_litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else import fetches prices online
    import litellm

    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners in our output
    return litellm


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def classify(exc: BaseException, attempt: int) -> _AttemptFailed:
    """Map a litellm/openai/httpx exception to a fault (checked against litellm 1.110.2's mapping)."""
    import httpx
    import openai

    litellm = _import_litellm()
    chain = _causes(exc)
    status = getattr(exc, "status_code", None)
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    # HTTP statuses a server really sent come first. litellm reports a body it could not parse, and a
    # refused connection, as a 500 InternalServerError: the cause is further down the chain.
    if any(isinstance(e, (litellm.Timeout, openai.APITimeoutError, httpx.TimeoutException, TimeoutError))
           for e in chain) or status == 408:
        kind = "timeout"
        status = None if any(isinstance(e, (httpx.TimeoutException, TimeoutError)) for e in chain) else status
    elif isinstance(exc, litellm.RateLimitError) or status == 429:
        kind = "rate_limit"
    elif isinstance(exc, litellm.ContextWindowExceededError):  # the prompt outgrew the window: not the model's fault
        kind, message = "context_exceeded", f"{type(exc).__name__}: {message}"
    elif isinstance(exc, (litellm.AuthenticationError, litellm.PermissionDeniedError)) or status in (401, 403):
        kind = "auth"  # litellm raises a plain APIError for 403
    elif isinstance(exc, litellm.BadRequestError) or (isinstance(status, int) and 400 <= status < 500):
        kind = "bad_request"  # includes ContextWindowExceededError, 404 unknown model, 422
        message = f"{type(exc).__name__}: {message}"
    elif any(type(e) is openai.OpenAIError for e in chain):
        # the SDK refused before sending anything (no api key...): litellm calls it a 500, retrying cannot help
        kind = "auth" if any(w in message.lower() for w in ("api_key", "credential")) else "unknown"
        status = None
    elif any(isinstance(e, json.JSONDecodeError) for e in chain):
        kind, status = "malformed", None
    elif any(isinstance(e, (openai.APIConnectionError, httpx.TransportError, ConnectionError)) for e in chain):
        kind, status = "connection", None
    elif isinstance(status, int) and status >= 500:
        kind = "server_error"
    else:
        kind, message = "unknown", f"{type(exc).__name__}: {message}"
    retry_after = None
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if kind == "rate_limit" and headers is not None:
        try:
            ms = headers.get("retry-after-ms")
            retry_after = float(ms) / 1000 if ms else float(headers.get("retry-after"))
        except (TypeError, ValueError):
            retry_after = None  # an HTTP date or nothing: our own backoff decides
    return _AttemptFailed(Fault(kind, status, message, attempt), retry_after)


class LiteLLMModel(_RetryingModel):
    """Any litellm model string; `openai/<name>` + api_base for vLLM, Ollama or any OpenAI-compatible server.

    Cost is the cost_per_mtok model parameter where given, else litellm's price table for the model
    name (None where it has none, e.g. self-hosted: unknown, never $0).
    `params` (model parameters) and a temperature go to the provider as given, or the call fails
    (bad_request) where litellm knows the model refuses them; never dropped in silence. Only the
    per-turn seed is left out for a provider that takes none. `extra` goes to litellm.completion
    as is (litellm-side settings).
    """

    def __init__(self, spec: str, *, api_base: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600, extra: dict | None = None, params: dict | None = None, **retry):
        super().__init__(**retry)
        try:  # fail at construction, in one line, rather than at the first call
            self.provider = _import_litellm().get_llm_provider(spec, api_base=api_base)[1]
        except Exception as exc:
            raise ValueError(f"model {spec!r}: litellm finds no provider; use e.g. openai/<name> (with api_base for "
                             "an OpenAI-compatible server), anthropic/..., gemini/..., ollama/..., hosted_vllm/...; "
                             "or replay:<run dir>, human, scripted:<file>") from exc
        self.name, self.api_base, self.api_key, self.timeout_s = spec, api_base, api_key, timeout_s
        # drop_params off: litellm would quietly remove a temperature (given or a model parameter)
        # that it thinks the model takes only as its default (gpt-5, the o-series), and the run would
        # record a setting that was never sent. A parameter asked for is sent, or the call fails
        # with litellm's reason (bad_request); the seed, our own default, is left out in _attempt.
        self.extra = {"drop_params": False, **(extra or {})}
        self.params = dict(params or {})

    @property
    def prompt_cache(self) -> bool:
        """Mark the stable prefix with cache_control? Anthropic (and Claude served elsewhere) caches
        only what is marked; OpenAI, Gemini and DeepSeek cache prefixes by themselves."""
        if "prompt_cache" in self.params:
            return bool(self.params["prompt_cache"])
        return self.provider == "anthropic" or "claude" in self.name.lower()

    def _takes(self, param: str) -> bool:
        """Whether litellm knows the provider to take this OpenAI parameter (unknown: assume it does)."""
        try:
            supported = _import_litellm().get_supported_openai_params(model=self.name, custom_llm_provider=self.provider)
        except Exception:
            return True
        return supported is None or param in supported

    def window(self) -> tuple[int | None, str]:
        window, source = super().window()
        if window is not None:
            return window, source
        try:
            info = _import_litellm().get_model_info(self.name, custom_llm_provider=self.provider)
        except Exception:  # a self-hosted or new model: litellm has no entry
            return None, "unknown to litellm; give --model-param context_window=N"
        window = info.get("max_input_tokens") or info.get("max_tokens")
        return (int(window), "litellm's model table") if window else (None, "unknown to litellm")

    def priced(self) -> bool:
        """A price given (cost_per_mtok), or one in litellm's table for this model."""
        if _price(self.params) is not None:
            return True
        try:
            _import_litellm().cost_per_token(model=self.name, custom_llm_provider=self.provider,
                                             prompt_tokens=1, completion_tokens=1)
        except Exception:  # litellm raises for a model it has no price for
            return False
        return True

    def count_tokens(self, messages: list[dict]) -> int:
        try:  # the model's tokenizer where litellm has it, else tiktoken's cl100k
            return int(_import_litellm().token_counter(model=self.name, messages=messages))
        except Exception:
            return super().count_tokens(messages)

    def _attempt(self, messages, attempt, grows: bool = True, **params):
        litellm = _import_litellm()
        kwargs = {k: v for k, v in params.items() if v is not None}
        if "seed" in kwargs and not self._takes("seed"):
            kwargs.pop("seed")  # ptxbench's own per-turn default; Anthropic, for one, takes none
        sent = {k: v for k, v in self.params.items() if k not in LOCAL_PARAMS}
        kwargs.update(sent)
        if sent:  # asked for by name: an error from the provider beats a silent drop
            kwargs["allowed_openai_params"] = sorted(sent)
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self.api_key:
            kwargs["api_key"] = self.api_key
        asked = messages
        if self.prompt_cache:
            messages = with_cache_markers(messages, grows)
        try:  # num_retries=0: litellm would otherwise retry on its own, unseen by the trajectory
            response = litellm.completion(model=self.name, messages=messages, timeout=self.timeout_s,
                                          num_retries=0, **self.extra, **kwargs)
        except Exception as exc:
            raise classify(exc, attempt) from exc
        raw = json.loads(json.dumps(response.model_dump(), default=str))
        if not response.choices or response.choices[0].message is None:
            raise _AttemptFailed(Fault("malformed", 200, "response has no choices", attempt))
        message = response.choices[0].message
        text = message.content or ""
        usage = usage_of(response.usage)
        # A server that sends no usage (some proxies and local servers) reads as 0 tokens through
        # litellm: count them here, so the summary and a --max-tokens budget see what was spent.
        if usage.prompt_tokens == 0 and asked:
            usage.prompt_tokens, usage.estimated = self.count_tokens(asked), True
        if usage.completion_tokens == 0 and (said := text + str(getattr(message, "reasoning_content", None) or "")):
            usage.completion_tokens, usage.estimated = self._count_text(said), True
        try:
            if (price := _price(self.params)) is not None:  # the user's price beats litellm's table
                usage.cost_usd = _cost_at(usage, price)
            elif usage.estimated:  # priced on the counted tokens, not on the zeros
                usage.cost_usd = float(sum(litellm.cost_per_token(
                    model=self.name, custom_llm_provider=self.provider, prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens)))
            else:
                usage.cost_usd = float(litellm.completion_cost(completion_response=response))
        except Exception:  # a model without a price (self-hosted, new) must never fail a call
            usage.cost_usd = None
        return text, response.model or self.name, usage, raw

    def _count_text(self, text: str) -> int:
        try:
            return int(_import_litellm().token_counter(model=self.name, text=text))
        except Exception:
            return _estimate_tokens(text)


def usage_of(u: Any) -> Usage:
    """litellm's usage -> ours, cached prompt tokens included (OpenAI: prompt_tokens_details.cached_tokens;
    Anthropic: cache_read_input_tokens and cache_creation_input_tokens, which litellm also maps)."""
    details = getattr(u, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or getattr(u, "cache_read_input_tokens", None) or 0
    written = getattr(u, "cache_creation_input_tokens", None) or getattr(details, "cache_creation_tokens", None) or 0
    return Usage(getattr(u, "prompt_tokens", 0) or 0, getattr(u, "completion_tokens", 0) or 0,
                 cached_tokens=int(cached), cache_write_tokens=int(written))


CACHE_MARK = {"type": "ephemeral"}


def with_cache_markers(messages: list[dict], grows: bool = True) -> list[dict]:
    """The chat with cache_control on the stable prefix: the system prompt and the task (the same
    in every turn under either history policy) and, when the chat `grows` (the full history: the
    next call sends all of this again), the last reply before the newest message. A mark where the
    next call differs would only pay for a cache write (Anthropic bills writes at 1.25x). At most
    three marks (Anthropic takes four). The messages given are not changed."""
    marks = {i for i, m in enumerate(messages[:2]) if m.get("role") in ("system", "user")}
    if grows and len(messages) > 3 and messages[-2].get("role") == "assistant":
        marks.add(len(messages) - 2)
    out = []
    for i, m in enumerate(messages):
        if i in marks and isinstance(m.get("content"), str) and m["content"]:
            m = {**m, "content": [{"type": "text", "text": m["content"], "cache_control": dict(CACHE_MARK)}]}
        out.append(m)
    return out


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # content blocks
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, dict))
    return str(content or "")


# ---- replay, human, scripted ----------------------------------------------------------------

def _usage_from(d: dict | None, default: Usage) -> Usage:
    if not d:
        return default
    return Usage(int(d.get("prompt_tokens") or 0), int(d.get("completion_tokens") or 0), d.get("cost_usd"),
                 int(d.get("cached_tokens") or 0), int(d.get("cache_write_tokens") or 0), bool(d.get("estimated")))


class ReplayModel(_RetryingModel):
    """The `llm_response` events of a recorded run's events.jsonl, in file order, usage as recorded."""

    def __init__(self, run: str | os.PathLike):
        super().__init__(max_retries=0)
        path = Path(run)
        path = path / "events.jsonl" if path.is_dir() else path
        if not path.is_file():
            raise ValueError(f"replay: no events.jsonl at {path}")
        from agent.trajectory import RunFolderError, read_event_file

        self.name, self.path = f"replay:{run}", path
        try:  # a line cut short by a crash is not a recorded response; any other damage is an error
            self.responses = list(read_event_file(path, "llm_response"))
        except RunFolderError as exc:
            raise ValueError(f"replay: {exc}") from None
        if not self.responses:  # a truncated recording: replaying it would "finish" a run of no turns
            raise ValueError(f"replay: {path} holds no recorded model response")
        self.index = 0

    def priced(self) -> bool:
        """Costs as recorded (known only if every recorded call had one), or the recorded tokens at
        the price given (cost_per_mtok)."""
        return _price(self.params) is not None or all(
            isinstance((e.get("usage") or {}).get("cost_usd"), (int, float)) for e in self.responses)

    def _attempt(self, messages, attempt, **params):
        if self.index >= len(self.responses):
            raise ModelError("replay_exhausted", f"{self.path} holds {len(self.responses)} responses")
        event, self.index = self.responses[self.index], self.index + 1
        usage = _usage_from(event.get("usage"), Usage(0, 0))
        if (price := _price(self.params)) is not None:
            usage.cost_usd = _cost_at(usage, price)
        # events hold no raw response; the finish_reason they hold is what the graph reads from it
        # (a reply cut off at the token limit is told so in its feedback, in the replay too)
        raw = event.get("raw") or {"finish_reason": event.get("finish_reason"), "replayed_seq": event.get("seq")}
        return event.get("text") or "", event.get("model") or self.name, usage, raw


def _estimate_tokens(text: str) -> int:
    return (len(text) + 3) // 4  # ~4 characters a token: enough for budgets in tests


def _scripted_reply_problem(reply: Any) -> str | None:
    """Why one entry of a script is not a reply ScriptedModel can send, or None."""
    if isinstance(reply, str):
        return None
    if not isinstance(reply, dict):
        return f"is {type(reply).__name__ if reply is not None else 'null'}; a reply is text or an object with \"text\""
    if "fault" in reply:
        return None if isinstance(reply["fault"], str) else "has a fault that is not a name (e.g. \"rate_limit\")"
    if not isinstance(reply.get("text", ""), str):
        return "has a \"text\" that is not text"
    if reply.get("usage") is not None and not isinstance(reply["usage"], dict):
        return "has a \"usage\" that is not an object"
    return None


class ScriptedModel(_RetryingModel):
    """Replies from a list: "text", {"text": ..., "usage": {...}}, or {"fault": "rate_limit"} to inject a fault.

    Faults go through the same retry loop as a real model (without sleeping), so the graph's
    fault handling can be tested without a server. Usage defaults to a characters/4 estimate.
    When the list is used up the run ends there, as a replay does (script_exhausted: stop_reason
    script_end, finished, measured up to its turns): the script is all this model will ever say.
    A provider failure (a resumable model_error) is a fault entry, e.g. {"fault": "auth"}.
    """

    def __init__(self, replies: list, *, name: str = "scripted", max_retries: int = 6, params: dict | None = None):
        super().__init__(max_retries=max_retries, retry_base_s=0.0, retry_max_s=0.0)
        self.name, self.replies, self.index = name, list(replies), 0
        self.params = dict(params or {})  # recorded; context_window is honoured like a real model's

    @classmethod
    def from_file(cls, path: str | os.PathLike, params: dict | None = None) -> "ScriptedModel":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"scripted: {path} is not UTF-8 text (a script is JSON or YAML)") from None
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ValueError(f"scripted: {path} is not valid YAML: {exc}".splitlines()[0]) from None
        else:
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"scripted: {path} is not valid JSON ({exc})") from None
        replies = data.get("replies") if isinstance(data, dict) else data
        if not isinstance(replies, list):
            raise ValueError(f"scripted: {path} must hold a list of replies (or {{'replies': [...]}})")
        if not replies:  # its end is a natural end (script_end): a run of no turns is no run
            raise ValueError(f"scripted: {path} holds no replies")
        for i, reply in enumerate(replies, 1):  # all checked now: a bad one must not stop a run half-way
            if (problem := _scripted_reply_problem(reply)):
                raise ValueError(f"scripted: {path}: reply {i} {problem}")
        params = {**({"context_window": data["context_window"]} if isinstance(data, dict) and
                     data.get("context_window") else {}), **(params or {})}
        return cls(replies, name=f"scripted:{path}", params=params)

    def _attempt(self, messages, attempt, **params):
        if self.index >= len(self.replies):
            raise ModelError("script_exhausted", f"all {len(self.replies)} scripted replies used")
        reply, self.index = self.replies[self.index], self.index + 1
        reply = {"text": reply} if isinstance(reply, str) else dict(reply)
        if "fault" in reply:
            kind = reply["fault"]
            raise _AttemptFailed(Fault(kind, reply.get("status"), reply.get("message", f"scripted {kind}"), attempt))
        text = reply.get("text") or ""
        prompt = self.count_tokens(messages)
        usage = _usage_from(reply.get("usage"), Usage(prompt, _estimate_tokens(text), 0.0))
        return text, self.name, usage, {"scripted_index": self.index - 1, "finish_reason": "stop"}


REPLY_MARKER = "# ---- write your reply below this line (everything above it is dropped) ----"


class HumanModel(_RetryingModel):
    """A person answers: the prompt goes to the terminal, the reply comes from $EDITOR or a file.

    `reply_file` (or env PTXBENCH_HUMAN_REPLY_FILE) is either one file, read afresh at every call,
    or a folder whose files are the replies in name order.
    """

    name = "human"

    def __init__(self, reply_file: str | None = None):
        super().__init__(max_retries=0)
        self.reply_file = reply_file or os.environ.get("PTXBENCH_HUMAN_REPLY_FILE")
        self.index = 0
        if self.reply_file and not Path(self.reply_file).exists():  # say so now, not after the first prompt
            raise ValueError(f"human: reply file {self.reply_file} does not exist (a reply file, or a folder of them)")
        if self.reply_file and Path(self.reply_file).is_dir() and not any(
                p.is_file() for p in Path(self.reply_file).iterdir()):  # a run of no turns is no run
            raise ValueError(f"human: reply folder {self.reply_file} holds no reply files")

    def _attempt(self, messages, attempt, **params):
        prompt = human_view(messages)
        print(f"\n===== prompt for the human model =====\n{prompt}\n======================================",
              file=sys.stderr)
        text = self._from_file() if self.reply_file else self._from_editor(prompt)
        return text, "human", Usage(0, 0, 0.0), {"finish_reason": "stop", "source": self.reply_file or "editor"}

    def _from_file(self) -> str:
        path = Path(self.reply_file)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file())
            if self.index >= len(files):
                raise ModelError("human_exhausted", f"no reply file left in {path}")
            path, self.index = files[self.index], self.index + 1
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:  # gone or binary since the run started: no reply
            raise ModelError("human_no_reply", f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None

    def _from_editor(self, prompt: str) -> str:
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        quoted = "\n".join("# " + line for line in prompt.splitlines())
        with tempfile.NamedTemporaryFile("w", suffix=".md", prefix="ptxbench-reply-", delete=False) as f:
            f.write(f"{quoted}\n{REPLY_MARKER}\n")
        try:
            if subprocess.call([*shlex.split(editor), f.name]) != 0:
                raise ModelError("human_aborted", f"{editor} exited with an error")
            text = Path(f.name).read_text()
        except OSError as exc:
            raise ModelError("human_aborted", f"cannot run {editor}: {exc}") from exc
        finally:
            os.unlink(f.name)
        return text.split(REPLY_MARKER, 1)[-1].strip("\n")


def human_view(messages: list[dict]) -> str:
    """What a person is shown: the whole chat before the first reply (the system prompt holds the
    reply format and the credit rules a model is told), then the reply the newest feedback is
    about (for evolve, the parent) and that feedback."""
    last_reply = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    shown = messages if last_reply is None else messages[last_reply:]
    return "\n\n".join(f"[{m.get('role')}]\n{_content_text(m.get('content')).strip()}" for m in shown)


def get_model(spec: str, *, api_base: str | None = None, api_key: str | None = None, timeout_s: float = 600,
              max_retries: int = 6, retry_base_s: float = 2.0, retry_max_s: float = 60.0,
              extra: dict | None = None, params: dict | None = None) -> Model:
    """`replay:<run dir>`, `human`, `scripted:<file>`, or any litellm model string. `params`:
    model parameters (sent to a litellm model; recorded, and context_window honoured, for all)."""
    extra, params = dict(extra or {}), dict(params or {})
    if spec.startswith("replay:"):
        model: Model = ReplayModel(spec.removeprefix("replay:"))
    elif spec == "human":
        model = HumanModel(reply_file=extra.get("reply_file"))
    elif spec.startswith("scripted:"):
        return ScriptedModel.from_file(spec.removeprefix("scripted:"), params)
    else:
        return LiteLLMModel(spec, api_base=api_base, api_key=api_key, timeout_s=timeout_s, extra=extra, params=params,
                            max_retries=max_retries, retry_base_s=retry_base_s, retry_max_s=retry_max_s)
    model.params = params
    return model
