"""`agent serve`: ptxbench's evaluator as an HTTP service, for agents and RL trainers elsewhere.

    GET    /health         up or not; with a token, GPUs, queue depth, versions (the one open endpoint)
    GET    /tasks          the tasks, as `agent tasks --json` lists them
    GET    /tasks/{id}     one task and its statement as a model sees it (visible workloads only)
    POST   /check          compile + SASS verdicts, synchronous, CPU only: `agent check --json`
    POST   /evaluate       queue an evaluation; 202 and a job id
    GET    /jobs/{id}      its status and, once done, the JSON `agent eval --json` prints
    DELETE /jobs/{id}      cancel it
    GET    /openapi.json, /docs   the API's description

A service that compiles and runs arbitrary kernels is an attack surface, so (docs/SERVE.md):
- who: with a token file every endpoint but /health answers 401 without `Authorization: Bearer`
  and one of its tokens (compared in constant time); binding anything but loopback needs one
  (agent/commands/serve.py). Each token names a client; a client sees only its own jobs.
- what: nothing a client sends is a path (a task is a registry name or alias, never a Definition
  file); bodies, sources and manifests have size limits (413); a body that is not JSON, or
  nested past what the parser takes, is a 400, a wrong field a 422, never a 500.
- how much: a bounded queue (429 and Retry-After when full) and a bound per client on its
  queued + running jobs; /check's compiles have slots of their own (429 too); a request must
  arrive whole within a deadline (deadline_protocol); a client's ended jobs kept are bounded.
- held-out workloads are judged and reported by class, as the agent's feedback tells a model
  (agent.feedback.redact_held_out, the one view both read): never their names or sizes.
The evaluation itself is the CLI's: the executor's shared evaluator (agent/executors.py: the
in-process Evaluator locally, the Ray executor's GPU actors with --ray-address), the compile
sandbox and worker isolation included. Jobs live in SQLite (agent/jobstore.py) and survive a
restart; a shutdown waits for running jobs, then requeues those still running.

No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations.
"""
import hmac
import json
import logging
import math
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from agent.jobstore import Job, JobStore
from agent.trajectory import EXECUTED_CHECK_DEFAULT

log = logging.getLogger("ptxbench.serve")

KIB = 1024
Arch = Literal["sm_90a", "sm_100a"]


# ---------------------------------------------------------------------------------------
# What a client sends
# ---------------------------------------------------------------------------------------
class SolutionIn(BaseModel):
    """A solution as JSON: the kernel text and its launch manifest (docs/SOLUTION_FORMAT.md)."""

    model_config = ConfigDict(extra="forbid")
    task: str = Field(max_length=256, description="a task name or alias (GET /tasks)")
    arch: Arch = "sm_90a"
    source: str = Field(description="the kernel.cu or kernel.ptx text")
    launch: dict[str, Any] = Field(description="the launch.json object")
    lang: Literal["cuda", "ptx"] = "cuda"


class EvaluateIn(SolutionIn):
    workloads: Literal["visible", "held_out", "all"] = "visible"
    credit: bool = Field(EXECUTED_CHECK_DEFAULT, description="count executed instructions (the arch credit)")
    profile: bool = Field(False, description="with credit: the Nsight Compute profile too")
    sanitize: bool = Field(False, description="also run compute-sanitizer memcheck")
    time: bool = Field(True, description="time against the library baseline (false: correctness only)")
    task_hash: Optional[str] = Field(None, max_length=64, description=(
        "sha256 of the client's definition of the task (agent.run.task_hash): refused with 409 when the "
        "service judges another definition under that name"))


class Limits(BaseModel):
    """Bounds on what one request and all clients together may ask."""

    max_body_bytes: int = 2048 * KIB
    max_source_bytes: int = 1024 * KIB
    max_launch_bytes: int = 64 * KIB
    queue_size: int = 64  # queued jobs, all clients
    per_client: int = 8  # one client's queued + running jobs
    check_slots: int = 2  # /check compiles at once
    keep_ended: int = 1000  # one client's ended jobs kept in the store (older ones are forgotten: 404)


