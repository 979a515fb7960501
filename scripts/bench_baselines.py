"""Every library baseline of every task on this GPU, timed as the evaluator times it, with
and without the stream gate (tools/timing.py), on each task's first visible workload.

For each backend tasks.families.baselines offers: cold runs (fresh L2, outputs scrubbed after each run,
as in an evaluation), `--runs` with the gate and as many without, interleaved in blocks so
drift hits both alike; the median ms, TFLOP/s (task FLOPs) and GB/s (compulsory bytes,
Task.min_bytes). The ungated column is what the evaluator measured before the gate: where it
is well above the gated one, the library's host wrapper was being timed.

    python3 scripts/bench_baselines.py [--tasks gdn_decode_qk4_v8_d128_k_last,...] [--out runs/baselines]

Writes OUT/baselines.json and OUT/baselines.md. Runs in one process on the GPU (no worker).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for tools/ and tasks/

DEFAULT_TASKS = ("gemm_n7168_k5120,mha_fwd_d128,mha_bwd_d128,mha_fwd_d256,mha_bwd_d256,"
                 "fp8_gemm_nt_1d2d_n4096_k7168,fp8_mha_with_lse_d64,fp8_mha_with_lse_d128,"
                 "fp8_mha_with_lse_d128_causal,fp8_mha_with_lse_d256,"
                 "gdn_decode_qk4_v8_d128_k_last,gdn_decode_qk8_v16_d128_k_last,"
                 "gdn_prefill_qk4_v8_d128_k_last,gdn_prefill_qk8_v16_d128_k_last")


def bench_task(name: str, state, runs: int, blocks: int) -> list[dict]:
    from tasks import get_task
    from tasks.families.baselines import list_backends, make_baseline
    from tasks.generators import generate_inputs
    from tools.timing import Side, measure
    from tools.timed import library_side

    task = get_task(name)
    wl = task.workloads_for("visible")[0]
    axes = task.axis_values(wl)
    inputs = generate_inputs(task, axes, seed=1, device="cuda", fast=True)
    rows = []
    for backend in list_backends(task):
        row = {"task": name, "workload": wl.name, "backend": backend}
        try:
            side = library_side(backend, make_baseline(task, inputs, backend), inputs)
            t0 = time.perf_counter()
            measure(side, state, 3, 600.0)  # first use: Triton autotune, cuDNN plan build
            row["first_use_s"] = time.perf_counter() - t0
            plain = Side(side.name + " ungated", side.run, side.prepare, side.finish, gated=False)
            gated, ungated = [], []
            for _ in range(blocks):
                gated += measure(side, state, runs // blocks, 60.0)
                ungated += measure(plain, state, runs // blocks, 60.0)
        except Exception as exc:  # noqa: BLE001 - a backend that refuses this GPU or shape: say so, go on
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(f"[baseline] {name} {backend}: {row['error']}", flush=True)
            continue
        ms, ms_ungated = statistics.median(gated), statistics.median(ungated)
        row.update(ms=ms, ms_ungated=ms_ungated, cv=statistics.pstdev(gated) / statistics.mean(gated),
                   still_gated=side.gated, runs=len(gated),
                   tflops=task.flop_count(axes) / ms / 1e9, gbps=task.min_bytes(axes) / ms / 1e6)
        rows.append(row)
        print(f"[baseline] {name} {backend}: {ms:.4f} ms gated (CV {row['cv']:.2%}), "
              f"{ms_ungated:.4f} ms ungated, {row['tflops']:.1f} TFLOP/s, {row['gbps']:.0f} GB/s", flush=True)
    return rows


def markdown(rows: list[dict], gpu: str) -> str:
    out = [f"Library baselines on {gpu} (first visible workload, cold runs, median)", "",
           "| task | backend | ms (gated) | CV | ms ungated | ungated/gated | TFLOP/s | GB/s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['task']} | {r['backend']} | {r['error']} | | | | | |")
            continue
        out.append(f"| {r['task']} | {r['backend']} | {r['ms']:.4f} | {r['cv']:.2%} | {r['ms_ungated']:.4f} | "
                   f"{r['ms_ungated'] / r['ms']:.2f} | {r['tflops']:.1f} | {r['gbps']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=DEFAULT_TASKS)
    ap.add_argument("--runs", type=int, default=30, help="gated runs per backend (and as many ungated)")
    ap.add_argument("--blocks", type=int, default=3, help="alternations of gated and ungated blocks")
    ap.add_argument("--out", default="runs/baselines")
    args = ap.parse_args(argv)
    from tools.evaluator import require_gpu

    require_gpu(f"scripts/{Path(__file__).name}")
    import torch

    from tools.worker import State

    state = State()
    if state.gate is None:
        print(f"no stream gate: {state.gate_error}", file=sys.stderr)
        return 1
    gpu = torch.cuda.get_device_name()
    rows = []
    for name in [t for t in args.tasks.split(",") if t]:
        rows += bench_task(name, state, args.runs, args.blocks)
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "baselines.json").write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "rows": rows}, indent=1))
    (out / "baselines.md").write_text(markdown(rows, gpu))
    print(markdown(rows, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
