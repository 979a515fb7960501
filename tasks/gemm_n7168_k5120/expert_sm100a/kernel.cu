// Expert sm_100a GEMM for gemm_n7168_k5120: C[M,N] = A[M,K] * B[N,K]^T, bf16 in/out, fp32 accumulate.
// Blackwell (B200) version: tcgen05.mma with the accumulator in tensor memory.
// NOT RUN: no sm_100 GPU was available; compiled with ptxas 13.0 for sm_100a only (NOTES.md).
//
// Design:
//  - 128x256 output tile per CTA, K sliced by 64 (128-byte swizzled rows), STAGES-deep TMA
//    ring with full/empty mbarriers. Persistent grid, tiles walked in groups of GROUP_M rows.
//  - 192 threads, one role per warp: warp 0 = TMA producer (one lane), warp 1 = tensor
//    memory owner (tcgen05.alloc/dealloc, whole warp) and MMA issuer (one lane: four
//    tcgen05.mma kind::f16 M=128 N=256 K=16 per K slice), warps 2..5 = epilogue.
//  - The accumulator lives in tensor memory, double-buffered (2 x 256 fp32 columns = all
//    512 columns), so the epilogue of tile i overlaps the MMAs of tile i+1.
//  - tcgen05.commit -> mbarrier frees a smem stage once the MMAs reading it are done, and
//    signals "accumulator ready" after the last K slice of a tile.
//  - Epilogue: tcgen05.ld 32x32b.x32 (warp w reads lanes 32*(w%4)..+31 = tile rows),
//    fp32 -> bf16, 16-byte global stores of 64 contiguous bytes per thread, rows >= M skipped.
// M may be any positive value (TMA zero-fills rows >= M), N a multiple of 256, K >= 1.

#ifndef STAGES
#define STAGES 4
#endif
#ifndef GROUP_M
#define GROUP_M 16
#endif
#define BM 128
#define BN 256
#define BK 64
#define A_STAGE_BYTES (BM * BK * 2)
#define B_STAGE_BYTES (BN * BK * 2)
#define TMEM_COLS 512  // two accumulators of 256 fp32 columns

typedef unsigned int u32;
typedef unsigned long long u64;

static __device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
static __device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
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
static __device__ __forceinline__ void tma_load_2d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// tcgen05 shared-memory descriptor, K-major tile with 128-byte rows in 128B swizzle:
// start >> 4 (bits 0-13), LBO unused (1), SBO = 1024 B between 8-row groups (bits 32-45),
// fixed version 0b001 (bits 46-48), base offset 0 (1024-aligned tiles), swizzle mode 2 =
// 128B (bits 61-63). Step along K inside the row by adding bytes >> 4 to the start field.
static __device__ __forceinline__ u64 umma_desc_sw128(u32 saddr) {
  return (u64)((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 46) | (2ull << 61);
}
// Instruction descriptor, kind::f16: D fp32 (bits 4-5 = 1), A and B bf16 (bits 7-9, 10-12 = 1),
// both K-major (bits 15, 16 = 0), N >> 3 at bits 17-22, M >> 4 at bits 24-28.
#define IDESC ((1u << 4) | (1u << 7) | (1u << 10) | ((u32)(BN >> 3) << 17) | ((u32)(BM >> 4) << 24))

static __device__ __forceinline__ void umma_bf16(u32 d_tmem, u64 adesc, u64 bdesc, u32 accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %4, 0;\n"
      "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p; }" ::"r"(d_tmem),
      "l"(adesc), "l"(bdesc), "r"(IDESC), "r"(accumulate)
      : "memory");
}
// Arrive on `bar` once every tcgen05 op this thread issued so far has completed.
static __device__ __forceinline__ void umma_commit(u32 bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void tmem_ld_32cols(u32 taddr, u32 (&v)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, [%32];"
      :
        "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]), "=r"(v[4]), "=r"(v[5]), "=r"(v[6]), "=r"(v[7]),
        "=r"(v[8]), "=r"(v[9]), "=r"(v[10]), "=r"(v[11]), "=r"(v[12]), "=r"(v[13]), "=r"(v[14]), "=r"(v[15]),
        "=r"(v[16]), "=r"(v[17]), "=r"(v[18]), "=r"(v[19]), "=r"(v[20]), "=r"(v[21]), "=r"(v[22]), "=r"(v[23]),
        "=r"(v[24]), "=r"(v[25]), "=r"(v[26]), "=r"(v[27]), "=r"(v[28]), "=r"(v[29]), "=r"(v[30]), "=r"(v[31])
      : "r"(taddr));
}

static __device__ __forceinline__ u32 pack_bf16x2(u32 lo, u32 hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__uint_as_float(hi)), "f"(__uint_as_float(lo)));
  return r;
}

static __device__ __forceinline__ void tile_coords(int t, int num_m, int num_n, int& m, int& n) {
  const int per_group = GROUP_M * num_n;
  const int g = t / per_group;
  const int first = g * GROUP_M;
  const int size = min(num_m - first, GROUP_M);
  const int r = t - g * per_group;
  m = first + r % size;
  n = r / size;
}

