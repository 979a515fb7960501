"""Where a sweep's evaluations run: one evaluator per GPU, requests queued per GPU.

A sweep's runs live in threads of the driver process (their LLM calls are I/O). Every
candidate's evaluation goes through `executor.evaluator()`, one SharedEvaluator that all
runs hold; GPU work waits for a free GPU whatever the number of runs in flight.

  local  one tools.evaluator.Evaluator, which owns one worker subprocess per local GPU and
         queues requests per GPU; compile + inspect run in the caller's thread. Without a
         GPU: compile + inspect only (each EvalResult says run skipped, and why). GPUs of one
         kind only (one_gpu_kind): the runs record one GPU.
  ray    a Ray cluster (an existing one by address, or a local one started with ray.init()):
         compile + inspect as Ray CPU tasks anywhere in the cluster, then each request goes
         to the next free GPU actor (one per GPU), which only runs kernels; dead actors are
         replaced, nodes that join get actors (agent/ray_evaluator.py). On a cluster without
         GPUs the CPU tasks do compile + inspect only. Needs the optional extra:
         pip install -e '.[ray]'.

Both run the same agent code and the same evaluator code, so a sweep gives the same
per-run verdicts on either.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Protocol


class Executor(Protocol):
    def evaluator(self) -> "SharedEvaluator": ...
    def describe(self) -> str: ...
    def close(self) -> None: ...


class SharedEvaluator:
    """What every run of a sweep is handed: looks like one Evaluator, outlives the runs.

    `evaluate` does the work (on the local Evaluator, or on the next free Ray actor).
    close() is a no-op: the executor shuts the real evaluators down after the sweep.
    """

    def __init__(self, evaluate: Callable, gpu: str | None, no_gpu_reason: str | None):
        self._evaluate = evaluate
        self.gpu = gpu  # GPU name recorded in each run's config (None: no GPU)
        self.no_gpu_reason = no_gpu_reason

    @property
    def has_gpu(self) -> bool:
        return self.gpu is not None

    def gpu_name(self) -> str | None:
        return self.gpu

    def evaluate(self, solution, task, arch, **kwargs):
        return self._evaluate(solution, task, arch, **kwargs)

    def close(self) -> None:
        pass


def one_gpu_kind(gpus: list[str], arches: list[str]) -> tuple[list[str], list[str]]:
    """Of the local GPUs `gpus` (detect_gpus ids), those of one kind (nvidia-smi's name), and the names
    of the others, left idle. A sweep's runs record one GPU and every verdict and speedup is filed under
    it, while each evaluation goes to whichever GPU worker is free: on a machine with two kinds (an H100
    beside a display card, or beside an H200) a run's candidates would be judged on both. The kind: the
    first GPU's that runs one of the sweep's arches, else the first GPU's. Where nvidia-smi cannot say,
    all of them, as before."""
    from tools.evaluator import ARCH_CC

    smi = shutil.which("nvidia-smi")
    if len(gpus) < 2 or smi is None:
        return gpus, []
    try:
        proc = subprocess.run([smi, "--query-gpu=index,uuid,name,compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return gpus, []
    rows = [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.count(",") >= 3]
    # an id is an index or (a prefix of) a UUID, as CUDA_VISIBLE_DEVICES gives it (detect_gpus)
    kind = {g: next(((r[2], r[3]) for r in rows if r[0] == g or r[1].startswith(g)), None) for g in gpus}
    if proc.returncode != 0 or None in kind.values():
        return gpus, []
    wanted = {ARCH_CC[a] for a in arches if a in ARCH_CC}
    first = next((g for g in gpus if kind[g][1] in wanted), gpus[0])
    keep = [g for g in gpus if kind[g][0] == kind[first][0]]
    return keep, [kind[g][0] for g in gpus if g not in keep]


class LocalExecutor:
    """One tools.evaluator.Evaluator for the sweep: it owns one worker per local GPU and
    queues GPU requests per GPU itself; compile + inspect run in the calling run's thread,
    so they go on in parallel. Without a GPU it compiles and inspects only. `arches`: the
    sweep's, which choose the GPU kind on a machine with several (one_gpu_kind)."""

    def __init__(self, arches: list[str] | None = None):
        from tools.evaluator import Evaluator, detect_gpus

        gpus, reason = detect_gpus()  # nvidia-smi: this process creates no CUDA context
        gpus, idle = one_gpu_kind(gpus, list(arches or []))
        self._evaluator = Evaluator(gpus=gpus or None)  # None: it says itself why there is no GPU
        self._what = (f"local: {len(gpus)} GPU worker(s)" if gpus
                      else f"local: no GPU ({reason}); compile + inspect only")
        if idle:  # the runs record one GPU: the others would judge candidates under its name
            self._what += f"; {len(idle)} GPU(s) of another kind left idle ({', '.join(sorted(set(idle)))})"
        self._shared = SharedEvaluator(self._evaluator.evaluate, self._evaluator.gpu_name(), reason)

    def evaluator(self) -> SharedEvaluator:
        return self._shared

    def describe(self) -> str:
        return self._what

    def close(self) -> None:
        self._evaluator.close()


# ---------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------
def _code_dirs() -> list[str]:
    """The packages a worker on another machine imports: agent (the actor and task code), tools,
    and what tools imports (tasks, knowledge). Nothing here needs litellm or langgraph."""
    import agent
    import knowledge
    import tasks
    import tools

    return [str(Path(m.__file__).parent) for m in (agent, tools, tasks, knowledge)]


class RayExecutor:
    """Evaluations spread over a Ray cluster (agent/ray_evaluator.py): compile + inspect as CPU
    tasks anywhere, one GPU actor per GPU for the kernels, dead actors replaced, new nodes used.

    `address`: an existing cluster ("auto", "ray://host:10001", "host:6379"); None starts a
    local one. `stages`: stubs for tests and the scaling simulation. `gpu_actor_cpus`: CPUs
    each GPU actor reserves; None: 1 where the cluster has at least two CPUs per GPU (the
    actor's host work then never competes with compiles), else 0 (so compiles still run)."""

    def __init__(self, address: str | None = None, *, stages=None, gpu_actor_cpus: float | None = None,
                 poll_s: float = 1.0, ready_timeout_s: float = 900.0):
        try:
            import ray
        except ImportError:
            raise RuntimeError("executor 'ray' needs the optional extra: pip install -e '.[ray]'") from None
        from agent.ray_evaluator import ClusterEvaluator

        self._started = not ray.is_initialized()
        if self._started:
            if address:  # an existing cluster: ship our packages to its workers
                ray.init(address=address, runtime_env={"py_modules": _code_dirs()}, log_to_driver=False)
            else:
                # "local": a new instance even when another Ray runs on this machine (never join it unasked)
                ray.init(address="local", num_cpus=max(1, os.cpu_count() or 1), include_dashboard=False,
                         log_to_driver=False)
        self._cpu0, self._cpu_end = time.process_time(), None  # the driver's CPU over the executor's life
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        if gpu_actor_cpus is None:
            gpu_actor_cpus = 1.0 if cpus >= 2 * gpus else 0.0
        self._cluster = ClusterEvaluator(stages, actor_cpus=gpu_actor_cpus, poll_s=poll_s)
        if gpus:
            # The first actor's GPU names the sweep's GPU; the others join as they come up.
            infos = self._cluster.pool.wait_live(1, ready_timeout_s)
            if not infos:
                self.close()
                raise RuntimeError(f"no GPU actor came up within {ready_timeout_s:.0f} s on a cluster with {gpus} "
                                   f"GPU(s): {self._cluster.pool.last_error or 'no GPU free for it?'}")
            gpu, reason = infos[0].gpu, infos[0].no_gpu_reason
            self._what = f"ray: {gpus} GPU evaluator actor(s), compile + inspect as CPU tasks ({cpus} CPUs)"
        else:
            gpu, reason = None, self._cluster.no_gpu_reason
            self._what = f"ray: no GPU in the cluster ({cpus} CPUs); compile + inspect only, as CPU tasks"
        self._shared = SharedEvaluator(self._cluster.evaluate, gpu, reason)

    def evaluator(self) -> SharedEvaluator:
        return self._shared

    def driver_cpu_s(self) -> float:
        """CPU this process spent from the executor's start to its close (or now): every thread,
        the runs' own work and Ray's client included."""
        return (self._cpu_end if self._cpu_end is not None else time.process_time()) - self._cpu0

    def describe(self) -> str:
        s = self._cluster.stats()
        what = self._what
        if s.pool.other_gpu:  # the runs record one GPU: actors on another are left idle
            what += (f"; {s.pool.other_gpu} actor(s) on another GPU ({', '.join(s.pool.other_gpus)}) left idle: "
                     f"the runs are judged on {self._shared.gpu}")
        if not s.evaluations:
            return what
        per_eval = 1000.0 / s.evaluations
        return (f"{what}; {s.evaluations} evaluations, driver CPU {self.driver_cpu_s() * per_eval:.1f} "
                f"ms/evaluation (executor bookkeeping {s.bookkeeping_cpu_s * per_eval:.1f} ms), "
                f"{s.retried} retried, {s.pool.replaced} GPU actors replaced")

    def stats(self):
        """agent.ray_evaluator.DriverStats: evaluations, retries, bookkeeping CPU, the pool."""
        return self._cluster.stats()

    def close(self) -> None:
        import ray

        if self._cpu_end is not None:
            return
        self._cpu_end = time.process_time()  # describe() after the sweep reports up to here
        self._cluster.close()
        if self._started:
            ray.shutdown()


def make_executor(config) -> Executor:
    """From a SweepConfig: its `executor` ("local" | "ray") and `ray_address`."""
    if config.executor == "ray":
        return RayExecutor(config.ray_address)
    return LocalExecutor(config.arches)
