"""The Ray executor on a real local Ray cluster (ray.cluster_utils.Cluster: one head with one
fake GPU, nodes added and removed as the tests need): compile + inspect as CPU tasks, the
cubin through the object store, GPU actors that die and are replaced, nodes that join and
are lost, a driver killed mid-sweep and resumed. Compile, inspect and the agent's runs are
real; the GPU actor is tests/ray_stubs.py's stand-in where a test needs to count or kill it
(a fake GPU cannot run kernels). One cluster for the module: starting one costs seconds.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from agent_loop_helpers import GEMM_TASK, PROBE_CU, PROBE_MANIFEST, BROKEN_LINE_TEXT, probe_reply  # noqa: E402
from ray_stubs import log_lines, stub_stages  # noqa: E402

from agent.executors import RayExecutor  # noqa: E402
from agent.trajectory import read_summary  # noqa: E402
from tools.solution import Solution  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.2  # the pool's supervisor: how soon a joined or lost node is noticed


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False})
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def probe(broken: bool = False) -> Solution:
    src = PROBE_CU.replace(BROKEN_LINE_TEXT, BROKEN_LINE_TEXT.replace("float d0", "flaot d0")) if broken else PROBE_CU
    return Solution(language="cuda", source=src, manifest=PROBE_MANIFEST)


def wait_for(what, timeout_s: float = 60.0, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"still not true after {timeout_s} s")


def test_compile_is_a_cpu_task_and_the_cubin_travels_to_the_gpu_actor(cluster, tmp_path, monkeypatch):
    from tools.evaluator import Evaluator

    def not_here(*a, **k):
        raise AssertionError("the driver compiled")

    monkeypatch.setattr(Evaluator, "compile_and_inspect", staticmethod(not_here))
    log = tmp_path / "gpu.log"
    ex = RayExecutor(stages=stub_stages(log), poll_s=POLL_S)
    try:
        ev = ex.evaluator()
        good = ev.evaluate(probe(), GEMM_TASK, "sm_90a", workloads="all")
        bad = ev.evaluate(probe(broken=True), GEMM_TASK, "sm_90a", workloads="all")
        stats = ex.stats()
    finally:
        ex.close()
    # Compiled and inspected elsewhere, with the SASS verdicts the local evaluator gives.
    assert good.compiled and good.arch_ok and good.device and good.run_reason.startswith("no GPU: stub GPU")
    assert good.compile.cubin is None  # it went to the actor; the driver does not get it back
    [(_, node, pid, cubin_bytes)] = log_lines(log, "end")
    assert int(pid) != os.getpid() and int(cubin_bytes) > 1000
    # A candidate that does not compile ends in its CPU task: no GPU actor is taken for it.
    assert bad.compile.status != "ok" and bad.run_reason == "did not compile"
    assert (stats.evaluations, stats.on_gpu, stats.retried) == (2, 1, 0)
    assert "ms/evaluation" in ex.describe()


def test_the_real_gpu_actor_on_a_fake_gpu_says_why_nothing_ran(cluster):
    ex = RayExecutor(poll_s=POLL_S)  # the real stages: GpuEvaluatorActor finds no usable GPU here
    try:
        ev = ex.evaluator()
        assert not ev.has_gpu and "nvidia-smi" in ev.no_gpu_reason
        res = ev.evaluate(probe(), GEMM_TASK, "sm_90a", workloads="visible")
    finally:
        ex.close()
    assert res.compiled and res.arch_ok and res.run_status == "skipped" and "nvidia-smi" in res.run_reason
    assert ex.stats().on_gpu == 1


def test_a_dying_gpu_actor_is_replaced_and_its_request_retried_once(cluster, tmp_path):
    log, die = tmp_path / "gpu.log", tmp_path / "die"
    ex = RayExecutor(stages=stub_stages(log, die_file=die), poll_s=POLL_S)
    try:
        ev = ex.evaluator()
        die.write_text("1")  # the next request kills its actor
        res = ev.evaluate(probe(), GEMM_TASK, "sm_90a")
        assert res.compiled and res.run_reason.startswith("no GPU: stub GPU")
        s = ex.stats()
        # Two attempts, on two actors (the only GPU went to the replacement); one evaluation.
        begins, ends = log_lines(log, "begin"), log_lines(log, "end")
        assert len(begins) == 2 and len(ends) == 1 and begins[0][2] != ends[0][2]
        assert (s.evaluations, s.retried, s.lost, s.pool.replaced) == (1, 1, 0, 1)

        die.write_text("2")  # the request and its retry both die: an infrastructure fault, never a verdict
        lost = ev.evaluate(probe(), GEMM_TASK, "sm_90a")
        assert "died 2 times" in lost.infra_error and lost.run_status == "skipped" and lost.compiled
        # ... and the pool recovers: the next request runs on a fresh actor.
        assert ev.evaluate(probe(), GEMM_TASK, "sm_90a").compiled
        s = ex.stats()
        assert (s.evaluations, s.retried, s.lost, s.pool.replaced) == (3, 2, 1, 3)
        assert len(log_lines(log, "end")) == 2
    finally:
        ex.close()


def test_a_joining_node_gets_work_and_a_lost_node_loses_none(cluster, tmp_path):
    log = tmp_path / "gpu.log"
    ex = RayExecutor(stages=stub_stages(log, gpu_s=0.5), poll_s=POLL_S)
    head = ray.get_runtime_context().get_node_id()
    results, errors, stop = [], [], threading.Event()

    def run_loop():  # a sweep's run thread, evaluating until told to stop
        while not stop.is_set():
            try:
                results.append(ex.evaluator().evaluate(probe(), GEMM_TASK, "sm_90a"))
            except Exception as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run_loop) for _ in range(3)]
    node = None
    try:
        for t in threads:
            t.start()
        wait_for(lambda: log_lines(log, "end"))
        node = cluster.add_node(num_cpus=1, num_gpus=1)  # joins mid-sweep
        wait_for(lambda: ex.stats().pool.live == 2)
        new = lambda kind: [x for x in log_lines(log, kind) if x[1] != head]  # noqa: E731
        wait_for(lambda: new("end"))  # it got work
        # Lose the node while its actor is in the middle of a request.
        wait_for(lambda: len(new("begin")) > len(new("end")), every_s=0.01)
        cluster.remove_node(node)
        node = None
        wait_for(lambda: ex.stats().retried >= 1)
        done = len(results)
        wait_for(lambda: len(results) >= done + 3)  # the head's actor carries on alone
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        s = ex.stats()
        if node is not None:
            cluster.remove_node(node)
        ex.close()
    assert not errors, errors
    begins, ends = log_lines(log, "begin"), log_lines(log, "end")
    # Every request answered exactly once; the request cut off with the node was run again.
    assert s.evaluations == len(results) == len(ends)
    assert len(begins) == len(ends) + s.retried and s.retried >= 1 and s.lost == 0
    assert s.pool.replaced >= 1 and s.pool.live == 1  # the replacement waits for a free GPU
    assert all(r.compiled for r in results)


SWEEP = """\
name = "faults"
models = [{spec = "scripted:probe.json", name = "probe"}]
tasks = ["gemm"]
contexts = ["none", "docs"]
replicas = 2
concurrency = 2

