"""Why do the attention-backward expert's counted runs at S=8192 run slower than its timed runs
(issue 42, 2026-12-03: 32.8-35.9 ms against a timed median of 29.7-31.7 ms, intermittently)?
One process, the shipped experts, each run prepared as a timed run is (fresh inputs, outputs
poisoned, L2 flushed, stream gate, events around the launches), pairs with the library alternating
as tools.timing.paired_steps orders them, each candidate run judged on sampled rows (the GPU work
between runs that the harness does). Blocks, most decisive first (a slice may be killed):

  A  bwd S8192: plain pairs; two sessions of the check's own metric set (tools.credit.credit_metrics,
     CUPTI user replay), each pass three pairs, the middle one's candidate run inside the range (the
     drain before push and pop as tools.counted does), the others in the session but outside it;
     plain pairs again (drift)
  B  bwd S8192: a session per metric of that set (which metric slows a ranged run), and a trivial set
  C  controls: GEMM expert M8192 and attention-forward expert S8192, plain pairs and one session
  D  a real evaluation (tools.evaluator, credit on, every workload): each workload's counted and
     timed runs and the gaps before them by kind (tools.counted.launch_gaps)
  E  (only when asked) CUPTI's own push and pop time by range capacity and metric set (GEMM M70)

Every run goes to OUT/runs.jsonl.txt (JSON lines) as it is made (with the SM clock, temperature and power read by
NVML just before it); `nvidia-smi -lms 50` logs the same to OUT/nvsmi.csv in the background. A
summary per block is printed as each block ends.

    python3 scripts/diag_counted_slowdown.py --out OUT [--blocks A,B,C,D] [--pairs 12]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NVSMI_FIELDS = ("timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_event_reasons.active",
                "timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw")


def nvsmi_logger(path: Path):
    """nvidia-smi sampling every 50 ms into `path` (the first field set it accepts), or None."""
    for fields in NVSMI_FIELDS:
        try:
            f = open(path, "w")
            p = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv", "-lms", "50"], stdout=f,
                                 stderr=subprocess.STDOUT)
        except OSError:
            return None
        time.sleep(0.4)
        if p.poll() is None:
            return p
    return None


class Case:
    """One task's expert on one workload, bound and ready: candidate and library as timed Sides."""

    def __init__(self, state, task_name: str, workload: str):
        from tasks import get_task
        from tools.compile import compile_solution
        from tools.launch import Bound, Module, plan_launches
        from tools.solution import Solution
        from tools.timed import library_side
        from tasks.families.baselines import list_backends, make_baseline
        from tools.workspace import TimedJudge, Workspace

        self.state, self.name = state, f"{task_name}:{workload}"
        self.task = task = get_task(task_name)
        wl = next(w for w in task.workloads if w.name == workload)
        self.axes = task.axis_values(wl)
        sol = Solution.from_dir(ROOT / "tasks" / task_name / "expert")
        comp = compile_solution(sol, "sm_90a")
        if comp.status != "ok":
            raise RuntimeError(f"{task_name} expert did not compile: {comp.error}")
        plan = plan_launches(sol.manifest, task, self.axes, state.limits)
        self.ws = ws = Workspace(task, plan)
        self.module = Module(comp.cubin, comp.symbols)
        self.bound = Bound(plan, self.module, ws.pointers())
        self.rng = random.Random(20261203)
        self.judge = TimedJudge(task, self.axes, ws, self.rng, "cuda")
        self.judge.full_at = set()  # sampled rows on every run: no whole-output check (0.5 s at S8192) in the gaps
        self.judge.before_pair(0, 1)
        backend = list_backends(task)[0]
        lib = make_baseline(task, ws.inputs, backend)
        library_prepare = lib.prepare
        lib.prepare = lambda: (self.judge.inputs_for_run(), library_prepare())
        self.library = library_side(backend, lib, ws.inputs)
        self.backend = backend

    def candidate(self, released: list):
        from tools.timing import Side

        def prepare():
            self.judge.inputs_for_run()
            self.ws.prepare()
        return Side("candidate", lambda: (self.ws.zero_scratch(), self.bound.launch()), prepare, released=released)


