"""`agent serve`: the evaluator as an HTTP service (agent/service.py; docs/SERVE.md)."""
from __future__ import annotations

import ipaddress
import itertools
import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from agent.commands.common import CliError

MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def read_tokens(path: Path) -> dict[str, str]:
    """A token file: one `TOKEN` or `NAME TOKEN` a line (# comments). NAME is the client the
    token's jobs belong to (tokens that share a NAME share its jobs); a bare TOKEN gets a name of
    its own, client1, client2, ..., skipping every NAME the file gives (a bare token named like
    another line's client would read and cancel that client's jobs). Token -> name."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--token-file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    entries: list[tuple[int, list[str]]] = []
    for n, line in enumerate(lines, 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) > 2:
            raise CliError(f"--token-file {path}, line {n}: expected `TOKEN` or `NAME TOKEN`")
        entries.append((n, parts))
    named = {parts[0] for _, parts in entries if len(parts) == 2}
    bare = (name for name in (f"client{i}" for i in itertools.count(1)) if name not in named)
    tokens: dict[str, str] = {}
    for n, parts in entries:
        name, token = (parts if len(parts) == 2 else (next(bare), parts[0]))
        if len(token) < MIN_TOKEN_CHARS:
            raise CliError(f"--token-file {path}, line {n}: a token needs at least {MIN_TOKEN_CHARS} characters "
                           "(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        if token in tokens:
            raise CliError(f"--token-file {path}, line {n}: the same token twice")
        tokens[token] = name
    if not tokens:
        raise CliError(f"--token-file {path}: no token in it")
    return tokens


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        host: Annotated[str, typer.Option("--host", help="address to bind; anything but loopback needs --token-file")]
        = "127.0.0.1",
        port: Annotated[int, typer.Option("--port", help="port (0: any free one; the first line printed says which)")]
        = 8008,
        token_file: Annotated[Optional[Path], typer.Option(
            "--token-file", help="tokens clients send as `Authorization: Bearer`: `TOKEN` or `NAME TOKEN` a line")] = None,
        store: Annotated[Path, typer.Option("--store", help="SQLite file of the jobs (kept across restarts)")]
        = Path("runs/serve/jobs.sqlite"),
        ray_address: Annotated[Optional[str], typer.Option(
            "--ray-address", help="evaluate on this Ray cluster (auto, host:6379, ray://host:10001), one GPU actor "
                                  "per GPU as `agent sweep --executor ray` does; default: this machine's GPUs")] = None,
        slots: Annotated[Optional[int], typer.Option("--slots", help="jobs run at once (default: 2 per GPU, at least 2)")]
        = None,
        queue_size: Annotated[int, typer.Option("--queue-size", help="queued jobs before POST /evaluate answers 429")]
        = 64,
        per_client: Annotated[int, typer.Option("--per-client", help="one client's queued + running jobs at most")]
        = 8,
        keep_jobs: Annotated[int, typer.Option("--keep-jobs", help="one client's ended jobs kept (older ones are "
                                                                   "forgotten: 404)")] = 1000,
        max_body_kb: Annotated[int, typer.Option("--max-body-kb", help="largest request body (KiB; 413 above)")]
        = 2048,
        request_timeout_s: Annotated[float, typer.Option(
            "--request-timeout-s", help="seconds a request's headers and body get to arrive; the connection is "
                                        "closed after")] = 60.0,
        drain_s: Annotated[float, typer.Option("--drain-s", help="on shutdown, seconds running jobs get to finish "
                                                                 "before they are requeued")] = 30.0,
    ) -> None:
        """Serve the evaluator over HTTP: tasks, check, evaluate (queued jobs), health; OpenAPI at /docs.

        Stopped by SIGTERM or Ctrl-C, it takes no new request, gives running jobs --drain-s, requeues
        the rest, and ends as the signal it got (130 for Ctrl-C). Exit status 2: bad input (a
        non-loopback --host without --token-file, a bad token file, a port in use)."""
        from agent.service import Limits, deadline_protocol

        if not is_loopback(host) and token_file is None:
            raise CliError(f"--host {host} is not loopback: anyone who reaches it could run kernels; "
                           "give --token-file (or bind 127.0.0.1)")
        tokens = read_tokens(token_file) if token_file is not None else {}
        for name, value in (("--queue-size", queue_size), ("--per-client", per_client), ("--max-body-kb", max_body_kb),
                            ("--keep-jobs", keep_jobs)):
            if value < 1:
                raise CliError(f"{name} must be at least 1, not {value}")
        if not request_timeout_s > 0:
            raise CliError(f"--request-timeout-s must be above 0, not {request_timeout_s}")
        if slots is not None and slots < 1:
            raise CliError(f"--slots must be at least 1, not {slots}")
        if not 0 <= port <= 65535:
            raise CliError(f"--port must be 0..65535, not {port}")
        try:
            import fastapi  # noqa: F401
            import uvicorn
        except ImportError as exc:
            raise CliError(f"agent serve needs fastapi and uvicorn ({exc.name} is missing): pip install -e .") from None
        limits = Limits(max_body_bytes=max_body_kb * 1024, queue_size=queue_size, per_client=per_client,
                        keep_ended=keep_jobs, check_slots=max(1, (os.cpu_count() or 2) // 2))
        if limits.max_source_bytes > limits.max_body_bytes:
            limits.max_source_bytes = limits.max_body_bytes
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(2048)  # before the line below: a client that reads it may connect at once
        except OSError as exc:
            sock.close()
            raise CliError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
        service, app = _build(store, ray_address, slots, limits, tokens)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        print(f"listening on http://{shown}:{bound} ({service.executor.describe()}; {service.dispatcher.slots} job "
              f"slot(s); store {store}; {'token required' if tokens else 'no token: loopback only'})", flush=True)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=int(drain_s) + 5,
                                access_log=False, http=deadline_protocol(request_timeout_s))
        uvicorn.Server(config).run(sockets=[sock])
        sys.stdout.flush()


def _build(store_path: Path, ray_address: str | None, slots: int | None, limits, tokens: dict[str, str]):
    """The executor (the same code path as `agent sweep`'s), the store (jobs that were running when
    the last service stopped are queued again) and the app."""
    from agent.executors import LocalExecutor, RayExecutor
    from agent.jobstore import JobStore, StoreLocked
    from agent.service import Dispatcher, Service, create_app

    store = JobStore(store_path)
    try:
        store.lock()
    except StoreLocked as exc:
        store.close()
        raise CliError(str(exc)) from None
    requeued = store.requeue_running()
    if requeued:
        print(f"requeued {requeued} job(s) that were running when the service last stopped", flush=True)
    try:
        executor = RayExecutor(ray_address) if ray_address else LocalExecutor()
    except RuntimeError as exc:
        store.close()
        raise CliError(str(exc)) from None
    if ray_address:
        import ray

        gpus = [f"ray GPU {i}" for i in range(int(ray.cluster_resources().get("GPU", 0)))]
    else:
        from tools.evaluator import detect_gpus

        gpus = detect_gpus()[0]
    dispatcher = Dispatcher(store, executor.evaluator(), limits, slots or max(2, 2 * len(gpus)))
    service = Service(store=store, executor=executor, limits=limits, dispatcher=dispatcher,
                      versions=_versions(), gpus=gpus)
    return service, create_app(service, tokens)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from tools.results import RULES_VERSION
    from tools.toolchain import find_toolchain

    out: dict[str, str] = {"rules": str(RULES_VERSION)}
    for dist in ("ptxbench", "fastapi", "uvicorn"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    try:
        out.update(find_toolchain().versions())
    except Exception as exc:  # noqa: BLE001 - /health says so; /check answers 503
        out["toolchain"] = f"unavailable: {exc}"
    return out
