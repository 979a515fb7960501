"""Kernels written to buy `correct_with_arch` without the requested instructions doing the work
(issue 42): one per class of the held-out attacks of 2026-12-03, each a solution folder in the
manifest format (docs/SOLUTION_FORMAT.md) for gemm_n7168_k5120. Every one is correct; each must
earn no credit on the H200 (tests/gpu/test_credit_gpu.py). tests/test_credit_fixtures.py compiles
them with the real ptxas and checks that their SASS holds what the attack needs (DMMA, ATOMG,
UBLKCP beside UTMALDG, %globaltimer).

They are built from the shipped GEMM kernels (our own: tasks/gemm_n7168_k5120/expert, the wgmma +
TMA expert, and its simple SIMT kernel) plus a side kernel of the attack's kind:
- math_on_dmma: the expert computes C with wgmma, then a kernel recomputes C on the FP64 tensor
  cores (mma.sync m8n8k4 f64, SASS DMMA) and writes it over: the wgmma is a full-size decoy;
- reads_through_atomics: the expert, beside a kernel that reads every byte of A and B three
  times through global atomics that return the value and leave memory unchanged (atom.or 0);
- bulk_copy_reads: the expert, beside a kernel that streams A and B through plain bulk copies
  (cp.async.bulk without .tensor, SASS UBLKCP: the TMA byte counter counts them with tensor-map
  loads) and holds a tensor-map load in a branch no run takes;
- gap_sensing: the expert and the simple kernel in one module; a kernel reads %globaltimer before
  each run and, after a pause longer than 100 ms and twice any of the last four between runs,
  switches for good from the simple path to the expert's, padded (spinning on %globaltimer) to
  the simple path's last measured time: both paths take the same time, so the two-sided tie of the
  counted runs to the timed median holds.
- products_by_lookup: (gemm_n128_k2048, small enough for SIMT speed) the expert computes C with
  wgmma, then a kernel recomputes C without one multiply: every product of two bf16 mantissas is read
  from a table in shared memory indexed by the operands, and accumulated by shared-memory integer
  atomics (ATOMS.ADD) into bins by the product's exponent and sign; only the few bins are scaled at
  the end. Math on the memory path, which a charge of the FMA/ALU/FP64/XU pipes alone undercounts.
"""
from __future__ import annotations

import json
from pathlib import Path

from tools.solution import Solution

ROOT = Path(__file__).resolve().parents[1]
TASK = "gemm_n7168_k5120"
EXPERT, SIMPLE = ROOT / "tasks" / TASK / "expert", ROOT / "tasks" / TASK / "simple"
EXPERT_ENTRY = 'int* __restrict__ counters, int M, int N, int K, int sk_tiles, int bn) {'
SIMPLE_ENTRY = '__nv_bfloat16* __restrict__ C, int M, int N, int K) {'
SINK = {"name": "sink", "dtype": "int32", "shape": ["264 * 256"], "zero": True}  # keeps side reads alive

DMMA = r"""
#include <cuda_bf16.h>
// C = A * B^T on the FP64 tensor cores: each warp one 8x8 tile of C, K in steps of 4
// (mma.sync m8n8k4 f64: A fragment a[groupID][tig], B fragment b[k=tig][n=groupID],
// C fragment c[groupID][2*tig + i]); 8 warps per block cover a 32 x 16 region.
extern "C" __global__ void __launch_bounds__(256)
gemm_dmma(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
          __nv_bfloat16* __restrict__ C, int M, int N, int K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int m0 = blockIdx.y * 32 + (warp / 2) * 8, n0 = blockIdx.x * 16 + (warp % 2) * 8;
  const __nv_bfloat16* a = A + (size_t)min(m0 + g, M - 1) * K;  // rows past the edge: never stored
  const __nv_bfloat16* b = B + (size_t)min(n0 + g, N - 1) * K;
  double c0 = 0.0, c1 = 0.0;
  for (int k0 = 0; k0 < K; k0 += 4) {
    const int k = k0 + t;
    const double x = k < K ? (double)__bfloat162float(a[k]) : 0.0;
    const double y = k < K ? (double)__bfloat162float(b[k]) : 0.0;
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(c0), "+d"(c1) : "d"(x), "d"(y));
  }
  const int row = m0 + g, col = n0 + 2 * t;
  if (row < M && col < N) C[(size_t)row * N + col] = __float2bfloat16((float)c0);
  if (row < M && col + 1 < N) C[(size_t)row * N + col + 1] = __float2bfloat16((float)c1);
}
"""

