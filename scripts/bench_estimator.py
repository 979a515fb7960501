"""The speedup estimator under the power cap (issue 44; figures for docs/BENCHMARKS.md).

At S=8192 the attention-backward pair (expert ~29 ms, cuDNN ~28 ms) holds the H200 at its power cap
and whichever side runs second in a pair runs up to 15% slower: per-pair ratios form two modes by
order, and the median of per-pair ratios falls on one mode or between them by chance. This script
records long runs of pairs exactly as tools.timing.paired_steps orders them (candidate first in
even pairs), each run prepared, flushed, gated and timed as a timed run is and each candidate run
judged on sampled rows, then cuts them into evaluation-sized phases and compares, per phase:

  old   the median of the per-pair ratios (the estimator until 2026-12-04)
  abba  the median over blocks of two adjacent pairs (opposite order) of the geometric mean of
        their two ratios, which cancels a multiplicative second-run penalty

with phases starting on either parity (the warm-up's random count decides which in an evaluation).
A/A blocks time the library against itself (true ratio 1.0). Blocks, most decisive first; each
stops at the deadline (a slice may be killed), every pair is written to OUT/pairs.jsonl.txt as it
is made, so `--analyse OUT/pairs.jsonl.txt` redoes the tables on a CPU machine.

    python3 scripts/bench_estimator.py --out OUT [--budget-s 70] [--blocks bwd8192,aa_bwd8192,...]
    python scripts/bench_estimator.py --analyse OUT/pairs.jsonl.txt [--phase 12]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# name: (task, workload, kind, pairs); "aa": the library timed against a second instance of itself
BLOCKS = {
    "bwd8192": ("mha_bwd_d128", "S8192", "expert", 64),
    "aa_bwd8192": ("mha_bwd_d128", "S8192", "aa", 48),
    "gemm8192": ("gemm_n7168_k5120", "M8192", "expert", 48),
    "fwd4096": ("mha_fwd_d128", "S4096", "expert", 48),
    "bwd4096": ("mha_bwd_d128", "S4096", "expert", 48),
    "gemm70": ("gemm_n7168_k5120", "M70", "expert", 64),
    "aa_gemm8192": ("gemm_n7168_k5120", "M8192", "aa", 48),
    "aa_fwd4096": ("mha_fwd_d128", "S4096", "aa", 48),
}


def run_blocks(out: Path, names: list[str], budget_s: float) -> None:
    from diag_counted_slowdown import Diag

    t0 = time.monotonic()
    deadline = t0 + budget_s
    d = Diag(out, deadline)
    d.runs.close()
    d.runs = open(out / "pairs.jsonl.txt", "a")
    for name in names:
        task, workload, kind, pairs = BLOCKS[name]
        if d.left() < 4:
            print(f"{name}: not started (deadline)", flush=True)
            continue
        try:
            run_block(d, name, task, workload, kind, pairs, t0)
        except Exception as exc:  # noqa: BLE001 - one block's failure must not cost the others
            print(f"{name}: stopped: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        import torch

        torch.cuda.empty_cache()
    d.runs.close()


def run_block(d, name: str, task: str, workload: str, kind: str, pairs: int, t0: float) -> int:
    from diag_counted_slowdown import Case
    from tasks.families.baselines import make_baseline
    from tools.timed import library_side
    from tools.timing import _cold_run
    from tools.workspace import Failed

    case = Case(d.state, task, workload)
    if kind == "aa":  # a second instance of the same library, its inputs loaded as the library's are
        lib = make_baseline(case.task, case.ws.inputs, case.backend)
        prepare = lib.prepare
        lib.prepare = lambda prepare=prepare: (case.judge.inputs_for_run(), prepare())
        cand = library_side(case.backend, lib, case.ws.inputs)
        cand.name = "candidate"
    else:
        cand = case.candidate(d.released)
    n = 0
    for i in range(-2, pairs):  # two warm pairs (first calls), not recorded
        if d.left() < 2:
            break
        nv = d.nvml_state(d.nvml)
        case.judge.before_pair(max(i, 0), 99)
        sides = [cand, case.library]
        if i % 2:
            sides.reverse()
        ev = {s.name: _cold_run(s, d.state) for s in sides}
        d.state.wait(60)
        c, b = ev["candidate"], ev[case.library.name]
        failed = None
        if kind == "expert":
            try:
                case.judge.after_pair(max(i, 0), 99)
            except Failed as exc:  # a judge verdict is not this script's subject: record it, go on
                failed = f"{exc.reason}: {exc.detail}"[:300]
                case.judge._generated = None
                print(f"{name} pair {i}: {failed}", flush=True)
        else:
            case.judge._generated = None
        if i < 0:
            continue
        d.record(block=name, kind=kind, i=i, cand_first=i % 2 == 0, cand_ms=round(c[0].elapsed_time(c[1]), 5),
                 lib_ms=round(b[0].elapsed_time(b[1]), 5), library=case.backend, failed=failed, **nv)
        n += 1
    print(f"{name}: {n} pairs at {time.monotonic() - t0:.1f} s", flush=True)
    return n


def old_estimate(ratios: list[float]) -> float:
    return statistics.median(ratios)


def abba_estimate(ratios: list[float]) -> float:
    """Median over blocks of two adjacent pairs of the geometric mean of their ratios (an odd last
    pair dropped)."""
    return statistics.median(math.sqrt(ratios[k] * ratios[k + 1]) for k in range(0, len(ratios) - 1, 2))


def split_estimate(ratios: list[float]) -> float:
    """The geometric mean of the two orders' medians (candidate first, candidate second)."""
    a, b = ratios[0::2], ratios[1::2]
    return math.sqrt(statistics.median(a) * statistics.median(b)) if b else statistics.median(a)