class Rejected(Exception):
    """A request refused with an HTTP status and one line (and maybe headers)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


# ---------------------------------------------------------------------------------------
# From a request to what the evaluator takes
# ---------------------------------------------------------------------------------------
def resolve_task(name: str):
    """A registry task by name or alias; never a path (get_task also opens Definition files)."""
    from tasks.registry import ALIASES, TASKS, get_task

    key = name.strip()
    if key not in TASKS and key not in ALIASES:
        raise Rejected(404, f"unknown task {name[:80]!r} (GET /tasks lists them)")
    return get_task(key)


def resolve_definition(req: EvaluateIn):
    """The task an evaluation is judged against: the registry's, refused (409) where the request's
    task_hash names another definition. The service fills task_hash in when it accepts a job, so a
    job that waits in the store (queued, or requeued by a restart) is judged against the very
    definition it was accepted for or not at all: a restart onto other tasks fails it, never
    flips its verdict against a definition its client did not ask for."""
    from agent.run import task_hash

    task = resolve_task(req.task)
    if req.task_hash is not None and req.task_hash != task_hash(task):
        raise Rejected(409, f"task {task.name!r}: the service judges another definition of it "
                            f"(its hash {task_hash(task)[:12]}, this request's {req.task_hash[:12]})")
    return task


def build_solution(req: SolutionIn, limits: Limits):
    """The request's Solution; 413 for a source or manifest over its limit, 422 for one unusable."""
    from tools.solution import Solution, SolutionError, parse_manifest

    source_bytes = len(req.source.encode("utf-8", "surrogatepass"))
    if source_bytes > limits.max_source_bytes:
        raise Rejected(413, f"source: {source_bytes} bytes; at most {limits.max_source_bytes}")
    launch_text = json.dumps(req.launch)
    if len(launch_text) > limits.max_launch_bytes:
        raise Rejected(413, f"launch: {len(launch_text)} bytes as JSON; at most {limits.max_launch_bytes}")
    if req.lang == "ptx" and not req.source.isascii():
        raise Rejected(422, "source: PTX must be ASCII")
    if not req.source.strip():
        raise Rejected(422, "source: the kernel source is empty")
    try:
        manifest = parse_manifest(launch_text, where="launch")
    except SolutionError as exc:
        raise Rejected(422, str(exc)) from None
    return Solution(language=req.lang, source=req.source, manifest=manifest,
                    name="kernel.cu" if req.lang == "cuda" else "kernel.ptx")


def check_json(req: SolutionIn, limits: Limits) -> dict:
    """POST /check: what `agent check --json --task T` prints for a solution folder."""
    from agent.commands.check import _compile_and_inspect, manifest_problems, report
    from tools.toolchain import ToolchainError, find_toolchain

    task, solution = resolve_task(req.task), build_solution(req, limits)
    try:
        tc = find_toolchain()
        tc.require("ptxas")
        if req.lang == "cuda":
            tc.require("nvrtc")
    except ToolchainError as exc:
        raise Rejected(503, f"the service's toolchain: {exc}") from None
    requested = task.features_for(req.arch)
    launched = [launch.kernel for launch in solution.manifest.launches]
    compiled, info = _compile_and_inspect(solution.source, solution.language, req.arch, launched)
    missing = info.missing(requested) if info.status == "ok" else None
    return {**report(compiled, info), "task": task.name, "requested": requested, "missing": missing,
            "manifest_errors": manifest_problems(solution, compiled, task.name, req.arch)}


# ---------------------------------------------------------------------------------------
# Running jobs
# ---------------------------------------------------------------------------------------
def run_job(evaluator, req: EvaluateIn, limits: Limits) -> str:
    """One job: the evaluation, then its `agent eval --json` dict as a model would be shown it
    (agent.feedback.redact_held_out: held-out workloads by class), as JSON text that keeps inf and
    NaN as JSON's words (agent.trajectory.write_eval_json says why)."""
    from agent.commands.evaluate import eval_json
    from agent.feedback import redact_held_out

    task, solution = resolve_definition(req), build_solution(req, limits)
    res = evaluator.evaluate(solution, task, req.arch, workloads=req.workloads, executed_check=req.credit,
                             sanitize=req.sanitize, time=req.time, profile=req.credit and req.profile)
    return json.dumps(eval_json(redact_held_out(res)))