class Diag:
    def __init__(self, out: Path, deadline: float):
        from tools.worker import State, _nvml_handle, _nvml_state

        self.state = State()
        self.nvml = _nvml_handle()
        self.nvml_state = _nvml_state
        self.out = out
        self.runs = open(out / "runs.jsonl.txt", "a")  # (.txt: what the device hands back)
        self.deadline = deadline
        self.released: list[float] = []

    def record(self, **row) -> None:
        self.runs.write(json.dumps(row) + "\n")
        self.runs.flush()

    def busy(self) -> bool:
        return self.state.stream_busy()

    def drain(self) -> None:
        end = time.perf_counter() + 30
        while self.busy() and time.perf_counter() < end:
            pass

    def pair(self, case: Case, i: int, block: str, cond: str, around=None, judge: bool = True, library: bool = True,
             **tags) -> dict:
        """One pair as paired_steps runs it (order flipped on odd i), the candidate's run inside
        `around` (a context manager) where given; judged on sampled rows. Returns the row."""
        from tools.timing import _cold_run

        st = self.state
        nv = self.nvml_state(self.nvml)
        t0 = time.perf_counter()
        case.judge.before_pair(i, 99)
        cand = case.candidate(self.released)
        cand.around = around
        sides = [cand] + ([case.library] if library else [])
        if i % 2:
            sides.reverse()
        ev = {s.name: _cold_run(s, st) for s in sides}
        st.wait(60)
        c = ev["candidate"]
        lib = ev.get(case.library.name)
        row = {"t": time.time(), "block": block, "case": case.name, "cond": cond, "i": i,
               "cand_ms": round(c[0].elapsed_time(c[1]), 5),
               "lib_ms": round(lib[0].elapsed_time(lib[1]), 5) if lib else None,
               "gap_ms": round((self.released[-1] - self.released[-2]) * 1e3, 2) if len(self.released) > 1 else None,
               **{k: v for k, v in nv.items()}, **tags}
        t1 = time.perf_counter()
        if judge:
            case.judge.after_pair(i, 99)
        else:
            case.judge._generated = None
        row["pair_s"], row["judge_s"] = round(time.perf_counter() - t0, 4), round(time.perf_counter() - t1, 4)
        self.record(**row)
        return row

    def ranged_with_drain(self, ranged, label: str):
        @contextlib.contextmanager
        def ctx():
            self.drain()
            with ranged(label):
                yield
                self.drain()
        return ctx

    def session(self, case: Case, metrics: list[str], block: str, cond: str, pairs_per_pass: int = 3,
                counted_at: int = 1, judge: bool = True, library: bool = True) -> list[dict]:
        """One CUPTI user-replay session of `metrics`: per pass `pairs_per_pass` pairs, pair
        `counted_at` with its candidate run inside the range."""
        from tools.cupti import RangeProfiler

        t0 = time.perf_counter()
        prof = RangeProfiler(list(metrics), replay="user")
        rows: list[dict] = []
        n = [0]

        def run_pass(p: int, ranged) -> None:
            for j in range(pairs_per_pass):
                inside = j == counted_at
                around = self.ranged_with_drain(ranged, "diag") if inside else None
                rows.append(self.pair(case, n[0], block, cond, around=around, judge=judge, library=library,
                                      pass_=p, in_range=inside, passes=prof.passes))
                n[0] += 1

        try:
            launches = prof.profile_passes(run_pass, "diag")
            got = {k: v for x in launches for k, v in x.metrics.items()}
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say it and go on
            got = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            with contextlib.suppress(Exception):
                prof.close()
        self.record(block=block, case=case.name, cond=cond, kind="session", passes=prof.passes,
                    seconds=round(time.perf_counter() - t0, 3), starts=getattr(prof, "last_pass_s", None),
                    values={k: (v if isinstance(v, str) else float(v)) for k, v in got.items()})
        return rows

    def left(self) -> float:
        return self.deadline - time.monotonic()


def summary(title: str, rows: list[dict], key=lambda r: (r["cond"], r.get("pass_"), r.get("in_range"))) -> None:
    groups: dict = {}
    for r in rows:
        if "cand_ms" in r:
            groups.setdefault(key(r), []).append(r)
    print(f"\n== {title}")
    print(f"{'cond':>28} {'pass':>4} {'rng':>4} {'n':>3} {'cand med':>9} {'min':>8} {'max':>8} {'lib med':>8} "
          f"{'gap med':>8} {'MHz':>5} {'W':>5} {'C':>3}")
    for (cond, p, inside), rs in groups.items():
        c = [r["cand_ms"] for r in rs]
        lib = [r["lib_ms"] for r in rs if r.get("lib_ms")]
        gaps = [r["gap_ms"] for r in rs if r.get("gap_ms") is not None]
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        print(f"{str(cond)[:28]:>28} {'' if p is None else p:>4} {'' if inside is None else int(inside):>4} "
              f"{len(c):3d} {med(c):9.3f} {min(c):8.3f} {max(c):8.3f} {med(lib):8.3f} {med(gaps):8.1f} "
              f"{med([r.get('sm_mhz', 0) for r in rs]):5.0f} {med([r.get('power_w', 0) for r in rs]):5.0f} "
              f"{med([r.get('temp_c', 0) for r in rs]):3.0f}", flush=True)


