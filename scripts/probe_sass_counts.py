"""Why does a second collect of CUPTI's SASS metrics return no records (issue 42 item 7, part 3)?
On this GPU, in one process, with tests/gpu/test_sass_counts_gpu.py's kernel (a plain bulk copy, mode 0):
each step prints how many per-instruction records a collect (tools.cupti.SassCounter) returned.

  A        module A, loaded before the counter exists, collected (the first collect)
  B        module B, the same cubin, loaded after A's collect
  A again  module A collected a second time
  C        module C, another cubin (one instruction differs), loaded after the first collect
  D        module D, the same cubin as A, loaded while the API is enabled (inside the collect)
  B eager  module B collected with lazy patching off
  reset    the configuration unset and set again, then B collected
  reinit   the profiler API deinitialized and initialized, the configuration set again, then B collected

On the H200 (2026-12-03): A 92 records, every later step 0 (reset and reinit: SetConfig answers
OUT_OF_MEMORY). The worker's path differs: its range profiler runs a session before every SASS-metrics
collect. `--range-first` runs one range-profiler session (one pass, one range around a launch of A)
before the counter exists and another between the collects of A and B. `--evaluations N`: the worker's
own path, the dead_bulk_copy credit fixture (tests/credit_fixtures.py: plain bulk copies in the module)
evaluated N times in one worker, printing whether each workload's exact counts came back.

    python scripts/probe_sass_counts.py [--range-first] [--evaluations N] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--range-first", action="store_true")
    ap.add_argument("--evaluations", type=int, default=0)
    args = ap.parse_args()
    if args.evaluations:
        return evaluations(args.evaluations, args.json)
    import torch
    import test_sass_counts_gpu as t

    from tools import cupti
    from tools.compile import compile_source
    from tools.launch import Module, TensorMapPlan, encode_tensor_map

    src = torch.randint(0, 255, (t.ROWS, 256), dtype=torch.uint8, device="cuda")
    sink = torch.zeros(t.GRID * 128, dtype=torch.int32, device="cuda")
    cubin, _ = t.compiled()
    other = compile_source(t.SOURCE.replace("x ^= buf[i]", "x += buf[i]"), "cuda", "sm_90a")
    assert other.ok, other.error
    tmap = encode_tensor_map(TensorMapPlan("tm", "src", "uint8", (t.ROWS, 256), (16, 256), (1, 1), "none", "none",
                                           "zero"), src.data_ptr())
    out: dict = {}

    def step(name: str, fn) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a probe reports every step
            out[name] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"{name:>8}: {out[name]}", flush=True)

    a = Module(cubin)
    run = lambda m: (lambda: t._launch(m, src, sink, tmap, 0))  # noqa: E731

    def range_session(m) -> int:
        prof = cupti.RangeProfiler(["smsp__inst_executed.sum"], replay="user")

        def one_pass(i, ranged):
            with ranged():
                t._launch(m, src, sink, tmap, 0)
        try:
            return len(prof.profile_passes(one_pass, "probe"))
        finally:
            prof.close()

    if args.range_first:
        step("range", lambda: range_session(a))
    counter = cupti.SassCounter()
    step("A", lambda: len(counter.collect(run(a))))
    b = Module(cubin)
    if args.range_first:
        step("range B", lambda: range_session(b))
    step("B", lambda: len(counter.collect(run(b))))
    step("A again", lambda: len(counter.collect(run(a))))
    c = Module(other.cubin)
    step("C", lambda: len(counter.collect(run(c))))
    held: list = []

    def load_inside() -> None:
        held.append(Module(cubin))
        t._launch(held[-1], src, sink, tmap, 0)

    step("D", lambda: len(counter.collect(load_inside)))

    def eager(m) -> int:
        cupti._call("cuptiSassMetricsEnable", cupti.SassEnable(ctx=counter.ctx, enableLazyPatching=0))
        try:
            t._launch(m, src, sink, tmap, 0)
            props = cupti.SassDataProperties(ctx=counter.ctx)
            cupti._call("cuptiSassMetricsGetDataProperties", props)
            return int(props.numOfPatchedInstructionRecords)
        finally:
            cupti._call("cuptiSassMetricsDisable", cupti.SassDisable(ctx=counter.ctx))

    step("B eager", lambda: eager(b))

    def reset() -> int:
        counter.close()
        cupti._call("cuptiSassMetricsSetConfig", cupti.SassSetConfig(
            numOfMetricConfig=len(counter._configs), pConfigs=counter._configs, deviceIndex=counter.device_index))
        return len(counter.collect(run(b)))

    step("reset", reset)

    def reinit() -> int:
        counter.close()
        cupti._call("cuptiProfilerDeInitialize", cupti.Init())
        cupti._call("cuptiProfilerInitialize", cupti.Init())
        cupti._call("cuptiSassMetricsSetConfig", cupti.SassSetConfig(
            numOfMetricConfig=len(counter._configs), pConfigs=counter._configs, deviceIndex=counter.device_index))
        return len(counter.collect(run(b)))

    step("reinit", reinit)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def evaluations(n: int, json_out: str | None) -> int:
    """The worker's path: the dead_bulk_copy fixture evaluated n times in one worker (same cubin)."""
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    import credit_fixtures as fx

    from tools.evaluator import Evaluator

    out = []
    with tempfile.TemporaryDirectory() as tmp, Evaluator(cache_dir=Path(tmp) / "cache") as ev:
        sol = fx.FIXTURES["dead_bulk_copy"](Path(tmp) / "sol")
        for k in range(n):
            r = ev.evaluate(sol, fx.TASK, "sm_90a", workloads="visible", executed_check=True)
            for x in r.workloads:
                launch = ((x.credit or {}).get("launches") or [{}])[0]
                row = {"evaluation": k + 1, "workload": x.workload, "exact_runs": (x.credit or {}).get("exact_runs"),
                       "opcodes": launch.get("opcodes"), "missing": launch.get("opcodes_missing"),
                       "tma_carries": (r.executed.carries or {}).get("tma") if r.executed else None,
                       "counted_runs_s": r.phase_s.get("counted_runs")}
                out.append(row)
                print(json.dumps(row), flush=True)
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