def _spread(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(xs)
    return m, (statistics.pstdev(xs) / m if len(xs) > 1 else 0.0), (max(xs) - min(xs)) / m


def _ci_width(xs: list[float], resamples: int = 1000) -> float:
    import numpy as np

    x = np.asarray(xs)
    g = np.random.default_rng(1)
    meds = np.median(x[g.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    lo, hi = np.quantile(meds, [0.025, 0.975])
    return float(math.log(hi / lo))


def analyse(path: Path, phase: int) -> list[dict]:
    from tools.timing import median_ci

    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    by: dict[str, list[dict]] = {}
    for r in rows:
        if "cand_ms" in r and r.get("block") in BLOCKS:
            by.setdefault(r["block"], []).append(r)
    out = []
    print(f"windows of {phase}-{phase + 5} pairs at every start (both parities): estimator mean, CV, range, "
          f"median 95% interval width (log %)")
    print(f"{'block':>12} {'n':>4} {'r first':>8} {'r second':>8} {'all ABBA':>8} | {'k':>3} "
          f"{'old mean':>8} {'CV%':>5} {'rng%':>5} {'ci%':>5} | {'abba mean':>9} {'CV%':>5} {'rng%':>5} {'ci%':>5} | "
          f"{'split':>7} {'CV%':>5} {'rng%':>5} | cover old/abba")
    for name, rs in by.items():
        rs.sort(key=lambda r: r["i"])
        ratios = [r["lib_ms"] / r["cand_ms"] for r in rs]
        first = [x for x, r in zip(ratios, rs) if r["cand_first"]]
        second = [x for x, r in zip(ratios, rs) if not r["cand_first"]]
        olds, abbas, splits, wo, wa, co, ca = [], [], [], [], [], [], []
        old_all, abba_all = old_estimate(ratios), abba_estimate(ratios)
        # every window of phase .. phase+5 pairs (an evaluation's drawn count at a 1 s budget: 10-15),
        # at every start: both parities of the first pair, odd and even counts
        for length in range(phase, phase + 6):
            for start in range(0, len(ratios) - length + 1):
                seg = ratios[start:start + length]
                olds.append(old_estimate(seg))
                abbas.append(abba_estimate(seg))
                splits.append(split_estimate(seg))
                if start % 3 == 0:  # the interval on a third of them (the bootstrap is the slow part)
                    wo.append(_ci_width(seg))
                    wa.append(_ci_width([math.sqrt(seg[k] * seg[k + 1]) for k in range(0, len(seg) - 1, 2)]))
                    # does the window's interval (the evaluator's: tools.timing.median_ci) hold the
                    # estimator's value over the whole block (its long-run value)?
                    lo, hi = median_ci(seg, random.Random(start))
                    co.append(lo <= old_all <= hi)
                    lo, hi = median_ci([math.sqrt(seg[k] * seg[k + 1]) for k in range(0, len(seg) - 1, 2)],
                                       random.Random(start))
                    ca.append(lo <= abba_all <= hi)
        if not olds:
            continue
        om, ocv, orng = _spread(olds)
        am, acv, arng = _spread(abbas)
        sm, scv, srng = _spread(splits)
        row = {"block": name, "pairs": len(ratios), "median_first": statistics.median(first) if first else None,
               "median_second": statistics.median(second) if second else None, "abba_all": abba_estimate(ratios),
               "phase": phase, "phases": len(olds), "old": {"mean": om, "cv": ocv, "range": orng, "values": olds,
                                                             "ci_log_width": statistics.median(wo),
                                                             "coverage": statistics.fmean(co)},
               "abba": {"mean": am, "cv": acv, "range": arng, "values": abbas, "ci_log_width": statistics.median(wa),
                        "coverage": statistics.fmean(ca)},
               "split": {"mean": sm, "cv": scv, "range": srng, "values": splits},
               "cand_ms": statistics.median(r["cand_ms"] for r in rs), "lib_ms": statistics.median(r["lib_ms"] for r in rs)}
        out.append(row)
        f = lambda v: f"{v:8.4f}" if v is not None else f"{'-':>8}"  # noqa: E731
        print(f"{name:>12} {len(ratios):4d} {f(row['median_first'])} {f(row['median_second'])} {f(row['abba_all'])} | "
              f"{len(olds):3d} {om:8.4f} {100 * ocv:5.2f} {100 * orng:5.2f} {100 * row['old']['ci_log_width']:5.2f} | "
              f"{am:9.4f} {100 * acv:5.2f} {100 * arng:5.2f} {100 * row['abba']['ci_log_width']:5.2f} | "
              f"{sm:7.4f} {100 * scv:5.2f} {100 * srng:5.2f} | {statistics.fmean(co):.2f}/{statistics.fmean(ca):.2f}",
              flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--blocks", default=",".join(BLOCKS))
    ap.add_argument("--budget-s", type=float, default=70.0)
    ap.add_argument("--analyse", help="a pairs.jsonl.txt to analyse (no GPU)")
    ap.add_argument("--phase", type=int, default=10, help="the fewest pairs of a simulated evaluation (windows of it to it+5)")
    args = ap.parse_args()
    if args.analyse:
        if not Path(args.analyse).is_file():
            print(f"bench_estimator: no such file: {args.analyse}", file=sys.stderr)
            return 2
        for p in (args.phase, 2 * args.phase):
            analyse(Path(args.analyse), p)
        return 0
    names = [b for b in args.blocks.split(",") if b]
    unknown = [b for b in names if b not in BLOCKS]
    if unknown:
        print(f"bench_estimator: unknown block(s) {unknown}; known: {list(BLOCKS)}", file=sys.stderr)
        return 2
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")  # the measurement needs one (--analyse does not)
    if not args.out:
        print("bench_estimator: --out or --analyse is required", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_blocks(out, names, args.budget_s)
    for p in (args.phase, 2 * args.phase):
        rows = analyse(out / "pairs.jsonl.txt", p)
        (out / f"analysis_p{p}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
