"""Evaluations on a Ray cluster: compile + inspect on any CPU, kernels on GPU actors.

One candidate's way through the cluster, with the driver only submitting and waiting:

    prepare           a Ray CPU task (num_cpus=1), anywhere: NVRTC + ptxas + SASS inspection
                      (Evaluator.compile_and_inspect). Its result, cubin included, stays in
                      Ray's object store; the driver fetches only a one-bit "done?" flag.
    GpuEvaluatorActor one per GPU (num_gpus=1): Evaluator.evaluate(..., compiled=<that object>),
                      i.e. correctness and timing only. Ray moves the cubin to the actor's node.
    GpuActorPool      which actors are free; replaces dead ones; grows when nodes join; hands out
                      only actors on the GPU the sweep's runs record (the first actor's).
    ClusterEvaluator  what a run calls: prepare -> the next free actor -> EvalResult.

Faults, and what each costs:
- a GPU actor dies while running a request (worker crash, node lost): the pool drops it and
  starts a replacement (placed when a GPU is free); the request is retried once on another
  actor. Only the retry's result comes back, so nothing is counted twice; a request whose
  retry dies too comes back with `harness_fault` set (no verdict), as a local GPU worker
  failing on its own does: the run stops with infra_error and the next `agent sweep`
  resumes it (evaluate() of ClusterEvaluator; _on_gpu raises GpuActorsLost).
- a node is lost while its actors are idle: the pool's supervisor sees the node gone
  (ray.nodes(), every poll_s) and replaces them before a request can pick one.
- a node joins: the supervisor sees more GPUs than actors and starts actors on them.
- a GPU of another kind (an H100 node in a sweep judged on H200s): every run records one GPU
  (the first actor's), and what `agent report` files its speedups under must be what measured
  them, so that actor is held idle (its GPU taken, no actor started in its place) and never
  given a request; the executor's description names it.
- the driver is killed: nothing here survives it and nothing needs to; each run's folder
  keeps every finished evaluation (eval.json), which a resumed run reuses (agent/nodes.py).
- a node running a prepare task is lost: Ray re-runs the task (tasks retry by default).
- a node whose compilers (NVRTC, ptxas) are other releases than the driver's: a run records the
  driver's (config.tool_versions) and ptxas writes the machine code that is judged, so a
  candidate compiled there gets no verdict (infra_error: install the driver's toolchain on that
  node, then resume) and takes no GPU (checked_prepare).

Tests and the scaling simulation (agent/ray_sim.py) swap the stages for stubs through
RayStages: a fake GPU cannot run kernels, and a simulated compile should cost a fixed time.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tools.results import EvalResult


class GpuActorsLost(RuntimeError):
    """A request's GPU actor died, and so did the one its retry went to."""


@dataclass(frozen=True)
class ActorInfo:
    """What a GPU actor says about itself once it is up."""

    gpu: str | None  # the GPU's name; None: the actor found no GPU it can use
    no_gpu_reason: str | None
    node_id: str  # the Ray node it lives on, to notice when that node is lost

    @staticmethod
    def here(gpu: str | None, no_gpu_reason: str | None) -> "ActorInfo":
        import ray

        return ActorInfo(gpu, no_gpu_reason, ray.get_runtime_context().get_node_id())


def without_cubin(res: EvalResult) -> EvalResult:
    """The cubin went to the GPU through the object store; the driver never needs it back."""
    if res.compile.cubin is not None:
        res.compile = res.compile.model_copy(update={"cubin": None})
    return res


# ---------------------------------------------------------------------------------------
# The real stages
# ---------------------------------------------------------------------------------------
Prepared = tuple[bool, Any]  # (True, EvalResult): that is the whole verdict; (False, compiled): GPU next


def without_gpu(solution, task, arch: str, compiled, kwargs: dict, why: str) -> EvalResult:
    """The verdict of a compiled candidate that gets no GPU, saying `why`: the evaluator still runs
    the static manifest checks."""
    from tools.evaluator import Evaluator

    cpu_only = Evaluator(gpus=[])
    cpu_only.no_gpu_reason = why
    return without_cubin(cpu_only.evaluate(solution, task, arch, compiled=compiled, **kwargs))