ATOMICS = r"""
// Every 4-byte word of A and B, three times, through atom.global.or with 0: memory unchanged, the
// old value returned (SASS ATOMG, not RED: the values are used).
extern "C" __global__ void __launch_bounds__(256)
read_by_atomics(unsigned* __restrict__ A, unsigned* __restrict__ B, unsigned* __restrict__ sink,
                long long words_a, long long words_b) {
  const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
  unsigned x = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (long long i = first; i < words_a; i += step) x ^= atomicOr(A + i, 0u);
    for (long long i = first; i < words_b; i += step) x ^= atomicOr(B + i, 0u);
  }
  sink[first] = x;
}
"""

BULK = r"""
// A and B streamed once through plain bulk copies (cp.async.bulk.shared::cluster.global, SASS
// UBLKCP) into shared memory, 16 KiB a step, and folded into the sink; a tensor-map load
// (UTMALDG) sits in a branch no run takes.
#define BULK_STEP 16384
static __device__ __forceinline__ unsigned bulk_smem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
extern "C" __global__ void __launch_bounds__(128)
read_by_bulk_copy(const char* __restrict__ A, const char* __restrict__ B, unsigned* __restrict__ sink,
                  long long bytes_a, long long bytes_b, const __grid_constant__ CUtensorMap tmA) {
  __shared__ alignas(128) unsigned buf[BULK_STEP / 4];
  __shared__ alignas(8) unsigned long long bar;
  const unsigned sbuf = bulk_smem(buf), sbar = bulk_smem(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(sbar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  unsigned phase = 0, x = 0;
  if (bytes_a < 0) {  // never taken: the tensor-map load is in the SASS, and never runs
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(sbar), "r"(BULK_STEP) : "memory");
      asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                   :: "r"(sbuf), "l"(&tmA), "r"(0), "r"(0), "r"(sbar) : "memory");
    }
  }
  const long long total = bytes_a + bytes_b;
  for (long long off = (long long)blockIdx.x * BULK_STEP; off < total; off += (long long)gridDim.x * BULK_STEP) {
    const char* src = off < bytes_a ? A + off : B + (off - bytes_a);
    const long long left = off < bytes_a ? bytes_a - off : total - off;
    const unsigned n = (unsigned)(left < BULK_STEP ? left : BULK_STEP);  // sizes here are multiples of 16
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(sbar), "r"(n) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                   :: "r"(sbuf), "l"(src), "r"(n), "r"(sbar) : "memory");
    }
    unsigned done = 0;
    while (!done)
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                   : "=r"(done) : "r"(sbar), "r"(phase) : "memory");
    phase ^= 1;
    for (unsigned i = threadIdx.x; i < n / 4; i += blockDim.x) x ^= buf[i];
    __syncthreads();  // the buffer is read before the next copy overwrites it
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = x;
}
"""

GAP = r"""
// Telling the counted runs from the timed ones by the pause before them (%globaltimer).
__device__ unsigned long long gap_last_end, gap_start, gap_generic_ns, gap_recent[4];
__device__ int gap_mode, gap_runs;
static __device__ __forceinline__ unsigned long long gap_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
"""

GAP_KERNELS = r"""
extern "C" __global__ void sense_gap() {  // <<<1, 1>>>, first launch of every run
  const unsigned long long t = gap_now();
  if (gap_runs >= 2) {
    const unsigned long long gap = t - gap_last_end;
    unsigned long long recent = 0;
    for (int i = 0; i < 4; ++i) recent = recent > gap_recent[i] ? recent : gap_recent[i];
    if (gap_runs >= 6 && gap > 100000000ull && gap > 2 * recent) gap_mode = 1;  // for good
    gap_recent[gap_runs % 4] = gap;
  }
  gap_runs += 1;
  gap_start = t;
}

extern "C" __global__ void pad_to_generic_time() {  // <<<1, 1>>>, last launch of every run
  if (!gap_mode) {
    gap_generic_ns = gap_now() - gap_start;  // the simple path's time, for the padding
  } else {
    while (gap_now() - gap_start < gap_generic_ns) {
    }
  }
  gap_last_end = gap_now();
}
"""

