// Expert sm_90a attention backward, head dim 128. Given Q, K, V, O, dO ([B, H, S, 128] bf16, D contiguous)
// and the forward's LSE ([B, H, S] fp32, natural log): dQ, dK, dV (bf16). Two launches (v6; v5 had a third):
//   1. attn_bwd_pre_sm90:   Delta = rowsum(dO * O) (fp32) and dQacc = 0 (fp32 scratch), one warp per row.
//   2. attn_bwd_main_sm90 / attn_bwd_main_causal_sm90: one CTA per (128-key block, batch*head), 384
//      threads. Warpgroup 0 produces (setmaxnreg.dec; one thread issues the TMA loads and, DQ_WARP, one
//      thread of warp 1 the dQ reduce-adds, so no consumer thread waits on or issues bulk copies: v4,
//      +6%), warpgroups 1-2 consume
//      (setmaxnreg.inc), each owning 64 of the block's keys. K and V stay in shared memory; 64-query
//      blocks of Q, dO, LSE and Delta stream through a STAGES-deep ring. Per query block, per warpgroup,
//      everything is computed transposed (keys are the M dimension), so P^T and dS^T come out of the
//      wgmma accumulators in exactly the A-fragment layout and feed the next products from registers:
//        S^T  = K Q^T          (wgmma m64n64k16, K and Q from shared memory, both K-major)
//        dP^T = V dO^T         (same)
//        P^T  = exp2(S^T * scale*log2e - LSE*log2e)     (0 where masked)
//        dV  += P^T dO         (wgmma m64n128k16, A = P^T bf16 from registers, dO N-major from smem)
//        dS^T = P^T * (dP^T - Delta)
//        dK  += dS^T Q         (same shape, A = dS^T from registers)
//        dQ_blk = dS K         (dS^T of both warpgroups through shared memory as an M-major A operand;
//                               warpgroup c computes head-dim columns 64c..64c+63 over all 128 keys)
//                               with DQ_COMP, dS = hi + lo in two bf16 parts and two products
//        dQacc += dQ_blk       (DQ_TMA: staged in smem as fp32, handed to the reducer warp by mbarrier, added
//                               by cp.reduce.async.bulk.tensor (TMA reduce-add; clips rows >= S); issued
//                               before dK, so the drain overlaps dK)
//      dK, dV are scaled by sm_scale, rounded to bf16 and stored by TMA (which clips keys >= S).
//      Causal: CAUSAL_GROUP renumbers the CTAs so the longest key blocks (the first ones) start first.
//      DQ_HEADCONV (v5), where a head has more than one key block (conv): each CTA counts itself done in
//      its head once its reduce-adds are complete; the CTA that completes the count converts the head's
//      dQ = bf16(sm_scale * dQacc) while dQacc is still in L2. DQ_DIRECT (v6), where a head has one key block
//      (S <= 128): the CTA sums all of the head's keys, so the consumers store dQ = bf16(sm_scale * dQ_blk)
//      themselves, and the pre kernel leaves dQacc alone.
//   (attn_bwd_dq_sm90: dQ = bf16(sm_scale * dQacc) in a launch of its own; v5 and earlier, DQ_DIRECT 0.)
// The other knobs below (AREG, DV_LATE, EXP_POLY, DQ_FUSE, QSTAGGER, DS_STMATRIX, DK_CARRY) are measured
// alternatives, off by default: NOTES.md, v4, says what each one did.
// Any S >= 1: TMA zero-fills rows past S of a head on load (Q, dO, K, V); P is masked to 0 for
// queries >= S and keys >= S (and for keys after the query when causal), and stores are clipped.

#ifndef STAGES
#define STAGES 2  // Q/dO ring depth (v3: 2 and 3 measured within +-2% of each other; 2 needs 33 KiB less smem)
#endif
#ifndef DQ_COMP
#define DQ_COMP 0  // 1: dQ from dS = hi + lo (two bf16 parts), 0: from bf16(dS) alone
#endif
#ifndef DQ_TMA
#define DQ_TMA 1  // 1: dQ_blk staged in smem, added by a TMA tensor reduce; 0: red.global.add.v2 per thread
#endif
#ifndef DQ_DEFER
#define DQ_DEFER 1  // 1: dQ is issued before dK and drained (staged, reduced) while dK runs
#endif

#ifndef AREG
#define AREG 0  // 1: this warpgroup's K rows live in registers as the A operand of S^T (RS wgmma); 2: V's, for dP^T
#endif
#ifndef DV_LATE
#define DV_LATE 0  // 1: dV is issued after dS^T is computed (lower register peak; the tensor cores wait for dS)
#endif
#ifndef EXP_POLY
#define EXP_POLY 0  // of each thread's 8 column groups of P^T (4 elements each), this many use poly_exp2 (FMA pipe), not MUFU
#endif
#ifndef DQ_WARP
#define DQ_WARP 1  // 1 (with DQ_TMA): a producer warp issues the dQ reduce-adds; consumers hand over their staged
                   // tile by mbarrier (no per-step named barrier or bulk-group wait in the consumers). v4: +6%
#endif
#if DQ_WARP && !DQ_TMA  // per-thread reds leave nothing for a reducer warp to do
#undef DQ_WARP
#define DQ_WARP 0
#endif
#ifndef DQ_FUSE
#define DQ_FUSE 0  // 1 (with DQ_WARP): no dQ launch; the CTA whose reduce-add completes a query block converts it
#endif
#if DQ_FUSE && !DQ_WARP
#error "DQ_FUSE needs DQ_WARP"
#endif
#ifndef DQ_HEADCONV
#define DQ_HEADCONV 1  // 1 (with DQ_WARP): where the launch asks (conv), the last CTA of a head to finish converts
                       // that head's dQacc, from L2, and the dQ launch has nothing left to do. v5: +1.3% / +2%
#endif
#if DQ_HEADCONV && (!DQ_WARP || DQ_FUSE)
#error "DQ_HEADCONV needs DQ_WARP and excludes DQ_FUSE"
#endif
#ifndef DQ_RING
#define DQ_RING 0  // 1 (with DQ_HEADCONV): dQacc is a ring of `ring` head slots (head bh in slot bh % ring), not one
                   // per head: the pre kernel zeroes only the ring, the converting CTA re-zeroes its slot for head
                   // bh + ring and releases it by a per-slot generation count (dQcnt[B*H + slot]); that head's
                   // reducer acquires it before its first reduce-add. (Heads bh - ring start before bh: CTAs are
                   // dispatched in launch order, and causal renumbering needs ring >= CAUSAL_GROUP.)