def prepare(solution, task, arch: str, kwargs: dict, no_gpu_reason: str | None) -> Prepared:
    """Compile + inspect, as a Ray CPU task. When that is the whole verdict (it did not compile,
    or the cluster has no GPU), finish it here, so no GPU actor is taken for it."""
    from tools.evaluator import Evaluator

    compiled = Evaluator.compile_and_inspect(solution, arch)
    if compiled[0].ok and no_gpu_reason is None:
        return False, compiled
    # which GPU it would have had does not matter for a candidate that did not compile
    why = no_gpu_reason or "no GPU needed: it did not compile"
    return True, without_gpu(solution, task, arch, compiled, kwargs, why)


def checked_prepare(stage: tuple[Callable[..., Prepared], dict[str, str]], solution, task, arch: str, kwargs: dict,
                    no_gpu_reason: str | None) -> Prepared:
    """`stage` = (the prepare stage, the compilers the sweep's runs record: the driver's). The stage runs
    here, on any node; a candidate it compiled with other compiler releases is no verdict of the run's
    (agent.run.toolchain_change refuses a resume under another ptxas for the same reason)."""
    prepare_stage, compilers = stage
    done, payload = prepare_stage(solution, task, arch, kwargs, no_gpu_reason)
    comp, insp = (payload.compile, payload.inspect) if done else payload
    differ = [n for n, v in compilers.items() if comp.toolchain.get(n) not in (None, v)]
    if not differ:
        return done, payload
    why = (f"this Ray node compiled with {', '.join(f'{n} {comp.toolchain[n]}' for n in differ)}; the sweep's runs "
           f"record {', '.join(f'{n} {compilers[n]}' for n in differ)} (the driver's): install those on every node "
           f"(agent doctor lists them), then run the sweep again")
    compiled = (comp.model_copy(update={"infra_error": why, "cubin": None}), insp)
    return True, without_gpu(solution, task, arch, compiled, kwargs, why)


class GpuEvaluatorActor:
    """One Evaluator per GPU. Ray pins the actor to its GPU (CUDA_VISIBLE_DEVICES), so the
    Evaluator's discovery finds exactly that one; its worker subprocess runs the kernels."""

    def __init__(self):
        from tools.evaluator import Evaluator

        self._evaluator = Evaluator()

    def describe(self) -> ActorInfo:
        # Starts the GPU worker (torch, CUDA context): the first request then finds it warm.

        return ActorInfo.here(self._evaluator.gpu_name(), self._evaluator.no_gpu_reason)

    def evaluate(self, solution, task, arch: str, compiled, kwargs: dict) -> EvalResult:
        return without_cubin(self._evaluator.evaluate(solution, task, arch, compiled=compiled, **kwargs))

    def close(self) -> None:
        self._evaluator.close()


@dataclass(frozen=True)
class RayStages:
    """What runs where. `prepare` becomes a Ray task, `gpu_actor` an actor class (with
    describe() -> ActorInfo, evaluate(solution, task, arch, compiled, kwargs), close())."""

    prepare: Callable[..., Prepared] = prepare
    gpu_actor: type = GpuEvaluatorActor
    actor_args: tuple = ()
    prepare_cpus: float = 1.0  # a compile is one ptxas/cuobjdump process at a time


# ---------------------------------------------------------------------------------------
# GPU actors
# ---------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Slot:
    """One GPU actor as the pool sees it."""

    handle: Any
    ready_ref: Any
    info: ActorInfo | None = None
    alive: bool = True


@dataclass
class PoolStats:
    live: int = 0  # actors up and usable
    pending: int = 0  # started, waiting for a GPU or still starting
    started: int = 0
    replaced: int = 0  # died (or their node was lost) and replaced
    start_failures: int = 0
    other_gpu: int = 0  # up on a GPU of another kind than the sweep's: held idle, never handed a request
    other_gpus: list[str] = field(default_factory=list)  # those GPUs' names