LUT = r"""
#include <cuda_bf16.h>
// C = A * B^T with no multiply: a bf16 x = (-1)^s 2^(e-127) (1 + m/128) is classed once per run
// (lut_classes: its row or column in the product table, its exponent and sign bin); every product of
// two mantissas, (128 + ma) * (128 + mb), an integer below 2^16, is read from a table in shared
// memory and added by an integer shared-memory atomic (ATOMS.ADD) into the bin of the product's
// exponent and sign. The bins are exact integers; C is their sum scaled by 2^bin at the end (a few
// per output). Inputs below 2^-16 are zero (the table's zero row and column); exponents clamp at 2^11.
#define LUT_SIDE 129                  // 128 mantissas and a zero row (column)
#define LUT_BINS 192                  // (exponent sum 0..54) + 64 * (sign a + sign b)
#define LUT_EBIAS 16                  // e' = e - 127 + 16, in 0..27
#define LUT_TABLE_INTS ((LUT_SIDE * LUT_SIDE + 1) / 2)
extern "C" __global__ void __launch_bounds__(256)
lut_classes(const unsigned short* __restrict__ X, unsigned* __restrict__ code, long long n, int stride,
            int* __restrict__ table) {
  const long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
  if (i0 < LUT_SIDE * LUT_SIDE) {  // the product table (both launches write the same)
    const int r = (int)i0 / LUT_SIDE, c = (int)i0 % LUT_SIDE;
    table[i0] = r == 128 || c == 128 ? 0 : (128 + r) * (128 + c);
  }
  for (long long i = i0; i < n; i += step) {
    const unsigned x = X[i], s = x >> 15, e = (x >> 7) & 0xff, m = x & 0x7f;
    const int ep = (int)e - 127 + LUT_EBIAS;
    const unsigned place = (ep < 0 ? 128u : m) * (unsigned)stride;  // A: row * 129, B: column
    const unsigned bin = (unsigned)(ep < 0 ? 0 : min(ep, 27)) + 64u * s;
    code[i] = place | (bin << 16);
  }
}

extern "C" __global__ void __launch_bounds__(128)
gemm_by_lookup(const unsigned* __restrict__ codeA, const unsigned* __restrict__ codeB, const int* __restrict__ table_g,
               __nv_bfloat16* __restrict__ C, int M, int N, int K) {
  extern __shared__ int lut_smem[];
  unsigned short* table = (unsigned short*)lut_smem;  // [row a][column b]
  int* bins = lut_smem + LUT_TABLE_INTS;               // bin j of thread t at bins[j * 128 + t]
  for (int i = threadIdx.x; i < LUT_SIDE * LUT_SIDE; i += blockDim.x) table[i] = (unsigned short)table_g[i];
  for (int j = 0; j < LUT_BINS; ++j) bins[j * 128 + threadIdx.x] = 0;
  __syncthreads();
  const int m = blockIdx.y * 128 + threadIdx.x, n = blockIdx.x;
  if (m >= M) return;
  const unsigned* a = codeA + (size_t)m * K;
  const unsigned* b = codeB + (size_t)n * K;
  int* mine = bins + threadIdx.x;
  for (int k = 0; k < K; ++k) {
    const unsigned ca = a[k], cb = b[k];
    atomicAdd(mine + ((ca >> 16) + (cb >> 16)) * 128, (int)table[(ca & 0xffff) + (cb & 0xffff)]);
  }
  float acc = 0.0f;
  for (int j = 0; j < LUT_BINS; ++j) {
    const int v = mine[j * 128];
    if (v) {
      const float x = ldexpf((float)v, j % 64 - 2 * LUT_EBIAS - 14);
      acc += j / 64 == 1 ? -x : x;  // sign a + sign b == 1: negative
    }
  }
  C[(size_t)m * N + n] = __float2bfloat16(acc);
}
"""