def block_a(d: Diag, bwd: Case, pairs: int) -> None:
    from tools.credit import credit_metrics

    rows = [d.pair(bwd, i, "A", "plain") for i in range(pairs)]
    for s in range(2):
        rows += d.session(bwd, list(credit_metrics()), "A", f"check set #{s}")
    # plain again, every other pair's run judged whole (the fp32 reference of the whole output: 0.5 s
    # of GPU work at S8192): does a run right after one slow down, as counted runs after one did?
    bwd.judge.full_at = {0, 2, 4, 6}
    rows += [d.pair(bwd, i, "A", "plain after whole check" if i % 2 else "plain after") for i in range(6)]
    bwd.judge.full_at = set()
    summary("A: bwd S8192, plain vs the check's session (pass, inside the range)", rows)


def block_b(d: Diag, bwd: Case) -> None:
    """A trivial set, then the check's set by counter unit (L1TEX's, then the SM's), then each L1TEX
    metric alone (the reads and atomics the backward's dQ reduce-adds go through), then the rest."""
    from tools.credit import DURATION_METRIC, credit_metrics

    every = list(credit_metrics())
    l1 = [m for m in every if m.startswith("l1tex__")]
    sm = [m for m in every if m not in l1]
    sets = [("trivial", [DURATION_METRIC]), ("l1tex set", l1), ("sm set", sm)] + [(m, [m]) for m in l1 + sm]
    rows = []
    for name, metrics in sets:
        if d.left() < 25:
            print(f"block B: stopped before {name} (slice)", flush=True)
            break
        rows += d.session(bwd, metrics, "B", name, pairs_per_pass=2, counted_at=1, judge=False, library=True)
        rows += [d.pair(bwd, 0, "B", f"plain after {name}", judge=False)]
    summary("B: bwd S8192, metric sets (in_range=1: the ranged run)", rows)


def block_c(d: Diag, cases: list[Case], pairs: int) -> None:
    from tools.credit import credit_metrics

    rows = []
    for c in cases:
        rows += [d.pair(c, i, "C", f"{c.name} plain") for i in range(pairs)]
        rows += d.session(c, list(credit_metrics()), "C", f"{c.name} check", pairs_per_pass=2, counted_at=1)
    summary("C: controls", rows)


def block_e(d: Diag, case: Case) -> None:
    """CUPTI's own part of a range push and pop (after the drain: what every padded run waits), by the
    profiler's range capacity (tools.cupti.MAX_RANGES: 64, or 8, the most ranges a pass pushes is one
    per workload) and metric set: what the GEMM's padding (1.45 ms a run, 350 runs) could shed."""
    from tools import cupti
    from tools.credit import DURATION_METRIC, credit_metrics
    from tools.timing import Side, gated_run

    clock = time.perf_counter
    print("\n== E: CUPTI push / pop own ms (after the drain), per configuration", flush=True)
    keep = cupti.MAX_RANGES
    try:
        for cap, name, metrics in ((64, "check set", list(credit_metrics())), (8, "check set", list(credit_metrics())),
                                   (64, "trivial", [DURATION_METRIC]), (8, "trivial", [DURATION_METRIC])):
            cupti.MAX_RANGES = cap
            prof = cupti.RangeProfiler(metrics, replay="user")
            costs: list[tuple[float, float]] = []

            def run_pass(p, ranged):
                for _ in range(5):
                    case.judge.before_pair(0, 99)
                    side = Side("candidate", lambda: (case.ws.zero_scratch(), case.bound.launch()))
                    case.ws.prepare()
                    d.state.flusher.flush()
                    d.drain()
                    t0 = clock()
                    cm = ranged("e")
                    cm.__enter__()
                    push = clock() - t0
                    gated_run(side, d.state)
                    d.drain()
                    t1 = clock()
                    cm.__exit__(None, None, None)
                    costs.append((push * 1e3, (clock() - t1) * 1e3))
                    case.judge._generated = None

            t0 = clock()
            try:
                prof.profile_passes(run_pass, "e")
            finally:
                prof.close()
            pushes, pops = [c[0] for c in costs], [c[1] for c in costs]
            row = {"block": "E", "cap": cap, "set": name, "passes": prof.passes, "push_ms": pushes, "pop_ms": pops,
                   "session_s": round(clock() - t0, 3), "start_stop_s": prof.last_pass_s}
            d.record(**row)
            print(f"  ranges {cap:2d} {name:9s} passes {prof.passes}: push med {statistics.median(pushes):.3f} ms, "
                  f"pop med {statistics.median(pops):.3f} ms; first Start {prof.last_pass_s[0][0]:.3f} s, "
                  f"session {clock() - t0:.2f} s", flush=True)
    finally:
        cupti.MAX_RANGES = keep