#endif
#if DQ_RING && !DQ_HEADCONV
#error "DQ_RING needs DQ_HEADCONV"
#endif
#if DQ_RING
#define RING_PARAM , int ring
#define RING_ARG , ring
#else
#define RING_PARAM
#define RING_ARG
#endif
#if DQ_FUSE  // the main kernel also takes the bf16 dQ output and one zeroed int32 counter per (head, query block)
#define FUSE_PARAMS , unsigned short *__restrict__ dQ, int *__restrict__ dQcnt
#define FUSE_ARGS , dQ, dQcnt
#elif DQ_HEADCONV  // ... dQ, one zeroed int32 counter per head, and whether to convert here (0: the dQ launch does)
#define FUSE_PARAMS , unsigned short *__restrict__ dQ, int *__restrict__ dQcnt, int conv RING_PARAM
#define FUSE_ARGS , dQ, dQcnt, conv RING_ARG
#else
#define FUSE_PARAMS
#define FUSE_ARGS
#endif
#ifndef DS_STMATRIX
#define DS_STMATRIX 0  // 1: dS^T goes to shared memory by stmatrix.x4 (4 instructions a thread, not 16 st.shared)
#endif
#ifndef QSTAGGER
#define QSTAGGER 0  // 1 (non-causal): each key block sweeps the query blocks from its own starting block
#endif
#ifndef CAUSAL_GROUP
#define CAUSAL_GROUP 8  // causal: CTAs renumbered longest first within groups of this many heads (0: head by head)
#endif
#ifndef DK_CARRY
#define DK_CARRY 0  // 1 (with DQ_DEFER): a step does not wait for its dK; the next step's S^T and dP^T queue behind it
#endif
#if DK_CARRY && (!DQ_DEFER || DV_LATE || AREG)
#error "DK_CARRY needs DQ_DEFER and neither DV_LATE nor AREG"
#endif
#ifndef DQ_DIRECT
#define DQ_DIRECT DQ_HEADCONV  // 1 (with DQ_HEADCONV): where a head has one key block (conv == 0) the CTA holds every key of the
                     // head, so its dQ_blk is the whole dQ of its query block: stored as bf16 by the consumers (no
                     // dQacc zeroing, reduce-adds or dQ launch). 0: the dQ launch converts those heads (v5)
#endif
#if DQ_DIRECT && !DQ_HEADCONV
#error "DQ_DIRECT needs DQ_HEADCONV"
#endif
#if DQ_RING && !DQ_DIRECT
#error "DQ_RING needs DQ_DIRECT (the pre kernel's ring argument)"
#endif
#ifndef HC_UNROLL
#define HC_UNROLL 16  // DQ_HEADCONV: 16-byte dQacc loads in flight per converting thread (16: 64 KiB per SM)
#endif
#ifndef AREG_KK
#define AREG_KK 8  // with AREG: the first AREG_KK of the 8 head-dim k-steps come from registers (4 registers each)
#endif

#define BN 128                   // keys per CTA
#define BM 64                    // queries per step
#define KV_HALF (128 * 128)      // 128 rows x 64 columns bf16 (one swizzled box)
#define KV_TILE (2 * KV_HALF)
#define QO_HALF (64 * 128)       // 64 rows x 64 columns bf16
#define QO_TILE (2 * QO_HALF)
#define DS_BYTES (128 * 128)     // dS^T: 128 keys x 64 queries bf16
#define DQ_STAGE (64 * 64 * 4)   // one warpgroup's dQ_blk: 64 queries x 64 columns fp32 (two 32-column boxes)
#define CONSUMER_REGS 240
#define PRODUCER_REGS 24

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

// ---------------------------------------------------------------- TMA
static __device__ __forceinline__ void tma_load_3d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
static __device__ __forceinline__ void tma_load_2d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
// dst += src, elementwise in fp32 (the type comes from the map); rows past S of a head are clipped.
static __device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, u32 src, int c0, int c1, int c2) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
static __device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, u32 src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(map), "r"(src), "r"(c0),
               "r"(c1), "r"(c2)
               : "memory");
}

// ---------------------------------------------------------------- wgmma
// 128B-swizzled shared-memory operand. K-major: rows of 128 bytes along K, SBO = 1 KiB between 8-row
// groups, LBO unused. MN-major: 64 elements of M/N per 128-byte row, rows along K; LBO = bytes between
// 64-element M/N chunks, SBO = 1 KiB between 8-row (K) groups.
static __device__ __forceinline__ u64 desc_sw128(u32 saddr, u32 lbo_bytes) {
  return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)(lbo_bytes >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
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

// d (64x64 fp32) (+)= A (smem) * B (smem); TA/TB: 0 = K-major, 1 = M/N-major.
template <int SCALE_D, int TA, int TB>
static __device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], u64 da, u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " REGS32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
      : ACC32(d, 0)
      : "l"(da), "l"(db), "n"(SCALE_D), "n"(TA), "n"(TB));
}
// The same with d = A * B written, not read (scale-d 0): the old accumulator values are not live into it
// (DK_CARRY needs the registers this frees).
#define ACC8W(d, i) "=f"(d[i]), "=f"(d[i + 1]), "=f"(d[i + 2]), "=f"(d[i + 3]), "=f"(d[i + 4]), "=f"(d[i + 5]), "=f"(d[i + 6]), "=f"(d[i + 7])
#define ACC32W(d, i) ACC8W(d, i), ACC8W(d, i + 8), ACC8W(d, i + 16), ACC8W(d, i + 24)
template <int TA, int TB>
static __device__ __forceinline__ void wgmma_ss_n64_first(float (&d)[32], u64 da, u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " REGS32 ", %32, %33, p, 1, 1, %34, %35;\n}\n"
      : ACC32W(d, 0)
      : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
#if DK_CARRY
#define SS_N64_FIRST(TA, TB, d, da, db) wgmma_ss_n64_first<TA, TB>(d, da, db)
#else
#define SS_N64_FIRST(TA, TB, d, da, db) wgmma_ss_n64<0, TA, TB>(d, da, db)
#endif
// d (64x128 fp32) += A (registers, 64x16 bf16) * B (smem, N-major 16x128)
static __device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : ACC32(d, 0), ACC32(d, 32)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
#if DK_CARRY
// The same, d = A * B where acc == 0 (a run-time scale-d): DK_CARRY starts dK this way, because a zeroing
// mov of an accumulator that is in flight across the loop's back-edge makes ptxas serialize every wgmma (C7515).
static __device__ __forceinline__ void wgmma_rs_n128_acc(float (&d)[64], u32 a0, u32 a1, u32 a2, u32 a3, u64 db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : ACC32(d, 0), ACC32(d, 32)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}
#endif
// d (64x64 fp32) (+)= A (registers, 64x16 bf16) * B (smem, K-major 16x64)
template <int SCALE_D>
static __device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : ACC32(d, 0)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "n"(SCALE_D));
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
#if AREG
static __device__ __forceinline__ u32 lds_u32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
#endif
static __device__ __forceinline__ float2 lds_f2(u32 addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
static __device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 2^x on the FMA pipe (the MUFU unit does 16 ex2 per clock per SM, the FMA pipes 128 FMAs): x = n + f with
// n = round(x) (the 1.5 * 2^23 trick leaves n in the low mantissa bits) and f in [-0.5, 0.5], 2^f by a
// degree-4 polynomial (least squares on relative error: 5.3e-6, far below P's bf16 rounding), 2^n added to
// the exponent field. x is clamped at -126: below that the result is a subnormal ~2^-126 (as good as ex2.ftz's 0),
// and at -127 a p just under 1 would carry into the sign bit (NaN).
static __device__ __forceinline__ float poly_exp2(float x) {
  x = fmaxf(x, -126.f);
  const float t = x + 12582912.f;
  const float f = x - (t - 12582912.f);
  float p = fmaf(f, 0.009554105f, 0.05587041f);
  p = fmaf(p, f, 0.24024697f);
  p = fmaf(p, f, 0.69312805f);
  p = fmaf(p, f, 0.99999946f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}
template <bool POLY>
static __device__ __forceinline__ float exp2_of(float x) {
  return POLY ? poly_exp2(x) : fast_exp2(x);
}

// Stage a warpgroup's 64 rows x 128 columns (accumulator layout, scaled) as bf16 in two 128B-swizzled
// boxes of 64 rows x 64 columns at base and base + half_bytes: 16-byte unit u of row r lives at unit
// u ^ (r & 7); rows r and r + 8 share the XOR. Conflict-free 4-byte stores.
static __device__ __forceinline__ void stage_rows(u32 base, u32 half_bytes, int r, int q4, const float (&a)[64], float scale) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const u32 addr = base + (j >> 3) * half_bytes + r * 128 + (((j & 7) ^ (r & 7)) << 4) + q4;
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(pack_bf16x2(a[4 * j] * scale, a[4 * j + 1] * scale)) : "memory");
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr + 8 * 128), "r"(pack_bf16x2(a[4 * j + 2] * scale, a[4 * j + 3] * scale))
                 : "memory");
  }
}

