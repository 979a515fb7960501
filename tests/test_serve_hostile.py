"""`agent serve` against clients that hunt for gaps: callers without a token, clients of one token
file that must not meet, connections that never finish a request, a store grown by a loop, a
second service on the store, one client's queue ahead of everyone's. Real server, real HTTP and
SQLite (tests/test_serve.py's Server); the store under restarts and other writers:
tests/test_serve_store.py."""
from __future__ import annotations

import signal
import socket
import time

import httpx
import pytest

from agent.client import RemoteEvaluator, ServiceClient, ServiceError
import test_serve
from test_serve import TOKENS, Server, solution_body

serve = test_serve.serve  # the fixture: servers started by a test, killed after it

BARE = "bare-token-0123456789abcdef"  # a token with no NAME: the file's first such, client1 by default
NAMED_CLIENT1 = "named-token-0123456789abcdef"  # a token whose NAME is client1


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """One service with a token file, a 2 s request deadline and 2 ended jobs kept per client, for
    the tests that do not restart (each test its own client)."""
    tmp = tmp_path_factory.mktemp("guarded")
    tokens = tmp / "tokens"
    tokens.write_text(f"{BARE}\nclient1 {NAMED_CLIENT1}\n" + "".join(f"{n} {t}\n" for n, t in TOKENS.items()))
    s = Server(tmp, "--token-file", str(tokens), "--request-timeout-s", "2", "--keep-jobs", "2")
    yield s
    s.stop(signal.SIGKILL)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_caller_without_a_token_learns_only_that_the_service_is_up(guarded):
    with httpx.Client(base_url=guarded.url, timeout=60) as h:
        assert h.get("/health").json() == {"status": "ok"}
        assert h.get("/health", headers=bearer("wrong-token-0123456789abc")).json() == {"status": "ok"}
        full = h.get("/health", headers=bearer(TOKENS["alice"])).json()
    assert {"gpus", "executor", "queue", "limits", "versions"} <= set(full)
    # the agent's evaluator says at once that its token is not taken (not: "the service has no GPU")
    with pytest.raises(ServiceError) as refused:
        RemoteEvaluator(guarded.url, "wrong-token-0123456789abc")
    assert refused.value.status == 401 and "does not accept this token" in refused.value.detail
    RemoteEvaluator(guarded.url, TOKENS["alice"]).close()


def test_a_bare_token_never_shares_a_client_with_a_named_one(guarded):
    """`TOKEN` then `client1 TOKEN2`: the bare token was named client1 too, so each read and
    cancelled the other's jobs."""
    body = solution_body()
    with ServiceClient(guarded.url, BARE) as bare:
        job = bare.submit("gemm", body["source"], body["launch"])
    with httpx.Client(base_url=guarded.url, timeout=60) as h:
        assert h.get(f"/jobs/{job}", headers=bearer(NAMED_CLIENT1)).status_code == 404
        assert h.delete(f"/jobs/{job}", headers=bearer(NAMED_CLIENT1)).status_code == 404
        assert h.delete(f"/jobs/{job}", headers=bearer(BARE)).json()["status"] == "cancelled"  # its own, yes


def test_an_accepted_job_records_the_definition_it_is_judged_against(guarded):
    from agent.run import task_hash
    from tasks import get_task

    body = solution_body()
    with ServiceClient(guarded.url, TOKENS["carol"]) as c:
        job = c.cancel(c.submit("gemm", body["source"], body["launch"]))  # no task_hash sent
    assert job["task_hash"] == task_hash(get_task("gemm"))


def test_a_submit_and_cancel_loop_leaves_a_client_its_newest_ended_jobs_only(guarded):
    """The per-client bound counts open jobs: submitting and cancelling in a loop (or sending
    kernels that fail at once) grew the store by a request a round, up to the body limit each,
    for ever. Now a client keeps its newest --keep-jobs ended jobs; older ones are forgotten."""
    body = solution_body()
    with ServiceClient(guarded.url, TOKENS["bob"]) as c:
        ids = []
        for _ in range(5):
            ids.append(c.submit("gemm", body["source"], body["launch"]))
            assert c.cancel(ids[-1])["status"] == "cancelled"
        with httpx.Client(base_url=guarded.url, timeout=60, headers=bearer(TOKENS["bob"])) as h:
            assert [h.get(f"/jobs/{i}").status_code for i in ids] == [404, 404, 200, 200, 200]


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Does the server close this connection within `seconds` (whatever it answers first)?"""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_request_that_never_arrives_whole_loses_its_connection(guarded):
    """Slowloris: a connection that sends nothing, headers that trickle, and a body under a large
    Content-Length that never comes were held open for ever, a file descriptor each, with no token
    needed for the first two. Each is closed at the deadline; a request that arrives whole is
    answered however long it then takes."""
    host, port = guarded.url.removeprefix("http://").rsplit(":", 1)
    started = [socket.create_connection((host, int(port))) for _ in range(3)]
    silent, trickle, body = started
    trickle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    body.sendall(b"POST /check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + TOKENS["dave"].encode() + b"\r\nContent-Length: 1000000\r\n\r\n{\"ta")
    t0 = time.monotonic()
    for sock in started:
        assert closed_within(sock, 10), "still open"
        sock.close()
    assert time.monotonic() - t0 < 10
    with httpx.Client(base_url=guarded.url, timeout=120) as h:
        assert h.get("/health").status_code == 200
        r = h.post("/check", headers=bearer(TOKENS["dave"]), json=solution_body())
        assert r.status_code == 200 and r.json()["compiled"] is True


def test_a_second_name_for_the_store_finds_it_locked(tmp_path):
    """Two services on one SQLite file would both run its queued jobs: a symlink to the store
    held its lock file next to the link, so a second `agent serve --store LINK` started
    (agent.commands.serve._build locks the store before it requeues or runs anything)."""
    from agent.jobstore import JobStore, StoreLocked

    first = JobStore(tmp_path / "jobs.sqlite")
    first.lock()
    link = tmp_path / "other" / "jobs.sqlite"
    link.parent.mkdir()
    link.symlink_to(first.path)
    second = JobStore(link)
    try:
        with pytest.raises(StoreLocked, match="in use by another"):
            second.lock()
    finally:
        second.close()
        first.close()


def test_clients_take_turns_for_the_slots(tmp_path):
    """A client that keeps its --per-client jobs queued: in arrival order, every other client
    waited behind all of them (with eight such clients, a newcomer behind 64 jobs). The store
    hands the next slot to the client served longest ago."""
    from agent.jobstore import JobStore

    store = JobStore(tmp_path / "jobs.sqlite")
    alice = [store.add("alice", {"n": i}, keep_ended=10).id for i in range(3)]
    bob = store.add("bob", {"n": 0}, keep_ended=10).id
    order = [store.claim().id for _ in range(4)]
    store.close()
    assert order == [alice[0], bob, alice[1], alice[2]]