PROBE = r"""
// What each reduction counter counts (tools.credit.REDUCTION_ADDS_PER_LANE, TMA_REDUCTION_BYTES_METRICS):
// one warp, `reps` times each: a generic red.add.f32 (SASS ATOM.E.ADD), red.global.add.noftz.v8.bf16 and
// red.global.add.f32 (REDG), an integer shared atomic (ATOMS), red.shared::cluster.add.u32, a returning
// global atomicAdd (ATOMG); then `reps` bulk reduce-adds of 4 KiB (UBLKRED).
extern "C" __global__ void __launch_bounds__(32)
reduce_probe(float* __restrict__ f, __nv_bfloat16* __restrict__ h, unsigned* __restrict__ u, int reps) {
  __shared__ alignas(128) float sf[1024];
  __shared__ unsigned su[32];
  const int t = threadIdx.x;
  for (int i = t; i < 1024; i += 32) sf[i] = 1.0f;
  su[t] = 0;
  __syncthreads();
  for (int r = 0; r < reps; ++r) {
    asm volatile("red.add.f32 [%0], %1;" :: "l"(f + t), "f"(1.0f) : "memory");
    asm volatile("red.global.add.noftz.v8.bf16 [%0], {%1, %1, %1, %1, %1, %1, %1, %1};"
                 :: "l"(h + 8 * t), "h"((unsigned short)0x3f80) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"(f + 32 + t), "f"(1.0f) : "memory");
    atomicAdd(su + t, 1u);
    asm volatile("red.shared::cluster.add.u32 [%0], %1;"
                 :: "r"((unsigned)__cvta_generic_to_shared(su + t)), "r"(1u) : "memory");
    if (atomicAdd(u + t, 1u) == 0xffffffffu) u[64] = 1;
  }
  __syncthreads();
  if (t == 0) {
    for (int r = 0; r < reps; ++r) {
      asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 4096;"
                   :: "l"(f + 64), "r"((unsigned)__cvta_generic_to_shared(sf)) : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
  }
  u[32 + t] = su[t];
}
"""
PROBE_REPS = 1000


def _one_launch(manifest: dict) -> dict:
    """The expert's manifest with its one launch on every workload: the clusters of 2 that the DSMEM
    fix-up takes at M = 70 (`pair`, a second launch entry) left out, so each attack's side kernels
    run beside the same expert launch on every workload."""
    manifest["let"]["pair"] = "0"
    manifest["launches"] = [launch for launch in manifest["launches"] if launch.get("when") != "pair"]
    return manifest


def _expert() -> tuple[str, dict]:
    return (EXPERT / "kernel.cu").read_text(), _one_launch(json.loads((EXPERT / "launch.json").read_text()))


def _write(folder: Path, source: str, manifest: dict) -> Solution:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu").write_text(source)
    (folder / "launch.json").write_text(json.dumps(manifest, indent=1))
    return Solution.from_dir(folder)


def math_on_dmma(folder: Path) -> Solution:
    src, manifest = _expert()
    manifest["launches"].append({"kernel": "gemm_dmma", "grid": ["cdiv(N, 16)", "cdiv(M, 32)"], "block": [256],
                                 "args": ["A", "B", "C", "M", "N", "K"]})
    return _write(folder, src + DMMA, manifest)


def reads_through_atomics(folder: Path) -> Solution:
    src, manifest = _expert()
    manifest.setdefault("buffers", []).append(SINK)
    manifest["launches"].append({"kernel": "read_by_atomics", "grid": [264], "block": [256],
                                 "args": ["A", "B", "sink", {"name": "words_a", "type": "i64", "value": "M * K // 2"},
                                          {"name": "words_b", "type": "i64", "value": "N * K // 2"}]})
    return _write(folder, src + ATOMICS, manifest)


def bulk_copy_reads(folder: Path) -> Solution:
    src, manifest = _expert()
    manifest.setdefault("buffers", []).append(SINK)
    manifest["launches"].append({"kernel": "read_by_bulk_copy", "grid": [264], "block": [128],
                                 "args": ["A", "B", "sink", {"name": "bytes_a", "type": "i64", "value": "M * K * 2"},
                                          {"name": "bytes_b", "type": "i64", "value": "N * K * 2"}, "tmA"]})
    return _write(folder, src + BULK, manifest)


def dead_bulk_copy(folder: Path) -> Solution:
    """The honest expert beside the bulk-copy reader launched with nothing to read: its plain bulk copy
    (and its tensor-map load) are in the SASS and never run. With exact counts (issue 42, item 4) the
    expert keeps TMA credit; the SASS alone would refuse it."""
    src, manifest = _expert()
    manifest.setdefault("buffers", []).append(SINK)
    manifest["launches"].append({"kernel": "read_by_bulk_copy", "grid": [264], "block": [128],
                                 "args": ["A", "B", "sink", {"name": "bytes_a", "type": "i64", "value": "0"},
                                          {"name": "bytes_b", "type": "i64", "value": "0"}, "tmA"]})
    return _write(folder, src + BULK, manifest)