template <bool CAUSAL>
static __device__ __forceinline__ void attn_bwd_body(const CUtensorMap* tmQ, const CUtensorMap* tmK, const CUtensorMap* tmV,
                                                     const CUtensorMap* tmdO, const CUtensorMap* tmLSE2,
                                                     const CUtensorMap* tmDelta, const CUtensorMap* tmdK,
                                                     const CUtensorMap* tmdV, const CUtensorMap* tmdQacc,
                                                     float* __restrict__ dQacc, int S,
                                                     float scale_log2, float sm_scale FUSE_PARAMS) {
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const u32 sK = base;
  const u32 sV = sK + KV_TILE;
  const u32 sQ = sV + KV_TILE;                 // STAGES x QO_TILE
  const u32 sdO = sQ + STAGES * QO_TILE;       // STAGES x QO_TILE
  const u32 sdS = sdO + STAGES * QO_TILE;      // 2 x DS_BYTES (double-buffered)
  const u32 sdSlo = sdS + 2 * DS_BYTES;        // 2 x DS_BYTES: dS - bf16(dS) (DQ_COMP)
  const u32 sdQ = sdSlo + (DQ_COMP ? 2 : 0) * DS_BYTES;  // 2 x DQ_STAGE, one per consumer warpgroup (DQ_TMA)
  const u32 sLD = sdQ + (DQ_TMA ? 2 : 0) * DQ_STAGE;     // per stage: 64 LSE*log2e floats, then 64 Delta floats
  const u32 bars = sLD + STAGES * 512;
  const u32 kv_full = bars;
#define FULL(s) (bars + 8 * (1 + (s)))
#define EMPTY(s) (bars + 8 * (1 + STAGES + (s)))
#define DQF(c) (bars + 8 * (1 + 2 * STAGES + (c)))      // DQ_WARP: consumer warpgroup c's dQ staging is written
#define DQE(c) (bars + 8 * (1 + 2 * STAGES + 2 + (c)))  // DQ_WARP: ... and has been read by its reduce-adds
#define CVF(k) (bars + 8 * (1 + 2 * STAGES + 4 + (k)))  // DQ_FUSE: mailbox slot k holds a query block to convert
#define CVE(k) (bars + 8 * (1 + 2 * STAGES + 6 + (k)))  // DQ_FUSE: ... and has been read
#define MAILBOX(k) (bars + 8 * (1 + 2 * STAGES + 8) + 4 * (k))

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  int nb = blockIdx.x, bh = blockIdx.y;
#if CAUSAL_GROUP
  if (CAUSAL) {
    // Causal key blocks differ in work (key block nb sees the query blocks from 2nb on). CTAs start in
    // linear block order, so renumber them: heads in groups of CAUSAL_GROUP, and within a group all its
    // heads' key block 0 first, then key block 1, ... The longest CTAs start first and the last ones to
    // start are short, which evens out the finish (a list-scheduling simulation at S = 4096 on 132 SMs:
    // 2.2% shorter than head by head), while the heads in flight stay few enough to share Q, dO and
    // dQacc in L2. A bijection on [0, gridDim.x * gridDim.y): the last group may hold fewer heads.
    const int nkb = gridDim.x, lin = blockIdx.y * nkb + blockIdx.x;
    const int base = lin / (CAUSAL_GROUP * nkb) * CAUSAL_GROUP;
    const int heads = min(CAUSAL_GROUP, (int)gridDim.y - base);
    const int w = lin - base * nkb;
    nb = w / heads;
    bh = base + w % heads;
  }
#endif
  const int n0 = nb * BN;
#if DQ_RING
  const int slot = bh % ring;  // this head's dQacc slot (the TMA map's outer coordinate, the conversion's source)
#else
  const int slot = bh;
#endif
  const int num_m = (S + BM - 1) / BM;
  const int m_begin = CAUSAL ? n0 / BM : 0;  // earlier query blocks see none of these keys
  const int n_iter = num_m - m_begin;
  // The query block of step i. QSTAGGER (non-causal): key block nb starts its sweep nb * num_m / nkb blocks
  // in and wraps around, so the CTAs of a head add into different dQacc blocks at any one time.
  const int q_first = (!CAUSAL && QSTAGGER) ? (int)(((long long)nb * num_m) / gridDim.x) : 0;
  auto qblk = [&](int i) {
    if (CAUSAL || !QSTAGGER) return m_begin + i;
    const int m = q_first + i;
    return m < num_m ? m : m - num_m;
  };

  if (tid == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(FULL(s), 1);
      mbar_init(EMPTY(s), 2);  // one arrival per consumer warpgroup
    }
#if DQ_WARP
    for (int c = 0; c < 2; ++c) {
      mbar_init(DQF(c), 4);  // one arrival per warp of consumer warpgroup c
      mbar_init(DQE(c), 1);
    }
#endif
#if DQ_FUSE
    for (int k = 0; k < 2; ++k) {
      mbar_init(CVF(k), 1);
      mbar_init(CVE(k), 64);  // every converter thread, once it has read the slot
    }
#endif
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
    if (tid == 0) {
      mbar_expect_tx(kv_full, 2 * KV_TILE);
      tma_load_3d(sK, tmK, kv_full, 0, n0, bh);
      tma_load_3d(sK + KV_HALF, tmK, kv_full, 64, n0, bh);
      tma_load_3d(sV, tmV, kv_full, 0, n0, bh);
      tma_load_3d(sV + KV_HALF, tmV, kv_full, 64, n0, bh);
      for (int i = 0; i < n_iter; ++i) {
        const int s = i % STAGES;
        const int mq = qblk(i) * BM;
        mbar_wait(EMPTY(s), ((i / STAGES) & 1) ^ 1);
        mbar_expect_tx(FULL(s), 2 * QO_TILE + 512);
        tma_load_3d(sQ + s * QO_TILE, tmQ, FULL(s), 0, mq, bh);
        tma_load_3d(sQ + s * QO_TILE + QO_HALF, tmQ, FULL(s), 64, mq, bh);
        tma_load_3d(sdO + s * QO_TILE, tmdO, FULL(s), 0, mq, bh);
        tma_load_3d(sdO + s * QO_TILE + QO_HALF, tmdO, FULL(s), 64, mq, bh);
        // LSE*log2(e) and Delta from the padded [B*H, Spad] scratch the pre kernel wrote (a [B*H, S]
        // fp32 TMA view of LSE itself would need S*4 % 16 == 0); entries past S are masked below.
        tma_load_2d(sLD + s * 512, tmLSE2, FULL(s), mq, bh);
        tma_load_2d(sLD + s * 512 + 256, tmDelta, FULL(s), mq, bh);
      }
    }
#if DQ_WARP
    else if (tid == 32) {
#if DQ_FUSE
      // Query block m of this head is complete once every key block that sees it has added its part: all
      // of them (non-causal) or those with 2 nb <= m (causal). The reduce-adds are async-proxy writes and
      // complete (wait_group above): a proxy fence, then a release/acquire count; the thread whose count
      // completes the block hands it to the converters through a two-slot mailbox.
      const int nkb = gridDim.x;
      int posted = 0;
      auto post = [&](int m) {
        const int k = posted++;
        mbar_wait(CVE(k & 1), ((k >> 1) & 1) ^ 1);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(MAILBOX(k & 1)), "r"(m) : "memory");
        mbar_arrive(CVF(k & 1));
      };
      auto count_block = [&](int m) {
        const int need = CAUSAL ? min(nkb, m / 2 + 1) : nkb;
        int* cnt = dQcnt + (size_t)bh * ((S + BM - 1) / BM) + m;
        int old;
        asm volatile("fence.proxy.async.global;" ::: "memory");
        asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(cnt) : "memory");
        if (old == need - 1) {
          *cnt = 0;  // every count of this launch is in: the next launch starts from 0 (zeroed scratch or not)
          post(m);
        }
      };
