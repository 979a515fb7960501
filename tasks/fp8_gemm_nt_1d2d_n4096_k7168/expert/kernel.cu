// Expert sm_90a block-scaled FP8 GEMM for fp8_gemm_nt_1d2d_n4096_k7168 (DeepSeek-V3 "1D2D" scaling):
//   D[i, j] = sum_kb SF_A[i, kb] * SF_B[j / 128, kb] * sum_{k in kb} A[i, k] * B[j, k]
// A [M, K] and B [N, K] e4m3 (both K-major), SF_A [M, K/128] and SF_B [N/128, K/128] fp32, D [M, N] bf16.
//
// Design (NOTES.md has the numbers):
//  - 128xBN output tile per CTA (BN = 256 shipped); one pipeline stage is one 128-wide K block,
//    which is one scale block and exactly one 128-byte swizzled row per operand row (e4m3: 1 byte).
//  - STAGES-deep shared-memory ring filled by TMA, a full and an empty mbarrier per stage.
//  - Warp specialisation, 384 threads: warpgroup 0 produces (one thread issues TMA, setmaxnreg.dec),
//    warpgroups 1 and 2 consume (setmaxnreg.inc), 64 rows x BN columns each: per K block and
//    per 128-column pass (one N scale block), four wgmma m64n128k32 e4m3.
//  - Scales outside the tensor core: each (K block, pass) accumulates into a fresh fp32 wgmma
//    accumulator (scale-d = 0 on its first k32 step), and once it retires the consumer promotes it:
//    acc += partial * SF_A[row, kb] * SF_B[nb, kb]. A pass is 128 columns aligned to an N block,
//    so SF_B is one scalar per (pass, kb); SF_A is two values per thread (rows r, r+8). Scales are
//    loaded before the stage's wait so their latency hides behind it. One 64-register partial is
//    reused by the passes (acc 128 + partial 64 registers fit; two partials would not), and while
//    one consumer warpgroup promotes, the other one's wgmmas keep the tensor cores busy.
//  - Persistent grid walking the tiles in groups of GROUP_M row tiles (L2 reuse of A and B panels).
//  - Epilogue: acc -> bf16 -> 128B-swizzled staging -> TMA store (clips rows >= M), double-buffered.
//  - CLUSTER_M = 2 (a variant): two CTAs of a cluster take vertically adjacent tiles and each
//    loads half of the shared B tile, multicast to both (halves B's L2 traffic).
//  - Small M (fewer tiles than SMs): K blocks split across CTAs. SPLIT_RED=1 (shipped): the first
//    split of a tile stores its promoted fp32 partial into the tile's `ws` rows, the others add
//    theirs in place (red.global.add), the last (per-tile `counters`) reads the sum and stores D;
//    `ws` holds one fp32 tile per output tile. SPLIT_RED=0: each split writes its own partial tile
//    and the last adds the others (needs `ws` of splits x that; 1.2x slower at M = 70).
// M may be any positive value (TMA zero-fills rows >= M); N must be a multiple of BN and K of 512
// (K/128 scale blocks a multiple of 4: the scales are read 16 bytes at a time); the task has 7168.

#ifndef STAGES
#define STAGES 4
#endif
#ifndef BN
#define BN 256  // tile columns: 128 or 256 (two 128-column passes per K block, one SF_B scale each)
#endif
#ifndef PIPE
#define PIPE 0  // 1 (BN = 128 only): two partials, K block kb+1's wgmmas run while kb is promoted
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1  // 2: two CTAs of a cluster take vertically adjacent tiles, each loads half of the shared B tile for both
#endif
#ifndef SPLIT_RED
#define SPLIT_RED 1  // 1: split-K partials added in place (red.global.add) into one fp32 tile; 0: one tile per split
#endif
#ifndef GROUP_M
#define GROUP_M 8  // row tiles per raster group
#endif

#define BM 128
#define BK 128                        // one scale block of K = one 128-byte row of e4m3
#define A_STAGE_BYTES (BM * BK)       // 16 KiB
#define B_STAGE_BYTES (BN * BK)       // 16 or 32 KiB
#define NH (BN / 128)                 // 128-column passes (N scale blocks) per tile
#if PIPE && BN != 128
#error "PIPE needs BN = 128 (acc + two partials = 192 registers)"
#endif
#define D_BUF_BYTES (64 * 64 * 2)     // one 64x64 bf16 staging box, 8 KiB
#define EPI_BYTES (2 * 2 * D_BUF_BYTES)  // two buffers per consumer warpgroup
#define CONSUMER_REGS 232
#define PRODUCER_REGS 40

