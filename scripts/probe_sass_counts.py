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

    python scripts/probe_sass_counts.py [--json OUT]
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
    args = ap.parse_args()
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
    counter = cupti.SassCounter()
    run = lambda m: (lambda: t._launch(m, src, sink, tmap, 0))  # noqa: E731
    step("A", lambda: len(counter.collect(run(a))))
    b = Module(cubin)
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


if __name__ == "__main__":
    sys.exit(main())