[budget]
max_turns = 2
"""


def test_a_killed_driver_resumes_without_evaluating_anything_twice(cluster, tmp_path):
    (tmp_path / "probe.json").write_text(json.dumps({"replies": [probe_reply(), probe_reply()]}))
    (tmp_path / "sweep.toml").write_text(SWEEP)
    runs = tmp_path / "runs"
    candidates = 4 * 2  # 4 runs x 2 turns, every candidate compiles and goes to the GPU actor

    def driver(log: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "ray_stubs.py"), str(tmp_path / "sweep.toml"),
             "--address", cluster.address, "--runs-dir", str(runs), "--log", str(log), "--gpu-s", "0.3"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = driver(tmp_path / "first.log")
    try:
        wait_for(lambda: len(log_lines(tmp_path / "first.log", "end")) >= 3 or first.poll() is not None, 240)
        assert first.poll() is None, first.communicate()[1][-3000:]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    recorded = sorted(runs.glob("faults/**/eval.json"))
    assert 0 < len(recorded) < candidates
    second = driver(tmp_path / "second.log")
    out, err = second.communicate(timeout=240)
    assert second.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["total"], result["failed"]) == (4, 0)
    # Nothing evaluated twice: the second driver evaluated exactly what the first had not recorded.
    assert len(log_lines(tmp_path / "second.log", "end")) == candidates - len(recorded)
    # Nothing lost: every run finished with both candidates judged.
    for run_id in json.loads((runs / "faults" / "sweep.json").read_text())["runs"]:
        s = read_summary(runs / run_id)
        assert s.status == "finished" and [c.outcome for t in s.per_turn for c in t.candidates] == \
            ["unverified", "unverified"], run_id
    assert len(sorted(runs.glob("faults/**/eval.json"))) == candidates


def test_agent_sweep_on_an_existing_cluster_by_address(cluster, tmp_path):
    (tmp_path / "probe.json").write_text(json.dumps({"replies": [probe_reply()]}))
    (tmp_path / "sweep.toml").write_text(SWEEP.replace("max_turns = 2", "max_turns = 1")
                                         .replace('["none", "docs"]', '["none"]').replace("replicas = 2", "replicas = 1"))
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "sweep.toml", "--executor", "ray",
                           "--address", cluster.address, "--json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert (result["total"], result["ran"], result["failed"]) == (1, 1, 0)
    assert result["executor"].startswith("ray: 1 GPU evaluator actor(s)") and "ms/evaluation" in result["executor"]
    [o] = result["outcomes"]
    assert [v["outcome"] for v in o["verdicts"]] == ["unverified"] and "nvidia-smi" in o["evaluation"]