#endif
      // dQ reducer: per query block, each consumer warpgroup's 64x64 fp32 dQ_blk from its staging tile into
      // dQacc (two 64x32 boxes each); the staging is released as soon as the bulk copy has read it.
      // (DQ_DIRECT without conv: the consumers store dQ themselves, nothing to reduce.)
#if DQ_RING
      if (conv && bh >= ring) {
        // The slot's previous head (bh - ring) is converted and the slot zeroed once its generation count
        // reaches bh / ring: acquire it (generic-proxy stores of another SM), then order the async proxy after it.
        const int* gen = dQcnt + gridDim.y + slot;
        int g;
        do {
          asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(g) : "l"(gen) : "memory");
        } while (g < bh / ring);
        asm volatile("fence.proxy.async.global;" ::: "memory");
      }
#endif
#if DQ_DIRECT
      const int n_reduce = conv ? n_iter : 0;
#else
      const int n_reduce = n_iter;
#endif
      for (int i = 0; i < n_reduce; ++i) {
        const int mq = qblk(i) * BM;
        for (int c = 0; c < 2; ++c) {
          mbar_wait(DQF(c), i & 1);
          tma_reduce_add_3d(tmdQacc, sdQ + c * DQ_STAGE, c * 64, mq, slot);
          tma_reduce_add_3d(tmdQacc, sdQ + c * DQ_STAGE + DQ_STAGE / 2, c * 64 + 32, mq, slot);
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        mbar_arrive(DQE(0));
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        mbar_arrive(DQE(1));
#if DQ_FUSE
        if (i > 0) {
          asm volatile("cp.async.bulk.wait_group 2;" ::: "memory");  // step i-1's two reduce-adds are done
          count_block(qblk(i - 1));
        }
#endif
      }
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#if DQ_HEADCONV
      if (conv) {
        // This CTA's reduce-adds are complete; count it in its head (async-proxy writes, then a release).
        // The CTA that completes the count converts the head (consumers, after their epilogue).
        int old;
        asm volatile("fence.proxy.async.global;" ::: "memory");
        asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], 1;" : "=r"(old) : "l"(dQcnt + bh) : "memory");
        const int last = old == (int)gridDim.x - 1;  // (the pre kernel zeroed the count)
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(MAILBOX(0)), "r"(last) : "memory");
      }
#endif
#if DQ_FUSE
      count_block(qblk(n_iter - 1));
      post(-1);  // no more blocks: the converters stop
#endif
    }
#if DQ_FUSE
    else if (tid >= 64) {
      // Converters (warps 2-3): dQ[block] = bf16(sm_scale * dQacc[block]) for each query block the reducer
      // found complete; one float4 (a quarter of a 512-byte dQacc row) per thread per access, from L2.
      const int t = tid - 64;
      for (int k = 0;; ++k) {
        mbar_wait(CVF(k & 1), (k >> 1) & 1);
        int m;
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(m) : "r"(MAILBOX(k & 1)) : "memory");
        mbar_arrive(CVE(k & 1));
        if (m < 0) break;
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        const int mq = m * BM, rows = min(BM, S - mq);
        const float* src = dQacc + ((size_t)bh * S + mq) * 128;
        unsigned short* dst = dQ + ((size_t)bh * S + mq) * 128;
#pragma unroll 2
        for (int idx = t; idx < rows * 32; idx += 64) {
          float4 a;
          asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(a.x), "=f"(a.y), "=f"(a.z), "=f"(a.w) : "l"(src + 4 * idx)
                       : "memory");
          uint2 r;
          r.x = pack_bf16x2(a.x * sm_scale, a.y * sm_scale);
          r.y = pack_bf16x2(a.z * sm_scale, a.w * sm_scale);
          *reinterpret_cast<uint2*>(dst + 4 * idx) = r;
        }
      }
    }
#endif
#endif
#if DQ_HEADCONV
    if (conv && tid >= 32 && tid < 64) {  // warp 1 (the reducer and its idle lanes) tells the consumers its verdict
      __syncwarp();
      asm volatile("bar.sync 4, 288;" ::: "memory");
    }