typedef unsigned int u32;
typedef unsigned long long u64;

static __device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// ---------------------------------------------------------------- mbarrier
static __device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ __attribute__((unused)) void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Arrive on the barrier at the same shared offset in CTA `rank` of the cluster.
static __device__ __forceinline__ __attribute__((unused)) void mbar_arrive_cluster(u32 bar, u32 rank) {
  asm volatile(
      "{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [r]; }" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// A consumer warpgroup is done with stage `s`: tell every CTA whose producer writes into it.
static __device__ __forceinline__ void release_stage(u32 empty_bar) {
#if CLUSTER_M > 1
  for (u32 r = 0; r < CLUSTER_M; ++r) mbar_arrive_cluster(empty_bar, r);
#else
  mbar_arrive(empty_bar);
#endif
}
static __device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---------------------------------------------------------------- TMA
static __device__ __forceinline__ void tma_load_2d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
// Same box written to the same offset in every CTA of `mask`, each CTA's barrier at `bar` told.
static __device__ __forceinline__ __attribute__((unused)) void tma_load_2d_multicast(u32 dst, const CUtensorMap* map, u32 bar,
                                                                                    int c0, int c1, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4}], "
      "[%2], %5;" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
static __device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map), "r"(src), "r"(c0),
               "r"(c1)
               : "memory");
}