@dataclass
class Dispatcher:
    """`slots` threads that take the next queued job from the store (JobStore.claim: the clients
    take turns) and run it. The evaluator queues GPU work per GPU itself (locally and on Ray), so
    slots beyond the GPUs overlap compiles."""

    store: JobStore
    evaluator: Any
    limits: Limits
    slots: int = 2
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Condition = field(default_factory=threading.Condition)
    _running: dict[str, Job] = field(default_factory=dict)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for i in range(self.slots):
            t = threading.Thread(target=self._loop, name=f"serve-job-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def notify(self) -> None:
        with self._wake:
            self._wake.notify()

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def stop(self, drain_s: float) -> list[str]:
        """Take no new job; wait up to drain_s for the running ones; requeue those still running
        (their late results are dropped: JobStore.finish). Returns the requeued ids."""
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        deadline = time.monotonic() + drain_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            left = list(self._running)
        if left:
            self.store.requeue_running(left)
        return left

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.store.claim()
            except sqlite3.Error:  # busy (another process's transaction on the file) or full: try again
                log.exception("claiming a job")
                self._stop.wait(1.0)
                continue
            if job is None:
                with self._wake:
                    self._wake.wait(timeout=1.0)
                continue
            with self._lock:
                self._running[job.id] = job
            try:
                self._run(job)
            finally:
                with self._lock:
                    self._running.pop(job.id, None)

    def _run(self, job: Job) -> None:
        try:
            text = run_job(self.evaluator, EvaluateIn.model_validate(job.request), self.limits)
        except Rejected as exc:  # the registry changed under a stored job (a restart with other tasks): said, not judged
            self._finish(job, error=exc.detail)
        except Exception as exc:  # noqa: BLE001 - the service's own fault: the job says so, the service goes on
            log.exception("job %s", job.id)
            self._finish(job, error=f"service error: {type(exc).__name__}: {str(exc)[:300]}")
        else:
            self._finish(job, result=text)

    def _finish(self, job: Job, **outcome: str) -> None:
        """Record the job's end however long the store refuses writes (another process holding a
        transaction on the file past SQLite's busy timeout, a full disk). An error here used to end
        the slot's thread: its job stayed `running` and the slot was gone, while the service went
        on accepting jobs that no slot would run."""
        while True:
            try:
                self.store.finish(job, **outcome)
                return
            except sqlite3.Error as exc:
                log.warning("job %s: the store refused its end (%s); trying again", job.id, exc)
                if self._stop.wait(1.0):
                    return  # shutting down: the job is requeued (stop(), or the next start)


# ---------------------------------------------------------------------------------------
# Who may ask, and how much: a plain ASGI layer in front of the app
# ---------------------------------------------------------------------------------------
def json_bytes(obj: Any) -> bytes:
    """Strict JSON (a float that is not finite is null, as `agent eval --json` prints it)."""
    from agent.commands.common import _finite

    return json.dumps(_finite(obj), allow_nan=False).encode()


async def _send_error(send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json_bytes({"detail": detail})
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """Authentication, the body's size and its JSON, before FastAPI sees the request.

    `tokens`: token -> client name; empty: no authentication (loopback only), the client is its
    address. A body longer than the limit is refused as soon as it is known to be (its
    Content-Length, or the bytes read so far): 413. A body that is not JSON (or nests deeper than
    Python's parser takes, which FastAPI would answer with a 500) is a 400 here."""

    OPEN_PATHS = ("/health",)

    def __init__(self, app, tokens: dict[str, str], max_body_bytes: int):
        self.app, self.tokens, self.max_body = app, tokens, max_body_bytes

    def client_of(self, scope) -> str | None:
        if not self.tokens:
            return (scope.get("client") or ("local",))[0]
        auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, given = auth.partition(" ")
        found = None
        for token, name in self.tokens.items():  # every token compared, in constant time each
            if hmac.compare_digest(given.strip().encode(), token.encode()) and scheme.lower() == "bearer":
                found = name
        return found

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client = self.client_of(scope)
        if client is None and scope["path"] not in self.OPEN_PATHS:
            return await _send_error(send, 401, "a valid token is required (Authorization: Bearer <token>)",
                                     {"WWW-Authenticate": "Bearer"})
        scope.setdefault("state", {}).update(client=client or "anonymous", authenticated=client is not None)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _send_error(send, 413 if length.isdigit() else 400,
                                     f"request body over {self.max_body} bytes" if length.isdigit()
                                     else "bad Content-Length")
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await _send_error(send, 413, f"request body over {self.max_body} bytes")
            chunks.append(chunk)
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            json.loads(body)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:200]
            return await _send_error(send, 400, f"the request body is not JSON: {why}")
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def deadline_protocol(request_timeout_s: float) -> type:
    """uvicorn's h11 protocol (its own choice where httptools is not installed; here always) with a
    deadline on each request's arrival: its headers and body whole within request_timeout_s of the
    connection opening (or of the previous response), or the connection is closed. uvicorn closes
    a connection idle *between* requests, but waits for ever for a first request and for headers
    or a body that trickle in: a caller with no token could hold every file descriptor
    (slowloris), and a client with one could keep the Gate reading a body for ever. The time an
    endpoint takes to answer is not bounded here: the deadline stops once the request is in."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class DeadlineH11Protocol(H11Protocol):
        _deadline: Any = None  # the timer (asyncio.TimerHandle) while a request is awaited
        _armed_after: Any = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_deadline()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._armed_after and not self.cycle.more_body:
                self._disarm_deadline()  # this request is in, whole

        def connection_lost(self, exc) -> None:
            self._disarm_deadline()
            super().connection_lost(exc)

        def _arm_deadline(self) -> None:
            self._disarm_deadline()
            self._armed_after = self.cycle  # the request answered last (None on a new connection)
            self._deadline = self.loop.call_later(request_timeout_s, self._deadline_passed)

        def _disarm_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = None

        def _deadline_passed(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return DeadlineH11Protocol


# ---------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------
@dataclass
class Service:
    """What the endpoints share."""

    store: JobStore
    executor: Any  # agent.executors: LocalExecutor or RayExecutor
    limits: Limits
    dispatcher: Dispatcher
    versions: dict[str, str]
    gpus: list[str]
    drain_s: float = 30.0
    _submit: threading.Lock = field(default_factory=threading.Lock)
    _check_slots: threading.BoundedSemaphore | None = None

    def __post_init__(self):
        self._check_slots = threading.BoundedSemaphore(self.limits.check_slots)

    def retry_after(self, queued: int) -> str:
        """Seconds until a slot is likely free: the recent mean job time x the jobs ahead / slots."""
        recent = self.store.recent_seconds()
        mean = sum(recent) / len(recent) if recent else 5.0
        return str(max(1, min(600, math.ceil(mean * (queued + 1) / max(1, self.dispatcher.slots)))))

    def submit(self, client: str, req: EvaluateIn) -> Job:
        from agent.run import task_hash

        task = resolve_definition(req)
        build_solution(req, self.limits)  # a bad solution is refused now, not found by a worker later
        accepted = req.model_copy(update={"task_hash": task_hash(task)})  # the definition it is judged against
        with self._submit:  # the count and the insert together: the limits hold under concurrent posts
            everyone, mine = self.store.counts(), self.store.counts(client)
            in_flight = sum(mine.get(s, 0) for s in ("queued", "running"))
            if in_flight >= self.limits.per_client:
                raise Rejected(429, f"you have {in_flight} jobs queued or running; at most {self.limits.per_client}",
                               {"Retry-After": self.retry_after(in_flight)})
            queued = everyone.get("queued", 0)
            if queued >= self.limits.queue_size:
                raise Rejected(429, f"the queue is full ({queued} jobs)", {"Retry-After": self.retry_after(queued)})
            job = self.store.add(client, accepted.model_dump(mode="json"), self.limits.keep_ended)
        self.dispatcher.notify()
        return job

    def check(self, req: SolutionIn) -> dict:
        assert self._check_slots is not None
        if not self._check_slots.acquire(blocking=False):
            raise Rejected(429, f"all {self.limits.check_slots} compile slots are busy", {"Retry-After": "2"})
        try:
            return check_json(req, self.limits)
        finally:
            self._check_slots.release()

    def health(self) -> dict:
        counts = self.store.counts()
        return {"status": "ok", "gpus": self.gpus, "gpu": self.executor.evaluator().gpu,
                "executor": self.executor.describe(),
                "queue": {"queued": counts.get("queued", 0), "running": self.dispatcher.running(),
                          "capacity": self.limits.queue_size, "slots": self.dispatcher.slots},
                "limits": self.limits.model_dump(), "versions": self.versions}


def job_json(job: Job, floats: str = "json") -> dict:
    """GET /jobs/{id}: the job's state and, once done, its result (`agent eval --json`'s dict).
    floats=words keeps inf and NaN as JSON's Infinity/NaN (Python's json reads them; the Python
    client asks for them so a wrong kernel's errors read back as they were)."""
    out: dict[str, Any] = {"id": job.id, "status": job.status, "created": job.created, "started": job.started,
                           "finished": job.finished, "attempt": job.attempt, "error": job.error,
                           "task": job.request.get("task"), "task_hash": job.request.get("task_hash"),
                           "arch": job.request.get("arch")}
    out["result"] = json.loads(job.result) if job.result is not None else None
    return out