#endif
  } else {
    // ------------------------------------------------------------ consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1;  // keys n0 + 64cw .. +63
    const int t128 = tid & 127;
    const int warp = t128 >> 5, lane = tid & 31;
    const int r_in = warp * 16 + (lane >> 2);  // first accumulator row of this thread (also r_in + 8)
    const int q2 = 2 * (lane & 3);             // first accumulator column within each 8-column chunk
    const int key0 = n0 + cw * 64 + r_in;      // S^T rows are keys
    const bool mask_keys = !CAUSAL && n0 + BN > S;

    // dQacc[query][64cw + col] += dq (accumulator rows are queries here).
    auto dq_out = [&](const float(&dq)[32], int mq, bool issue, int it) {
#if DQ_DIRECT
      if (!conv) {
        // One key block per head: dq is dQ itself (all keys of the head summed). bf16(sm_scale * dq), rows >= S dropped.
        const int qa = mq + r_in;
        unsigned short* row_a = dQ + ((size_t)bh * S + qa) * 128 + cw * 64 + q2;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (qa < S) *reinterpret_cast<u32*>(row_a + 8 * j) = pack_bf16x2(dq[4 * j] * sm_scale, dq[4 * j + 1] * sm_scale);
          if (qa + 8 < S)
            *reinterpret_cast<u32*>(row_a + 8 * 128 + 8 * j) = pack_bf16x2(dq[4 * j + 2] * sm_scale, dq[4 * j + 3] * sm_scale);
        }
        return;
      }
#endif
#if DQ_TMA && DQ_WARP
      // Staging as below; the reducer's reduce-adds of step it-1 have read it once DQE(cw) completes.
      const u32 stg = sdQ + cw * DQ_STAGE;
      mbar_wait(DQE(cw), (it & 1) ^ 1);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const u32 a = stg + (j >> 2) * (DQ_STAGE / 2) + r_in * 128 + (((2 * (j & 3) + (q2 >> 2)) ^ (r_in & 7)) << 4) + (lane & 1) * 8;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(dq[4 * j]), "f"(dq[4 * j + 1]) : "memory");
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a + 8 * 128), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3]) : "memory");
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // these stores before the bulk copy's reads
      __syncwarp();
      if (lane == 0) mbar_arrive(DQF(cw));
#elif DQ_TMA
      // 128B-swizzled fp32 staging, two boxes of 64 rows x 32 columns: 16-byte unit u of row r at
      // u ^ (r & 7) (conflict-free 8-byte stores). The previous reduce from this buffer finished
      // reading before the last bar.sync 1, 256 (the issuing thread waits for it there).
      const u32 stg = sdQ + cw * DQ_STAGE;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const u32 a = stg + (j >> 2) * (DQ_STAGE / 2) + r_in * 128 + (((2 * (j & 3) + (q2 >> 2)) ^ (r_in & 7)) << 4) + (lane & 1) * 8;
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(dq[4 * j]), "f"(dq[4 * j + 1]) : "memory");
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a + 8 * 128), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3]) : "memory");
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
      if (issue && t128 == 0) {
        tma_reduce_add_3d(tmdQacc, stg, cw * 64, mq, bh);
        tma_reduce_add_3d(tmdQacc, stg + DQ_STAGE / 2, cw * 64 + 32, mq, bh);
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
#else
      const int qa = mq + r_in;
      float* row_a = dQacc + ((size_t)bh * S + qa) * 128 + cw * 64 + q2;
      float* row_b = row_a + 8 * 128;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (issue && qa < S)
          asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(row_a + 8 * j), "f"(dq[4 * j]), "f"(dq[4 * j + 1])
                       : "memory");
        if (issue && qa + 8 < S)
          asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(row_b + 8 * j), "f"(dq[4 * j + 2]), "f"(dq[4 * j + 3])
                       : "memory");
      }
#endif
    };

    float dv[64], dk[64], dq[32];
#if DK_CARRY
    // dS^T packed: the A operand of a dK wgmma that is still in flight at the next step's start, so the
    // array outlives the step (rewritten only after the wait that retires that dK).
    u32 ds[16];
#endif
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      dv[i] = 0.f;
      if (!DK_CARRY) dk[i] = 0.f;  // DK_CARRY: the first dK wgmma does not accumulate (see wgmma_rs_n128_acc)
    }

    mbar_wait(kv_full, 0);
#if AREG
    // This warpgroup's 64 rows of K (AREG 1) or V (AREG 2) as wgmma A fragments, loaded once: for k-step kk
    // (head-dim columns 16kk..16kk+15) a0/a1 hold rows r_in/r_in+8 at columns q2, q2+1 and a2/a3 the same
    // rows 8 columns on, the layout the accumulators of P^T/dS^T have. Saves the A operand's shared-memory
    // reads (2 KiB per m64n64k16) of one of the two n64 SS products.
    u32 af[4 * AREG_KK];
    {
      const int r0 = cw * 64 + r_in, x = r0 & 7;
      const u32 rows = (AREG == 1 ? sK : sV) + r0 * 128 + q2 * 2;
#pragma unroll
      for (int kk = 0; kk < AREG_KK; ++kk) {
        const u32 h = rows + (kk >> 2) * KV_HALF;
        const int u = (kk & 3) * 2;
        af[4 * kk] = lds_u32(h + ((u ^ x) << 4));
        af[4 * kk + 1] = lds_u32(h + 8 * 128 + ((u ^ x) << 4));
        af[4 * kk + 2] = lds_u32(h + (((u + 1) ^ x) << 4));
        af[4 * kk + 3] = lds_u32(h + 8 * 128 + (((u + 1) ^ x) << 4));
      }
    }
