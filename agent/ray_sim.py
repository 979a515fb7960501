"""How the Ray executor scales toward a cluster, simulated on one machine.

    python -m agent.ray_sim --gpus 1,8,32,64 --json runs/ray_sim.json --plot docs/ray_sim_scaling.png

For each GPU count G: a local Ray instance with G logical GPUs (Ray does not check that
they exist) and --compile-cpus logical CPUs; the real executor (agent/ray_evaluator.py:
ClusterEvaluator, GpuActorPool, the thread per run of a sweep) with two stub stages:

    prepare      a Ray CPU task that sleeps --compile-s and returns a real compile result
                 (the shipped expert GEMM, compiled once here: its cubin, PTX and SASS
                 verdicts), so the object store carries what a real compile puts in it;
    GPU actor    sleeps --gpu-s, then returns an EvalResult built on that compile result.

2 x G run threads (a sweep's `concurrency`) evaluate until G x --evals-per-gpu are done,
after one untimed round that starts every worker. Measured: evaluations per minute, steady
(between the G-th and the (n-G)-th completion, so neither the pipeline's fill nor its drain
counts) and overall, against the ideal G x 60 / gpu_s and against G x the 1-GPU rate; and
the driver's CPU per evaluation: time.process_time() of this whole process (every thread:
the run threads, the pool's supervisor, Ray's client) over the timed part, divided by the
evaluations; and, within it, the CPU the run threads spent inside evaluate().
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SimParams:
    gpu_s: float = 2.0  # GPU time per evaluation (a real one on an H200: ~2 s, docs/BENCHMARKS.md)
    compile_s: float = 0.5  # compile + inspect per candidate
    compile_cpus: int = 32  # logical CPUs for prepare tasks: enough that compiles never starve 64 GPUs
    evals_per_gpu: int = 10
    threads_per_gpu: int = 2  # run threads per GPU: each waits on its compile, then on a GPU
    idle_s: float = 5.0  # how long the driver's idle CPU is measured


@dataclass
class SimRow:
    gpus: int
    evaluations: int
    actors_up_s: float  # from the executor's start until every GPU actor answered
    wall_s: float
    evals_per_min: float  # overall: evaluations / wall
    steady_evals_per_min: float
    ideal_evals_per_min: float  # every GPU busy all the time: gpus x 60 / gpu_s
    of_ideal: float  # steady / ideal
    of_linear: float | None = None  # steady / (gpus x the 1-GPU steady rate)
    driver_cpu_ms_per_eval: float = 0.0  # this process, every thread
    driver_idle_cpu_ms_per_s: float = 0.0  # the same with no evaluation in flight, per second
    driver_cpu_ms_per_eval_less_idle: float = 0.0  # the per-evaluation cost: idle CPU over the wall time taken out
    bookkeeping_cpu_ms_per_eval: float = 0.0  # the run threads inside evaluate()
    retried: int = 0
    # Is this machine the limit? The simulated cluster's CPU (driver, GCS, raylet, every worker)
    # in cores, and how busy the whole host was (other work on it included), over the timed part.
    sim_cpu_cores: float = 0.0
    host_cpu_busy: float = 0.0


# ---------------------------------------------------------------------------------------
# The stub stages
# ---------------------------------------------------------------------------------------
def make_prepare(compile_s: float, compiled: tuple):
    """A prepare stage that takes compile_s and yields `compiled` (a real compile result,
    shipped with the function's definition once; each task returns its own copy)."""

    def sim_prepare(solution, task, arch, kwargs, no_gpu_reason):
        time.sleep(compile_s)
        return False, compiled

    return sim_prepare


class SimGpuActor:
    def __init__(self, gpu_s: float):
        self._gpu_s = gpu_s

    def describe(self):
        from agent.ray_evaluator import ActorInfo

        return ActorInfo.here("simulated GPU", None)

    def evaluate(self, solution, task, arch, compiled, kwargs):
        from agent.ray_evaluator import without_cubin
        from tools.results import EvalResult

        time.sleep(self._gpu_s)
        comp, insp = compiled
        return without_cubin(EvalResult(task=task.name, arch=arch, compile=comp, inspect=insp,
                                        requested_features=task.features_for(arch), run_status="ok",
                                        gpu="simulated GPU", device=os.environ.get("CUDA_VISIBLE_DEVICES"),
                                        seconds=self._gpu_s))

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------
# One GPU count
# ---------------------------------------------------------------------------------------
def measure(gpus: int, p: SimParams, solution, task, compiled, progress=None) -> SimRow:
    import ray

    from agent.executors import RayExecutor
    from agent.ray_evaluator import RayStages

    # address="local": always a new instance, never another Ray running on this machine.
    ray.init(address="local", num_cpus=p.compile_cpus, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=2 * 1024**3)
    try:
        stages = RayStages(prepare=make_prepare(p.compile_s, compiled), gpu_actor=SimGpuActor, actor_args=(p.gpu_s,))
        t_start = time.monotonic()
        # GPU actors reserve no CPU: the logical CPUs are all for prepare tasks, as on a GPU node
        # whose CPUs outnumber its GPUs many times over.
        ex = RayExecutor(stages=stages, gpu_actor_cpus=0.0)
        try:
            if len(ex._cluster.pool.wait_live(gpus, 1800)) < gpus:
                raise RuntimeError(f"only {ex.stats().pool.live} of {gpus} actors came up")
            actors_up_s = time.monotonic() - t_start
            evaluate = ex.evaluator().evaluate
            threads = max(1, p.threads_per_gpu * gpus)
            drive(evaluate, solution, task, n=max(gpus, threads), threads=threads)  # untimed: start every worker
            # The driver's CPU while nothing is evaluated (Ray's client, the pool's supervisor, the
            # progress bar): a cost per second, not per evaluation; at few GPUs it dominates the latter.
            idle0 = time.process_time()
            time.sleep(p.idle_s)
            idle_ms_per_s = 1000.0 * (time.process_time() - idle0) / p.idle_s
            before = ex.stats()
            host0, tree0 = host_cpu(), tree_cpu_s()
            cpu0, t0 = time.process_time(), time.monotonic()
            n = gpus * p.evals_per_gpu
            done_at = drive(evaluate, solution, task, n=n, threads=threads, progress=progress)
            wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
            host1, tree1 = host_cpu(), tree_cpu_s()
            after = ex.stats()
        finally:
            ex.close()
    finally:
        ray.shutdown()
    ends = sorted(t - t0 for t in done_at)
    lo, hi = gpus - 1, n - gpus - 1  # the G-th and the (n-G)-th completion
    steady = 60.0 * (hi - lo) / (ends[hi] - ends[lo]) if hi > lo and ends[hi] > ends[lo] else 60.0 * n / wall
    ideal = gpus * 60.0 / p.gpu_s
    return SimRow(gpus=gpus, evaluations=n, actors_up_s=round(actors_up_s, 1), wall_s=round(wall, 2),
                  evals_per_min=round(60.0 * n / wall, 1), steady_evals_per_min=round(steady, 1),
                  ideal_evals_per_min=round(ideal, 1), of_ideal=round(steady / ideal, 3),
                  driver_cpu_ms_per_eval=round(1000.0 * cpu / n, 2),
                  driver_idle_cpu_ms_per_s=round(idle_ms_per_s, 2),
                  driver_cpu_ms_per_eval_less_idle=round((1000.0 * cpu - idle_ms_per_s * wall) / n, 2),
                  bookkeeping_cpu_ms_per_eval=round(1000.0 * (after.bookkeeping_cpu_s - before.bookkeeping_cpu_s) / n, 2),
                  retried=after.retried - before.retried,
                  sim_cpu_cores=round((tree1 - tree0) / wall, 2),
                  host_cpu_busy=round((host1[0] - host0[0]) / max(1, host1[1] - host0[1]), 3))


def tree_cpu_s() -> float:
    """CPU seconds of this process and its descendants: with a local Ray, the whole cluster."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # exited meanwhile
            pass
    return total


def host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of every core of the host, from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v) - idle, sum(v)


def drive(evaluate, solution, task, *, n: int, threads: int, progress=None) -> list[float]:
    """n evaluations from `threads` run threads, each one after another (as a run does);
    the monotonic time each one ended."""
    left = [n]
    lock = threading.Lock()
    done_at: list[float] = []
    errors: list[BaseException] = []

    def run_thread() -> None:
        while True:
            with lock:
                if left[0] == 0 or errors:
                    return
                left[0] -= 1
            try:
                evaluate(solution, task, "sm_90a", workloads="all")
            except BaseException as exc:  # reported below; the other threads stop
                errors.append(exc)
                return
            with lock:
                done_at.append(time.monotonic())
            if progress:
                progress()

    pool = [threading.Thread(target=run_thread, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return done_at


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------
def table(rows: list[SimRow]) -> str:
    lines = ["| GPUs | evaluations | steady evaluations/min | ideal | of ideal | of linear (G x 1-GPU) | "
             "overall evaluations/min | driver CPU ms/evaluation | less idle CPU | idle CPU ms/s | "
             "in evaluate() ms | actors up s | simulation CPU cores | host CPU busy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        linear = "—" if r.of_linear is None else f"{r.of_linear:.3f}"
        lines.append(f"| {r.gpus} | {r.evaluations} | {r.steady_evals_per_min} | {r.ideal_evals_per_min} | "
                     f"{r.of_ideal:.3f} | {linear} | {r.evals_per_min} | {r.driver_cpu_ms_per_eval} | "
                     f"{r.driver_cpu_ms_per_eval_less_idle} | {r.driver_idle_cpu_ms_per_s} | "
                     f"{r.bookkeeping_cpu_ms_per_eval} | {r.actors_up_s} | {r.sim_cpu_cores} | "
                     f"{r.host_cpu_busy:.0%} |")
    return "\n".join(lines)


def plot(series: list[tuple[dict, list[SimRow]]], path: Path) -> None:
    """One figure for one or more runs of this script (meta, rows): throughput against GPUs,
    the share of linear, and the driver's CPU per evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, share, cpu) = plt.subplots(1, 3, figsize=(14, 4.2))
    for meta, rows in series:
        g = [r.gpus for r in rows]
        label = f"{meta['params']['gpu_s']:g} s GPU + {meta['params']['compile_s']:g} s compile"
        line, = rate.plot(g, [r.steady_evals_per_min for r in rows], "o-", label=label)
        rate.plot(g, [r.ideal_evals_per_min for r in rows], "--", color=line.get_color(), alpha=0.5,
                  label="every GPU busy")
        share.plot(g, [r.of_ideal for r in rows], "o-", color=line.get_color(), label=label)
        cpu.plot(g, [r.driver_cpu_ms_per_eval for r in rows], "o-", color=line.get_color(),
                 label=f"{label}: driver process")
        cpu.plot(g, [r.driver_cpu_ms_per_eval_less_idle for r in rows], "^:", color=line.get_color(),
                 label=f"{label}: less its idle CPU")
    share.axhline(0.9, ls=":", color="gray", label="goal: 0.9")
    share.set_ylim(0, 1.05)
    cpu.axhline(10, ls=":", color="gray", label="goal: under 10 ms")
    cpu.set_ylim(bottom=0)
    for ax, title, ylabel in ((rate, "throughput (steady)", "evaluations / min"),
                              (share, "share of linear (every GPU busy)", "steady / ideal"),
                              (cpu, "driver overhead", "ms CPU per evaluation")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(g, [str(x) for x in g])
        ax.set_xlabel("GPUs (simulated)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    rate.set_yscale("log")
    meta = series[0][0]
    fig.suptitle(f"agent/ray_sim.py, {meta['date']}: one {meta['cpus']}-core CPU VM (shared), Ray {meta['ray']}",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def load(path: Path) -> tuple[dict, list[SimRow]]:
    data = json.loads(path.read_text())
    return data["meta"], [SimRow(**r) for r in data["rows"]]


# ---------------------------------------------------------------------------------------
def the_candidate():
    """The shipped expert GEMM and its real compile result: the payload every simulated
    compile yields."""
    from tasks import get_task
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    solution = Solution.from_dir(REPO / "tasks" / "gemm_n7168_k5120" / "expert")
    compiled = Evaluator.compile_and_inspect(solution, "sm_90a")
    if not compiled[0].ok:
        raise SystemExit(f"the expert GEMM did not compile here: {compiled[0].error}")
    return solution, get_task("gemm"), compiled


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="1,8,32,64", help="GPU counts, comma-separated")
    ap.add_argument("--gpu-s", type=float, default=SimParams.gpu_s)
    ap.add_argument("--compile-s", type=float, default=SimParams.compile_s)
    ap.add_argument("--compile-cpus", type=int, default=SimParams.compile_cpus)
    ap.add_argument("--evals-per-gpu", type=int, default=SimParams.evals_per_gpu)
    ap.add_argument("--threads-per-gpu", type=int, default=SimParams.threads_per_gpu)
    ap.add_argument("--idle-s", type=float, default=SimParams.idle_s)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--plot", type=Path, help="write the plot (PNG) here")
    ap.add_argument("--replot", type=Path, nargs="+", metavar="JSON",
                    help="measure nothing: draw --plot from earlier --json files (one curve each)")
    a = ap.parse_args(argv)
    if a.replot:
        if not a.plot:
            ap.error("--replot needs --plot")
        plot([load(p) for p in a.replot], a.plot)
        return 0
    params = SimParams(a.gpu_s, a.compile_s, a.compile_cpus, a.evals_per_gpu, a.threads_per_gpu, a.idle_s)
    counts = [int(x) for x in a.gpus.split(",") if x.strip()]
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    import ray
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    solution, task, compiled = the_candidate()
    cubin_kb = len(compiled[0].cubin or b"") / 1024
    console.print(f"payload: expert GEMM, cubin {cubin_kb:.0f} KiB, PTX {len(compiled[0].ptx or '') / 1024:.0f} KiB")
    rows: list[SimRow] = []
    # Few refreshes: the bar's own thread counts in the driver's CPU.
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, refresh_per_second=2) as bar:
        for g in counts:
            tid = bar.add_task(f"{g} GPUs", total=g * params.evals_per_gpu)
            row = measure(g, params, solution, task, compiled, progress=lambda tid=tid: bar.advance(tid))
            rows.append(row)
            bar.update(tid, description=f"{g} GPUs: {row.steady_evals_per_min} evaluations/min, "
                                        f"{row.driver_cpu_ms_per_eval} ms driver CPU each")
    one = next((r for r in rows if r.gpus == 1), None)
    for r in rows:
        r.of_linear = round(r.steady_evals_per_min / (r.gpus * one.steady_evals_per_min), 3) if one else None
    meta = {"date": datetime.date.today().isoformat(), "host": platform.node(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "ray": ray.__version__, "params": asdict(params),
            "payload": {"cubin_kib": round(cubin_kb, 1), "ptx_kib": round(len(compiled[0].ptx or "") / 1024, 1)},
            "command": "python -m agent.ray_sim " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(table(rows))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    if a.plot:
        plot([(meta, rows)], a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
