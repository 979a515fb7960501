"""What a CUPTI user range costs beside the run it counts (issue 42 item 7: the counted runs' cost),
on this GPU, with the executed check's metric set and with one metric.

The executed check ranges every candidate run of a timed phase (tools.counted.ranged_run: a drain,
push, the run, a drain, pop) and pauses the library's run as long (matched_pause). On the H200 the
merged tree measured push 0.6 ms and pop 0.6 ms per run, most of the GEMM expert's 1.5 s counted
cost. This probe measures, in one process and one profiler session per metric set (each pass runs
the same ranges, as the check's passes do):

  idle     push and pop after a drain (the GPU idle): CUPTI's own part, as the check pays it
  busy     push with the GPU still running BUSY_MS of queued work, pop likewise: does CUPTI wait for
           the stream first (push ~ BUSY_MS + idle push) or overlap its own part (push ~ BUSY_MS)?
  one      two runs, each in a range of its own (the check today): push + pop per run
  two      two runs in ONE range, an L2 flush between them (what a range over two adjacent timed runs
           would hold at the least): (push + pop) / 2 per run, and its counts per run against `one`'s
  judged   as `two`, with a judge-like reference (a 64-row GEMM, as the timed judge's sampled rows)
           and the flush between: the range then counts the harness's work as the candidate's

for each metric set (one metric, six, the check's; and the check's with a counter data image for 512
ranges, about four times what an evaluation of five workloads asks for: does a range cost more in a larger image?),
plus each pass's CUPTI Start and Stop (the first Start after enabling is most of the pass
boundaries' cost) and, last, whether a second configuration on the same enabled object makes the
next first Start cheap (`restart`); with --each, every metric of the check alone (which counters make
a range cost what it does). Prints a table; --json writes every figure.

    python3 scripts/probe_range_cost.py [--n 4096] [--runs 6] [--busy-ms 2] [--sets one,six,full,full@512]
                                        [--each] [--json OUT]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = ("idle", "busy", "one", "two", "judged")


def _med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096, help="the bf16 GEMM's size (the counted run)")
    ap.add_argument("--runs", type=int, default=6, help="ranges of each case a pass")
    ap.add_argument("--busy-ms", type=float, default=2.0, help="GPU work queued before push and pop in `busy`")
    ap.add_argument("--sets", default="one,six,full,full@512",
                    help="metric sets: one (the wgmma instruction count), six (the check's first six), "
                         "full (the check's); NAME@K: its counter data image sized for K ranges (default: the ranges a pass makes)")
    ap.add_argument("--each", action="store_true",
                    help="then each of the check's metrics alone: its passes, push and pop (which counters cost)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.n < 64 or args.runs < 1 or not 0 < args.busy_ms <= 50:
        print("probe_range_cost: --n >= 64, --runs >= 1, 0 < --busy-ms <= 50", file=sys.stderr)
        return 2
    from tools import credit

    check = list(credit.credit_metrics())
    sets: list[tuple[str, list[str], int]] = []  # (name, metrics, counter data image's ranges)
    for which in [s for s in args.sets.split(",") if s]:
        kind, _, cap = which.partition("@")
        metrics = {"one": [credit.GMMA_METRIC], "six": check[:6], "full": check}.get(kind)
        if metrics is None or (cap and not cap.isdigit()):
            print(f"probe_range_cost: unknown set {which!r} (one, six, full, NAME@K)", file=sys.stderr)
            return 2
        sets.append((which, metrics, max(6 * args.runs, int(cap or 0))))
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    import torch

    from tools import cupti

    clock = time.perf_counter
    torch.zeros(1, device="cuda")
    n = args.n
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    rows = torch.empty(64, n, device="cuda", dtype=torch.bfloat16)
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20))
    flush_buf = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    sync = torch.cuda.synchronize

    def gemm() -> None:
        torch.matmul(a, b, out=c)

    def flush() -> None:
        flush_buf.zero_()

    def reference_rows() -> None:  # the timed judge's sampled reference rows, on the same tensor cores
        torch.matmul(a[:64], b, out=rows)

    # torch.cuda._sleep spins a number of cycles: calibrated to ms once
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        e0.record()
        torch.cuda._sleep(1 << 20)
        e1.record()
        sync()
    cycles_per_ms = (1 << 20) / max(e0.elapsed_time(e1), 1e-3)

    def busy() -> None:
        torch.cuda._sleep(int(args.busy_ms * cycles_per_ms))

    for _ in range(5):
        gemm()
    sync()
    plain = []
    for _ in range(10):
        e0.record()
        gemm()
        e1.record()
        sync()
        plain.append(e0.elapsed_time(e1))
    out: dict = {"n": n, "runs": args.runs, "busy_ms": args.busy_ms, "plain_gemm_ms": _med(plain),
                 "gpu": torch.cuda.get_device_name(0), "sets": {}}

    def in_range(ranged, label: str, body, before_pop=None) -> tuple[float, float]:
        """(push s, pop s) of one range around body(); before_pop() runs inside it, after body."""
        cm = ranged(label)
        t0 = clock()
        cm.__enter__()
        push = clock() - t0
        body()
        if before_pop is not None:
            before_pop()
        t1 = clock()
        cm.__exit__(None, None, None)
        return push, clock() - t1

    for which, metrics, capacity in sets:
        row: dict = {"metrics": len(metrics), "capacity": capacity, "error": None}
        out["sets"][which] = row
        try:
            t0 = clock()
            prof = cupti.RangeProfiler(metrics, replay="user")
            row.update(build_s=round(clock() - t0, 4), passes=prof.passes, instrumented=list(prof.instrumented_passes))
        except Exception as exc:  # noqa: BLE001 - a probe reports, never stops
            row["error"] = f"build: {type(exc).__name__}: {exc}"[:300]
            continue
        times = {k: {"push": [], "pop": []} for k in CASES}

        def run_pass(i: int, ranged, prof=prof, times=times) -> None:
            keep = i not in prof.instrumented_passes  # a SASS-patched pass's times are not a hardware pass's

            def note(case: str, pp: tuple[float, float], runs: int = 1) -> None:
                if keep:
                    times[case]["push"].append(pp[0] * 1e3 / runs)
                    times[case]["pop"].append(pp[1] * 1e3 / runs)

            for j in range(args.runs):
                flush()
                sync()
                note("idle", in_range(ranged, f"idle#{j}", gemm, sync))
                flush()
                sync()
                busy()  # the GPU busy at push; then the run and more work still queued at pop
                note("busy", in_range(ranged, f"busy#{j}", lambda: (gemm(), busy())))
                sync()
                for k in range(2):
                    flush()
                    sync()
                    note("one", in_range(ranged, f"one#{j}.{k}", gemm, sync))
                flush()
                sync()
                note("two", in_range(ranged, f"two#{j}", lambda: (gemm(), flush(), gemm()), sync), runs=2)
                flush()
                sync()
                note("judged", in_range(ranged, f"judged#{j}", lambda: (gemm(), reference_rows(), flush(), gemm()),
                                        sync), runs=2)

        try:
            t0 = clock()
            launches = prof.profile_passes(run_pass, "idle#0", max_ranges=capacity)
            row["profile_s"] = round(clock() - t0, 4)
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"profile: {type(exc).__name__}: {exc}"[:300]
            launches = []
        row["start_stop_s"] = [[round(x, 4) for x in p] for p in getattr(prof, "last_pass_s", [])]
        row["phase_s"] = {k: round(v, 4) for k, v in (prof.last_phase_s or {}).items()}
        row["cases"] = {k: {"push_ms": _med(v["push"]), "pop_ms": _med(v["pop"]),
                            "per_run_ms": _med([p + q for p, q in zip(v["push"], v["pop"])])} for k, v in times.items()}
        row["raw_ms"] = {k: {s: [round(x, 4) for x in xs] for s, xs in v.items()} for k, v in times.items()}
        # counts per run: `two` and `judged` hold two runs a range, `one` one
        by = {x.name: x.metrics for x in launches}

        def per_run(prefix: str, runs: int) -> dict[str, float]:
            got = [m for name, m in by.items() if name.split("#")[0] == prefix]
            keys = dict.fromkeys(k for m in got for k in m)
            return {k: statistics.fmean(m.get(k, math.nan) for m in got) / runs for k in keys} if got else {}

        one, two, judged = per_run("one", 1), per_run("two", 2), per_run("judged", 2)

        def drift(other: dict[str, float]) -> dict[str, float]:
            out_ = {}
            for k, v in one.items():
                w = other.get(k)
                if w is None or not (math.isfinite(v) and math.isfinite(w)):
                    continue
                if v == 0 and w == 0:
                    continue
                out_[k] = round(w / v, 4) if v else math.inf
            return dict(sorted(out_.items(), key=lambda kv: -abs(math.log(kv[1])) if 0 < kv[1] < math.inf else -1e9))

        row["counts_one"] = one
        row["two_over_one"] = drift(two)  # 1.0: the range's counts per run are one run's
        row["judged_over_one"] = drift(judged)
        with contextlib.suppress(Exception):
            prof.close()

    if args.each:
        out["each"] = each_metric(cupti, check, gemm, flush, sync, clock, in_range)
    # last: it leaves a pass abandoned on an enabled object, which nothing after it should inherit
    out["restart"] = restart_probe(cupti, check, gemm, sync, clock)
    table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


def each_metric(cupti, metrics: list[str], gemm, flush, sync, clock, in_range, runs: int = 4) -> dict:
    """Each metric in a configuration of its own: its passes, the first Start, push and pop after a
    drain (medians of `runs` ranges a pass): which counters make a range cost 0.6 ms."""
    out: dict = {}
    for m in metrics:
        row: dict = {}
        out[m] = row
        pp: list[tuple[float, float]] = []
        prof = None

        def run_pass(i, ranged, pp=pp):
            for j in range(runs):
                flush()
                sync()
                pp.append(in_range(ranged, f"m#{j}", gemm, sync))
        try:
            prof = cupti.RangeProfiler([m], replay="user")
            row["passes"] = prof.passes
            prof.profile_passes(run_pass, "m#0", max_ranges=runs)
            row["start_s"] = round(prof.last_pass_s[0][0], 4) if prof.last_pass_s else None
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            if prof is not None:
                with contextlib.suppress(Exception):
                    prof.close()
        row["push_ms"] = _med([a * 1e3 for a, _ in pp])
        row["pop_ms"] = _med([b * 1e3 for _, b in pp])
    return out


def restart_probe(cupti, metrics: list[str], gemm, sync, clock) -> dict:
    """Is the first Start's cost the enable's (paid once per enabled object: a second configuration
    on it starts cheap) or every configuration's? Start, one range, Stop (an abandoned pass), then
    the image initialised and SetConfig again on the same object, and Start timed again."""
    res: dict = {}
    try:
        prof = cupti.RangeProfiler(metrics, replay="user")
    except Exception as exc:  # noqa: BLE001
        return {"error": f"build: {exc}"[:300]}
    try:
        prof._capacity = 4
        for k in ("first", "second"):
            t0 = clock()
            obj, _ = prof._configure(cupti.USER_RANGE, cupti.USER_REPLAY)
            res[f"{k}_configure_s"] = round(clock() - t0, 4)
            t0 = clock()
            cupti._call("cuptiRangeProfilerStart", cupti.RPObject(pRangeProfilerObject=obj))
            res[f"{k}_start_s"] = round(clock() - t0, 4)
            with prof._ranged(obj, "restart", []):
                gemm()
                sync()
            t0 = clock()
            cupti._call("cuptiRangeProfilerStop", cupti.Stop(pRangeProfilerObject=obj))
            res[f"{k}_stop_s"] = round(clock() - t0, 4)
    except Exception as exc:  # noqa: BLE001
        res["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        with contextlib.suppress(Exception):
            prof.close()
    return res


def table(out: dict) -> None:
    print(f"{out['gpu']}: bf16 GEMM n={out['n']} {out['plain_gemm_ms']} ms plain; busy = {out['busy_ms']} ms queued")
    for which, row in out["sets"].items():
        print(f"\n[{which}] {row['metrics']} metrics, image for {row.get('capacity')} ranges, passes {row.get('passes')}, "
              f"instrumented {row.get('instrumented')}" + (f", ERROR {row['error']}" if row.get("error") else ""))
        if row.get("start_stop_s"):
            print(f"  Start/Stop s per pass: {row['start_stop_s']}  phases: {row.get('phase_s')}")
        print(f"  {'case':8} {'push ms':>9} {'pop ms':>9} {'per run ms':>11}")
        for k, v in (row.get("cases") or {}).items():
            note = {"busy": "  (~ busy_ms + idle push: CUPTI waits first; ~ busy_ms: its own part overlaps)",
                    "two": "  (a range over 2 runs, /2)", "judged": "  (2 runs + reference rows + flush, /2)"}.get(k, "")
            print(f"  {k:8} {v['push_ms']!s:>9} {v['pop_ms']!s:>9} {v['per_run_ms']!s:>11}{note}")
        for key, what in (("two_over_one", "a 2-run range (flush between) / one run"),
                          ("judged_over_one", "a 2-run range (judge rows + flush between) / one run")):
            d = row.get(key) or {}
            top = list(d.items())[:5]
            if top:
                print(f"  counts per run, {what}: " + ", ".join(f"{k.split('.')[0]} x{v}" for k, v in top))
    if out.get("restart"):
        print(f"\nthe check's set, a second configuration on the same enabled object: {out['restart']}")
    if out.get("each"):
        print(f"\neach metric alone:\n  {'metric':76} {'passes':>6} {'push ms':>8} {'pop ms':>8} {'Start s':>8}")
        for m, r in out["each"].items():
            print(f"  {m:76} {r.get('passes')!s:>6} {r.get('push_ms')!s:>8} {r.get('pop_ms')!s:>8} "
                  f"{r.get('start_s')!s:>8}" + (f"  ERROR {r['error']}" if r.get("error") else ""))


if __name__ == "__main__":
    raise SystemExit(main())
