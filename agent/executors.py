"""Where a sweep's evaluations run: one evaluator per GPU, requests queued per GPU.

A sweep's runs live in threads of the driver process (their LLM calls are I/O). Every
candidate's evaluation goes through `executor.evaluator()`, one SharedEvaluator that all
runs hold; GPU work waits for a free GPU whatever the number of runs in flight.

  local  one tools.evaluator.Evaluator, which owns one worker subprocess per local GPU and
         queues requests per GPU; compile + inspect run in the caller's thread. Without a
         GPU: compile + inspect only (each EvalResult says run skipped, and why).
  ray    one evaluator actor per GPU of a Ray cluster (an existing one by address, or a
         local one started with ray.init()); compile + inspect run in the driver's run
         threads, then each request goes to the next free actor. On
         a cluster without GPUs, one actor per CPU doing compile + inspect. Needs the
         optional extra: pip install -e '.[ray]'.

Both run the same agent code and the same evaluator code, so a sweep gives the same
per-run verdicts on either.
"""
from __future__ import annotations

import os
import queue
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

    def evaluate(self, solution, task, arch, **kwargs):
        return self._evaluate(solution, task, arch, **kwargs)

    def close(self) -> None:
        pass


def _gpu_name(evaluator) -> str | None:
    """The GPU's name from a tools.evaluator.Evaluator (starts its first worker); None without a GPU."""
    if not evaluator.has_gpu:
        return None
    info = evaluator.gpu_info() or {}
    return str(info.get("name") or info.get("gpu") or "GPU")


class LocalExecutor:
    """One tools.evaluator.Evaluator for the sweep: it owns one worker per local GPU and
    queues GPU requests per GPU itself; compile + inspect run in the calling run's thread,
    so they go on in parallel. Without a GPU it compiles and inspects only."""

    def __init__(self):
        from tools.evaluator import Evaluator, detect_gpus

        gpus, reason = detect_gpus()  # nvidia-smi: this process creates no CUDA context
        self._evaluator = Evaluator(gpus=gpus or None)  # None: it says itself why there is no GPU
        self._what = (f"local: {len(gpus)} GPU worker(s)" if gpus
                      else f"local: no GPU ({reason}); compile + inspect only")
        self._shared = SharedEvaluator(self._evaluator.evaluate, _gpu_name(self._evaluator), reason)

    def evaluator(self) -> SharedEvaluator:
        return self._shared

    def describe(self) -> str:
        return self._what

    def close(self) -> None:
        self._evaluator.close()


# ---------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------
class _EvaluatorActor:
    """One Evaluator inside a Ray actor. Ray pins a GPU actor to its GPU (CUDA_VISIBLE_DEVICES),
    so the Evaluator's GPU discovery finds exactly that one."""

    def __init__(self):
        from tools.evaluator import Evaluator

        self._evaluator = Evaluator()

    def describe(self) -> tuple[str | None, str | None]:
        return _gpu_name(self._evaluator), getattr(self._evaluator, "no_gpu_reason", None)

    def evaluate(self, solution, task, arch, **kwargs):
        return self._evaluator.evaluate(solution, task, arch, **kwargs)

    def close(self) -> None:
        self._evaluator.close()


def _code_dirs() -> list[str]:
    """The packages an actor on another machine imports: this module (the actor class), tools,
    and what tools imports (tasks, knowledge). Nothing here needs litellm or langgraph."""
    import agent
    import knowledge
    import tasks
    import tools

    return [str(Path(m.__file__).parent) for m in (agent, tools, tasks, knowledge)]


class RayExecutor:
    """One evaluator actor per GPU of the cluster (per CPU when it has none); each call goes
    to the next free actor, so GPU work is queued per GPU."""

    def __init__(self, address: str | None = None, cpu_actors: int | None = None):
        try:
            import ray
        except ImportError:
            raise RuntimeError("executor 'ray' needs the optional extra: pip install -e '.[ray]'") from None
        self._started = not ray.is_initialized()
        if self._started:
            if address:  # an existing cluster: ship our packages to its workers
                ray.init(address=address, runtime_env={"py_modules": _code_dirs()}, log_to_driver=False)
            else:
                ray.init(num_cpus=max(1, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        actor = ray.remote(_EvaluatorActor)
        if gpus:
            self._actors = [actor.options(num_gpus=1, num_cpus=1).remote() for _ in range(gpus)]
            self._what = f"ray: {gpus} GPU evaluator actor(s)"
        else:
            n = cpu_actors or max(1, int(resources.get("CPU", 1)))
            self._actors = [actor.options(num_cpus=1).remote() for _ in range(n)]
            self._what = f"ray: {n} CPU evaluator actor(s), no GPU; compile + inspect only"
        self._free: queue.Queue = queue.Queue()
        for a in self._actors:
            self._free.put(a)
        gpu, reason = ray.get(self._actors[0].describe.remote())
        self._shared = SharedEvaluator(self._evaluate, gpu, reason)

    def _evaluate(self, solution, task, arch, **kwargs):
        import ray

        from tools.evaluator import Evaluator

        # Compile and inspect here, in the run's own thread, in parallel with other runs; the
        # actor (a GPU) is taken only for the GPU work.
        kwargs.setdefault("compiled", Evaluator.compile_and_inspect(solution, arch))
        actor = self._free.get()  # blocks while every actor (GPU) is busy: the per-GPU queue
        try:
            return ray.get(actor.evaluate.remote(solution, task, arch, **kwargs))
        finally:
            self._free.put(actor)

    def evaluator(self) -> SharedEvaluator:
        return self._shared

    def describe(self) -> str:
        return self._what

    def close(self) -> None:
        import ray

        for a in self._actors:
            try:
                ray.get(a.close.remote())
            except Exception:  # an actor that died already has nothing to close
                pass
            ray.kill(a)
        if self._started:
            ray.shutdown()


def make_executor(config) -> Executor:
    """From a SweepConfig: its `executor` ("local" | "ray") and `ray_address`."""
    if config.executor == "ray":
        return RayExecutor(config.ray_address)
    return LocalExecutor()