def block_d(out: Path) -> None:
    from tools.evaluator import Evaluator
    from tools.solution import Solution

    sol = Solution.from_dir(ROOT / "tasks" / "mha_bwd_d128" / "expert")
    with Evaluator(timeout_s=300, kernel_timeout_s=30) as ev:
        for k in range(1):
            t0 = time.perf_counter()
            res = ev.evaluate(sol, "mha_bwd_d128", "sm_90a", workloads="all", executed_check=True)
            wall = time.perf_counter() - t0
            rows = {}
            for w in res.workloads:
                c = w.credit or {}
                rows[w.workload] = {"timed_ms": w.timing.median_ms if w.timing else None,
                                    "timing_cv": w.timing.cv if w.timing else None,
                                    "run_ms": c.get("run_ms"), "pair_library_ms": c.get("pair_library_ms"),
                                    "counted_pairs": c.get("counted_pairs"), "gaps_ms": c.get("gaps_ms"),
                                    "stretch_ends": c.get("stretch_ends"), "pair_ms": c.get("pair_ms"),
                                    "tie_band_ms": c.get("tie_band_ms"), "run_pairs": c.get("run_pairs"), "push_pop_ms": c.get("push_pop_ms"),
                                    "gpu_state": w.gpu_state}
            notes = {x.workload: x.notes for x in (res.executed.workloads if res.executed else []) if x.notes}
            (out / f"eval_{k}.json").write_text(json.dumps({"wall_s": wall, "correct_with_arch": res.correct_with_arch,
                                                             "workloads": rows, "notes": notes}, indent=1))
            print(f"\n== D: evaluation {k} ({wall:.1f} s) correct_with_arch {res.correct_with_arch}")
            for name, r in rows.items():
                g = r["gaps_ms"] or {}
                print(f"  {name:>6} timed {r['timed_ms']} runs {r['run_ms']} lib {r['pair_library_ms']} "
                      f"pairs {r['counted_pairs']} gaps {json.dumps(g)[:400]}", flush=True)
            s8192 = rows.get("S8192") or {}
            print(f"  S8192 pair_ms {s8192.get('pair_ms')} stretch_ends {s8192.get('stretch_ends')}")
            for name, n in notes.items():
                print(f"  notes {name}: {json.dumps(n)[:300]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--blocks", default="A,B,C,D")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=140.0, help="block B stops this close to the end")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    blocks = set(args.blocks.split(","))
    deadline = time.monotonic() + args.budget_s
    logger = nvsmi_logger(out / "nvsmi.csv")
    t0 = time.perf_counter()
    try:
        d = Diag(out, deadline)
        bwd = None
        if blocks & {"A", "B"}:
            bwd = Case(d.state, "mha_bwd_d128", "S8192")
            print(f"set-up {time.perf_counter() - t0:.1f} s (library {bwd.backend})", flush=True)
            for i in range(2):  # warm both sides (first calls), not recorded
                d.pair(bwd, i, "warm", "warm")
        if "A" in blocks:
            block_a(d, bwd, args.pairs)
        if "C" in blocks:
            block_c(d, [Case(d.state, "gemm_n7168_k5120", "M8192"), Case(d.state, "mha_fwd_d128", "S8192")],
                    max(6, args.pairs // 2))
        if "B" in blocks:
            block_b(d, bwd)
        if "E" in blocks:
            block_e(d, Case(d.state, "gemm_n7168_k5120", "M70"))
        d.runs.close()
        del d, bwd
        import torch

        torch.cuda.empty_cache()
        if "D" in blocks:
            block_d(out)
    finally:
        if logger is not None:
            logger.terminate()
    print(f"\ndone in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
