"""A Python client of `agent serve` (agent/service.py), and the evaluator the agent uses through it.

    from agent.client import ServiceClient
    with ServiceClient("http://gpu-host:8008", token="...") as c:
        c.tasks()                                   # GET /tasks
        c.check("gemm", source, launch)             # POST /check: compile + SASS verdicts
        job = c.submit("gemm", source, launch, workloads="all")
        c.wait(job)["result"]["verdicts"]           # `agent eval --json`'s dict

`RemoteEvaluator` looks like tools.evaluator.Evaluator to the agent (`agent solve --evaluator URL`,
`agent sweep --evaluator URL`): evaluate() submits, waits and returns the EvalResult. The token
comes from the argument or the PTXBENCH_EVALUATOR_TOKEN environment variable (a name the compile
sandbox never passes on). The package is `agent` (ptxbench ships agent, tools, knowledge, tasks),
so the client is `agent.client`; it needs httpx and pydantic only.
"""
from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import httpx

from tools.results import EvalResult

TOKEN_ENV = "PTXBENCH_EVALUATOR_TOKEN"
DONE = ("done", "failed", "cancelled")


class ServiceError(RuntimeError):
    """The service refused a request or could not be reached: the status (0: unreachable) and its line."""

    def __init__(self, status: int, detail: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {detail}" if status else detail)
        self.status, self.detail, self.retry_after = status, detail, retry_after


class ServiceClient:
    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 300.0, retries_429: int = 20):
        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.retries_429 = retries_429

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- the endpoints
    def health(self) -> dict:
        return self._call("GET", "/health")

    def tasks(self) -> list[dict]:
        return self._call("GET", "/tasks")

    def task(self, name: str, arch: str = "sm_90a", lang: str = "cuda") -> dict:
        return self._call("GET", f"/tasks/{name}", params={"arch": arch, "lang": lang})

    def check(self, task: str, source: str, launch: dict, *, arch: str = "sm_90a", lang: str = "cuda") -> dict:
        return self._call("POST", "/check", json=_solution(task, source, launch, arch, lang))

    def submit(self, task: str, source: str, launch: dict, *, arch: str = "sm_90a", lang: str = "cuda",
               wait_if_full: bool = True, **options: Any) -> str:
        """Queue an evaluation (options: workloads, credit, profile, sanitize, time, task_hash); its job id.
        A full queue (429) is waited out per its Retry-After, up to `retries_429` times."""
        body = {**_solution(task, source, launch, arch, lang), **options}
        for attempt in range(self.retries_429 + 1):
            try:
                return self._call("POST", "/evaluate", json=body)["id"]
            except ServiceError as exc:
                if exc.status != 429 or not wait_if_full or attempt == self.retries_429:
                    raise
                time.sleep((exc.retry_after or 1.0) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def job(self, job_id: str, *, exact_floats: bool = False) -> dict:
        """GET /jobs/{id}. exact_floats: inf and NaN as they were (JSON's Infinity/NaN words), else null."""
        return self._call("GET", f"/jobs/{job_id}", params={"floats": "words" if exact_floats else "json"})

    def cancel(self, job_id: str) -> dict:
        return self._call("DELETE", f"/jobs/{job_id}")

    def wait(self, job_id: str, *, timeout_s: float = 3600.0, poll_s: float = 0.5, exact_floats: bool = False) -> dict:
        """Poll until the job is done, failed or cancelled (TimeoutError after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        delay = min(poll_s, 0.1)
        while True:
            job = self.job(job_id, exact_floats=exact_floats)
            if job["status"] in DONE:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s:.0f} s")
            time.sleep(delay)
            delay = min(poll_s, delay * 2)

    def evaluate(self, task: str, source: str, launch: dict, **kwargs: Any) -> dict:
        """Submit and wait: the finished job."""
        wait_s = kwargs.pop("timeout_s", 3600.0)
        return self.wait(self.submit(task, source, launch, **kwargs), timeout_s=wait_s)

    # -- plumbing
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(0, f"cannot reach {self.url}: {exc}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text[:300]
            retry = r.headers.get("retry-after")
            raise ServiceError(r.status_code, str(detail), float(retry) if retry and retry.isdigit() else None)
        return json.loads(r.text)  # json, not r.json(): it reads the Infinity/NaN words of floats=words


def _solution(task: str, source: str, launch: dict, arch: str, lang: str) -> dict:
    return {"task": task, "arch": arch, "source": source, "launch": launch, "lang": lang}


class RemoteEvaluator:
    """tools.evaluator.Evaluator's face over a remote `agent serve`: what a run or a sweep holds.

    Every evaluation sends the task's name and its definition's hash: a service that judges another
    definition under that name refuses (409) rather than give verdicts against it. Held-out workloads
    come back by class (held_out_1, ... with no sizes): the agent's feedback tells them so anyway.
    A service that cannot be reached, or a job the service itself failed on, is a harness fault (an
    EvalResult with infra_error: the run stops and resumes later), never a verdict on the kernel."""

    def __init__(self, url: str, token: str | None = None, *, wait_s: float = 3600.0):
        self.client = ServiceClient(url, token)
        self.url, self.wait_s = url, wait_s
        self.no_gpu_reason: str | None = None
        try:
            h = self.client.health()
        except ServiceError as exc:
            raise ServiceError(exc.status, f"evaluator {url}: {exc.detail}") from None
        if "gpus" not in h:  # a service with a token file tells a caller it does not know only that it is up
            self.client.close()
            raise ServiceError(401, f"evaluator {url}: the service does not accept this token (${TOKEN_ENV})")
        self.gpu: str | None = h.get("gpu")
        if not self.gpu:
            self.no_gpu_reason = f"the service at {url} has no GPU ({h.get('executor', '')})"

    @property
    def has_gpu(self) -> bool:
        return self.gpu is not None

    def gpu_name(self) -> str | None:
        return self.gpu

    def evaluate(self, solution, task, arch: str, *, workloads: str = "visible", executed_check: bool = False,
                 sanitize: bool = False, time: bool = True, profile: bool = False, compiled=None) -> EvalResult:
        from agent.run import task_hash

        if isinstance(task, str):
            from tasks import get_task

            task = get_task(task)
        body = dict(workloads=workloads, credit=executed_check, sanitize=sanitize, time=time,
                    profile=profile, task_hash=task_hash(task))
        try:
            job_id = self.client.submit(task.name, solution.source, solution.manifest.model_dump(mode="json"),
                                        arch=arch, lang=solution.language, **body)
            job = self.client.wait(job_id, timeout_s=self.wait_s, exact_floats=True)
        except (ServiceError, TimeoutError) as exc:
            return self._fault(solution, task, arch, f"evaluator {self.url}: {exc}")
        if job["status"] != "done":
            return self._fault(solution, task, arch, f"evaluator {self.url}: job {job_id} {job['status']}"
                                                     + (f": {job['error']}" if job.get("error") else ""))
        return EvalResult.model_validate(job["result"])

    @staticmethod
    def _fault(solution, task, arch: str, why: str) -> EvalResult:
        from tools.results import CompileResult, InspectResult

        res = EvalResult(task=task.name, arch=arch, requested_features=task.features_for(arch),
                         compile=CompileResult(status="skipped", arch=arch, language=solution.language, error=why,
                                               infra_error=why),
                         inspect=InspectResult(status="skipped", reason=why, arch=arch))
        res.run_reason, res.harness_fault = why, why
        return res

    def close(self) -> None:
        self.client.close()


class RemoteExecutor:
    """agent.executors' Executor over a remote service (`agent sweep --evaluator URL`): every run
    holds the one RemoteEvaluator; the service queues the GPU work."""

    def __init__(self, url: str, token: str | None = None):
        self._evaluator = RemoteEvaluator(url, token)

    @classmethod
    def around(cls, evaluator: RemoteEvaluator) -> "RemoteExecutor":
        self = cls.__new__(cls)
        self._evaluator = evaluator
        return self

    def evaluator(self) -> RemoteEvaluator:
        return self._evaluator

    def describe(self) -> str:
        return f"remote: {self._evaluator.url} ({self._evaluator.gpu or 'no GPU'})"

    def close(self) -> None:
        self._evaluator.close()
