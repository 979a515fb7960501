// Expert sm_90a attention forward, head dim 128: O = softmax(sm_scale * Q K^T [causal]) V and the
// natural-log LSE of each query row. Q, K, V, O are [B, H, S, 128] bf16 (D contiguous), LSE [B, H, S] fp32.
// Two kernels from one body: attn_fwd_sm90 (non-causal) and attn_fwd_causal_sm90 (top-left causal).
//
// Design (NOTES.md has the measurements behind each choice):
//  - One CTA per (128-row query tile, batch*head); 384 threads. Warpgroup 0 produces (one thread
//    issues TMA, setmaxnreg.dec), warpgroups 1-2 consume (setmaxnreg.inc), each owning 64 query rows.
//  - Tensor maps view Q/K/V/O as [B*H, S, 128] with 128-byte swizzle; a 128x128 tile is two boxes of
//    128 rows x 64 columns (16 KiB each). Rows past S of a head are zero-filled by TMA on load and
//    clipped by TMA on store, so any S >= 1 works; keys past S get -inf scores.
//  - Q tile loaded once; K and V tiles through a STAGES-deep ring with separate full/empty mbarriers
//    for K and V (S = Q K^T can start before V has landed).
//  - S = Q K^T: wgmma m64n128k16, Q and K from shared memory (both K-major).
//  - Online softmax in registers in the log2 domain (sm_scale*log2(e) folded into one FFMA before
//    ex2.approx), per-thread partial row sums (reduced across the quad only at the end).
//  - O += P V: P converted to bf16 in registers and used as the A operand straight from registers
//    (the m64nNk16 accumulator layout of S is the A-fragment layout); V from shared memory as an
//    N-major ("transposed") B operand: 128B-swizzle MN-major descriptor, LBO = 16 KiB between the two
//    64-column halves, SBO = 1 KiB between 8-key groups.
//  - Intra-warpgroup overlap: iteration j issues S_j = Q K_j^T and O += P_{j-1} V_{j-1} back to back,
//    then does softmax(S_j) while the P V product runs on the tensor cores.
//  - PINGPONG=1: the two consumer warpgroups take turns issuing their GEMMs (named barriers), so one
//    warpgroup's softmax overlaps the other's GEMMs.
//  - Epilogue: O / l -> bf16 -> 128B-swizzled staging in the warpgroup's own (finished) part of the Q
//    buffer -> TMA store (clips rows >= S); LSE stored directly with a bounds check.

#ifndef STAGES
#define STAGES 3
#endif
#ifndef PINGPONG
#define PINGPONG 1
#endif
#ifndef PV_SPLIT
#define PV_SPLIT 0  // 1: O += P V as two m64n64k16 per key step (no LBO use); 0: one m64n128k16
#endif

#define BM 128
#define BN 128
#define HD 128
#define HALF_BYTES (128 * 128)              // one 128-row x 64-column bf16 box (16 KiB)
#define TILE_BYTES (2 * HALF_BYTES)         // a 128 x 128 bf16 tile (32 KiB)
#define CONSUMER_REGS 240
#define PRODUCER_REGS 24
#define SMEM_BYTES (1024 + TILE_BYTES * (1 + 2 * STAGES) + 256)

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

// ---------------------------------------------------------------- TMA (3-D: column, row, batch*head)
static __device__ __forceinline__ void tma_load_3d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
static __device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, u32 src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(map), "r"(src), "r"(c0),
               "r"(c1), "r"(c2)
               : "memory");
}

