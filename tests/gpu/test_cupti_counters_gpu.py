"""What the in-process counters (tools.cupti, tools.credit.CUPTI_METRICS) read on four minimal
tensor-core kernels, on the H200: a bf16 and an e4m3 wgmma (SASS HGMMA / QGMMA), a bf16 and an
e4m3 mma.sync (SASS HMMA; on sm_90a ptxas turns e4m3 mma.sync into F2FP unpacks to f16 and
HMMA.16816.F32, tests/test_cupti_counter_kernels.py).

The FP8 rule of tools.credit.work_metrics counts a run's fp8 tensor ops as wgmma's only where no
warp-level MMA ran in it (read from the tensor pipe's instruction classes of the same run: the HMMA
class less HFMA2.MMA and the warpgroup MMAs; CUPTI describes the HMMA class as counting HGMMA and
QGMMA too). Asserted here, on the hardware: what the rule makes of an fp8 wgmma kernel's counters
(all its tensor math is wgmma's) and of an fp8 mma.sync kernel's (none of it is). What the wgmma
kernels read on HMMA_INST_METRIC is recorded, not asserted. (The probe kernels' SIMT work, fills
and index arithmetic, is large beside their 8 MMAs: the tensor-pipe part is what is asserted.)

Each kernel is launched once (4 CTAs, 8 MMAs per warp or warpgroup, all inputs 1.0, so every
accumulator ends at K x 8 whatever layout the descriptors describe) inside one
`RangeProfiler(CUPTI_METRICS).profile(run)`, then again by user replay (`profile_passes`, the
worker's way). Every value is printed and written as JSON to
$PTXBENCH_GPU_LOGS/cupti_counters.json (a temporary folder when unset).
"""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import pytest

from tools import credit

pytestmark = pytest.mark.gpu

ITERS, BLOCKS = 8, 4  # MMAs per warp (mma.sync) or warpgroup (wgmma); CTAs per launch
SOURCE = r"""
#include <ptxbench/wgmma.cuh>
using namespace ptxbench;
constexpr int ITERS = %ITERS%;
constexpr int TILE_BYTES = 4096;  // A (64 x 32 bytes) and B (8 x 32 bytes) fit with room to spare

// words[k] holds 1.0 of the input type (packed); read with volatile loads per MMA, so ptxas can
// neither fold the inputs nor merge identical MMAs (it does both for constant e4m3 mma.sync).
__device__ unsigned word(const unsigned* words, int k) {
  unsigned w;
  asm volatile("ld.volatile.global.u32 %0, [%1];\n" : "=r"(w) : "l"(words + k));
  return w;
}

// The shared tiles filled with 1.0; the proxy fence makes these generic writes visible to wgmma.
__device__ void fill_tiles(unsigned* a, unsigned* b, unsigned w) {
  for (int i = threadIdx.x; i < TILE_BYTES / 4; i += blockDim.x) a[i] = b[i] = w;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
}

__device__ void store(float* out, const float (&d)[4]) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = 0; i < 4; ++i) out[4 * t + i] = d[i];
}

// No swizzle: 8-row x 16-byte core matrices, 128 B apart along K (LBO), 256 B along M/N (SBO).
__device__ unsigned long long desc(const void* tile) { return wgmma_desc(tile, 128, 256, WGMMA_SWIZZLE_NONE); }

extern "C" __global__ void __launch_bounds__(128) wgmma_bf16(const unsigned* words, float* out) {
  __shared__ __align__(1024) unsigned a[TILE_BYTES / 4], b[TILE_BYTES / 4];
  fill_tiles(a, b, word(words, 0));
  const unsigned long long da = desc(a), db = desc(b);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < ITERS; ++k)
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %6, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n\t}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db), "r"(1));
  wgmma_commit();
  wgmma_wait<0>();
  store(out, d);
}

extern "C" __global__ void __launch_bounds__(128) wgmma_e4m3(const unsigned* words, float* out) {
  __shared__ __align__(1024) unsigned a[TILE_BYTES / 4], b[TILE_BYTES / 4];
  fill_tiles(a, b, word(words, 0));
  const unsigned long long da = desc(a), db = desc(b);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < ITERS; ++k)
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %6, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n\t}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db), "r"(1));
  wgmma_commit();
  wgmma_wait<0>();
  store(out, d);
}

extern "C" __global__ void __launch_bounds__(32) mma_sync_bf16(const unsigned* words, float* out) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < ITERS; ++k) {
    const unsigned w = word(words, k);
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %4, %4, %4}, {%4, %4}, "
                 "{%0, %1, %2, %3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(w));
  }
  store(out, d);
}

extern "C" __global__ void __launch_bounds__(32) mma_sync_e4m3(const unsigned* words, float* out) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < ITERS; ++k) {
    const unsigned w = word(words, k);
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %4, %4, %4}, {%4, %4}, "
                 "{%0, %1, %2, %3};\n" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(w));
  }
  store(out, d);
}
""".replace("%ITERS%", str(ITERS))