class GpuActorPool:
    """One actor per GPU of the cluster, handed out one request at a time.

    A supervisor thread collects actors as they come up, compares the cluster's live GPUs
    with the actors it has (live + pending) every poll_s and starts the difference, and drops
    the actors of nodes that are gone. Actors are never restarted by Ray itself: a replacement
    is a new actor, so a request is never silently re-run on the same one.

    The sweep's runs record one GPU (`gpu`: the first actor's to come up) and their verdicts and
    speedups are filed under it: an actor that comes up on another GPU is held in `_other`, alive
    (its GPU counts as covered, so none is started in its place) and never handed out."""

    def __init__(self, stages: RayStages, *, actor_cpus: float, poll_s: float = 1.0, max_start_failures: int = 3):
        import ray

        # No task events: the GCS (one process for the whole cluster) would record every call;
        # without them its CPU per evaluation drops threefold (measured with agent/ray_sim.py).
        self._remote = ray.remote(stages.gpu_actor).options(
            num_gpus=1, num_cpus=actor_cpus, max_restarts=0, max_task_retries=0, enable_task_events=False)
        self._args = stages.actor_args
        self._poll_s = poll_s
        self._max_start_failures = max_start_failures
        self._lock = threading.Lock()
        self._live: list[_Slot] = []
        self._pending: list[_Slot] = []
        self._other: list[_Slot] = []  # up on another GPU than `gpu`: held idle
        self.gpu: str | None = None  # the GPU the sweep is judged on, once the first actor is up
        self._gpu_known = False
        self._free: queue.Queue[_Slot] = queue.Queue()
        self._became_live = threading.Condition(self._lock)
        self.stats = PoolStats()
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._reconcile()
        self._thread = threading.Thread(target=self._supervise, name="ray-gpu-pool", daemon=True)
        self._thread.start()

    # -- what ClusterEvaluator uses
    def acquire(self) -> _Slot:
        """The next free live actor; waits while all are busy (the per-GPU queue)."""
        while True:
            if self._broken():
                raise GpuActorsLost(f"no GPU actor could be started: {self.last_error}")
            try:
                slot = self._free.get(timeout=self._poll_s)
            except queue.Empty:
                continue
            if slot.alive:  # a slot dropped while it sat in the queue is skipped
                return slot

    def release(self, slot: _Slot) -> None:
        if slot.alive:
            self._free.put(slot)

    def lost(self, slot: _Slot, why: str) -> None:
        """The actor died or its node is gone: drop it and start a replacement."""
        import ray

        with self._lock:
            if not slot.alive:
                return  # already replaced (the supervisor and a run thread can both notice)
            slot.alive = False
            if slot in self._live:
                self._live.remove(slot)
            if slot in self._pending:
                self._pending.remove(slot)
            if slot in self._other:  # held idle: its replacement is held too, or becomes usable
                self._other.remove(slot)
            self.stats.replaced += 1
            self.last_error = why
            self._spawn(1)
        try:
            ray.kill(slot.handle, no_restart=True)  # in case it is only unreachable, not dead
        except Exception:  # already gone
            pass

    def wait_live(self, n: int, timeout_s: float) -> list[ActorInfo]:
        """Block until n actors are up (or timeout_s passes); their infos."""
        deadline = time.monotonic() + timeout_s
        with self._became_live:
            while len(self._live) < n and not self._broken_locked():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._became_live.wait(min(left, self._poll_s))
            return [s.info for s in self._live if s.info is not None]

    def snapshot(self) -> PoolStats:
        with self._lock:
            self.stats.live, self.stats.pending = len(self._live), len(self._pending)
            self.stats.other_gpu = len(self._other)
            self.stats.other_gpus = sorted({str(s.info.gpu) for s in self._other if s.info is not None})
            return PoolStats(**vars(self.stats))

    def close(self) -> None:
        import ray

        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            slots, self._live, self._pending, self._other = self._live + self._pending + self._other, [], [], []
        closing = [s.handle.close.remote() for s in slots if s.info is not None]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=30)
        for s in slots:
            try:
                ray.kill(s.handle, no_restart=True)
            except Exception:  # already gone
                pass

    # -- the supervisor
    def _supervise(self) -> None:
        next_reconcile = time.monotonic() + self._poll_s
        while not self._stop.is_set():
            try:
                self._collect_ready()
                if time.monotonic() >= next_reconcile:
                    self._reconcile()
                    next_reconcile = time.monotonic() + self._poll_s
            except Exception as exc:  # Ray shutting down under us; never kill the thread silently mid-sweep
                self.last_error = f"pool supervisor: {type(exc).__name__}: {exc}"
                self._stop.wait(self._poll_s)

    def _collect_ready(self) -> None:
        import ray

        with self._lock:
            waiting = {s.ready_ref: s for s in self._pending}
        if not waiting:
            self._stop.wait(self._poll_s)
            return
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=self._poll_s)
        for ref in ready:
            slot = waiting[ref]
            try:
                slot.info = ray.get(ref)
            except Exception as exc:  # its constructor or describe() failed, or it died starting
                with self._lock:
                    if slot in self._pending:
                        self._pending.remove(slot)
                    slot.alive = False
                    self.stats.start_failures += 1
                    self.last_error = f"a GPU actor did not start: {type(exc).__name__}: {str(exc)[:300]}"
                continue
            with self._became_live:
                if slot in self._pending and slot.alive:
                    self._pending.remove(slot)
                    if not self._gpu_known:  # the first actor up names the sweep's GPU
                        self.gpu, self._gpu_known = slot.info.gpu, True
                    if slot.info.gpu != self.gpu:
                        self._other.append(slot)
                        continue
                    self._live.append(slot)
                    self._free.put(slot)
                    self._became_live.notify_all()

    def _reconcile(self) -> None:
        """Drop actors on nodes that are gone; start actors for GPUs that have none."""
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        alive_ids = {n["NodeID"] for n in nodes}
        gpus = sum(int(n.get("Resources", {}).get("GPU", 0)) for n in nodes)
        with self._lock:
            gone = [s for s in self._live + self._other if s.info is not None and s.info.node_id not in alive_ids]
        for s in gone:
            self.lost(s, f"node {s.info.node_id[:8]} was lost")
        with self._lock:
            self._spawn(gpus - len(self._live) - len(self._pending) - len(self._other))

    def _spawn(self, n: int) -> None:
        """Start n actors (caller holds the lock). Stops after repeated start failures: an actor
        that cannot start (bad install on a node) would otherwise be retried every poll."""
        if self.stats.start_failures >= self._max_start_failures:
            return
        for _ in range(max(0, n)):
            handle = self._remote.remote(*self._args)
            self._pending.append(_Slot(handle, handle.describe.remote()))
            self.stats.started += 1

    def _broken(self) -> bool:
        with self._lock:
            return self._broken_locked()

    def _broken_locked(self) -> bool:
        return self.stats.start_failures >= self._max_start_failures and not self._live and not self._pending


