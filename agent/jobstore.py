"""The evaluation service's jobs, in one SQLite file that outlives the service (`agent serve`).

A job is one POST /evaluate: its request (the solution, task, arch and options), who sent it,
and, once done, the result JSON. States:

    queued -> running -> done          the evaluation ran to an EvalResult (a bad kernel is a result)
                      -> failed        the service itself broke on it (its error line; never a verdict)
    queued | running  -> cancelled     DELETE /jobs/{id}; a running job's result is then dropped

A job that was `running` when the service stopped (killed, or shut down before it finished) is
`queued` again on the next start (`requeue_running`), and `attempt` counts its tries: a result is
only ever written by the attempt that holds the job (`finish` checks it), so a requeued job is
answered once. After MAX_ATTEMPTS tries the service stopped under, a job is `failed` instead: one
that brings the service down would otherwise do so again at every start. One service per store: a
second one on the same file is refused (`lock`).
"""
from __future__ import annotations

import fcntl
import json
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]
OPEN: tuple[str, ...] = ("queued", "running")
ENDED: tuple[str, ...] = ("done", "failed", "cancelled")
MAX_ATTEMPTS = 3  # tries a job gets when the service stops while it runs

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    client TEXT NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    result TEXT,
    error TEXT,
    attempt INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    started REAL,
    finished REAL
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status, seq);
CREATE INDEX IF NOT EXISTS jobs_client ON jobs(client, status, seq);
CREATE INDEX IF NOT EXISTS jobs_client_started ON jobs(client, started);
"""


class Job(BaseModel):
    """One job as the store holds it (the result stays JSON text: exactly what was written)."""

    id: str
    client: str
    status: JobStatus
    request: dict[str, Any]
    result: str | None = None
    error: str | None = None
    attempt: int = 0
    created: float
    started: float | None = None
    finished: float | None = None


class StoreLocked(RuntimeError):
    """Another service holds this store."""


class JobStore:
    """Thread-safe: one connection, one lock (SQLite's writes are serial anyway)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._lock_file = None

    def lock(self) -> None:
        """Hold the store for this process (released when it exits): two services on one store
        would both run its queued jobs. The lock file sits next to the database file itself (the
        path resolved), so a second name for it (a symlink, a relative path) finds the same lock."""
        real = self.path.resolve()
        f = open(real.with_suffix(real.suffix + ".lock"), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise StoreLocked(f"{self.path} is in use by another `agent serve`") from None
        self._lock_file = f

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._lock_file is not None:
            self._lock_file.close()

    # -- writes
    def add(self, client: str, request: dict[str, Any], keep_ended: int) -> Job:
        """A new queued job of `client`; of its ended jobs only the newest `keep_ended` are kept.
        The per-client bound counts open jobs only, so without this a client that submits and
        cancels (or sends kernels that fail at once) in a loop grows the file by a request (up to
        the body limit) a round, for ever: a client's share of the store is now at most
        (keep_ended + its open jobs) requests and results."""
        job = Job(id=secrets.token_urlsafe(12), client=client, status="queued", request=request, created=time.time())
        with self._lock:
            self._db.execute("INSERT INTO jobs (id, client, status, request, created) VALUES (?, ?, 'queued', ?, ?)",
                             (job.id, client, json.dumps(request), job.created))
            self._db.execute("DELETE FROM jobs WHERE client = ? AND status IN (?, ?, ?) AND seq NOT IN "
                             "(SELECT seq FROM jobs WHERE client = ? AND status IN (?, ?, ?) ORDER BY seq DESC LIMIT ?)",
                             (client, *ENDED, client, *ENDED, keep_ended))
        return job

    def claim(self) -> Job | None:
        """The next queued job, now running under a new attempt; None when none is queued. Next is
        the oldest job of the client whose last job started longest ago (one never served first):
        the clients take turns. In plain arrival order a client that keeps its --per-client jobs
        queued made every other client wait behind all of them."""
        with self._lock:
            row = self._db.execute(  # SQLite sorts NULL (never started) first
                "SELECT seq FROM jobs AS q WHERE status = 'queued' ORDER BY "
                "(SELECT MAX(started) FROM jobs AS r WHERE r.client = q.client), seq LIMIT 1").fetchone()
            if row is None:
                return None
            self._db.execute("UPDATE jobs SET status = 'running', attempt = attempt + 1, started = ? WHERE seq = ?",
                             (time.time(), row[0]))
            return self._get_locked("seq = ?", row[0])

    def finish(self, job: Job, *, result: str | None = None, error: str | None = None) -> bool:
        """Record the end of `job`'s attempt; False (nothing written) when the job is no longer
        that attempt's: cancelled meanwhile, or requeued by a shutdown."""
        status = "failed" if error is not None else "done"
        with self._lock:
            cur = self._db.execute(
                "UPDATE jobs SET status = ?, result = ?, error = ?, finished = ? "
                "WHERE id = ? AND status = 'running' AND attempt = ?",
                (status, result, error, time.time(), job.id, job.attempt))
            return cur.rowcount == 1

    def cancel(self, job_id: str, client: str) -> Job | None:
        with self._lock:
            self._db.execute("UPDATE jobs SET status = 'cancelled', finished = ? "
                             "WHERE id = ? AND client = ? AND status IN ('queued', 'running')",
                             (time.time(), job_id, client))
            return self._get_locked("id = ? AND client = ?", job_id, client)

    def requeue_running(self, ids: list[str] | None = None) -> int:
        """Running jobs (all, or those of `ids`) back to queued: their attempt's result, if it still
        comes, is dropped (finish), and the next attempt runs them again; a job that has had
        MAX_ATTEMPTS tries ends `failed` instead. Returns how many were requeued."""
        picked = "" if ids is None else f" AND id IN ({', '.join('?' * len(ids))})"
        args = tuple(ids or ())
        with self._lock:
            self._db.execute(f"UPDATE jobs SET status = 'failed', finished = ?, error = 'the service stopped ' || "
                             f"attempt || ' times while this job ran; it is not tried again' "
                             f"WHERE status = 'running' AND attempt >= ?{picked}", (time.time(), MAX_ATTEMPTS, *args))
            cur = self._db.execute(f"UPDATE jobs SET status = 'queued', started = NULL WHERE status = 'running'{picked}",
                                   args)
            return cur.rowcount

    # -- reads
    def get(self, job_id: str, client: str) -> Job | None:
        """A client sees its own jobs only (another's id answers as unknown)."""
        with self._lock:
            return self._get_locked("id = ? AND client = ?", job_id, client)

    def counts(self, client: str | None = None) -> dict[str, int]:
        where, args = ("WHERE client = ?", (client,)) if client is not None else ("", ())
        with self._lock:
            rows = self._db.execute(f"SELECT status, COUNT(*) FROM jobs {where} GROUP BY status", args).fetchall()
        return {status: n for status, n in rows}

    def recent_seconds(self, n: int = 20) -> list[float]:
        """Wall seconds of the last n finished jobs (for Retry-After)."""
        with self._lock:
            rows = self._db.execute("SELECT finished - started FROM jobs WHERE status = 'done' AND started IS NOT NULL "
                                    "ORDER BY finished DESC LIMIT ?", (n,)).fetchall()
        return [r[0] for r in rows if r[0] is not None]

    def _get_locked(self, where: str, *args) -> Job | None:
        row = self._db.execute(f"SELECT id, client, status, request, result, error, attempt, created, started, finished "
                               f"FROM jobs WHERE {where}", args).fetchone()
        if row is None:
            return None
        keys = ("id", "client", "status", "request", "result", "error", "attempt", "created", "started", "finished")
        data = dict(zip(keys, row))
        data["request"] = json.loads(data["request"])
        return Job(**data)