BF16_ONES, E4M3_ONES = 0x3F803F80, 0x38383838  # 1.0 packed twice (bf16) or four times (e4m3)


def _kernel(threads: int, word: int, m: int, k: int, warps_issuing: int) -> dict:
    """A probe kernel: its block, input word, MMA shape (M x 8 x K) and the warps that issue each MMA."""
    return {"threads": threads, "word": word, "shape": (m, 8, k), "warps": warps_issuing}


KERNELS = {
    "wgmma_bf16": _kernel(128, BF16_ONES, 64, 16, 4),
    "wgmma_e4m3": _kernel(128, E4M3_ONES, 64, 32, 4),
    "mma_sync_bf16": _kernel(32, BF16_ONES, 16, 16, 1),
    "mma_sync_e4m3": _kernel(32, E4M3_ONES, 16, 32, 1),
}


def expected(name: str) -> dict:
    """What a launch does, for reading the counters against: warp-level MMA instructions issued and
    FLOPs (2 x M x N x K per MMA), and the value every output element must end at."""
    spec = KERNELS[name]
    m, n, k = spec["shape"]
    return {"mma_warp_instructions": BLOCKS * spec["warps"] * ITERS, "flops": 2 * m * n * k * ITERS * BLOCKS,
            "output": float(k * ITERS)}


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """Every probe kernel launched once under one RangeProfiler with the in-process check's metric
    set: per kernel its launches, every metric, what work_metrics derives, and its output."""
    import torch
    from cuda.bindings import driver as d

    from tools.compile import compile_source
    from tools.cupti import RangeProfiler
    from tools.launch import Module, check

    torch.zeros(1, device="cuda")  # the primary context, current before the module loads (FACTS.md)
    # Kernel replay saves and restores the device memory in use at every pass: what torch's caching
    # allocator still holds from earlier tests in this process (judge power's full-size tensors, GBs)
    # made this fixture take 164 s of a call (H200, 2026-12-04). Hand it back first.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    comp = compile_source(SOURCE, "cuda", "sm_90a")
    assert comp.ok, comp.error
    module = Module(comp.cubin, comp.symbols)
    profiler = RangeProfiler(list(credit.CUPTI_METRICS))
    results: dict = {"metrics": list(credit.CUPTI_METRICS), "passes": profiler.passes, "chip": profiler.chip,
                     "iters": ITERS, "blocks": BLOCKS, "kernels": {}}
    def launcher(name: str, spec: dict):
        """The kernel's launch on fresh inputs (all 1.0) and output (poisoned), and that output."""
        words = torch.full((ITERS,), spec["word"], dtype=torch.int32, device="cuda")
        out = torch.full((BLOCKS * spec["threads"] * 4,), -1.0, device="cuda")
        args = (ctypes.c_uint64(words.data_ptr()), ctypes.c_uint64(out.data_ptr()))
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
        fn = module.function(name)

        def launch() -> None:
            _ = (words, args)  # kept alive as long as the launch: params holds only their addresses
            check(d.cuLaunchKernel(fn, BLOCKS, 1, 1, spec["threads"], 1, 1, 0, d.CUstream(0),
                                   ctypes.addressof(params), 0), f"cuLaunchKernel({name})")

        return launch, out

    def synchronize() -> None:
        check(d.cuCtxSynchronize(), "cuCtxSynchronize")

    try:
        for name, spec in KERNELS.items():
            launch, out = launcher(name, spec)
            print(f"kernel replay: {name}", flush=True)
            launches = profiler.profile(lambda launch=launch: (launch(), synchronize()))
            row = {"name": launches[0].name, "metrics": launches[0].metrics} if launches else None
            values = out.cpu()
            results["kernels"][name] = {
                "launches": len(launches), "range_name": row["name"] if row else None,
                "metrics": row["metrics"] if row else {},
                # the rule reads the tensor pipe's instruction classes of this run (no SASS fact)
                "work_metrics": credit.work_metrics(credit.counter_rows([row]))
                if row else {},
                "expected": expected(name),
                "output": {"min": float(values.min()), "max": float(values.max())},
            }
    finally:
        profiler.close()
    # The same launches by user replay (what the worker's counted runs use), by a profiler of its
    # own made after the kernel-replay one is closed: one launch per pass, inside a user range.
    user = None
    try:
        user = RangeProfiler(list(credit.CUPTI_METRICS), replay="user")
        results["user_passes"], results["user_instrumented_passes"] = user.passes, list(user.instrumented_passes)
        for name, spec in KERNELS.items():
            launch, _out = launcher(name, spec)

            def run_pass(i, ranged, launch=launch) -> None:
                with ranged():
                    launch()
                synchronize()

            print(f"user replay: {name}", flush=True)
            ranges = user.profile_passes(run_pass, name)
            results["kernels"][name]["user_ranges"] = [x.name for x in ranges]
            results["kernels"][name]["user_metrics"] = ranges[0].metrics if ranges else {}
            results["kernels"][name]["user_stops"] = user.last_stops
    finally:  # a profiler left initialised would hold the device's one profiling session (Nsight Compute next)
        if user is not None:
            user.close()
        module.unload()
    logs = os.environ.get("PTXBENCH_GPU_LOGS")
    report(results, (Path(logs) if logs else tmp_path_factory.mktemp("cupti_counters")) / "cupti_counters.json")
    return results