// ---------------------------------------------------------------- wgmma
// K-major tile of 128-byte rows written by TMA with 128B swizzle: LBO unused (1), SBO = 1024 B
// between 8-row groups, layout type 1 (128B swizzle) in bits 62-63; tile base 1024-aligned.
// A k32 step of e4m3 is 32 bytes along the row: +2 in the descriptor's address field.
static __device__ __forceinline__ u64 desc_sw128(u32 saddr) {
  return (u64)((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
// d (+)= A[64x32] * B[128x32]^T, e4m3 in, fp32 out; scale_d = 0 starts a fresh accumulator.
static __device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[64], u64 desc_a, u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// Keeps the compiler from moving accesses of `d` across wgmma fences and waits (it does not know
// that wgmma writes its registers asynchronously).
static __device__ __forceinline__ void fence_operand(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

static __device__ __forceinline__ __attribute__((unused)) float pick(const float4& v, int c) {
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

static __device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Tile t -> (row unit, column tile); a row unit is CLUSTER_M row tiles. Groups of GROUP_M row
// tiles are walked column by column, so the CTAs resident at one moment share A and B panels in L2.
static __device__ __forceinline__ void tile_coords(int t, int num_units, int num_n, int& unit, int& nt) {
  const int group_units = GROUP_M / CLUSTER_M;
  const int per_group = group_units * num_n;
  const int g = t / per_group;
  const int first = g * group_units;
  const int size = min(num_units - first, group_units);
  const int r = t - g * per_group;
  unit = first + r % size;
  nt = r / size;
}

extern "C" __global__ void __launch_bounds__(384, 1)
fp8_gemm_1d2d_sm90(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                   const __grid_constant__ CUtensorMap tmD, const float* __restrict__ SF_A,
                   const float* __restrict__ SF_B, float* __restrict__ ws, int* __restrict__ counters, int M, int N,
                   int K, int splits) {
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 128B swizzle wants 1024-aligned tiles
  const u32 sA = base;
  const u32 sB = sA + STAGES * A_STAGE_BYTES;
  const u32 sD = sB + STAGES * B_STAGE_BYTES;
  const u32 bars = sD + EPI_BYTES;              // full[s] at bars + 8s, empty[s] at bars + 8(STAGES + s)
  const u32 flag_slot = bars + 8 * 2 * STAGES;  // split K: "this CTA finishes the tile"

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);               // the producer's expect_tx arrival
      mbar_init(bars + 8 * (STAGES + s), 2 * CLUSTER_M);  // one per consumer warpgroup of every CTA the stage feeds
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#if CLUSTER_M > 1
  u32 rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const int cluster_id = blockIdx.x / CLUSTER_M, num_clusters = gridDim.x / CLUSTER_M;
  asm volatile("barrier.cluster.arrive.release; barrier.cluster.wait.acquire;" ::: "memory");
#else
  const u32 rank = 0;
  const int cluster_id = blockIdx.x, num_clusters = gridDim.x;
  __syncthreads();
#endif

  const int num_units = (M + BM * CLUSTER_M - 1) / (BM * CLUSTER_M), num_n = N / BN;
  const int num_m = num_units * CLUSTER_M;       // row tiles, padded to whole units
  (void)num_m;                                   // (unused with SPLIT_RED)
  const int num_work = num_units * num_n * splits;  // work unit = (row unit, column tile, K split)
  const int num_kb = K / BK;

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(&tmA) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(&tmB) : "memory");
      int it = 0;
      for (int w = cluster_id; w < num_work; w += num_clusters) {
        int unit, nt;
        tile_coords(w / splits, num_units, num_n, unit, nt);
        const int mt = unit * CLUSTER_M + (int)rank;
        const int sp = w % splits, kb0 = sp * num_kb / splits, kb1 = (sp + 1) * num_kb / splits;
        for (int kb = kb0; kb < kb1; ++kb, ++it) {
          const int s = it % STAGES;
          const u32 full = bars + 8 * s;
          mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) & 1) ^ 1);  // every consumer it feeds released the slot
          mbar_expect_tx(full, A_STAGE_BYTES + B_STAGE_BYTES);          // zero-filled rows >= M count too
          tma_load_2d(sA + s * A_STAGE_BYTES, &tmA, full, kb * BK, mt * BM);
#if CLUSTER_M > 1
          // This CTA fetches its half of the B tile for both CTAs of the cluster.
          constexpr u32 half = B_STAGE_BYTES / 2;
          tma_load_2d_multicast(sB + s * B_STAGE_BYTES + rank * half, &tmB, full, kb * BK, nt * BN + (int)rank * (BN / 2),
                                (unsigned short)((1u << CLUSTER_M) - 1));
#else
          tma_load_2d(sB + s * B_STAGE_BYTES, &tmB, full, kb * BK, nt * BN);
#endif
        }
      }
    }
  } else {
    // ------------------------------------------------------------ consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1;       // consumer warpgroup: rows cw*64 .. cw*64+63 of the tile
    const int t128 = tid & 127;  // thread within the warpgroup
    const int warp = t128 >> 5, lane = tid & 31;
    const int row = warp * 16 + (lane >> 2);  // this thread's rows of the warpgroup's 64: row and row + 8
    const int q = lane & 3;
    float acc[NH * 64], part[64];
#if PIPE
    float part2[64];
#endif
#pragma unroll
    for (int i = 0; i < 64; ++i) part[i] = 0.f;
#if PIPE
#pragma unroll
    for (int i = 0; i < 64; ++i) part2[i] = 0.f;
#endif
    int it = 0;
    for (int w = cluster_id; w < num_work; w += num_clusters) {
      int unit, nt;
      tile_coords(w / splits, num_units, num_n, unit, nt);
      const int mt = unit * CLUSTER_M + (int)rank;
      const int sp = w % splits, kb0 = sp * num_kb / splits, kb1 = (sp + 1) * num_kb / splits;
      const int m0 = mt * BM, n0 = nt * BN;
      const int r0 = m0 + cw * 64 + row, r1 = r0 + 8;
      // Rows >= M have zero A (TMA fill) and are never stored: any finite scale will do, 0 here.
      const float* sfa0 = SF_A + (size_t)min(r0, M - 1) * num_kb;
      const float* sfa1 = SF_A + (size_t)min(r1, M - 1) * num_kb;
      const float* sfb = SF_B + (size_t)nt * NH * num_kb;  // pass h: N block nt * NH + h
      const bool v0 = r0 < M, v1 = r1 < M;
#pragma unroll
      for (int i = 0; i < NH * 64; ++i) acc[i] = 0.f;

#if PIPE
      // Scales by quads of K blocks: lane q of each row's four lanes holds K block k4 + q of rows r0,
      // r1 and of the N block (16 contiguous bytes per row: the sectors of one float4 load); a
      // shuffle hands each K block's to all four. The next quad is loaded one quad ahead.
      float ca0, ca1, cb, na0 = 0.f, na1 = 0.f, nb = 0.f;
#define LOAD_QUAD(K4, A0, A1, B)                    \
  do {                                              \
    const int k_ = (K4) + q;                        \
    A0 = v0 ? __ldg(sfa0 + k_) : 0.f;               \
    A1 = v1 ? __ldg(sfa1 + k_) : 0.f;               \
    B = __ldg(sfb + k_);                            \
  } while (0)
      LOAD_QUAD(kb0 & ~3, ca0, ca1, cb);
      if ((kb0 & ~3) + 4 < kb1) LOAD_QUAD((kb0 & ~3) + 4, na0, na1, nb);
      float pa0, pa1, pb0, pb1;  // the promotion scales (rows r0, r1) of part and part2
      // Wait for K block KB's stage and issue its four wgmmas into P (one commit group).
#define ISSUE(KB, P, S0, S1)                                                                              \
  do {                                                                                                    \
    const int kb_ = (KB), it_ = it + (kb_ - kb0), s_ = it_ % STAGES;                                      \
    if (kb_ != kb0 && (kb_ & 3) == 0) {                                                                   \
      ca0 = na0, ca1 = na1, cb = nb;                                                                      \
      if (kb_ + 4 < kb1) LOAD_QUAD(kb_ + 4, na0, na1, nb);                                                \
    }                                                                                                     \
    const int src_ = (lane & ~3) | (kb_ & 3);                                                             \
    const float b_ = __shfl_sync(0xffffffffu, cb, src_);                                                  \
    S0 = __shfl_sync(0xffffffffu, ca0, src_) * b_;                                                        \
    S1 = __shfl_sync(0xffffffffu, ca1, src_) * b_;                                                        \
    mbar_wait(bars + 8 * s_, (it_ / STAGES) & 1);                                                         \
    const u64 da_ = desc_sw128(sA + s_ * A_STAGE_BYTES + cw * (64 * 128));                                \
    const u64 db_ = desc_sw128(sB + s_ * B_STAGE_BYTES);                                                  \
    fence_operand(P);                                                                                     \
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");                                               \
    _Pragma("unroll") for (int kk = 0; kk < BK / 32; ++kk)                                                \
        wgmma_m64n128k32_e4m3(P, da_ + 2 * kk, db_ + 2 * kk, kk > 0 ? 1 : 0);                             \
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");                                        \
  } while (0)
      // K block KB's partial P has retired: free its stage, promote it.
#define PROMOTE(KB, P, S0, S1)                                                                            \
  do {                                                                                                    \
    fence_operand(P);                                                                                     \
    if (t128 == 0) release_stage(bars + 8 * (STAGES + (it + ((KB) - kb0)) % STAGES));                     \
    _Pragma("unroll") for (int j = 0; j < 16; ++j) {                                                      \
      acc[4 * j] = fmaf(P[4 * j], S0, acc[4 * j]);                                                        \
      acc[4 * j + 1] = fmaf(P[4 * j + 1], S0, acc[4 * j + 1]);                                            \
      acc[4 * j + 2] = fmaf(P[4 * j + 2], S1, acc[4 * j + 2]);                                            \
      acc[4 * j + 3] = fmaf(P[4 * j + 3], S1, acc[4 * j + 3]);                                            \
    }                                                                                                     \
  } while (0)
      // Branch-free steady state (ptxas keeps two groups in flight only where it can follow them):
      // part holds K block kb in flight on entry to each iteration.
      ISSUE(kb0, part, pa0, pa1);
      int kb = kb0;
      for (; kb + 2 < kb1; kb += 2) {
        ISSUE(kb + 1, part2, pb0, pb1);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        PROMOTE(kb, part, pa0, pa1);
        ISSUE(kb + 2, part, pa0, pa1);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        PROMOTE(kb + 1, part2, pb0, pb1);
      }
      if (kb + 1 < kb1) {  // two left: kb in flight, kb + 1 to issue
        ISSUE(kb + 1, part2, pb0, pb1);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        PROMOTE(kb, part, pa0, pa1);
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        PROMOTE(kb + 1, part2, pb0, pb1);
      } else {
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        PROMOTE(kb, part, pa0, pa1);
      }
      it += kb1 - kb0;
#undef ISSUE
#undef PROMOTE
#undef LOAD_QUAD
#else
      // Scales of 4 K blocks at once (one 16-byte load per row): a quarter of the load
      // instructions and of the sectors read outside TMA (the credit rules count those bytes).
      float4 qa0, qa1, qb[NH];
      for (int kb = kb0; kb < kb1; ++kb, ++it) {
        const int s = it % STAGES;
        if (kb == kb0 || (kb & 3) == 0) {
          const int k4 = kb & ~3;
          qa0 = v0 ? __ldg(reinterpret_cast<const float4*>(sfa0 + k4)) : make_float4(0.f, 0.f, 0.f, 0.f);
          qa1 = v1 ? __ldg(reinterpret_cast<const float4*>(sfa1 + k4)) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int h = 0; h < NH; ++h) qb[h] = __ldg(reinterpret_cast<const float4*>(sfb + h * num_kb + k4));
        }
        const int c = kb & 3;
        const float sa0 = pick(qa0, c), sa1 = pick(qa1, c);
        float sb[NH];
#pragma unroll
        for (int h = 0; h < NH; ++h) sb[h] = pick(qb[h], c);
        mbar_wait(bars + 8 * s, (it / STAGES) & 1);
        const u64 da = desc_sw128(sA + s * A_STAGE_BYTES + cw * (64 * 128));
#pragma unroll
        for (int h = 0; h < NH; ++h) {
          const u64 db = desc_sw128(sB + s * B_STAGE_BYTES + h * (128 * 128));
          fence_operand(part);
          asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
          for (int kk = 0; kk < BK / 32; ++kk) wgmma_m64n128k32_e4m3(part, da + 2 * kk, db + 2 * kk, kk > 0 ? 1 : 0);
          asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
          fence_operand(part);
          if (h == NH - 1 && t128 == 0) release_stage(bars + 8 * (STAGES + s));  // the slot is free for the producer(s)
          // Promotion into fp32 with this K block's and this N block's scales.
          const float s0 = sa0 * sb[h], s1 = sa1 * sb[h];
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            float* a = acc + h * 64 + 4 * j;  // columns h*128 + 8j + 2q (+1), rows r (0, 1) and r + 8 (2, 3)
            a[0] = fmaf(part[4 * j], s0, a[0]);
            a[1] = fmaf(part[4 * j + 1], s0, a[1]);
            a[2] = fmaf(part[4 * j + 2], s1, a[2]);
            a[3] = fmaf(part[4 * j + 3], s1, a[3]);
          }
        }
      }
