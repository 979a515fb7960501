"""Issue 42 items 3/7: what happens when EVERY timed candidate run sits in a CUPTI user range of its
pass's config (the construction "the timed runs are themselves counted"), against plain pairs and
against the padding (a host pause matching CUPTI's push and pop) the tree uses today; and the
library's side with the same range (or pause) or without. One process, the shipped experts, each
run prepared, gated, timed and judged (sampled rows) as a timed run is; pairs ordered as
tools.timing.paired_steps orders them (candidate first in even pairs, second in odd ones).

Conditions (one row per pair, OUT/runs.jsonl.txt):
  plain        no CUPTI session
  rng_cand     a user-replay session of the check's metric set; every candidate run of every pass in a
               range of its own (c<j>, the same names each pass), the drain before push and pop as
               tools.counted does; the library outside any range
  rng_both     the same, the library's run in a range of its own too (l<j>)
  pad_cand     no session; every candidate run padded (drain, host pause = the push, run, drain, pause = the pop)
  pad_both     the same on the library's runs too

Blocks, most decisive first (a slice may be killed; each prints its table when it ends):
  S  bwd S8192: plain / rng_cand / rng_both / pad_cand, two rounds (drift)
  M  GEMM M70: plain / pad_cand / pad_both / rng_cand / rng_both, two rounds: the speedup by condition
  N  CUPTI naming: one range name repeated within a pass; unequal range counts across passes (GEMM M70)
  G  GEMM M8192: plain / rng_cand / rng_both

    python3 scripts/diag_ranged.py --out OUT [--blocks S,M,N,G] [--budget-s 100]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from diag_counted_slowdown import Case, nvsmi_logger  # noqa: E402


class Diag:
    def __init__(self, out: Path, deadline: float):
        from tools.worker import State, _nvml_handle, _nvml_state

        self.state = State()
        self.nvml, self.nvml_state = _nvml_handle(), _nvml_state
        self.runs = open(out / "runs.jsonl.txt", "a")
        self.deadline = deadline
        self.push_pop = {"push": 0.00063, "pop": 0.00063}  # until a session measured them (H200, 22 metrics)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, **row) -> None:
        self.runs.write(json.dumps(row) + "\n")
        self.runs.flush()

    def drain(self) -> None:
        end = time.perf_counter() + 30
        while self.state.stream_busy() and time.perf_counter() < end:
            pass

    def spin(self, s: float) -> None:
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    def ranged(self, ranged, label: str, costs: list):
        @contextlib.contextmanager
        def ctx():
            self.drain()
            t0 = time.perf_counter()
            with ranged(label):
                push = time.perf_counter() - t0
                yield
                self.drain()
                t1 = time.perf_counter()
            costs.append((push, time.perf_counter() - t1))
        return ctx

    def padded(self):
        @contextlib.contextmanager
        def ctx():
            self.drain()
            self.spin(self.push_pop["push"])
            yield
            self.drain()
            self.spin(self.push_pop["pop"])
        return ctx

    def pair(self, case: Case, i: int, block: str, cond: str, cand_around=None, lib_around=None, **tags) -> dict:
        from tools.timing import _cold_run

        nv = self.nvml_state(self.nvml)
        t0 = time.perf_counter()
        case.judge.before_pair(i, 99)
        cand = case.candidate([])
        cand.around = cand_around
        case.library.around = lib_around
        sides = [cand, case.library]
        if i % 2:
            sides.reverse()
        ev = {s.name: _cold_run(s, self.state) for s in sides}
        self.state.wait(60)
        c, lib = ev["candidate"], ev[case.library.name]
        cm, lm = c[0].elapsed_time(c[1]), lib[0].elapsed_time(lib[1])
        judged = "ok"
        try:
            case.judge.after_pair(i, 99)
        except Exception as exc:  # noqa: BLE001 - a diagnostic: a judge's verdict is recorded, the pairs go on
            judged = f"{type(exc).__name__}: {exc}"[:300]
            print(f"  judge on {case.name} pair {i} ({cond}): {judged}", flush=True)
        row = {"judged": judged, "block": block, "case": case.name, "cond": cond, "i": i, "cand_first": i % 2 == 0,
               "cand_ms": round(cm, 5), "lib_ms": round(lm, 5), "ratio": round(lm / cm, 5) if cm > 0 else None,
               "pair_s": round(time.perf_counter() - t0, 4), **nv, **tags}
        self.record(**row)
        return row

    def plain(self, case, block, cond, n, start=0, pad_cand=False, pad_both=False):
        return [self.pair(case, start + i, block, cond, cand_around=self.padded() if pad_cand else None,
                          lib_around=self.padded() if pad_both else None) for i in range(n)]

    def session(self, case: Case, block: str, cond: str, per_pass: int, lib_ranged: bool) -> list[dict]:
        """A user-replay session of the check's metric set; every candidate run of each pass in its
        own range (and the library's where lib_ranged); returns the pair rows, records the per-range
        values and CUPTI's costs."""
        from tools import cupti
        from tools.credit import GMMA_METRIC, credit_metrics

        metrics = list(credit_metrics())
        cupti.MAX_RANGES = max(64, 2 * per_pass + 2)
        t0 = time.perf_counter()
        prof = cupti.RangeProfiler(metrics, replay="user")
        rows: list[dict] = []
        costs: list = []
        n = [0]

        def run_pass(p: int, ranged) -> None:
            for j in range(per_pass):
                rows.append(self.pair(case, n[0], block, cond,
                                      cand_around=self.ranged(ranged, f"c{j}", costs),
                                      lib_around=self.ranged(ranged, f"l{j}", []) if lib_ranged else None,
                                      pass_=p, passes=prof.passes))
                n[0] += 1

        err, got = None, []
        try:
            got = prof.profile_passes(run_pass, "diag")
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say it and go on
            err = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            with contextlib.suppress(Exception):
                prof.close()
        if costs:
            self.push_pop = {"push": statistics.median(c[0] for c in costs),
                             "pop": statistics.median(c[1] for c in costs)}
        g = {x.name: x.metrics.get(GMMA_METRIC) for x in got}
        cand_g = [v for k, v in g.items() if k.startswith("c") and v is not None]
        self.record(block=block, case=case.name, cond=cond, kind="session", passes=prof.passes, error=err,
                    seconds=round(time.perf_counter() - t0, 3), phase_s=prof.last_phase_s,
                    start_stop_s=prof.last_pass_s, push_pop_ms=[[round(a * 1e3, 4), round(b * 1e3, 4)] for a, b in costs],
                    ranges=len(got), values={x.name: x.metrics for x in got})
        print(f"  session {case.name} {cond}: {prof.passes} passes, {len(got)} ranges, {time.perf_counter() - t0:.2f} s "
              f"(decode {prof.last_phase_s.get('decode', 0):.3f} s, setup {prof.last_phase_s.get('setup', 0):.3f}); "
              f"push/pop med {self.push_pop['push'] * 1e3:.3f}/{self.push_pop['pop'] * 1e3:.3f} ms; "
              f"gmma per cand range min/max {min(cand_g, default=None)}/{max(cand_g, default=None)}; "
              f"lib ranges gmma {[v for k, v in g.items() if k.startswith('l')][:3]}; err {err}", flush=True)
        return rows


def table(title: str, rows: list[dict]) -> None:
    groups: dict = {}
    for r in rows:
        groups.setdefault(r["cond"], []).append(r)
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    print(f"\n== {title}")
    print(f"{'cond':>10} {'n':>3} {'ratio med':>9} {'ratio 1st':>9} {'ratio 2nd':>9} | {'cand 1st':>8} {'cand 2nd':>8} "
          f"| {'lib 1st':>8} {'lib 2nd':>8} | {'W':>4} {'MHz':>5}")
    for cond, rs in groups.items():
        first = [r for r in rs if r["cand_first"]]
        second = [r for r in rs if not r["cand_first"]]
        print(f"{cond:>10} {len(rs):3d} {med([r['ratio'] for r in rs]):9.4f} {med([r['ratio'] for r in first]):9.4f} "
              f"{med([r['ratio'] for r in second]):9.4f} | {med([r['cand_ms'] for r in first]):8.4f} "
              f"{med([r['cand_ms'] for r in second]):8.4f} | {med([r['lib_ms'] for r in second]):8.4f} "
              f"{med([r['lib_ms'] for r in first]):8.4f} | {med([r.get('power_w', 0) for r in rs]):4.0f} "
              f"{med([r.get('sm_mhz', 0) for r in rs]):5.0f}", flush=True)
    print("(cand 1st/2nd: the candidate's run when it runs first/second in its pair; lib 1st/2nd: the library's run "
          "when IT runs first/second)")


def block_s(d: Diag, bwd: Case) -> None:
    rows = []
    for r in range(2):
        if d.left() < 30:
            break
        rows += d.plain(bwd, "S", "plain", 6)
        rows += d.session(bwd, "S", "rng_cand", 4, False)
        rows += d.session(bwd, "S", "rng_both", 4, True)
        rows += d.plain(bwd, "S", "pad_cand", 6, pad_cand=True)
    table("S: bwd S8192 (every candidate run ranged vs plain vs padded)", rows)


def block_m(d: Diag, gemm: Case, tag: str = "M", rounds: int = 2) -> None:
    rows = []
    for r in range(rounds):
        if d.left() < 15:
            break
        rows += d.plain(gemm, tag, "plain", 16)
        rows += d.session(gemm, tag, "rng_cand", 8, False)
        rows += d.plain(gemm, tag, "pad_cand", 16, pad_cand=True)
        rows += d.session(gemm, tag, "rng_both", 8, True)
        rows += d.plain(gemm, tag, "pad_both", 16, pad_cand=True, pad_both=True)
    table(f"{tag}: {gemm.name} speedup by condition", rows)


def block_n(d: Diag, gemm: Case) -> None:
    """How CUPTI decodes one name pushed several times a pass, and unequal range counts across passes."""
    from tools import cupti
    from tools.credit import GMMA_METRIC, credit_metrics
    from tools.timing import _cold_run

    def run(ranged_ctx):
        gemm.judge.before_pair(0, 99)
        side = gemm.candidate([])
        side.around = ranged_ctx
        _cold_run(side, d.state)
        d.state.wait(60)
        gemm.judge._generated = None

    for name, counts, same in (("same name x3", None, True), ("counts 3/2/3/3", [3, 2, 3, 3], False),
                               ("names per pass", None, "pass")):
        prof = cupti.RangeProfiler(list(credit_metrics()), replay="user")
        raw: list = []
        orig = prof._ranges

        def spy(obj, data, orig=orig, raw=raw):
            out = orig(obj, data)
            raw.extend(out)
            return out
        prof._ranges = spy

        def run_pass(p, ranged, counts=counts, same=same):
            k = 3 if counts is None else counts[p % len(counts)]
            for j in range(k):
                run(d.ranged(ranged, f"p{p}c{j}" if same == "pass" else "same" if same else f"c{j}", []))
        err = None
        try:
            prof.profile_passes(run_pass, "n")
        except Exception as exc:  # noqa: BLE001
            err = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            with contextlib.suppress(Exception):
                prof.close()
        summary = [(n, v.get(GMMA_METRIC), len(v)) for n, v in raw]
        d.record(block="N", kind=name, error=err, raw=[(n, v) for n, v in raw])
        print(f"  N {name}: passes {prof.passes}, err {err}, ranges decoded {summary}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--blocks", default="S,M,N,G")
    ap.add_argument("--budget-s", type=float, default=100.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    blocks = args.blocks.split(",")
    logger = nvsmi_logger(out / "nvsmi.csv")
    t0 = time.perf_counter()
    try:
        d = Diag(out, time.monotonic() + args.budget_s)
        for b in blocks:
            if d.left() < 10:
                print(f"stopped before block {b} (budget)", flush=True)
                break
            t1 = time.perf_counter()
            if b == "S":
                bwd = Case(d.state, "mha_bwd_d128", "S8192")
                for i in range(2):
                    d.pair(bwd, i, "warm", "warm")
                block_s(d, bwd)
                del bwd
            elif b in ("M", "N"):
                gemm = getattr(d, "m70", None) or Case(d.state, "gemm_n7168_k5120", "M70")
                d.m70 = gemm
                if b == "M":
                    for i in range(3):
                        d.pair(gemm, i, "warm", "warm")
                    block_m(d, gemm)
                else:
                    block_n(d, gemm)
            elif b == "G":
                g = Case(d.state, "gemm_n7168_k5120", "M8192")
                for i in range(2):
                    d.pair(g, i, "warm", "warm")
                block_m(d, g, "G", rounds=1)
            print(f"block {b}: {time.perf_counter() - t1:.1f} s", flush=True)
    finally:
        if logger is not None:
            logger.terminate()
    print(f"\ndone in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