# ---------------------------------------------------------------------------------------
# What a run calls
# ---------------------------------------------------------------------------------------
@dataclass
class DriverStats:
    """The driver's share of the work: evaluations done and the CPU its threads spent on them."""

    evaluations: int = 0  # each request once, however many attempts it took
    retried: int = 0  # requests whose first GPU actor died
    lost: int = 0  # requests whose retry died too (GpuActorsLost)
    on_gpu: int = 0  # requests that went to a GPU actor (the rest ended in prepare)
    bookkeeping_cpu_s: float = 0.0  # thread CPU inside evaluate(): submit, wait, deserialize
    pool: PoolStats = field(default_factory=PoolStats)


class ClusterEvaluator:
    """evaluate() with Evaluator.evaluate's signature, spread over a Ray cluster: compile on
    any CPU, kernels on the next free GPU actor. Ray must be initialised. Without a GPU in the
    cluster (at start) every evaluation ends in prepare, with `no_gpu_reason` as its reason."""

    def __init__(self, stages: RayStages | None = None, *, actor_cpus: float = 1.0, poll_s: float = 1.0,
                 retries: int = 1):
        import ray

        from agent.run import COMPILERS
        from tools.toolchain import find_toolchain

        self.stages = stages or RayStages()
        self._prepare = ray.remote(checked_prepare).options(  # no task events: as for the actors
            num_cpus=self.stages.prepare_cpus, num_returns=2, enable_task_events=False)
        try:  # what every run records (agent.run.tool_versions); a driver without a toolchain checks none
            mine = find_toolchain().versions()
        except Exception:  # noqa: BLE001
            mine = {}
        self._stage = ray.put((self.stages.prepare, {n: v for n, v in mine.items() if n in COMPILERS}))
        self.gpus = int(ray.cluster_resources().get("GPU", 0))
        self.no_gpu_reason = None if self.gpus else "the Ray cluster has no GPU"
        self.pool = GpuActorPool(self.stages, actor_cpus=actor_cpus, poll_s=poll_s) if self.gpus else None
        self._retries = retries
        self._lock = threading.Lock()
        self._stats = DriverStats()
        self._task_refs: dict[str, tuple[Any, Any]] = {}  # task name -> (task, its object)

    def evaluate(self, solution, task, arch: str, **kwargs) -> EvalResult:
        t0 = time.thread_time()
        try:
            return self._evaluate(solution, task, arch, kwargs)
        finally:
            with self._lock:
                self._stats.evaluations += 1
                self._stats.bookkeeping_cpu_s += time.thread_time() - t0

    def _evaluate(self, solution, task, arch: str, kwargs: dict) -> EvalResult:
        import ray

        compiled = kwargs.pop("compiled", None)
        task_ref = self._shared(task)
        if compiled is None:
            done_ref, payload_ref = self._prepare.remote(self._stage, solution, task_ref, arch, kwargs,
                                                         self.no_gpu_reason)
            if ray.get(done_ref):  # one bool: the cubin stays in the object store
                return ray.get(payload_ref)
        else:  # the caller compiled already
            payload_ref = ray.put(compiled)
        with self._lock:
            self._stats.on_gpu += 1
        try:
            return self._on_gpu(solution, task_ref, arch, payload_ref, kwargs)
        except GpuActorsLost as exc:
            # The harness failed, not the candidate: no verdict (tools/results.py), and the run stops with
            # infra_error as it does when a local worker fails on its own, never as a ptxbench error.
            return self._lost(solution, task, arch, ray.get(payload_ref), kwargs, str(exc))

    @staticmethod
    def _lost(solution, task, arch: str, compiled, kwargs: dict, why: str) -> EvalResult:
        res = without_gpu(solution, task, arch, compiled, kwargs, why)
        res.harness_fault = why
        return res

    def _on_gpu(self, solution, task, arch: str, payload_ref, kwargs: dict) -> EvalResult:
        import ray
        from ray.exceptions import RayActorError

        assert self.pool is not None
        died: list[str] = []
        for attempt in range(1 + self._retries):
            slot = self.pool.acquire()
            try:
                result = ray.get(slot.handle.evaluate.remote(solution, task, arch, payload_ref, kwargs))
            except RayActorError as exc:  # died (crash, node lost) or unreachable: its answer is void
                self.pool.lost(slot, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                died.append(type(exc).__name__)
                if attempt == 0:
                    with self._lock:
                        self._stats.retried += 1
                continue
            except BaseException:  # a bug in the evaluator: the actor itself is fine
                self.pool.release(slot)
                raise
            self.pool.release(slot)
            return result
        with self._lock:
            self._stats.lost += 1
        raise GpuActorsLost(f"the GPU actors running this evaluation died {len(died)} times ({', '.join(died)}); "
                            f"last: {self.pool.last_error}")

    def _shared(self, task):
        """The task as an object in the store, put once: a sweep sends the same few tasks
        thousands of times, and pickling one per call is driver CPU for nothing."""
        import ray

        if isinstance(task, str):
            return task
        with self._lock:
            held = self._task_refs.get(task.name)
            if held is None or held[0] != task:  # each run has its own copy: equal is enough, and cheaper
                held = self._task_refs[task.name] = (task, ray.put(task))
            return held[1]

    def stats(self) -> DriverStats:
        with self._lock:
            s = DriverStats(**{k: v for k, v in vars(self._stats).items() if k != "pool"})
        if self.pool is not None:
            s.pool = self.pool.snapshot()
        return s

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
