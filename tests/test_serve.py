"""`agent serve` as its users meet it: a real server process on loopback (`agent serve --port 0`),
real HTTP, real ptxas and SQLite. On this machine (no GPU) an evaluation ends with its GPU stages
skipped, which is a job result like any other."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agent.client import RemoteEvaluator, ServiceClient, ServiceError

ROOT = Path(__file__).parent.parent
SIMPLE = ROOT / "tasks" / "gemm_n7168_k5120" / "simple"
TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdefgh",
          "carol": "carol-token-0123456789abcdef", "dave": "dave-token-0123456789abcdefg"}


def solution_body(**extra) -> dict:
    return {"task": "gemm", "arch": "sm_90a", "source": (SIMPLE / "kernel.cu").read_text(),
            "launch": json.loads((SIMPLE / "launch.json").read_text()), "lang": "cuda", **extra}


class Server:
    """`agent serve --port 0 ...` in a subprocess; its URL from the first line it prints."""

    def __init__(self, tmp: Path, *args: str, store: Path | None = None):
        self.store = store or tmp / "jobs.sqlite"
        self.log = open(tmp / f"serve-{time.monotonic_ns()}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "serve", "--port", "0", "--store", str(self.store), *args],
            cwd=tmp, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
        line = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not line.startswith("listening on "):
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"agent serve exited {self.proc.returncode}: {self.log.read()[-2000:]}")
        self.url = line.split()[2]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # never block on a full pipe

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture
def serve(tmp_path):
    servers: list[Server] = []

    def start(*args: str, store: Path | None = None) -> Server:
        s = Server(tmp_path, *args, store=store)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop(signal.SIGKILL)


def token_file(tmp: Path) -> Path:
    path = tmp / "tokens"
    path.write_text("# name token\n" + "".join(f"{name} {tok}\n" for name, tok in TOKENS.items()))
    return path


def agent_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "1000"}, timeout=180)


# ---------------------------------------------------------------------------------------
def test_tasks_and_check_answer_what_the_cli_prints(serve, tmp_path):
    s = serve()
    with ServiceClient(s.url) as c:
        health = c.health()
        assert health["status"] == "ok" and health["queue"]["queued"] == 0 and health["versions"]["ptxas"]
        listed = c.tasks()
        cli = json.loads(agent_cli("tasks", "--json").stdout)
        assert listed == cli
        one = c.task("gemm")
        assert one["name"] == "gemm_n7168_k5120" and "M8192" in one["statement"]
        from tasks import get_task

        held = [w.name for w in get_task("gemm").workloads_for("held_out")]
        assert held and not any(name in json.dumps(one) for name in held)  # visible workloads only
        checked = c.check("gemm", (SIMPLE / "kernel.cu").read_text(), json.loads((SIMPLE / "launch.json").read_text()))
    p = agent_cli("check", str(SIMPLE), "--task", "gemm", "--json")
    local = json.loads(p.stdout)
    for key in ("compiled", "features", "missing", "requested", "manifest_errors", "flags", "symbols"):
        assert checked[key] == local[key], key
    assert checked["compiled"] is True and checked["kernels"].keys() == local["kernels"].keys()


def test_tokens_are_required_everywhere_but_health(serve, tmp_path):
    s = serve("--token-file", str(token_file(tmp_path)))
    paths = [("GET", "/tasks"), ("GET", "/tasks/gemm"), ("POST", "/check"), ("POST", "/evaluate"),
             ("GET", "/jobs/abc"), ("DELETE", "/jobs/abc"), ("GET", "/openapi.json"), ("GET", "/docs")]
    with httpx.Client(base_url=s.url, timeout=60) as h:
        assert h.get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789abc"},
                        {"Authorization": f"Basic {TOKENS['alice']}"}, {"Authorization": TOKENS["alice"]}):
            for method, path in paths:
                r = h.request(method, path, headers=headers, json=solution_body() if method == "POST" else None)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
        ok = {"Authorization": f"Bearer {TOKENS['alice']}"}
        assert h.get("/tasks", headers=ok).status_code == 200
        spec = h.get("/openapi.json", headers=ok).json()
        assert {"/check", "/evaluate", "/jobs/{job_id}", "/tasks", "/health"} <= set(spec["paths"])
        job = h.post("/evaluate", headers=ok, json=solution_body()).json()["id"]
        # another client's job is unknown to bob, and bob cannot cancel it
        bob = {"Authorization": f"Bearer {TOKENS['bob']}"}
        assert h.get(f"/jobs/{job}", headers=bob).status_code == 404
        assert h.delete(f"/jobs/{job}", headers=bob).status_code == 404
        assert h.get(f"/jobs/{job}", headers=ok).status_code == 200


def test_bind_refusals_are_one_line_and_exit_2(tmp_path):
    p = agent_cli("serve", "--host", "0.0.0.0", "--port", "0", "--store", str(tmp_path / "j.sqlite"))
    assert p.returncode == 2 and "--token-file" in p.stderr and "Traceback" not in p.stderr
    weak = tmp_path / "weak"
    weak.write_text("short\n")
    p = agent_cli("serve", "--host", "0.0.0.0", "--port", "0", "--token-file", str(weak))
    assert p.returncode == 2 and "at least 16 characters" in p.stderr


def test_size_limits_and_malformed_bodies_are_4xx_never_500(serve):
    s = serve("--max-body-kb", "256")
    body = solution_body()
    malformed = [b"", b"{", b"[]", b"null", b"\"text\"", b"\xff\xfe{}", b"[" * 200_000, b"{\"a\":" * 50_000,
                 json.dumps({**body, "task": 7}).encode(), json.dumps({**body, "source": None}).encode(),
                 json.dumps({**body, "launch": []}).encode(), json.dumps({**body, "arch": "sm_80"}).encode(),
                 json.dumps({**body, "lang": "rust"}).encode(), json.dumps({**body, "extra": 1}).encode(),
                 json.dumps({**body, "source": "  "}).encode(),
                 json.dumps({**body, "lang": "ptx", "source": "// é\n"}).encode(),
                 json.dumps({**body, "launch": {"launches": [{"kernel": "k", "grid": [1], "block": [1],
                                                              "shared_byte": 4}]}}).encode(),
                 json.dumps({**body, "workloads": "secret"}).encode()]
    with httpx.Client(base_url=s.url, timeout=120) as h:
        for path in ("/check", "/evaluate"):
            for raw in malformed:
                r = h.post(path, content=raw, headers={"content-type": "application/json"})
                assert 400 <= r.status_code < 500, (path, raw[:60], r.status_code, r.text[:200])
                assert len(r.text) < 1000 and "detail" in r.json()
        # no client-named path: a task is a registry name, never a file
        for task in ("/etc/passwd", str(SIMPLE / "launch.json"), "../tasks/gemm_n7168_k5120/definition.json"):
            assert h.post("/check", json={**body, "task": task}).status_code == 404
        assert h.get("/tasks/..%2F..%2Fetc%2Fpasswd").status_code == 404
        # 413: the whole body (by Content-Length, and chunked with none), the source, the manifest
        big = json.dumps({**body, "source": "x" * (300 << 10)}).encode()
        assert h.post("/check", content=big, headers={"content-type": "application/json"}).status_code == 413
        chunks = (big[i:i + 8192] for i in range(0, len(big), 8192))
        assert h.post("/evaluate", content=chunks, headers={"content-type": "application/json"}).status_code == 413
        launch = {**body["launch"], "buffers": [{"name": f"b{i}", "dtype": "float32", "shape": [1]}
                                                for i in range(2000)]}
        assert len(json.dumps(launch)) > 64 << 10
        r = h.post("/check", json={**body, "launch": launch})
        assert r.status_code == 413 and "launch" in r.json()["detail"]
        assert h.get("/health").json()["status"] == "ok"  # and the service goes on


def test_queue_and_client_limits_answer_429_with_retry_after(serve, tmp_path):
    s = serve("--token-file", str(token_file(tmp_path)), "--slots", "1", "--queue-size", "2", "--per-client", "2")
    auth = {name: {"Authorization": f"Bearer {tok}"} for name, tok in TOKENS.items()}
    accepted: dict[str, list[str]] = {}
    with httpx.Client(base_url=s.url, timeout=60) as h:
        for name in ("alice", "alice", "alice"):
            r = h.post("/evaluate", headers=auth[name], json=solution_body())
            if r.status_code == 202:
                accepted.setdefault(name, []).append(r.json()["id"])
        assert len(accepted["alice"]) == 2  # her third: over her own limit, whatever the queue
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and "at most 2" in r.json()["detail"]
        full = None
        for name in ("bob", "bob", "carol", "carol"):
            r = h.post("/evaluate", headers=auth[name], json=solution_body())
            if r.status_code == 202:
                accepted.setdefault(name, []).append(r.json()["id"])
            else:
                full = r
        assert full is not None and full.status_code == 429 and "queue is full" in full.json()["detail"]
        assert int(full.headers["retry-after"]) >= 1
        # every accepted job is answered, once
        for name, ids in accepted.items():
            with ServiceClient(s.url, TOKENS[name]) as c:
                for job_id in ids:
                    job = c.wait(job_id, timeout_s=300)
                    assert job["status"] == "done" and job["attempt"] == 1, job
                    assert job["result"]["run_status"] == "skipped"  # no GPU here: said, not passed


def test_restart_keeps_finished_jobs_and_runs_the_interrupted_ones(serve, tmp_path):
    s = serve("--slots", "1")
    with ServiceClient(s.url) as c:
        first = c.evaluate("gemm", solution_body()["source"], solution_body()["launch"], timeout_s=300)
        assert first["status"] == "done"
        pending = [c.submit("gemm", solution_body()["source"], solution_body()["launch"]) for _ in range(2)]
        cancelled = c.submit("gemm", solution_body()["source"], solution_body()["launch"])
        assert c.cancel(cancelled)["status"] == "cancelled"
    s.stop(signal.SIGKILL)  # killed: whatever was running is requeued at the next start
    s2 = serve("--slots", "1", "--drain-s", "0", store=s.store)
    with ServiceClient(s2.url) as c:
        again = c.job(first["id"])
        assert again["status"] == "done" and again["result"] == first["result"]
        for job_id in pending:
            job = c.wait(job_id, timeout_s=300)
            assert job["status"] == "done" and job["result"]["task"] == "gemm_n7168_k5120"
        assert c.job(cancelled)["status"] == "cancelled"
        late = c.submit("gemm", solution_body()["source"], solution_body()["launch"])
    # graceful, with no time to drain: the running job goes back to the queue; the process ends as the
    # signal it got (uvicorn raises it again, for process managers)
    assert s2.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    s3 = serve("--slots", "1", store=s.store)
    with ServiceClient(s3.url) as c:
        job = c.wait(late, timeout_s=300)
        assert job["status"] == "done" and job["result"]["task"] == "gemm_n7168_k5120"


def test_concurrent_clients_each_job_answered_once(serve, tmp_path):
    s = serve("--token-file", str(token_file(tmp_path)), "--slots", "2", "--per-client", "3")
    results: dict[str, list[dict]] = {}
    errors: list[BaseException] = []

    def client(name: str) -> None:
        try:
            with ServiceClient(s.url, TOKENS[name]) as c:
                ids = [c.submit("gemm", solution_body()["source"], solution_body()["launch"]) for _ in range(3)]
                results[name] = [c.wait(i, timeout_s=400) for i in ids]
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(name,)) for name in TOKENS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=500)
    assert not errors, errors
    ids = [job["id"] for jobs in results.values() for job in jobs]
    assert len(ids) == 3 * len(TOKENS) == len(set(ids))
    assert all(job["status"] == "done" and job["attempt"] == 1 for jobs in results.values() for job in jobs)
    with ServiceClient(s.url, TOKENS["alice"]) as c:
        assert c.health()["queue"] == {"queued": 0, "running": 0, "capacity": 64, "slots": 2}


def test_held_out_workloads_come_back_by_class_never_by_name(serve):
    from tasks import get_task
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    task = get_task("gemm")
    held = [w.name for w in task.workloads_for("held_out")]
    held_sizes = {w.axes["M"] for w in task.workloads_for("held_out")} - {w.axes["M"] for w in task.workloads_for("visible")}
    s = serve()
    ev = RemoteEvaluator(s.url)
    res = ev.evaluate(Solution.from_dir(SIMPLE), task, "sm_90a", workloads="all", executed_check=True)
    ev.close()
    text = res.model_dump_json()
    assert not any(name in text for name in held)
    assert not any(f'"M":{m}' in text.replace(" ", "") for m in held_sizes)
    split = [w.split for w in res.workloads]
    assert split.count("held_out") == len(held) and [w.workload for w in res.workloads if w.split == "held_out"] \
        == [f"held_out_{i}" for i in range(1, len(held) + 1)]
    with Evaluator(gpus=[]) as local:  # the same verdicts as the evaluator here
        mine = local.evaluate(Solution.from_dir(SIMPLE), task, "sm_90a", workloads="all", executed_check=True)
    assert res.verdicts() == mine.verdicts() and res.run_status == mine.run_status


def test_remote_evaluator_refuses_another_definition_and_says_unreachable(serve):
    from tasks import get_task
    from tools.solution import Solution

    s = serve()
    task = get_task("gemm")
    task.tolerance.rtol = 0.5  # the client's definition differs from the service's
    ev = RemoteEvaluator(s.url)
    res = ev.evaluate(Solution.from_dir(SIMPLE), task, "sm_90a")
    assert res.infra_error and "409" in res.infra_error and "another definition" in res.infra_error
    s.stop()
    res = ev.evaluate(Solution.from_dir(SIMPLE), get_task("gemm"), "sm_90a")
    assert res.infra_error and "cannot reach" in res.infra_error  # a harness fault, never a verdict
    ev.close()
    with pytest.raises(ServiceError):
        RemoteEvaluator(s.url)


def test_redaction_scrubs_a_held_out_size_quoted_in_any_string():
    from agent.feedback import redact_held_out
    from tasks import get_task
    from tools.results import CompileResult, EvalResult, InspectResult, WorkloadResult

    task = get_task("gemm")
    hw = task.workloads_for("held_out")[0]
    vis = task.workloads_for("visible")[0]
    res = EvalResult(task=task.name, arch="sm_90a", compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                     inspect=InspectResult(status="ok", arch="sm_90a"), run_status="failed",
                     run_reason=f"the manifest is wrong without running: grid is 0 at M={hw.axes['M']} ({hw.name})",
                     workloads=[WorkloadResult(workload=vis.name, split="visible", axes=vis.axes, status="passed"),
                                WorkloadResult(workload=hw.name, split="held_out", axes=hw.axes, status="failed",
                                               reason="manifest_error", detail=f"M={hw.axes['M']}")])
    out = redact_held_out(res)
    text = out.model_dump_json()
    assert hw.name not in text and f"M={hw.axes['M']}" not in text and vis.name in text
    held = out.workloads[1]
    assert (held.workload, held.axes, held.reason, held.detail) == ("held_out_1", {}, "manifest_error", "manifest_error")


def held_out_only_below(rows: int, folder: Path):
    """The simple GEMM with a grid row count of M - rows: fine at every M above `rows`, wrong (and
    said with the value it came to) at held-out M70 alone."""
    from tools.solution import Solution

    launch = json.loads((SIMPLE / "launch.json").read_text())
    launch["launches"][0]["grid"][1] = f"M - {rows}"
    (folder / "kernel.cu").write_text((SIMPLE / "kernel.cu").read_text())
    (folder / "launch.json").write_text(json.dumps(launch))
    return Solution.from_dir(folder)


def test_a_manifest_that_fails_only_at_a_held_out_size_is_not_quoted_with_its_values(tmp_path):
    """Where nothing runs (no GPU here; on a GPU service, an arch it has not), the evaluation's
    run_reason said why the manifest is wrong, quoting the first workload it failed on: a held-out
    one where the visible ones pass, with what its expression came to (M - 100 = -30: M is 70).
    The client reads that the manifest fails on a held-out workload, by class, never the value."""
    from agent.commands.evaluate import eval_json
    from agent.feedback import redact_held_out
    from tasks import get_task
    from tools.evaluator import Evaluator

    task = get_task("gemm")
    with Evaluator(gpus=[]) as local:
        res = local.evaluate(held_out_only_below(100, tmp_path), task, "sm_90a", workloads="all")
    [bad] = [w for w in res.workloads if w.status == "failed"]
    assert (bad.workload, bad.reason) == ("M70", "manifest_error") and "= -30" in bad.detail  # kept for the researcher
    out = eval_json(redact_held_out(res))
    assert out["run_status"] == "failed" and "the manifest is wrong without running: held-out workload held_out_4" \
        in out["run_reason"]
    assert "-30" not in json.dumps(out) and "M70" not in json.dumps(out)


def test_a_check_with_no_workload_to_count_names_a_held_out_failure_by_class(tmp_path):
    """The executed check on an evaluation of the held-out workloads alone (`workloads: held_out`),
    none of which ran to a verdict, said why by quoting the first failure's detail: M70's value."""
    from agent.feedback import redact_held_out
    from tasks import get_task
    from tools.credit import Counting
    from tools.evaluator import Evaluator

    task, solution = get_task("gemm"), held_out_only_below(100, tmp_path)
    with Evaluator(gpus=[]) as local:
        res = local.evaluate(solution, task, "sm_90a", workloads="held_out")
        res.executed = local._executed(res, solution, task, task.workloads_for("held_out"), None,
                                       Counting(mode="cupti"), "0", "sm_90a", res.inspect)
    assert res.executed.status == "skipped" and res.executed.reason.startswith("not profiled: no workload ran")
    assert "-30" not in res.executed.reason and "-30" not in redact_held_out(res).model_dump_json()


def test_a_client_reads_the_visible_workloads_credit_figures_only():
    """The executed check as a client gets it: counts, shares and notes the visible workloads'
    (a held-out workload's grow with its size and quote its FLOPs and tile padding: M70's cap,
    2.5 x 128/70 = 4.57x), the held-out credits by verdict only; the verdicts the evaluation's."""
    from agent.commands.evaluate import eval_json
    from agent.feedback import redact_held_out
    from test_mutation_feedback import held_out_credit_eval

    e = held_out_credit_eval()
    held = [c for c in e.executed.workloads if c.split == "held_out"]
    vis = [c for c in e.executed.workloads if c.split == "visible"]
    out = redact_held_out(e)
    ex, text = out.executed, json.dumps(eval_json(out))
    assert ex.counts == vis[0].counts and ex.shares == vis[0].shares and ex.executed == e.executed.executed
    assert ex.notes["wgmma"] == "a held-out workload: wgmma did not carry the work there (its figures are not shown)"
    assert not any(note in text for c in held for note in c.notes.values()) and "4.57" not in text
    assert [c.model_dump(exclude_defaults=True) for c in ex.workloads if c.split == "held_out"] == [
        {"workload": f"held_out_{i}", "split": "held_out", "status": "ok", "executed": c.executed, "carries": c.carries}
        for i, c in enumerate(held, 1)]
    assert out.verdicts() == e.verdicts() and eval_json(out)["failures"] == eval_json(e)["failures"]


def test_on_a_ray_cluster_the_service_evaluates_through_the_ray_executor(serve, tmp_path):
    """`agent serve --ray-address`: the service's jobs go through the Ray executor, as `agent sweep
    --executor ray` does (compile as a CPU task, one GPU actor per GPU), on a real local cluster
    with one fake GPU. The real GPU actor finds no usable GPU here and says so: the job ends done,
    compiled and inspected, its run `skipped` with the reason, never passed."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False})
    try:
        s = serve("--ray-address", cluster.address)
        with ServiceClient(s.url) as c:
            health = c.health()
            assert health["gpus"] == ["ray GPU 0"] and "ray" in json.dumps(health["executor"]).lower()
            job = c.wait(c.submit("gemm", **{k: v for k, v in solution_body().items() if k != "task"}),
                         timeout_s=240, poll_s=0.5)
        assert job["status"] == "done", job
        result = job["result"]
        assert result["verdicts"]["compiled"] is True and result["verdicts"]["arch_sass"] is not None
        assert result["run_status"] == "skipped" and "nvidia-smi" in result["run_reason"]
        assert result["verdicts"]["correct"] is None  # nothing ran: never judged correct
    finally:
        ray.shutdown()
        cluster.shutdown()