#endif
    for (int i = 0; i < n_iter; ++i) {
      const int s = i % STAGES;
      const int mq = qblk(i) * BM;
      const u32 q_s = sQ + s * QO_TILE, do_s = sdO + s * QO_TILE, ld_s = sLD + s * 512;
      const u32 ds_buf = sdS + (i & 1) * DS_BYTES;
#if DQ_COMP
      const u32 dslo_buf = sdSlo + (i & 1) * DS_BYTES;
#endif
      mbar_wait(FULL(s), (i / STAGES) & 1);

      float st[32], dp[32];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {  // S^T = K Q^T over the head dim
        const u32 off_a = (kk >> 2) * KV_HALF + cw * (64 * 128) + (kk & 3) * 32;
        const u32 off_b = (kk >> 2) * QO_HALF + (kk & 3) * 32;
#if AREG == 1
        if (kk < AREG_KK) {
          if (kk == 0)
            wgmma_rs_n64<0>(st, af[4 * kk], af[4 * kk + 1], af[4 * kk + 2], af[4 * kk + 3], desc_sw128(q_s + off_b, 16));
          else
            wgmma_rs_n64<1>(st, af[4 * kk], af[4 * kk + 1], af[4 * kk + 2], af[4 * kk + 3], desc_sw128(q_s + off_b, 16));
          continue;
        }
#endif
        if (kk == 0)
          SS_N64_FIRST(0, 0, st, desc_sw128(sK + off_a, 16), desc_sw128(q_s + off_b, 16));
        else
          wgmma_ss_n64<1, 0, 0>(st, desc_sw128(sK + off_a, 16), desc_sw128(q_s + off_b, 16));
      }
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {  // dP^T = V dO^T
        const u32 off_a = (kk >> 2) * KV_HALF + cw * (64 * 128) + (kk & 3) * 32;
        const u32 off_b = (kk >> 2) * QO_HALF + (kk & 3) * 32;
#if AREG == 2
        if (kk < AREG_KK) {
          if (kk == 0)
            wgmma_rs_n64<0>(dp, af[4 * kk], af[4 * kk + 1], af[4 * kk + 2], af[4 * kk + 3], desc_sw128(do_s + off_b, 16));
          else
            wgmma_rs_n64<1>(dp, af[4 * kk], af[4 * kk + 1], af[4 * kk + 2], af[4 * kk + 3], desc_sw128(do_s + off_b, 16));
          continue;
        }
#endif
        if (kk == 0)
          SS_N64_FIRST(0, 0, dp, desc_sw128(sV + off_a, 16), desc_sw128(do_s + off_b, 16));
        else
          wgmma_ss_n64<1, 0, 0>(dp, desc_sw128(sV + off_a, 16), desc_sw128(do_s + off_b, 16));
      }
      wgmma_commit();
      wgmma_wait<1>();  // S^T done (DK_CARRY: and the previous step's dK)
#if DK_CARRY
      // That dK has read its Q stage: hand the stage back to the producer.
      if (i > 0 && t128 == 0) mbar_arrive(EMPTY((i - 1) % STAGES));
#endif

      // P^T = exp2(S^T * scale*log2e - LSE*log2e); columns are queries mq + 8j + q2 + e.
      const bool mask_q = mq + BM > S;  // padded queries: their LSE/Delta entries are not data
      const bool mask = (CAUSAL && mq < n0 + BN) || mask_keys || mask_q;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 lse = lds_f2(ld_s + (8 * j + q2) * 4);
        const float l0 = lse.x, l1 = lse.y;  // already * log2(e)
        if (j < EXP_POLY) {
          st[4 * j] = exp2_of<true>(fmaf(st[4 * j], scale_log2, -l0));
          st[4 * j + 1] = exp2_of<true>(fmaf(st[4 * j + 1], scale_log2, -l1));
          st[4 * j + 2] = exp2_of<true>(fmaf(st[4 * j + 2], scale_log2, -l0));
          st[4 * j + 3] = exp2_of<true>(fmaf(st[4 * j + 3], scale_log2, -l1));
        } else {
          st[4 * j] = fast_exp2(fmaf(st[4 * j], scale_log2, -l0));
          st[4 * j + 1] = fast_exp2(fmaf(st[4 * j + 1], scale_log2, -l1));
          st[4 * j + 2] = fast_exp2(fmaf(st[4 * j + 2], scale_log2, -l0));
          st[4 * j + 3] = fast_exp2(fmaf(st[4 * j + 3], scale_log2, -l1));
        }
        if (mask) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int qi = mq + 8 * j + q2 + e;
            if (qi >= S || (CAUSAL ? qi < key0 : key0 >= S)) st[4 * j + e] = 0.f;
            if (qi >= S || (CAUSAL ? qi < key0 + 8 : key0 + 8 >= S)) st[4 * j + 2 + e] = 0.f;
          }
        }
      }
      u32 p[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) p[k] = pack_bf16x2(st[2 * k], st[2 * k + 1]);
#if !DV_LATE
      // dV += P^T dO: 4 k-steps of 16 queries; dO is N-major (rows = queries), halves QO_HALF apart.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs_n128(dv, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], desc_sw128(do_s + kk * 2048, QO_HALF));
      wgmma_commit();
      wgmma_wait<1>();  // dP^T done (dV may still run)
#else
      wgmma_wait<0>();  // dP^T done; dV is issued after dS, so P^T's and dS^T's fp32 registers never overlap dV's operands
#endif

      // dS^T = P^T * (dP^T - Delta)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 dl = lds_f2(ld_s + 256 + (8 * j + q2) * 4);
        float d0 = dl.x, d1 = dl.y;
        if (mask_q) {  // padding entries may hold anything; P is 0 there, keep dS 0 too
          if (mq + 8 * j + q2 >= S) d0 = 0.f;
          if (mq + 8 * j + q2 + 1 >= S) d1 = 0.f;
        }
        dp[4 * j] = st[4 * j] * (dp[4 * j] - d0);
        dp[4 * j + 1] = st[4 * j + 1] * (dp[4 * j + 1] - d1);
        dp[4 * j + 2] = st[4 * j + 2] * (dp[4 * j + 2] - d0);
        dp[4 * j + 3] = st[4 * j + 3] * (dp[4 * j + 3] - d1);
      }
#if !DK_CARRY
      u32 ds[16];
#endif
#pragma unroll
      for (int k = 0; k < 16; ++k) ds[k] = pack_bf16x2(dp[2 * k], dp[2 * k + 1]);
#if DV_LATE
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs_n128(dv, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3], desc_sw128(do_s + kk * 2048, QO_HALF));
      wgmma_commit();
#endif
      // dS^T -> shared memory (rows = keys, 64 queries per 128-byte swizzled row) for dQ = dS K.
      // Written before dK is issued so the fp32 dS registers die early (with them live across the
      // dK issue, ptxas serializes the wgmmas for lack of registers: C7512).
#if DS_STMATRIX && !DQ_COMP
      {
        // Four stmatrix.x4 instead of 16 st.shared.b32: the accumulator fragment is stmatrix's (a thread holds
        // two adjacent columns of row lane/4 of each 8x8 tile). Matrices of one x4: rows 16w..+7 and 16w+8..+15
        // at column chunks j and j+1; lane L gives the address of row L%8 of matrix L/8.
        const int mi = lane >> 3;
        const int r = cw * 64 + warp * 16 + (mi & 1) * 8 + (lane & 7);
        const u32 row = ds_buf + r * 128;
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          const u32 a = row + (((j + (mi >> 1)) ^ (r & 7)) << 4);
          asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(ds[2 * j]),
                       "r"(ds[2 * j + 1]), "r"(ds[2 * j + 2]), "r"(ds[2 * j + 3])
                       : "memory");
        }
      }
#else
      {
        const int r = cw * 64 + r_in;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const u32 a = ds_buf + r * 128 + ((j ^ (r & 7)) << 4) + (lane & 3) * 4;
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(a), "r"(ds[2 * j]) : "memory");
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(a + 8 * 128), "r"(ds[2 * j + 1]) : "memory");
#if DQ_COMP
          // The rounding residue of dS, so that dQ = (hi + lo) K keeps ~16 mantissa bits of dS: dQ
          // rows sum dS over keys with heavy cancellation (sum_j dS_ij = 0), so bf16(dS) alone
          // leaves errors of 2^-9 |dS K| on results much smaller than that.
          const u32 h0 = ds[2 * j], h1 = ds[2 * j + 1];
          const u32 lo0 = pack_bf16x2(dp[4 * j] - __uint_as_float(h0 << 16), dp[4 * j + 1] - __uint_as_float(h0 & 0xffff0000u));
          const u32 lo1 = pack_bf16x2(dp[4 * j + 2] - __uint_as_float(h1 << 16), dp[4 * j + 3] - __uint_as_float(h1 & 0xffff0000u));
          const u32 b = dslo_buf + r * 128 + ((j ^ (r & 7)) << 4) + (lane & 3) * 4;
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(b), "r"(lo0) : "memory");
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(b + 8 * 128), "r"(lo1) : "memory");
#endif
        }
      }
#endif
#if !DQ_DEFER
      // dK += dS^T Q
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_rs_n128(dk, ds[4 * kk], ds[4 * kk + 1], ds[4 * kk + 2], ds[4 * kk + 3], desc_sw128(q_s + kk * 2048, QO_HALF));
      wgmma_commit();