// ---------------------------------------------------------------- wgmma
// K-major 128B-swizzled tile (rows of 128 bytes, 8-row groups 1 KiB apart): LBO unused (1), SBO 1 KiB.
static __device__ __forceinline__ u64 desc_kmajor(u32 saddr) {
  return (u64)((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
// MN-major 128B-swizzled tile (V: rows = keys = the K dimension, 64 columns of N per 128-byte row):
// LBO = bytes between 64-column halves of N, SBO = bytes between 8-key groups.
static __device__ __forceinline__ u64 desc_mnmajor(u32 saddr) {
  return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)(HALF_BYTES >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

#define ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define ACC32(d, i) ACC8(d, i), ACC8(d, i + 8), ACC8(d, i + 16), ACC8(d, i + 24)
#define REGS32                                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define REGS64                                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (64x128 fp32) (+)= A (smem, K-major) * B (smem, K-major)^T
template <int SCALE_D>
static __device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], u64 da, u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : ACC32(d, 0), ACC32(d, 32)
      : "l"(da), "l"(db), "n"(SCALE_D));
}
// d (64x128 fp32) += A (registers, 64x16 bf16) * B (smem, N-major, 16x128)
static __device__ __forceinline__ __attribute__((unused)) void wgmma_rs_n128(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : ACC32(d, 0), ACC32(d, 32)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
// d (64x64 fp32, columns [32*h .. 32*h+31] of the 64x128 accumulator) += A (registers) * B (smem, N-major, 16x64)
template <int H>
static __device__ __forceinline__ __attribute__((unused)) void wgmma_rs_n64(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : ACC32(d, 32 * H)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

static __device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
static __device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
static __device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// S = Q K^T for this warpgroup's 64 rows: 8 k-steps of 16 over the head dim (4 per 64-column half).
static __device__ __forceinline__ void issue_qk(float (&s)[64], u32 q_base, u32 k_base) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const u32 off = (kk >> 2) * HALF_BYTES + (kk & 3) * 32;  // +32 bytes along the swizzled row per k-step
    if (kk == 0)
      wgmma_ss_n128<0>(s, desc_kmajor(q_base + off), desc_kmajor(k_base + off));
    else
      wgmma_ss_n128<1>(s, desc_kmajor(q_base + off), desc_kmajor(k_base + off));
  }
}
// O += P V: 8 k-steps of 16 keys; P's A fragment for keys 16kk..16kk+15 is p[4kk..4kk+3].
static __device__ __forceinline__ void issue_pv(float (&o)[64], const u32 (&p)[32], u32 v_base) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
#if PV_SPLIT
    wgmma_rs_n64<0>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], desc_mnmajor(v_base + kk * 2048));
    wgmma_rs_n64<1>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], desc_mnmajor(v_base + HALF_BYTES + kk * 2048));
#else
    wgmma_rs_n128(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], desc_mnmajor(v_base + kk * 2048));
#endif
  }
}

// Online softmax of one 64x128 score tile held as the wgmma accumulator s (this thread: rows r0 and
// r0 + 8, columns 8j + 2q + {0,1}). Updates the running max (log2 units) and partial sums, leaves
// exp2 values in s and returns the factors that rescale the previous O rows.
template <bool MASK, bool CAUSAL>
static __device__ __forceinline__ void online_softmax(float (&s)[64], float& m0, float& m1, float& l0, float& l1, float& a0,
                                                      float& a1, float scale_log2, int key0, int qrow0, int S) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const int q2 = 2 * (threadIdx.x & 3);
  if (MASK) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * j + q2 + e;
        if (CAUSAL ? key > qrow0 : key >= S) s[4 * j + e] = NEG_INF;
        if (CAUSAL ? key > qrow0 + 8 : key >= S) s[4 * j + 2 + e] = NEG_INF;
      }
  }
  float mx0 = s[0], mx1 = s[2];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  mx0 = quad_max(mx0) * scale_log2;
  mx1 = quad_max(mx1) * scale_log2;
  const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
  // A row with every key so far masked keeps max -inf; subtract 0 then, so exp2 gives 0, not NaN.
  const float u0 = n0 == NEG_INF ? 0.f : n0, u1 = n1 == NEG_INF ? 0.f : n1;
  a0 = fast_exp2(m0 - u0);
  a1 = fast_exp2(m1 - u1);
  m0 = n0;
  m1 = n1;
  float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    s[4 * j] = fast_exp2(fmaf(s[4 * j], scale_log2, -u0));
    s[4 * j + 1] = fast_exp2(fmaf(s[4 * j + 1], scale_log2, -u0));
    s[4 * j + 2] = fast_exp2(fmaf(s[4 * j + 2], scale_log2, -u1));
    s[4 * j + 3] = fast_exp2(fmaf(s[4 * j + 3], scale_log2, -u1));
    sum0 += s[4 * j] + s[4 * j + 1];
    sum1 += s[4 * j + 2] + s[4 * j + 3];
  }
  l0 = l0 * a0 + sum0;
  l1 = l1 * a1 + sum1;
}

static __device__ __forceinline__ void pack_p(u32 (&p)[32], const float (&s)[64]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) p[i] = pack_bf16x2(s[2 * i], s[2 * i + 1]);
}

// Ping-pong: warpgroup c waits for its turn (barrier 1 + c) before issuing GEMMs and hands the turn
// to the other (barrier 2 - c) after. Both barriers count 256 threads: 128 syncing + 128 arriving.
static __device__ __forceinline__ void turn_wait(int cw) {
#if PINGPONG
  asm volatile("bar.sync %0, 256;" ::"r"(1 + cw) : "memory");
#endif
}
static __device__ __forceinline__ void turn_pass(int cw) {
#if PINGPONG
  asm volatile("bar.arrive %0, 256;" ::"r"(2 - cw) : "memory");
#endif
}