#endif

      // ---------------------------------------------------------- epilogue
#if SPLIT_RED
      if (splits > 1) {
        // Split K, reduced in place: the first split to arrive at the tile (ticket 0) stores its
        // partial into the tile's fp32 ws rows (< M), the others wait for that, then add theirs
        // with red.global.add; the split that finishes last reads the sum back and stores D.
        // Ticket 0 never waits, so the others' wait always ends. Both counters are reset by the
        // last split (the next launch finds them at 0).
        const int tile_id = mt * num_n + nt;
        int* tickets = counters + 2 * tile_id;
        int* done = tickets + 1;
        float* mine = ws + (size_t)r0 * N + n0 + q * 2;
        if (tid == 128) {
          const int ticket = atomicAdd(tickets, 1);
          asm volatile("st.shared.u32 [%0], %1;" ::"r"(flag_slot), "r"(ticket) : "memory");
        }
        asm volatile("bar.sync 3, 256;" ::: "memory");
        u32 ticket;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(ticket) : "r"(flag_slot) : "memory");
        if (ticket == 0) {
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            if (v0) *reinterpret_cast<float2*>(mine + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
            if (v1) *reinterpret_cast<float2*>(mine + (size_t)8 * N + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
          }
        } else {
          if (tid == 128) {
            int seen;
            do {
              asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(done) : "memory");
            } while (seen < 1);
          }
          asm volatile("bar.sync 3, 256;" ::: "memory");
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            if (v0)
              asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(mine + 8 * j), "f"(acc[4 * j]), "f"(acc[4 * j + 1])
                           : "memory");
            if (v1)
              asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(mine + (size_t)8 * N + 8 * j), "f"(acc[4 * j + 2]),
                           "f"(acc[4 * j + 3])
                           : "memory");
          }
        }
        __threadfence();
        asm volatile("bar.sync 3, 256;" ::: "memory");
        if (tid == 128) {
          const u32 last = atomicAdd(done, 1) == splits - 1;
          if (last) *tickets = 0, *done = 0;  // ready for the next launch
          asm volatile("st.shared.u32 [%0], %1;" ::"r"(flag_slot), "r"(last) : "memory");
        }
        asm volatile("bar.sync 3, 256;" ::: "memory");
        u32 last;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag_slot) : "memory");
        if (!last) continue;
        __threadfence();
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const float2 a = v0 ? __ldcg(reinterpret_cast<const float2*>(mine + 8 * j)) : make_float2(0.f, 0.f);
          const float2 b = v1 ? __ldcg(reinterpret_cast<const float2*>(mine + (size_t)8 * N + 8 * j)) : make_float2(0.f, 0.f);
          acc[4 * j] = a.x, acc[4 * j + 1] = a.y, acc[4 * j + 2] = b.x, acc[4 * j + 3] = b.y;
        }
      }