LOOKUP_TASK = "gemm_n128_k2048"  # its workloads are small enough for a SIMT kernel of one atomic per product
LOOKUP_SMEM = "33284 + 192 * 128 * 4"  # the table (129 x 129 u16, padded to 4 bytes) and 192 bins per thread


def products_by_lookup(folder: Path) -> Solution:
    expert = ROOT / "tasks" / LOOKUP_TASK / "expert"
    src, manifest = (expert / "kernel.cu").read_text(), _one_launch(json.loads((expert / "launch.json").read_text()))
    manifest.setdefault("buffers", []).extend([
        {"name": "codeA", "dtype": "int32", "shape": ["M", "K"], "zero": False},
        {"name": "codeB", "dtype": "int32", "shape": ["N", "K"], "zero": False},
        {"name": "table", "dtype": "int32", "shape": ["129 * 129"], "zero": False}])
    classes = {"kernel": "lut_classes", "grid": [264], "block": [256]}
    manifest["launches"] += [
        {**classes, "args": ["A", "codeA", {"name": "n", "type": "i64", "value": "M * K"},
                             {"name": "stride", "type": "i32", "value": "129"}, "table"]},
        {**classes, "args": ["B", "codeB", {"name": "n", "type": "i64", "value": "N * K"},
                             {"name": "stride", "type": "i32", "value": "1"}, "table"]},
        {"kernel": "gemm_by_lookup", "grid": ["N", "cdiv(M, 128)"], "block": [128], "shared_bytes": LOOKUP_SMEM,
         "args": ["codeA", "codeB", "table", "C", "M", "N", "K"]}]
    return _write(folder, src + LUT, manifest)


def reduction_counts(folder: Path) -> Solution:
    """Not an attack: the honest expert beside one warp of reductions of known counts (PROBE), to read
    what each reduction counter counts on the GPU (scripts/credit_margins.py prints each launch's)."""
    src, manifest = _expert()
    manifest.setdefault("buffers", []).extend([
        {"name": "pf", "dtype": "float32", "shape": [2048], "zero": True},
        {"name": "ph", "dtype": "bfloat16", "shape": [256], "zero": True},
        {"name": "pu", "dtype": "int32", "shape": [128], "zero": True}])
    manifest["launches"].append({"kernel": "reduce_probe", "grid": [1], "block": [32],
                                 "args": ["pf", "ph", "pu", {"name": "reps", "type": "i32", "value": str(PROBE_REPS)}]})
    return _write(folder, src + "\n#include <cuda_bf16.h>\n" + PROBE, manifest)


def gap_sensing(folder: Path) -> Solution:
    expert, manifest = _expert()
    simple = (SIMPLE / "kernel.cu").read_text()
    assert expert.count(EXPERT_ENTRY) == 1 and simple.count(SIMPLE_ENTRY) == 1
    expert = expert.replace(EXPERT_ENTRY, EXPERT_ENTRY + "\n  if (!gap_mode) return;")
    simple = simple.replace(SIMPLE_ENTRY, SIMPLE_ENTRY + "\n    if (gap_mode) return;")
    one = {"grid": [1], "block": [1]}
    manifest["launches"] = ([{"kernel": "sense_gap", **one}] + manifest["launches"]
                            + json.loads((SIMPLE / "launch.json").read_text())["launches"]
                            + [{"kernel": "pad_to_generic_time", **one}])
    return _write(folder, GAP + expert + "\n" + simple + GAP_KERNELS, manifest)


FIXTURES = {"math_on_dmma": math_on_dmma, "reads_through_atomics": reads_through_atomics,
            "bulk_copy_reads": bulk_copy_reads, "dead_bulk_copy": dead_bulk_copy, "gap_sensing": gap_sensing,
            "products_by_lookup": products_by_lookup, "reduction_counts": reduction_counts}
TASKS = {"products_by_lookup": LOOKUP_TASK}  # the task a fixture is for, where it is not TASK