template <bool CAUSAL>
static __device__ __forceinline__ void attn_fwd_body(const CUtensorMap* tmQ, const CUtensorMap* tmK, const CUtensorMap* tmV,
                                                     const CUtensorMap* tmO, float* __restrict__ LSE, int S, float scale_log2) {
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 128B swizzle: tiles 1 KiB aligned
  const u32 sQ = base;
  const u32 sK = sQ + TILE_BYTES;
  const u32 sV = sK + STAGES * TILE_BYTES;
  const u32 bars = sV + STAGES * TILE_BYTES;
  // q_full at bars; k_full[s] at +8(1+s); v_full[s] at +8(1+STAGES+s); k_empty[s] at +8(1+2*STAGES+s);
  // v_empty[s] at +8(1+3*STAGES+s)
  const u32 q_full = bars;
#define K_FULL(s) (bars + 8 * (1 + (s)))
#define V_FULL(s) (bars + 8 * (1 + STAGES + (s)))
#define K_EMPTY(s) (bars + 8 * (1 + 2 * STAGES + (s)))
#define V_EMPTY(s) (bars + 8 * (1 + 3 * STAGES + (s)))

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int num_m = gridDim.x;
  // Causal: the heaviest query tile of each head first (block x = 0 gets the last tile).
  const int mt = CAUSAL ? num_m - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int bh = blockIdx.y;
  const int m0 = mt * BM;
  const int num_kv_all = (S + BN - 1) / BN;
  const int n_kv = CAUSAL ? min(num_kv_all, mt + 1) : num_kv_all;  // BM == BN: tile mt ends on the diagonal
  // The last key tile needs a mask: causal (diagonal) or keys past S.
  const bool mask_last = CAUSAL || (S % BN) != 0;

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(K_FULL(s), 1);
      mbar_init(V_FULL(s), 1);
      mbar_init(K_EMPTY(s), 2);  // one arrival per consumer warpgroup
      mbar_init(V_EMPTY(s), 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(tmQ) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(tmK) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(tmV) : "memory");
      mbar_expect_tx(q_full, TILE_BYTES);
      tma_load_3d(sQ, tmQ, q_full, 0, m0, bh);
      tma_load_3d(sQ + HALF_BYTES, tmQ, q_full, 64, m0, bh);
      for (int j = 0; j < n_kv; ++j) {
        const int s = j % STAGES;
        const u32 ph = (j / STAGES) & 1;
        mbar_wait(K_EMPTY(s), ph ^ 1);
        mbar_expect_tx(K_FULL(s), TILE_BYTES);
        tma_load_3d(sK + s * TILE_BYTES, tmK, K_FULL(s), 0, j * BN, bh);
        tma_load_3d(sK + s * TILE_BYTES + HALF_BYTES, tmK, K_FULL(s), 64, j * BN, bh);
        mbar_wait(V_EMPTY(s), ph ^ 1);
        mbar_expect_tx(V_FULL(s), TILE_BYTES);
        tma_load_3d(sV + s * TILE_BYTES, tmV, V_FULL(s), 0, j * BN, bh);
        tma_load_3d(sV + s * TILE_BYTES + HALF_BYTES, tmV, V_FULL(s), 64, j * BN, bh);
      }
    }
  } else {
    // ------------------------------------------------------------ consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1;  // rows cw*64 .. cw*64+63 of the query tile
    const int t128 = tid & 127;
    const int warp = t128 >> 5, lane = tid & 31;
    const int r_in = warp * 16 + (lane >> 2);  // this thread's first row within the warpgroup's 64 (also +8)
    const int qrow0 = m0 + cw * 64 + r_in;     // its query index
    const u32 q_base = sQ + cw * (64 * 128);   // this warpgroup's 64 rows in each 64-column half
    const float NEG_INF = -__int_as_float(0x7f800000);

    float o[64], s[64];
    u32 p[32];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m_0 = NEG_INF, m_1 = NEG_INF, l_0 = 0.f, l_1 = 0.f, a_0, a_1;

#if PINGPONG
    if (cw == 1) asm volatile("bar.arrive %0, 256;" ::"r"(1) : "memory");  // warpgroup 0 goes first
#endif
    mbar_wait(q_full, 0);
    // ---- key tile 0: S_0 and its softmax
    mbar_wait(K_FULL(0), 0);
    turn_wait(cw);
    wgmma_fence();
    issue_qk(s, q_base, sK);
    wgmma_commit();
    turn_pass(cw);
    wgmma_wait<0>();
    if (t128 == 0) mbar_arrive(K_EMPTY(0));
    if (mask_last && n_kv == 1)
      online_softmax<true, CAUSAL>(s, m_0, m_1, l_0, l_1, a_0, a_1, scale_log2, 0, qrow0, S);
    else
      online_softmax<false, CAUSAL>(s, m_0, m_1, l_0, l_1, a_0, a_1, scale_log2, 0, qrow0, S);
    pack_p(p, s);

    // ---- key tiles 1..n-1: S_j overlaps... issue S_j and P_{j-1} V_{j-1}, softmax S_j meanwhile
    for (int j = 1; j < n_kv; ++j) {
      const int st = j % STAGES, pst = (j - 1) % STAGES;
      mbar_wait(K_FULL(st), (j / STAGES) & 1);
      turn_wait(cw);
      wgmma_fence();
      issue_qk(s, q_base, sK + st * TILE_BYTES);
      wgmma_commit();
      mbar_wait(V_FULL(pst), ((j - 1) / STAGES) & 1);
      issue_pv(o, p, sV + pst * TILE_BYTES);
      wgmma_commit();
      turn_pass(cw);
      wgmma_wait<1>();  // S_j is done
      if (t128 == 0) mbar_arrive(K_EMPTY(st));
      if (mask_last && j == n_kv - 1)
        online_softmax<true, CAUSAL>(s, m_0, m_1, l_0, l_1, a_0, a_1, scale_log2, j * BN, qrow0, S);
      else
        online_softmax<false, CAUSAL>(s, m_0, m_1, l_0, l_1, a_0, a_1, scale_log2, j * BN, qrow0, S);
      wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O may be rescaled, P overwritten, V's slot freed
      if (t128 == 0) mbar_arrive(V_EMPTY(pst));
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        o[4 * i] *= a_0;
        o[4 * i + 1] *= a_0;
        o[4 * i + 2] *= a_1;
        o[4 * i + 3] *= a_1;
      }
      pack_p(p, s);
    }
    // ---- the last P V
    {
      const int pst = (n_kv - 1) % STAGES;
      mbar_wait(V_FULL(pst), ((n_kv - 1) / STAGES) & 1);
      turn_wait(cw);
      wgmma_fence();
      issue_pv(o, p, sV + pst * TILE_BYTES);
      wgmma_commit();
#if PINGPONG
      if (cw == 0) turn_pass(cw);  // warpgroup 1's last hand-over would have no taker
#endif
      wgmma_wait<0>();
      if (t128 == 0) mbar_arrive(V_EMPTY(pst));
    }

    // ---------------------------------------------------------- epilogue
    l_0 = quad_sum(l_0);
    l_1 = quad_sum(l_1);
    const float inv0 = l_0 > 0.f ? 1.f / l_0 : 0.f, inv1 = l_1 > 0.f ? 1.f / l_1 : 0.f;
    const int q4 = (lane & 3) * 4;
    // Stage O (bf16) in this warpgroup's 64 rows of the Q buffer, 128B-swizzled like a TMA box:
    // 16-byte unit u of row r lives at unit u ^ (r & 7); rows r and r + 8 share the XOR.
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const u32 a = q_base + (j >> 3) * HALF_BYTES + r_in * 128 + (((j & 7) ^ (r_in & 7)) << 4) + q4;
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(a), "r"(pack_bf16x2(o[4 * j] * inv0, o[4 * j + 1] * inv0)) : "memory");
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(a + 8 * 128), "r"(pack_bf16x2(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1))
                   : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // st.shared -> visible to the TMA engine
    asm volatile("bar.sync %0, 128;" ::"r"(3 + cw) : "memory");
    if (t128 == 0) {
      tma_store_3d(tmO, q_base, 0, m0 + cw * 64, bh);
      tma_store_3d(tmO, q_base + HALF_BYTES, 64, m0 + cw * 64, bh);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    if ((lane & 3) == 0) {
      const float LN2 = 0.6931471805599453f;
      float* lse = LSE + (size_t)bh * S;
      if (qrow0 < S) lse[qrow0] = (m_0 + __log2f(l_0)) * LN2;
      if (qrow0 + 8 < S) lse[qrow0 + 8] = (m_1 + __log2f(l_1)) * LN2;
    }
    if (t128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // staging must outlive the read
  }
}

extern "C" __global__ void __launch_bounds__(384, 1)
attn_fwd_sm90(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
              const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmO, float* __restrict__ LSE,
              int S, float scale_log2) {
  attn_fwd_body<false>(&tmQ, &tmK, &tmV, &tmO, LSE, S, scale_log2);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attn_fwd_causal_sm90(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmO,
                     float* __restrict__ LSE, int S, float scale_log2) {
  attn_fwd_body<true>(&tmQ, &tmK, &tmV, &tmO, LSE, S, scale_log2);
}