def report(results: dict, path: Path) -> None:
    """Print every kernel's counters and write them all as JSON to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True))
    print(f"\ncupti counters on {results['chip']} ({results['passes']} passes), written to {path}")
    for name, r in results["kernels"].items():
        print(f"== {name}: {r['launches']} launch(es) ({r['range_name']}), expected {r['expected']}, output {r['output']}")
        for metric, value in r["metrics"].items():
            print(f"   {metric:70s} {value:,.0f}")
        print(f"   work_metrics: wgmma_flops {r['work_metrics'].get('wgmma_flops')} "
              f"other_flops {r['work_metrics'].get('other_flops')}")
    bf16 = results["kernels"]["wgmma_bf16"]["metrics"]
    print(f"OPEN QUESTION: bf16 wgmma (HGMMA only) reads {credit.HMMA_INST_METRIC} = {bf16.get(credit.HMMA_INST_METRIC)} "
          f"(its GMMA instructions: {bf16.get(credit.GMMA_METRIC)})")
    # sm_90a has no fp8 mma.sync datapath (ptxas unpacks to f16, tests/test_cupti_counter_kernels.py):
    # if this reads 0, fp8 ops on Hopper come from QGMMA only, and the rule needs no HMMA gate there
    fp8_sync = results["kernels"]["mma_sync_e4m3"]["metrics"]
    print(f"fp8 mma.sync reads {credit.FP8_OPS_METRIC} = {fp8_sync.get(credit.FP8_OPS_METRIC)}, "
          f"sm__ops_path_tensor_op_hmma_src_fp16.sum = {fp8_sync.get('sm__ops_path_tensor_op_hmma_src_fp16.sum')}")


def _counters(measured: dict, name: str) -> tuple[dict, str]:
    """A kernel's metric values, and every value in one line for an assertion's message."""
    r = measured["kernels"][name]
    assert r["launches"] == 1, f"{name}: {r['launches']} profiled launches, expected 1"
    shown = f"{name}: " + ", ".join(f"{m}={v:g}" for m, v in r["metrics"].items()) + \
        f"; work_metrics {r['work_metrics']}; expected {r['expected']}"
    return r["metrics"], shown


def test_probe_kernels_compute_what_they_should(measured):
    """Every accumulator ends at K x ITERS: the kernels did their MMAs (else fix this test's kernels,
    and read none of the counter verdicts below)."""
    for name, r in measured["kernels"].items():
        want = r["expected"]["output"]
        assert r["output"] == {"min": want, "max": want}, f"{name}: output {r['output']}, expected all {want}"


def test_bf16_wgmma_counts_as_gmma_and_hgmma_ops(measured):
    m, shown = _counters(measured, "wgmma_bf16")
    assert m[credit.GMMA_METRIC] > 0, shown
    assert m[credit.HGMMA_OPS_METRICS[0]] > 0, shown
    # Recorded, not asserted: does the HMMA-pipe counter count warpgroup MMAs too?
    print(f"wgmma_bf16 {credit.HMMA_INST_METRIC} = {m[credit.HMMA_INST_METRIC]:g} (not asserted)")


def test_fp8_wgmma_math_is_all_wgmmas(measured):
    m, shown = _counters(measured, "wgmma_e4m3")
    assert m[credit.GMMA_METRIC] > 0, shown
    assert m[credit.FP8_OPS_METRIC] > 0, shown
    work = measured["kernels"]["wgmma_e4m3"]["work_metrics"]
    # no other tensor-pipe math (its fills and index arithmetic are SIMT: large beside 8 MMAs, not asserted)
    assert work["wgmma_flops"] == m[credit.FP8_OPS_METRIC] and work["other_tensor_flops"] == 0, (
        f"DEFECT in the FP8 rule (tools.credit.work_metrics): an fp8 wgmma kernel's math is not all wgmma's. {shown}")
    print(f"wgmma_e4m3 {credit.HMMA_INST_METRIC} = {m[credit.HMMA_INST_METRIC]:g} (not asserted)")


def test_bf16_mma_sync_counts_as_hmma_not_gmma(measured):
    m, shown = _counters(measured, "mma_sync_bf16")
    assert m[credit.HMMA_INST_METRIC] > 0, shown
    assert m[credit.GMMA_METRIC] == 0, shown
    # the per-type HMMA ops counters are no longer read: the HMMA class (less the warpgroup MMAs) is
    # charged as other tensor math, bounded from above (tools.credit)
    work = measured["kernels"]["mma_sync_bf16"]["work_metrics"]
    assert work["wgmma_flops"] == 0 and work["other_tensor_flops"] > 0, shown


def test_fp8_mma_sync_math_is_never_wgmmas(measured):
    m, shown = _counters(measured, "mma_sync_e4m3")
    assert m[credit.HMMA_INST_METRIC] > 0, shown
    work = measured["kernels"]["mma_sync_e4m3"]["work_metrics"]
    assert work["wgmma_flops"] == 0 and work["other_tensor_flops"] > 0, (
        f"DEFECT in the FP8 rule: fp8 mma.sync math counts as wgmma's. {shown}")


def test_user_replay_reads_what_kernel_replay_reads(measured):
    """The worker's counted runs use CUPTI's user replay (one run per pass, hardware counters only:
    no pass runs SASS-patched code): every counter but the range's own duration reads what kernel
    replay reads on the same launch."""
    assert measured["user_instrumented_passes"] == [], measured["user_instrumented_passes"]
    for name, r in measured["kernels"].items():
        assert r["user_ranges"] == [name], r["user_ranges"]
        user, kernel = r["user_metrics"], r["metrics"]
        differ = {m: (kernel[m], user.get(m)) for m in kernel if m != credit.DURATION_METRIC and user.get(m) != kernel[m]}
        assert not differ, f"{name}: user replay reads differently (kernel, user): {differ}"