#endif

      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#if DQ_TMA
      // this warpgroup's last dQ reduce has read its staging buffer (the next dq_out rewrites it)
      if (!DQ_WARP && t128 == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
      asm volatile("bar.sync 1, 256;" ::: "memory");  // both warpgroups' dS^T rows are in place

      // dQ_blk[:, 64cw..64cw+63] = dS K[:, 64cw..]: A = dS (M = queries) M-major from dS^T, B = K N-major.
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const u64 da = desc_sw128(ds_buf + kk * 2048, DS_BYTES);
        const u64 db = desc_sw128(sK + cw * KV_HALF + kk * 2048, KV_HALF);
        if (kk == 0)
          SS_N64_FIRST(1, 1, dq, da, db);
        else
          wgmma_ss_n64<1, 1, 1>(dq, da, db);
#if DQ_COMP
        wgmma_ss_n64<1, 1, 1>(dq, desc_sw128(dslo_buf + kk * 2048, DS_BYTES), db);
#endif
      }
      wgmma_commit();
#if DQ_DEFER
      // dK after dQ: dQ_blk leaves the accumulators (staging, reduce) while dK runs on the tensor cores.
      // dK += dS^T Q
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#if DK_CARRY
        wgmma_rs_n128_acc(dk, ds[4 * kk], ds[4 * kk + 1], ds[4 * kk + 2], ds[4 * kk + 3], desc_sw128(q_s + kk * 2048, QO_HALF), kk | i);
#else
        wgmma_rs_n128(dk, ds[4 * kk], ds[4 * kk + 1], ds[4 * kk + 2], ds[4 * kk + 3], desc_sw128(q_s + kk * 2048, QO_HALF));
#endif
      wgmma_commit();
      wgmma_wait<1>();  // dV and dQ done, dK may still run
      dq_out(dq, mq, true, i);
#if !DK_CARRY
      wgmma_wait<0>();
      if (t128 == 0) mbar_arrive(EMPTY(s));
#endif
#else
      wgmma_wait<0>();
      if (t128 == 0) mbar_arrive(EMPTY(s));
      dq_out(dq, mq, true, i);
#endif
    }

#if DK_CARRY
    wgmma_wait<0>();  // the last step's dK (its Q stage is not reloaded: no EMPTY arrival needed)
#endif
    // ---------------------------------------------------------- epilogue: dK, dV via TMA stores
    asm volatile("bar.sync 1, 256;" ::: "memory");  // both warpgroups are done reading K and V
    const u32 kb = sK + cw * (64 * 128), vb = sV + cw * (64 * 128);
    stage_rows(kb, KV_HALF, r_in, (lane & 3) * 4, dk, sm_scale);
    stage_rows(vb, KV_HALF, r_in, (lane & 3) * 4, dv, 1.f);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("bar.sync %0, 128;" ::"r"(2 + cw) : "memory");
    if (t128 == 0) {
      tma_store_3d(tmdK, kb, 0, n0 + cw * 64, bh);
      tma_store_3d(tmdK, kb + KV_HALF, 64, n0 + cw * 64, bh);
      tma_store_3d(tmdV, vb, 0, n0 + cw * 64, bh);
      tma_store_3d(tmdV, vb + KV_HALF, 64, n0 + cw * 64, bh);
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
#if DQ_HEADCONV
    u32 last = 0;
    if (conv) {
      asm volatile("bar.sync 4, 288;" ::: "memory");  // the reducer has counted this CTA
      asm volatile("ld.shared.b32 %0, [%1];" : "=r"(last) : "r"(MAILBOX(0)) : "memory");
    }
    if (last) {
      // Every CTA of this head has added its part: dQ = bf16(sm_scale * dQacc) for the head, from L2 (the
      // head's dQacc was written moments ago), HC_UNROLL 16-byte loads in flight per thread.
      asm volatile("fence.acq_rel.gpu;" ::: "memory");
      float* src = dQacc + (size_t)slot * S * 128;
      unsigned short* dst = dQ + (size_t)bh * S * 128;
      const int n4 = S * 32, t = tid - 128;
#if DQ_RING
      const bool rezero = bh + ring < (int)gridDim.y;  // a later head takes this slot: leave it zeroed
#endif
      for (int b = t; b < n4; b += 256 * HC_UNROLL) {
        float4 a[HC_UNROLL];
#pragma unroll
        for (int u = 0; u < HC_UNROLL; ++u)
          if (b + 256 * u < n4)
            asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(a[u].x), "=f"(a[u].y), "=f"(a[u].z), "=f"(a[u].w)
                         : "l"(src + 4 * (b + 256 * u)) : "memory");
#pragma unroll
        for (int u = 0; u < HC_UNROLL; ++u)
          if (b + 256 * u < n4) {
            uint2 r;
            r.x = pack_bf16x2(a[u].x * sm_scale, a[u].y * sm_scale);
            r.y = pack_bf16x2(a[u].z * sm_scale, a[u].w * sm_scale);
            *reinterpret_cast<uint2*>(dst + 4 * (b + 256 * u)) = r;
#if DQ_RING
            if (rezero)  // the same thread read these addresses above: program order keeps the read first
              asm volatile("st.global.cg.v4.f32 [%0], {%1, %1, %1, %1};" ::"l"(src + 4 * (b + 256 * u)), "f"(0.f) : "memory");
#endif
          }
      }
#if DQ_RING
      if (rezero) {
        // Every converting thread's zeros, then one release of the slot's next generation (the CTA barrier
        // orders the other threads' stores before this thread's gpu-scope release: cumulativity).
        asm volatile("bar.sync 5, 256;" ::: "memory");
        if (tid == 128)
          asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(dQcnt + gridDim.y + slot), "r"(bh / ring + 1) : "memory");
      }
#endif
    }
#endif
  }
}

