"""`agent serve`'s job store under restarts and other writers: a job that waits across a restart
onto other task definitions, and a store another process holds locked. Real server, real SQLite
(tests/test_serve.py's Server)."""
from __future__ import annotations

import signal
import sqlite3
import time

import test_serve
from agent.client import ServiceClient
from test_serve import solution_body

serve = test_serve.serve  # the fixture: servers started by a test, killed after it


def test_a_job_requeued_after_a_restart_onto_another_definition_fails_never_flips(serve, tmp_path):
    """A queued job, the service restarted onto tasks/ that define the task otherwise (a pull
    between two starts; here its stored hash is made another definition's): it was judged
    against the new definition, a verdict its client never asked for. Now it fails, saying so."""
    body = solution_body()
    s = serve("--slots", "1")
    with ServiceClient(s.url) as c:
        for _ in range(2):
            c.submit("gemm", body["source"], body["launch"])
    s.stop(signal.SIGKILL)
    db = sqlite3.connect(s.store)
    waiting = [row[0] for row in db.execute("SELECT id FROM jobs WHERE status IN ('queued', 'running')")]
    db.execute("UPDATE jobs SET request = json_set(request, '$.task_hash', ?) WHERE status IN ('queued', 'running')",
               ("0" * 64,))
    db.commit()
    db.close()
    assert waiting
    s2 = serve("--slots", "1", store=s.store)
    with ServiceClient(s2.url) as c:
        jobs = [c.wait(i, timeout_s=300) for i in waiting]
    for job in jobs:
        assert job["status"] == "failed" and job["result"] is None, job
        assert "another definition" in job["error"]


def test_a_store_locked_by_another_process_delays_a_result_never_loses_a_slot(serve):
    """Another process (an operator's sqlite3 shell, a backup) holds a write transaction on the
    store past SQLite's busy timeout (5 s) while a job ends: the slot's thread died of "database
    is locked", its job stayed `running` for ever, and later jobs were accepted and never run.
    Now the result is written once the store is free, and the slot goes on."""
    body = solution_body(source="this is not CUDA\n")  # fails to compile: a job of a second or so
    s = serve("--slots", "1")
    with ServiceClient(s.url) as c:
        first = c.submit("gemm", body["source"], body["launch"])
        db = sqlite3.connect(s.store, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")  # in WAL mode: every other writer waits
        time.sleep(8)
        db.execute("COMMIT")
        db.close()
        second = c.submit("gemm", body["source"], body["launch"])
        jobs = [c.wait(i, timeout_s=60) for i in (first, second)]
    assert [j["status"] for j in jobs] == ["done", "done"] and [j["attempt"] for j in jobs] == [1, 1]
    assert jobs[0]["result"]["verdicts"]["compiled"] is False


def test_a_job_the_service_stops_under_again_and_again_ends_failed(tmp_path):
    """A job running each time the service dies (one that brings it down) was queued again at
    every start, for ever: it now has MAX_ATTEMPTS tries, then ends `failed`, saying so."""
    from agent.jobstore import MAX_ATTEMPTS, JobStore

    store = JobStore(tmp_path / "jobs.sqlite")
    poison, other = store.add("alice", {"n": 0}, keep_ended=10), store.add("bob", {"n": 1}, keep_ended=10)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert store.claim().id == poison.id
        # as at the next start, or as a shutdown's Dispatcher.stop() does with the jobs still running
        requeued = store.requeue_running() if attempt % 2 else store.requeue_running([poison.id])
        assert requeued == (1 if attempt < MAX_ATTEMPTS else 0)
    job, waiting = store.get(poison.id, "alice"), store.get(other.id, "bob")
    store.close()
    assert (job.status, job.attempt) == ("failed", MAX_ATTEMPTS) and (waiting.status, waiting.attempt) == ("queued", 0)
    assert job.error == f"the service stopped {MAX_ATTEMPTS} times while this job ran; it is not tried again"
