"""A stand-in GPU actor for the Ray executor's scheduler and fault tests (tests/test_ray_executor.py).

A fake GPU cannot run kernels, so StubGpuActor does what the real actor does without one:
Evaluator.evaluate on the compiled candidate it was sent (static manifest checks, run
skipped), after `gpu_s` of pretend GPU time. Everything around it is real: compile and
inspect in Ray CPU tasks, the object store, the pool, the agent's runs. It writes one line
per request to a log (begin, then end), so a test can count what each actor did, and it dies
(os._exit: a worker crash) while a countdown file says so.

Run as a script it is a sweep driver the tests can SIGKILL:
    python tests/ray_stubs.py SWEEP.toml --address ADDR --runs-dir DIR --log LOG [--gpu-s S]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


class StubGpuActor:
    def __init__(self, log: str, gpu_s: float = 0.0, die_file: str | None = None):
        import ray

        self._log, self._gpu_s, self._die_file = log, gpu_s, die_file
        self._node = ray.get_runtime_context().get_node_id()

    def describe(self):
        from agent.ray_evaluator import ActorInfo

        return ActorInfo.here("stub GPU", None)

    def evaluate(self, solution, task, arch, compiled, kwargs):
        from agent.ray_evaluator import without_cubin
        from tools.evaluator import Evaluator

        cubin = compiled[0].cubin or b""
        self._write(f"begin {self._node} {os.getpid()} {len(cubin)}")
        if self._should_die():
            os._exit(1)  # a worker crash, mid-request
        time.sleep(self._gpu_s)
        cpu_only = Evaluator(gpus=[])
        cpu_only.no_gpu_reason = "stub GPU: kernels are not run"
        res = cpu_only.evaluate(solution, task, arch, compiled=compiled, **kwargs)
        res.gpu, res.device = "stub GPU", self._node[:8]
        self._write(f"end {self._node} {os.getpid()} {len(cubin)}")
        return without_cubin(res)

    def close(self) -> None:
        pass

    def _write(self, line: str) -> None:
        with open(self._log, "a") as f:  # one short O_APPEND write per line: lines never interleave
            f.write(line + "\n")

    def _should_die(self) -> bool:
        """The countdown file holds how many more requests die; each death takes one."""
        if not self._die_file:
            return False
        try:
            fd = os.open(self._die_file + ".lock", os.O_CREAT | os.O_EXCL)  # one actor at a time
        except FileExistsError:
            return False
        try:
            p = Path(self._die_file)
            left = int(p.read_text() or 0) if p.exists() else 0
            if left > 0:
                p.write_text(str(left - 1))
            return left > 0
        finally:
            os.close(fd)
            os.unlink(self._die_file + ".lock")


def log_lines(log: Path, kind: str) -> list[list[str]]:
    """The log's `begin` or `end` lines, split: [kind, node_id, pid, cubin_bytes]."""
    if not log.exists():
        return []
    return [line.split() for line in log.read_text().splitlines() if line.startswith(kind + " ")]


def stub_stages(log: Path, gpu_s: float = 0.0, die_file: Path | None = None):
    from agent.ray_evaluator import RayStages

    return RayStages(gpu_actor=StubGpuActor, actor_args=(str(log), gpu_s, str(die_file) if die_file else None))


def _register_by_value() -> None:
    """Ray workers cannot import this file (tests/ is not a package on their path): ship the
    class itself, pickled by value."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--address", required=True)
    p.add_argument("--runs-dir", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--gpu-s", type=float, default=0.0)
    a = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agent.executors import RayExecutor
    from agent.sweep import load_sweep_config, run_sweep

    import ray

    _register_by_value()
    # Connected here, so the executor ships no packages: the cluster's workers share this
    # machine's install (the `agent sweep --address` test covers the shipping).
    ray.init(address=a.address, log_to_driver=False)
    cfg = load_sweep_config(a.config, runs_dir=a.runs_dir, executor="ray", ray_address=a.address)
    executor = RayExecutor(a.address, stages=stub_stages(Path(a.log), a.gpu_s), poll_s=0.2)
    try:
        result = run_sweep(cfg, executor)
    finally:
        executor.close()
    print(result.model_dump_json())


if __name__ == "__main__":
    main()
else:
    try:
        _register_by_value()
    except ImportError:  # no Ray: the tests that need it skip themselves
        pass