extern "C" __global__ void __launch_bounds__(192, 1)
gemm_bf16_tn_sm100(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                   unsigned short* __restrict__ C, int M, int N, int K) {
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const u32 sA = base;
  const u32 sB = sA + STAGES * A_STAGE_BYTES;
  const u32 bars = sB + STAGES * B_STAGE_BYTES;
  // full[s] = bars + 8s, empty[s] = bars + 8(STAGES+s), acc_full[b] = bars + 8(2 STAGES + b),
  // acc_empty[b] = bars + 8(2 STAGES + 2 + b), tensor-memory base address at bars + 8(2 STAGES + 4).
  const u32 acc_full = bars + 8 * (2 * STAGES), acc_empty = acc_full + 16;
  const u32 tmem_slot = acc_full + 32;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);             // producer's expect_tx arrival
      mbar_init(bars + 8 * (STAGES + s), 1);  // tcgen05.commit from the MMA lane
    }
    for (int b = 0; b < 2; ++b) {
      mbar_init(acc_full + 8 * b, 1);   // tcgen05.commit after a tile's last MMA
      mbar_init(acc_empty + 8 * b, 4);  // one arrival per epilogue warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (warp == 1) {  // the whole warp allocates; the address lands in shared memory
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(tmem_slot), "n"(TMEM_COLS) : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
  }
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
  __syncthreads();
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
  u32 tmem_base;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(tmem_base) : "r"(tmem_slot) : "memory");

  const int num_n = N / BN;
  const int num_m = (M + BM - 1) / BM;
  const int num_tiles = num_m * num_n;
  const int num_k = (K + BK - 1) / BK;

  if (warp == 0) {
    // ------------------------------------------------------------ TMA producer
    if (lane == 0) {
      int it = 0;
      for (int t = blockIdx.x; t < num_tiles; t += gridDim.x) {
        int m, n;
        tile_coords(t, num_m, num_n, m, n);
        for (int kb = 0; kb < num_k; ++kb, ++it) {
          const int s = it % STAGES;
          const u32 full = bars + 8 * s;
          mbar_wait(bars + 8 * (STAGES + s), ((it / STAGES) & 1) ^ 1);
          mbar_expect_tx(full, A_STAGE_BYTES + B_STAGE_BYTES);
          tma_load_2d(sA + s * A_STAGE_BYTES, &tmA, full, kb * BK, m * BM);
          tma_load_2d(sB + s * B_STAGE_BYTES, &tmB, full, kb * BK, n * BN);
        }
      }
    }
  } else if (warp == 1) {
    // ------------------------------------------------------------ MMA issuer
    if (lane == 0) {
      int it = 0, local = 0;
      for (int t = blockIdx.x; t < num_tiles; t += gridDim.x, ++local) {
        const int b = local & 1;
        const u32 d_tmem = tmem_base + b * BN;  // column offset of this accumulator
        mbar_wait(acc_empty + 8 * b, ((local >> 1) & 1) ^ 1);  // epilogue drained it
        asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
        for (int kb = 0; kb < num_k; ++kb, ++it) {
          const int s = it % STAGES;
          mbar_wait(bars + 8 * s, (it / STAGES) & 1);
          asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
          const u64 da = umma_desc_sw128(sA + s * A_STAGE_BYTES);
          const u64 db = umma_desc_sw128(sB + s * B_STAGE_BYTES);
#pragma unroll
          for (int kk = 0; kk < BK / 16; ++kk) umma_bf16(d_tmem, da + 2 * kk, db + 2 * kk, (kb > 0 || kk > 0) ? 1u : 0u);
          umma_commit(bars + 8 * (STAGES + s));  // stage free once these MMAs have read it
        }
        umma_commit(acc_full + 8 * b);  // accumulator complete
      }
    }
  } else {
    // ------------------------------------------------------------ epilogue (warps 2..5)
    const int quarter = warp & 3;  // tcgen05.ld: warp w may touch lanes 32*(w%4) .. +31
    int local = 0;
    for (int t = blockIdx.x; t < num_tiles; t += gridDim.x, ++local) {
      int m, n;
      tile_coords(t, num_m, num_n, m, n);
      const int b = local & 1;
      mbar_wait(acc_full + 8 * b, (local >> 1) & 1);
      asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
      const int row = m * BM + quarter * 32 + lane;  // TMEM lane = tile row
      const u32 taddr = tmem_base + ((u32)(quarter * 32) << 16) + b * BN;
      unsigned short* out = C + (size_t)row * N + n * BN;
#pragma unroll 1
      for (int c = 0; c < BN / 32; ++c) {
        u32 v[32];
        tmem_ld_32cols(taddr + c * 32, v);
        asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory");
        if (row < M) {
          uint4* dst = reinterpret_cast<uint4*>(out + c * 32);
#pragma unroll
          for (int q = 0; q < 4; ++q)
            dst[q] = make_uint4(pack_bf16x2(v[8 * q], v[8 * q + 1]), pack_bf16x2(v[8 * q + 2], v[8 * q + 3]),
                                pack_bf16x2(v[8 * q + 4], v[8 * q + 5]), pack_bf16x2(v[8 * q + 6], v[8 * q + 7]));
        }
      }
      // All of this warp's tensor-memory reads are done: hand the accumulator back.
      asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
      __syncwarp();
      if (lane == 0) mbar_arrive(acc_empty + 8 * b);
    }
  }

  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
  __syncthreads();
  if (warp == 1) {
    asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(tmem_base), "n"(TMEM_COLS) : "memory");
  }
}