#else
      if (splits > 1) {
        // Split K: every split writes its scaled fp32 partial tile to ws[sp]; the split that
        // arrives last at the tile's counter adds the others and runs the normal epilogue.
        const int tile_id = mt * num_n + nt;
        const size_t stride_sp = (size_t)num_m * BM * N;
        float* mine = ws + sp * stride_sp + (size_t)r0 * N + n0 + q * 2;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          // Rows >= M are never stored: their partials are neither written nor read (M = 70: 55% of the traffic).
          if (v0) *reinterpret_cast<float2*>(mine + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
          if (v1) *reinterpret_cast<float2*>(mine + (size_t)8 * N + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
        }
        __threadfence();
        asm volatile("bar.sync 3, 256;" ::: "memory");
        if (tid == 128) {
          const int arrived = atomicAdd(counters + tile_id, 1);
          const u32 last = arrived == splits - 1;
          if (last) counters[tile_id] = 0;  // ready for the next launch
          asm volatile("st.shared.u32 [%0], %1;" ::"r"(flag_slot), "r"(last) : "memory");
        }
        asm volatile("bar.sync 3, 256;" ::: "memory");
        u32 last;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag_slot) : "memory");
        if (!last) continue;
        __threadfence();
        for (int other = 0; other < splits; ++other) {
          if (other == sp) continue;
          const float* p = ws + other * stride_sp + (size_t)r0 * N + n0 + q * 2;
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const float2 a = v0 ? __ldcg(reinterpret_cast<const float2*>(p + 8 * j)) : make_float2(0.f, 0.f);
            const float2 b = v1 ? __ldcg(reinterpret_cast<const float2*>(p + (size_t)8 * N + 8 * j)) : make_float2(0.f, 0.f);
            acc[4 * j] += a.x, acc[4 * j + 1] += a.y, acc[4 * j + 2] += b.x, acc[4 * j + 3] += b.y;
          }
        }
      }
#endif
      const u32 dbuf = sD + cw * (2 * D_BUF_BYTES);
#pragma unroll
      for (int chunk = 0; chunk < BN / 64; ++chunk) {
        const u32 buf = dbuf + (chunk & 1) * D_BUF_BYTES;
        // The store issued from this buffer two chunks ago must have finished reading it.
        if (t128 == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = chunk * 8 + jj;
          // 128B swizzle: 16-byte unit jj of row r lives at unit jj ^ (r & 7); rows r and r+8 share it.
          const u32 a0 = buf + row * 128 + ((jj ^ (row & 7)) << 4) + q * 4;
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(a0), "r"(pack_bf16x2(acc[4 * j], acc[4 * j + 1])) : "memory");
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(a0 + 8 * 128), "r"(pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]))
                       : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // st.shared visible to the TMA engine
        asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
        if (t128 == 0) {
          tma_store_2d(&tmD, buf, n0 + chunk * 64, m0 + cw * 64);
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
      }
    }
    if (t128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
#if CLUSTER_M > 1
  // No CTA may leave while its peer can still multicast into it or arrive on its barriers.
  asm volatile("barrier.cluster.arrive.release; barrier.cluster.wait.acquire;" ::: "memory");
#endif
}