def create_app(service: Service, tokens: dict[str, str]):
    """The ASGI app: FastAPI behind the Gate."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response

    def reply(obj: Any, status: int = 200, floats: str = "json") -> Response:
        body = (json.dumps(obj).encode() if floats == "words" else json_bytes(obj))
        return Response(body, status_code=status, media_type="application/json")

    @asynccontextmanager
    async def lifespan(app):
        service.dispatcher.start()
        yield
        # graceful shutdown: uvicorn has stopped taking requests; running jobs get drain_s, then go back
        left = service.dispatcher.stop(service.drain_s)
        if left:
            log.warning("requeued %d running job(s): %s", len(left), ", ".join(left))
        service.executor.close()
        service.store.close()

    app = FastAPI(title="ptxbench evaluation service", version=service.versions.get("ptxbench", "0"),
                  description=__doc__.split("\n\n")[0], lifespan=lifespan)

    @app.exception_handler(Rejected)
    async def _rejected(request: Request, exc: Rejected):
        return Response(json_bytes({"detail": exc.detail}), status_code=exc.status, media_type="application/json",
                        headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        # one line, and never the input echoed back (it may be a megabyte of source)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return Response(json_bytes({"detail": f"{where or 'body'}: {first.get('msg', 'invalid')}"[:300]}),
                        status_code=422, media_type="application/json")

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.exception("%s %s", request.method, request.url.path)
        return Response(json_bytes({"detail": f"internal error: {type(exc).__name__}"}), status_code=500,
                        media_type="application/json")

    def client(request: Request) -> str:
        return request.scope.get("state", {}).get("client", "anonymous")

    @app.get("/health", summary="liveness without a token; with one, GPUs, queue depth, limits, versions")
    def health(request: Request):
        # a caller the token file does not know learns that the service is up, nothing about its
        # GPUs, load, Ray cluster or toolchain versions (what to aim at, and when)
        if not request.scope.get("state", {}).get("authenticated"):
            return reply({"status": "ok"})
        return reply(service.health())

    @app.get("/tasks", summary="the benchmark's tasks, as `agent tasks --json` lists them")
    def tasks_list():
        from agent.commands.tasks import listed

        return reply(listed())

    @app.get("/tasks/{name}", summary="one task and the statement a model sees (visible workloads only)")
    def task_one(name: str, arch: Arch = "sm_90a", lang: Literal["cuda", "ptx"] = "cuda"):
        from agent.commands.tasks import _summary
        from tasks.describe import render_task

        task = resolve_task(name)
        return reply({**_summary(task), "statement": render_task(task, arch, lang)})

    @app.post("/check", summary="compile + SASS verdicts, synchronous (`agent check --json`)")
    def check(req: SolutionIn):
        return reply(service.check(req))

    @app.post("/evaluate", status_code=202, summary="queue an evaluation; answers the job id")
    def evaluate(req: EvaluateIn, request: Request):
        job = service.submit(client(request), req)
        return reply({"id": job.id, "status": job.status}, status=202)

    @app.get("/jobs/{job_id}", summary="a job's status and, when done, the JSON `agent eval --json` gives")
    def job_get(job_id: str, request: Request, floats: Literal["json", "words"] = Query("json")):
        job = service.store.get(job_id, client(request))
        if job is None:
            raise Rejected(404, "no such job")
        return reply(job_json(job), floats=floats)

    @app.delete("/jobs/{job_id}", summary="cancel a job (a running one's result is dropped)")
    def job_cancel(job_id: str, request: Request):
        job = service.store.cancel(job_id, client(request))
        if job is None:
            raise Rejected(404, "no such job")
        return reply(job_json(job))

    return Gate(app, tokens, service.limits.max_body_bytes)
