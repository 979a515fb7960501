"""Exact executions per opcode from CUPTI's SASS metrics API (tools.cupti.SassCounter, issue 42
item 4), on the H200: one kernel holds both a tensor-map load (UTMALDG) and a plain bulk copy
(UBLKCP.S.G), and `mode` picks which one runs. The range profiler's counters lump the two
(smsp__sass_inst_executed_op_tma_ld counts both); the per-instruction counts, mapped to opcodes
through the module's own SASS (tools.cupti.opcode_counts), must give each its exact executions:
one per block and step for the live one, none for the dead one.

    python -m pytest -m gpu tests/gpu/test_sass_counts_gpu.py -q -s
"""
from __future__ import annotations

import ctypes

import pytest

pytestmark = pytest.mark.gpu

STEP = 4096  # bytes per copy: a 16 x 256 box of uint8
GRID, STEPS, ROWS = 8, 5, 16 * 64

SOURCE = r"""
static __device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

extern "C" __global__ void __launch_bounds__(128)
tma_or_bulk(const unsigned char* __restrict__ src, unsigned* __restrict__ sink, int steps, int mode,
            const __grid_constant__ CUtensorMap tm) {
  __shared__ alignas(128) unsigned buf[4096 / 4];
  __shared__ alignas(8) unsigned long long bar;
  const unsigned sbuf = smem_addr(buf), sbar = smem_addr(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(sbar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  unsigned phase = 0, x = 0;
  for (int s = 0; s < steps; ++s) {
    const int row = (blockIdx.x * steps + s) % 64 * 16;
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(sbar), "r"(4096) : "memory");
      if (mode == 1)  // a tensor-map load: UTMALDG
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                     :: "r"(sbuf), "l"(&tm), "r"(0), "r"(row), "r"(sbar) : "memory");
      else  // a plain bulk copy of the same bytes: UBLKCP.S.G
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     :: "r"(sbuf), "l"(src + (long long)row * 256), "r"(4096), "r"(sbar) : "memory");
    }
    unsigned done = 0;
    while (!done)
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                   : "=r"(done) : "r"(sbar), "r"(phase) : "memory");
    phase ^= 1;
    for (unsigned i = threadIdx.x; i < 1024; i += blockDim.x) x ^= buf[i];
    __syncthreads();
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
"""
KERNEL = "tma_or_bulk"


def compiled():
    """(cubin, the module's SASS as parse_sass gives it)."""
    from tools.compile import compile_source
    from tools.sass import disassemble, parse_sass

    comp = compile_source(SOURCE, "cuda", "sm_90a")
    assert comp.ok, (comp.error, [d.message for d in comp.errors()])
    return comp.cubin, parse_sass(disassemble(comp.cubin)[0])


def _launch(module, src, sink, tmap: bytes, mode: int) -> None:
    from cuda.bindings import driver as d

    from tools.launch import check

    fn = module.function(KERNEL)
    vals = [ctypes.c_uint64(src.data_ptr()), ctypes.c_uint64(sink.data_ptr()), ctypes.c_int32(STEPS),
            ctypes.c_int32(mode)]
    tm = (ctypes.c_uint8 * 128).from_buffer_copy(tmap)
    ptrs = (ctypes.c_void_p * 5)(*[ctypes.addressof(v) for v in vals], ctypes.addressof(tm))
    check(d.cuLaunchKernel(fn, GRID, 1, 1, 128, 1, 1, 0, 0, ctypes.addressof(ptrs), 0), "cuLaunchKernel")
    check(d.cuCtxSynchronize(), "cuCtxSynchronize")


def test_sass_metrics_split_tensor_map_loads_from_bulk_copies():
    import torch

    from tools.cupti import SASS_INST_EXECUTED, SassCounter, opcode_counts, sass_metric_names
    from tools.launch import Module, TensorMapPlan, encode_tensor_map

    assert torch.cuda.is_available(), "needs a GPU"
    src = torch.randint(0, 255, (ROWS, 256), dtype=torch.uint8, device="cuda")
    sink = torch.zeros(GRID * 128, dtype=torch.int32, device="cuda")
    cubin, sass = compiled()
    tmap = encode_tensor_map(TensorMapPlan("tm", "src", "uint8", (ROWS, 256), (16, 256), (1, 1), "none", "none",
                                           "zero"), src.data_ptr())
    from tools.sass import kernel_sass

    sites = {KERNEL: kernel_sass(sass[KERNEL]).tma_sites}
    # As in the worker, where the range profiler's passes always run before the first exact count:
    # after a range-profiler session in the process every SASS-metrics collect returns its records;
    # without one only the first collect does, every later one none, whatever is collected (H200,
    # 2026-12-03, scripts/probe_sass_counts.py, with and without --range-first)
    from tools.cupti import RangeProfiler

    first = Module(cubin)
    session = RangeProfiler(["smsp__inst_executed.sum"], replay="user")

    def one_pass(i, ranged):
        with ranged():
            _launch(first, src, sink, tmap, 0)
    try:
        assert len(session.profile_passes(one_pass, "before")) == 1
    finally:
        session.close()
    counter = SassCounter()
    names = sass_metric_names(counter.chip)
    print(f"\nSASS metrics on {counter.chip}: {len(names)}: " + ", ".join(sorted(names)), flush=True)
    assert SASS_INST_EXECUTED in names
    ublk = lambda c: sum(v for k, v in c.items() if k.startswith("UBLKCP"))  # noqa: E731
    utma = lambda c: sum(v for k, v in c.items() if k.startswith("UTMALDG"))  # noqa: E731
    modules = []
    for mode in (0, 1):
        # a module of its own per collect, as each workload's counted runs have (tools.worker.keep_module)
        modules.append(Module(cubin))
        records = counter.collect(lambda: _launch(modules[-1], src, sink, tmap, mode))
        counts, missing = opcode_counts(records, sites)
        print(f"mode {mode}: {len(records)} records ({sorted({r.function for r in records})}), missing {missing}; "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
        # every collect exact: the live copy once per block and step, the dead one never (H200,
        # 2026-12-03: UBLKCP.S.G 40, UTMALDG 0 on the first; a later collect, a fresh module of the
        # same cubin, returned all 92 records after a range-profiler session)
        live = (GRID * STEPS, 0) if mode == 0 else (0, GRID * STEPS)
        assert not missing and (ublk(counts), utma(counts)) == live, (mode, missing, counts)
    # the first module counted again: exact again (a second evaluation of the same cubin in one worker)
    _launch(modules[0], src, sink, tmap, 0)  # (outside collect(): unpatched, counts nothing)
    again, missing = opcode_counts(counter.collect(lambda: _launch(modules[0], src, sink, tmap, 0)), sites)
    print(f"again: missing {missing}; {again}", flush=True)
    assert not missing and ublk(again) == GRID * STEPS, (missing, again)
    counter.close()
    for m in [first, *modules]:
        m.unload()
