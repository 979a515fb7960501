"""Audit 6: the Ray executor on a cluster whose nodes differ (a real local Ray cluster; the GPU actor is
a stand-in, as in tests/test_ray_executor.py, since a fake GPU cannot run kernels).

1. GPUs of two kinds (an H100 node and an H200 node): every run records the first actor's GPU
   (config.gpu, what `agent report` files its verdicts and speedups under), yet each evaluation went
   to whichever actor was free, so about half of a run's candidates were judged and timed on the other
   GPU, against that GPU's library. A sweep's evaluations now go only to actors on the GPU its runs
   record; actors on another kind are held idle (so no actor is started in their place) and the
   executor's description says so.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from agent_loop_helpers import GEMM_TASK, PROBE_CU, PROBE_MANIFEST  # noqa: E402
from ray_stubs import StubGpuActor  # noqa: E402

from agent.executors import RayExecutor  # noqa: E402
from agent.ray_evaluator import ActorInfo, RayStages  # noqa: E402
from tools.solution import Solution  # noqa: E402

POLL_S = 0.2


class KindStubActor(StubGpuActor):
    """The stand-in GPU actor, naming its GPU after its node: `stub H100` on a node with the custom
    resource stub_h100, `stub H200` elsewhere."""

    def __init__(self, log: str):
        super().__init__(log)
        node = next(n for n in ray.nodes() if n["NodeID"] == self._node)
        self._gpu = "stub H100" if "stub_h100" in node.get("Resources", {}) else "stub H200"

    def describe(self):
        return ActorInfo.here(self._gpu, None)

    def evaluate(self, solution, task, arch, compiled, kwargs):
        res = super().evaluate(solution, task, arch, compiled, kwargs)
        res.gpu = self._gpu
        return res


@pytest.fixture(scope="module")
def two_kinds():
    """A head with one `H200` and a node with one `H100`."""
    from ray.cluster_utils import Cluster

    import ray.cloudpickle

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1, num_gpus=1, resources={"stub_h100": 1})
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def _wait_for(what, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(0.1)
    raise AssertionError(f"still not true after {timeout_s} s")


def test_a_sweep_is_judged_on_the_one_gpu_its_runs_record(two_kinds, tmp_path):
    ex = RayExecutor(stages=RayStages(gpu_actor=KindStubActor, actor_args=(str(tmp_path / "gpu.log"),)),
                     poll_s=POLL_S)
    try:
        # both actors up (one on each GPU), none still starting
        _wait_for(lambda: (s := ex.stats().pool).started >= 2 and s.pending == 0)
        ev = ex.evaluator()
        assert ev.gpu in ("stub H100", "stub H200")
        probe = Solution(language="cuda", source=PROBE_CU, manifest=PROBE_MANIFEST)
        gpus = [ev.evaluate(probe, GEMM_TASK, "sm_90a").gpu for _ in range(4)]
        assert gpus == [ev.gpu] * 4, (ev.gpu, gpus)
        time.sleep(5 * POLL_S)  # the other GPU's actor is held, not replaced again and again
        s = ex.stats()
        assert (s.pool.started, s.pool.live, s.pool.other_gpu, s.pool.replaced) == (2, 1, 1, 0), s
        other = "stub H100" if ev.gpu == "stub H200" else "stub H200"
        assert other in ex.describe() and "idle" in ex.describe(), ex.describe()
    finally:
        ex.close()


# ---- 2. GPU actors lost are an infrastructure fault, as a local worker's is -----------------------
def test_a_run_whose_gpu_actors_all_died_stops_as_an_infrastructure_fault(two_kinds, tmp_path):
    """A request whose actor and its retry's actor both die: the local executor's worker failing on its own
    stops the run with infra_error (resumed by the next sweep, exit 3); on Ray the same fault stopped it as
    a ptxbench error (status failed, stop_reason error): the next sweep skipped it as done, its cell lost a
    replica in `agent report` unless --retry-failed, and the sweep said 0 infrastructure errors."""
    from agent_loop_helpers import probe_reply, write_script
    from ray_stubs import stub_stages

    from agent.sweep import load_sweep_config, run_state, run_sweep
    from agent.trajectory import read_summary

    write_script(tmp_path / "m.json", [probe_reply()])
    (tmp_path / "sweep.toml").write_text(
        'name = "lost"\nmodels = [{spec = "scripted:m.json", name = "m"}]\ntasks = ["gemm"]\ncontexts = ["none"]\n'
        'concurrency = 1\nexecuted_check = false\n[budget]\nmax_turns = 1\n')
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"), executor="ray")
    die = tmp_path / "die"
    die.write_text("2")  # the request and its retry both kill their actor
    ex = RayExecutor(stages=stub_stages(tmp_path / "gpu.log", die_file=die), poll_s=POLL_S)
    try:
        first = run_sweep(cfg, ex)
        [o] = first.outcomes
        run_dir = tmp_path / "runs" / o.run_id
        summary = read_summary(run_dir)
        assert (summary.status, summary.stop_reason) == ("failed", "infra_error"), summary.stop_detail
        assert first.infra_errors == 1 and "died 2 times" in summary.stop_detail
        assert not list(run_dir.glob("candidates/*/eval.json"))  # no verdict drawn
        assert run_state(run_dir) == "partial"
        again = run_sweep(cfg, ex)  # the actors are back: the same sweep resumes it, no --retry-failed
        assert (again.resumed, again.infra_errors) == (1, 0)
        assert read_summary(run_dir).status == "finished" and read_summary(run_dir).stop_reason == "max_turns"
    finally:
        ex.close()


# ---- 3. a node that compiles with another toolchain draws no verdict ------------------------------
def other_ptxas_prepare(solution, task, arch, kwargs, no_gpu_reason):
    """The real compile + inspect task, on a node whose ptxas is another release than the driver's."""
    from agent.ray_evaluator import prepare

    done, payload = prepare(solution, task, arch, kwargs, no_gpu_reason)
    comp = payload.compile if done else payload[0]
    comp.toolchain = {**comp.toolchain, "ptxas": "12.0.76"}
    return done, payload


def test_a_candidate_compiled_by_another_ptxas_than_the_runs_record_draws_no_verdict(two_kinds, tmp_path):
    """Compile tasks run on any node. A run records the driver's compilers (config.tool_versions: a resume
    under another ptxas is refused, since ptxas writes the machine code that is judged); a node with
    another ptxas judged the run's candidates all the same (compile errors, registers, spills, the
    instructions in the SASS), under the recorded version. Such a candidate now gets no verdict
    (infra_error: fix the node, then resume), and takes no GPU."""
    from ray_stubs import StubGpuActor

    stages = RayStages(prepare=other_ptxas_prepare, gpu_actor=StubGpuActor, actor_args=(str(tmp_path / "gpu.log"),))
    ex = RayExecutor(stages=stages, poll_s=POLL_S)
    try:
        ev = ex.evaluator()
        good = ev.evaluate(Solution(language="cuda", source=PROBE_CU, manifest=PROBE_MANIFEST), GEMM_TASK, "sm_90a")
        broken = ev.evaluate(Solution(language="cuda", source=PROBE_CU.replace("float d0", "flaot d0"),
                                      manifest=PROBE_MANIFEST), GEMM_TASK, "sm_90a")
        stats = ex.stats()
    finally:
        ex.close()
    for res in (good, broken):
        assert res.infra_error and "ptxas 12.0.76" in res.infra_error, res.infra_error
    assert stats.on_gpu == 0