extern "C" __global__ void __launch_bounds__(384, 1)
attn_bwd_main_sm90(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                   const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                   const __grid_constant__ CUtensorMap tmLSE2, const __grid_constant__ CUtensorMap tmDelta,
                   const __grid_constant__ CUtensorMap tmdK, const __grid_constant__ CUtensorMap tmdV,
                   const __grid_constant__ CUtensorMap tmdQacc, float* __restrict__ dQacc, int S, float scale_log2, float sm_scale FUSE_PARAMS) {
  attn_bwd_body<false>(&tmQ, &tmK, &tmV, &tmdO, &tmLSE2, &tmDelta, &tmdK, &tmdV, &tmdQacc, dQacc, S, scale_log2, sm_scale FUSE_ARGS);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attn_bwd_main_causal_sm90(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                          const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO,
                          const __grid_constant__ CUtensorMap tmLSE2, const __grid_constant__ CUtensorMap tmDelta,
                          const __grid_constant__ CUtensorMap tmdK, const __grid_constant__ CUtensorMap tmdV,
                          const __grid_constant__ CUtensorMap tmdQacc, float* __restrict__ dQacc, int S, float scale_log2, float sm_scale FUSE_PARAMS) {
  attn_bwd_body<true>(&tmQ, &tmK, &tmV, &tmdO, &tmLSE2, &tmDelta, &tmdK, &tmdV, &tmdQacc, dQacc, S, scale_log2, sm_scale FUSE_ARGS);
}

// Per query row (one warp each, rows = B*H*S): Delta = sum_d dO * O (fp32) and LSE * log2(e), both
// written to padded [B*H, Spad] scratch (Spad = S rounded up to 64, so TMA can read 64-row boxes),
// and dQacc[row, :] = 0; DQ_HEADCONV: dQcnt[head] = 0. DQ_DIRECT: the padding too (Delta 0, LSE2 +inf, so
// a padded query's P = exp2(0 - inf) = 0 even unmasked: the scratch need not be zeroed by a timed memset),
// and dQacc only where the main kernel reduces into it (conv: more than one key block per head).
#if DQ_DIRECT
#define PRE_PARAMS , int *__restrict__ dQcnt, int conv RING_PARAM
#elif DQ_HEADCONV  // and the main kernel's per-head counters (a scratch buffer the harness zeroing would cost a launch)
#define PRE_PARAMS , int *__restrict__ dQcnt
#else
#define PRE_PARAMS
#endif
#if DQ_DIRECT
#define PRE_ARGS , dQcnt, conv RING_ARG
#elif DQ_HEADCONV
#define PRE_ARGS , dQcnt
#else
#define PRE_ARGS
#endif
#ifndef PRE_ROWS
#define PRE_ROWS 1  // rows per warp: 1 (a lane loads 8 bytes of O and of dO) or 4 (16 bytes, half a warp per row, four
                    // rows' loads in flight per warp: more bytes in flight for a kernel that only streams memory)
#endif

#if PRE_ROWS == 4
// dO . O of one packed bf16 pair, in fp32; bf16 -> fp32 is a 16-bit shift.
static __device__ __forceinline__ float dot_bf16x2(u32 o, u32 g) {
  return __uint_as_float(o << 16) * __uint_as_float(g << 16) + __uint_as_float(o & 0xffff0000u) * __uint_as_float(g & 0xffff0000u);
}
#endif

// What one row writes besides the sum: lane li (of the `lanes` that share the row) zeroes its part of dQacc[row]
// where the main kernel reduces into it; lane 0 writes Delta, LSE2 and the row's share of the padding and counters.
template <int LANES>
static __device__ __forceinline__ void pre_row_out(int row, int li, float acc, const float* __restrict__ LSE,
                                                   float* __restrict__ Delta, float* __restrict__ LSE2,
                                                   float* __restrict__ dQacc, int rows, int S, int Spad PRE_PARAMS) {
  if (li == 0) {
    const int bh = row / S, s = row - bh * S;
    Delta[(size_t)bh * Spad + s] = acc;
    LSE2[(size_t)bh * Spad + s] = LSE[row] * 1.4426950408889634f;
#if DQ_HEADCONV
    if (s == 0) dQcnt[bh] = 0;
#endif
#if DQ_RING
    if (s == 0 && bh < ring) dQcnt[rows / S + bh] = 0;  // the slot's generation count
#endif
#if DQ_DIRECT
    for (int p = S + s; p < Spad; p += S) {  // Spad - S < 64 entries per head, any S >= 1
      Delta[(size_t)bh * Spad + p] = 0.f;
      LSE2[(size_t)bh * Spad + p] = __int_as_float(0x7f800000);
    }
#endif
  }
#if DQ_DIRECT
  if (!conv) return;
#endif
#if DQ_RING
  if (row / S >= ring) return;  // dQacc holds `ring` heads; the converting CTAs re-zero the slots for later heads
#endif
#pragma unroll
  for (int k = 0; k < 32 / LANES; ++k)
    *reinterpret_cast<float4*>(dQacc + (size_t)row * 128 + (li * (32 / LANES) + k) * 4) = make_float4(0.f, 0.f, 0.f, 0.f);
}

// grid: cdiv(rows, 8 * PRE_ROWS) blocks of 256 threads.
extern "C" __global__ void __launch_bounds__(256)
attn_bwd_pre_sm90(const unsigned short* __restrict__ O, const unsigned short* __restrict__ dO, const float* __restrict__ LSE,
                  float* __restrict__ Delta, float* __restrict__ LSE2, float* __restrict__ dQacc, int rows, int S,
                  int Spad PRE_PARAMS) {
  const int lane = threadIdx.x & 31;
#if PRE_ROWS == 1
  const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (row >= rows) return;
  const uint2 o = *reinterpret_cast<const uint2*>(O + (size_t)row * 128 + lane * 4);
  const uint2 g = *reinterpret_cast<const uint2*>(dO + (size_t)row * 128 + lane * 4);
  float acc = __uint_as_float(o.x << 16) * __uint_as_float(g.x << 16) +
              __uint_as_float(o.x & 0xffff0000u) * __uint_as_float(g.x & 0xffff0000u) +
              __uint_as_float(o.y << 16) * __uint_as_float(g.y << 16) +
              __uint_as_float(o.y & 0xffff0000u) * __uint_as_float(g.y & 0xffff0000u);
#pragma unroll
  for (int w = 16; w > 0; w >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, w);
  pre_row_out<32>(row, lane, acc, LSE, Delta, LSE2, dQacc, rows, S, Spad PRE_ARGS);
#elif PRE_ROWS == 4
  // rows row0 + 2k + half, k = 0, 1: lanes 0-15 and 16-31 each take a row, 8 columns a lane; all four loads issued first
  const int row0 = (blockIdx.x * 8 + (threadIdx.x >> 5)) * 4, half = lane >> 4, li = lane & 15;
  uint4 o[2], g[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int row = row0 + 2 * k + half;
    o[k] = g[k] = make_uint4(0u, 0u, 0u, 0u);
    if (row < rows) {
      o[k] = *reinterpret_cast<const uint4*>(O + (size_t)row * 128 + li * 8);
      g[k] = *reinterpret_cast<const uint4*>(dO + (size_t)row * 128 + li * 8);
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    float acc = dot_bf16x2(o[k].x, g[k].x) + dot_bf16x2(o[k].y, g[k].y) + dot_bf16x2(o[k].z, g[k].z) + dot_bf16x2(o[k].w, g[k].w);
#pragma unroll
    for (int w = 8; w > 0; w >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, w);  // within each half warp
    const int row = row0 + 2 * k + half;
    if (row < rows) pre_row_out<16>(row, li, acc, LSE, Delta, LSE2, dQacc, rows, S, Spad PRE_ARGS);
  }
#else
#error "PRE_ROWS is 1 or 4"
#endif
}

// dQ = bf16(sm_scale * dQacc), 4 elements per thread per step.
extern "C" __global__ void __launch_bounds__(256)
attn_bwd_dq_sm90(const float* __restrict__ dQacc, unsigned short* __restrict__ dQ, int n4, float sm_scale) {
  for (int i = blockIdx.x * 256 + threadIdx.x; i < n4; i += gridDim.x * 256) {
    const float4 a = reinterpret_cast<const float4*>(dQacc)[i];
    uint2 r;
    r.x = pack_bf16x2(a.x * sm_scale, a.y * sm_scale);
    r.y = pack_bf16x2(a.z * sm_scale, a.w * sm_scale);
    reinterpret_cast<uint2*>(dQ)[i] = r;
  }
}
