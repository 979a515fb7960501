// Expert sm_90a Gated DeltaNet prefill, head size 128, k-last fp32 state [sequence, value head, V, K].
// One kernel serves both head configurations (qk4_v8 and qk8_v16: the head counts are arguments).
//
// The chunked form of the delta rule (chunks of C = 64 tokens; NOTES.md derives it and counts it).
// Per chunk, with S the [V, K] state at the chunk's start, gamma_t the cumulative log decay inside
// the chunk (Gamma_t = exp(gamma_t)), beta_t the write strength:
//     A[t, j]  = beta_t exp(gamma_t - gamma_j) k_t.k_j   (j < t)      T = (I + A)^-1   (the WY/UT form)
//     R^T      = (V - Gamma * (S K^T)) * beta            [V x C]      (what each token still has to write)
//     U^T      = R^T T^T                                 [V x C]      (the rank-1 updates, decoupled)
//     O^T      = Gamma * (S Q^T) + U^T Pm^T,  Pm[t, j] = exp(gamma_t - gamma_j) q_t.k_j (j <= t)
//     S'       = Gamma_C S + (U^T * exp(gamma_C - gamma)) K
// Everything is written with the state's V rows as the MMA's M dimension, so the fp32 state lives in
// wgmma accumulator registers for the whole sequence and every product takes its A operand straight
// from registers (the accumulator layout of one product is the A-fragment layout of the next):
//     S K^T, S Q^T  m64n64k16 (A = S in bf16, B = the K and Q chunk, K-major, as TMA landed it)
//     K K^T, Q K^T  m64n64k16 (both operands from shared memory)
//     R^T T^T     m64n64k16  (B = T, written K-major by the solve)
//     U^T Pm^T    m64n64k16  accumulating onto Gamma * (S Q^T)
//     U'^T K      m64n128k16 accumulating onto Gamma_C S (B = the same K chunk, read MN-major)
// Only the 64 x 64 triangular solve (T), the gates and the elementwise scalings run on SIMT.
//
// Layout: one CTA of 384 threads (three warpgroups) per (sequence, value head), warp-specialised:
//  - warpgroups 0 and 1 own the state rows v in [64w, 64w + 64) and run only the state chain of chunk c
//    (S K^T, S Q^T, R, U, O, the state update, the output);
//  - warpgroup 2 prepares the next chunk at the same time: its TMA loads, the gates, K K^T and Q K^T,
//    the masks, and T (in 32-row blocks: the diagonal blocks by forward substitution, one column per
//    thread, T21 = -T22 (A21 T11) by two small products), so none of that is on the state's path.
// Stages of two: K/Q, V, T, Pm and the gate tables per stage; `prep[s]` says stage s is ready for the
// state warpgroups, `done[s]` that they finished reading it. q, k, v come by TMA (3-D maps over
// [token, head, dim], boxes of 64 tokens x 64 columns, 128-byte swizzle: the wgmma operand layout);
// tokens past the tensor are zero-filled, tokens past the sequence get beta = 0 and g = 1, so they
// change nothing. The initial state comes by TMA too (two 64-row boxes), staged over the T/Pm/A area.
#include <cuda_bf16.h>
#include <ptxbench/mbarrier.cuh>
#include <ptxbench/tma.cuh>

#define HEAD 128
#define CH 64                       // chunk length
#define KQ_BYTES (4 * 8192)         // one stage of K and Q: [half][K rows | Q rows][64 cols] bf16
#define V_BYTES (2 * 8192)          // one stage of V: [half = warpgroup][64 tokens][64 cols] bf16
#define OFF_V (2 * KQ_BYTES)        // 65536: V stages (K/Q stages at 0)
#define O_STRIDE 72                 // output staging row: 64 bf16 + 8 (fewer bank conflicts)
#define OFF_T 98304                       // T, 2 stages x bf16 [t][j] 128B-swizzled (8 KiB)
#define OFF_P (OFF_T + 2 * 8192)          // Pm, 2 stages x bf16 [t][j] 128B-swizzled
#define OFF_A (OFF_P + 2 * 8192)          // A, fp32 [64][64] (the preparing warpgroup's)
#define OFF_TF (OFF_A + CH * CH * 4)      // T's diagonal blocks, fp32 [64][64]
#define OFF_O (OFF_TF + CH * CH * 4)      // output staging, 2 x [64 t][72] bf16
#define OFF_GATES (OFF_O + 2 * CH * O_STRIDE * 2)  // 2 stages x {gamma, beta, 2^gamma, 2^(gC-gamma)} + scan
#define OFF_STATE OFF_T                   // the initial state (64 KiB) is staged over T, Pm, A and Tf
#define SMEM_BYTES (OFF_GATES + 2 * 1024 + 256)  // + 1024 alignment slack in the manifest: 185600
#define STATE_REGS 200  // 2 x 128 x 200 + 128 x 104 <= 65536
#define PREP_REGS 104

typedef unsigned int u32;
typedef unsigned long long u64;

// ------------------------------------------------------------------ wgmma (bf16 in, fp32 accumulate)
// K-major 128B-swizzled tile (rows of 128 bytes, 8-row groups 1 KiB apart).
__device__ __forceinline__ u64 desc_k(u32 saddr) {
    return (u64)((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
// MN-major 128B-swizzled tile: rows are the K dimension (tokens), 64 N columns per 128-byte row,
// LBO = bytes between 64-column halves of N, SBO = 1 KiB between 8-row groups.
__device__ __forceinline__ u64 desc_mn(u32 saddr, u32 lbo) {
    return (u64)((saddr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

#define ACC8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define ACC32(d) ACC8(d, 0), ACC8(d, 8), ACC8(d, 16), ACC8(d, 24)
#define R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d[64x64] (+)= A (smem) * B (smem), both K-major.
__device__ __forceinline__ void mma_ss_n64(float (&d)[32], u64 da, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " R32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : ACC32(d) : "l"(da), "l"(db), "r"(acc));
}
// d[64x64] (+)= A (registers) * B (smem, K-major).
__device__ __forceinline__ void mma_rs_n64(float (&d)[32], const u32* a, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " R32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : ACC32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
// [d0 | d1] (64x128) (+)= A (registers) * B (smem; TRANS_B 0: K-major, 1: MN-major).
template <int TRANS_B>
__device__ __forceinline__ void mma_rs_n128(float (&d0)[32], float (&d1)[32], const u32* a, u64 db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " R64 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : ACC32(d0), ACC32(d1) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TRANS_B));
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Pin accumulators around async wgmma: the compiler may not move their reads or writes across.
__device__ __forceinline__ void pin(float (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// A fragments (m64 x k16 per k-step) from an m64nN fp32 accumulator: k-step kk is elements 8kk..8kk+7.
__device__ __forceinline__ void to_frag(u32* f, const float (&d)[32]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = pack_bf16(d[2 * i], d[2 * i + 1]);
}

// Accumulator element i of thread l (0..127 in its warpgroup): row and column of the 64 x N tile.
__device__ __forceinline__ int acc_row(int l, int i) { return (l / 32) * 16 + (l % 32) / 4 + ((i / 2) % 2) * 8; }
__device__ __forceinline__ int acc_col(int l, int i) { return (i / 4) * 8 + (l % 4) * 2 + (i % 2); }
// Byte offset of bf16 element (row r, column c < 64) in a 128B-swizzled tile of 128-byte rows.
__device__ __forceinline__ u32 swz(int r, int c) { return r * 128 + ((((c >> 3) ^ r) & 7) << 4) + (c & 7) * 2; }

__device__ __forceinline__ float ex2(float x) {  // 2^x (MUFU.EX2); -inf and large negative give 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // as torch's

__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }


extern "C" __global__ void __launch_bounds__(384, 1)
gdn_prefill_wgmma(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmState,
                     const float* __restrict__ A_log, const __nv_bfloat16* __restrict__ a,
                     const float* __restrict__ dt_bias, const __nv_bfloat16* __restrict__ b,
                     const long long* __restrict__ cu_seqlens, __nv_bfloat16* __restrict__ output,
                     float* __restrict__ new_state, int num_q_heads, int num_v_heads, float scale) {
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) u64 bars[7];  // full[2] (TMA), prep[2], done[2], the initial state
    u64* full = bars;
    u64* prep = bars + 2;
    u64* done = bars + 4;
    unsigned char* sm = smem_raw + ((1024 - (ptxbench::smem_u32(smem_raw) & 1023)) & 1023);
    const u32 base = ptxbench::smem_u32(sm);

    const int tid = threadIdx.x, w = ptxbench::warpgroup_idx();
    const int n = blockIdx.x / num_v_heads, h = blockIdx.x % num_v_heads;
    const int hq = h / (num_v_heads / num_q_heads);
    const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
    const int len = (int)(eos - bos), nch = (len + CH - 1) / CH;

    if (tid == 0) {
        for (int i = 0; i < 2; ++i) {
            ptxbench::mbarrier_init(&full[i], 1);
            ptxbench::mbarrier_init(&prep[i], 1);
            ptxbench::mbarrier_init(&done[i], 256);
        }
        ptxbench::mbarrier_init(&bars[6], 1);
        ptxbench::mbarrier_init_fence();
        ptxbench::mbarrier_arrive_expect_tx(&bars[6], 2 * 64 * HEAD * 4);
        const int row0 = (n * num_v_heads + h) * HEAD;
        ptxbench::tma_load_2d(sm + OFF_STATE, &tmState, &bars[6], 0, row0);
        ptxbench::tma_load_2d(sm + OFF_STATE + 64 * HEAD * 4, &tmState, &bars[6], 0, row0 + 64);
    }
    __syncthreads();

    if (w == 2) {
        // ------------------------------------------------------------------ preparation warpgroup
        ptxbench::setmaxnreg_dec<PREP_REGS>();
        const int lt = tid - 256;
        const float expA = expf(A_log[h]), dtb = dt_bias[h];
        float* sA = reinterpret_cast<float*>(sm + OFF_A);
        float* sTf = reinterpret_cast<float*>(sm + OFF_TF);
        float* sScan = reinterpret_cast<float*>(sm + OFF_GATES + 2048);
        // Gate inputs a, b of this thread's token (threads 0-63), loaded one chunk ahead: their global
        // latency is then off this warpgroup's per-chunk path.
        __nv_bfloat16 a_next = __float2bfloat16(0.0f), b_next = a_next;
        if (lt < min(CH, len)) {
            a_next = a[(size_t)(bos + lt) * num_v_heads + h];
            b_next = b[(size_t)(bos + lt) * num_v_heads + h];
        }
        named_sync(3, 128 + 256);  // (with the state warpgroups) the initial state has left shared memory
        for (int c = 0; c < nch; ++c) {
            const int s = c & 1, L = min(CH, len - c * CH), t0 = (int)bos + c * CH;
            const __nv_bfloat16 a_cur = a_next, b_cur = b_next;
            if (lt < CH && (c + 1) * CH + lt < len) {
                a_next = a[(size_t)(t0 + CH + lt) * num_v_heads + h];
                b_next = b[(size_t)(t0 + CH + lt) * num_v_heads + h];
            }
            const u32 kq = base + s * KQ_BYTES, vv = base + OFF_V + s * V_BYTES;
            float* g = reinterpret_cast<float*>(sm + OFF_GATES + s * 1024);  // gamma, beta, 2^gamma, tail
            if (c >= 2) ptxbench::mbarrier_wait(&done[s], ((c - 2) >> 1) & 1);  // chunk c-2 left stage s
            if (lt == 0) {
                ptxbench::mbarrier_arrive_expect_tx(&full[s], KQ_BYTES + V_BYTES);
                ptxbench::tma_load_3d(sm + (kq - base), &tmK, &full[s], 0, hq, t0);
                ptxbench::tma_load_3d(sm + (kq - base) + 8192, &tmQ, &full[s], 0, hq, t0);
                ptxbench::tma_load_3d(sm + (kq - base) + 16384, &tmK, &full[s], 64, hq, t0);
                ptxbench::tma_load_3d(sm + (kq - base) + 24576, &tmQ, &full[s], 64, hq, t0);
                ptxbench::tma_load_3d(sm + (vv - base), &tmV, &full[s], 0, h, t0);
                ptxbench::tma_load_3d(sm + (vv - base) + 8192, &tmV, &full[s], 64, h, t0);
            }
            if (lt < 64) {  // gates (log2), scanned per warp
                float lg = 0.0f, be = 0.0f;
                if (lt < L) {
                    lg = -expA * softplus(__bfloat162float(a_cur) + dtb) * 1.4426950408889634f;
                    be = 1.0f / (1.0f + expf(-__bfloat162float(b_cur)));
                }
                const int lane = lt & 31;
#pragma unroll
                for (int o = 1; o < 32; o *= 2) {
                    const float y = __shfl_up_sync(0xffffffffu, lg, o);
                    if (lane >= o) lg += y;
                }
                sScan[lt] = lg;
                g[64 + lt] = be;
            }
            named_sync(4, 128);
            if (lt < 64) {
                const float gm = sScan[lt] + (lt >= 32 ? sScan[31] : 0.0f), gC = sScan[31] + sScan[63];
                g[lt] = gm;
                g[128 + lt] = ex2(gm);
                g[192 + lt] = ex2(gC - gm);
            }
            ptxbench::mbarrier_wait(&full[s], (c >> 1) & 1);
            named_sync(4, 128);
            int l;
            asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(l));
            l &= 127;
            // K K^T -> A (fp32, masked, scaled); then Q K^T -> Pm (bf16, masked, decayed) into stage s.
#pragma unroll 1
            for (int which = 0; which < 2; ++which) {
                float G[32];
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < 8; ++kk) {
                    const u32 off = (kk >> 2) * 16384 + (kk & 3) * 32;
                    mma_ss_n64(G, desc_k(kq + off + (which ? 8192 : 0)), desc_k(kq + off), kk > 0);
                }
                wg_commit();
                wg_wait0();
                pin(G);
                if (which == 0) {
#pragma unroll
                    for (int i = 0; i < 32; i += 2) {
                        const int t = acc_row(l, i), j = acc_col(l, i);
                        const float gt = g[t], bt = g[64 + t];
                        const float d0 = ex2(fminf(gt - g[j], 0.0f)), d1 = ex2(fminf(gt - g[j + 1], 0.0f));
                        *reinterpret_cast<float2*>(sA + t * CH + j) =
                            make_float2(j < t ? bt * d0 * G[i] : 0.0f, j + 1 < t ? bt * d1 * G[i + 1] : 0.0f);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 32; i += 2) {
                        const int t = acc_row(l, i), j = acc_col(l, i);
                        const float gt = g[t];
                        const float d0 = ex2(fminf(gt - g[j], 0.0f)), d1 = ex2(fminf(gt - g[j + 1], 0.0f));
                        const u32 p = pack_bf16(j <= t ? d0 * G[i] : 0.0f, j + 1 <= t ? d1 * G[i + 1] : 0.0f);
                        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(base + OFF_P + s * 8192 + swz(t, j)), "r"(p) : "memory");
                    }
                }
            }
            named_sync(4, 128);
            const u32 tb = base + OFF_T + s * 8192;
            if (lt < CH) {  // T11, T22 by forward substitution: one column j per thread of warps 8-9
                const int o = lt & 32, jj = lt & 31, j = o + jj;
                float x[32];
#pragma unroll
                for (int tt = 0; tt < 32; ++tt) {
                    const float* row = sA + (o + tt) * CH + o;
                    float acc0 = row[jj], acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
#pragma unroll
                    for (int i = 0; i + 4 <= tt; i += 4) {
                        const float4 r = *reinterpret_cast<const float4*>(row + i);
                        acc0 = fmaf(r.x, x[i], acc0);
                        acc1 = fmaf(r.y, x[i + 1], acc1);
                        acc2 = fmaf(r.z, x[i + 2], acc2);
                        acc3 = fmaf(r.w, x[i + 3], acc3);
                    }
#pragma unroll
                    for (int i = tt & ~3; i < tt; ++i) acc1 = fmaf(row[i], x[i], acc1);
                    x[tt] = -((acc0 + acc1) + (acc2 + acc3));
                }
#pragma unroll
                for (int tt = 0; tt < 32; ++tt) {
                    const float xv = tt == jj ? 1.0f : x[tt];
                    sTf[(o + tt) * CH + j] = xv;
                    const __nv_bfloat16 xb = __float2bfloat16(xv);
                    asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(tb + swz(o + tt, j)),
                                 "h"(*reinterpret_cast<const unsigned short*>(&xb)) : "memory");
                    if (o) asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(tb + swz(tt, j)), "h"((unsigned short)0) : "memory");
                }
            }
            named_sync(4, 128);
            {   // Y = A21 T11 -> A's upper-right block; thread: column j = lt % 32, rows 32 + lt / 32 + 4r
                const int j = lt & 31, r0 = 32 + (lt >> 5);
                float y[8];
#pragma unroll
                for (int r = 0; r < 8; ++r) y[r] = 0.0f;
#pragma unroll 1
                for (int i = 0; i < 32; i += 4) {  // four i at a time: the A rows read as float4
                    const float t0 = sTf[i * CH + j], t1 = sTf[(i + 1) * CH + j];
                    const float t2 = sTf[(i + 2) * CH + j], t3 = sTf[(i + 3) * CH + j];
#pragma unroll
                    for (int r = 0; r < 8; ++r) {
                        const float4 ar = *reinterpret_cast<const float4*>(sA + (r0 + 4 * r) * CH + i);
                        y[r] = fmaf(ar.x, t0, fmaf(ar.y, t1, fmaf(ar.z, t2, fmaf(ar.w, t3, y[r]))));
                    }
                }
#pragma unroll
                for (int r = 0; r < 8; ++r) sA[(r0 + 4 * r - 32) * CH + 32 + j] = y[r];
            }
            named_sync(4, 128);
            {   // T21 = -T22 Y
                const int j = lt & 31, r0 = 32 + (lt >> 5);
                float y[8];
#pragma unroll
                for (int r = 0; r < 8; ++r) y[r] = 0.0f;
#pragma unroll 1
                for (int i = 0; i < 32; i += 4) {  // four i at a time: the T22 rows read as float4
                    const float y0 = sA[i * CH + 32 + j], y1 = sA[(i + 1) * CH + 32 + j];
                    const float y2 = sA[(i + 2) * CH + 32 + j], y3 = sA[(i + 3) * CH + 32 + j];
#pragma unroll
                    for (int r = 0; r < 8; ++r) {
                        const float4 tr = *reinterpret_cast<const float4*>(sTf + (r0 + 4 * r) * CH + 32 + i);
                        y[r] = fmaf(tr.x, y0, fmaf(tr.y, y1, fmaf(tr.z, y2, fmaf(tr.w, y3, y[r]))));
                    }
                }
#pragma unroll
                for (int r = 0; r < 8; ++r) {
                    const __nv_bfloat16 xb = __float2bfloat16(-y[r]);
                    asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(tb + swz(r0 + 4 * r, j)),
                                 "h"(*reinterpret_cast<const unsigned short*>(&xb)) : "memory");
                }
            }
            ptxbench::fence_proxy_async_smem();  // T and Pm: read by the state warpgroups' wgmma
            named_sync(4, 128);
            if (lt == 0) ptxbench::mbarrier_arrive(&prep[s]);
        }
        return;
    }

    // ---------------------------------------------------------------------- state warpgroups (0, 1)
    ptxbench::setmaxnreg_inc<STATE_REGS>();
    float S0[32], S1[32];
    ptxbench::mbarrier_wait(&bars[6], 0);
    {
        const float* st = reinterpret_cast<const float*>(sm + OFF_STATE) + w * 64 * HEAD;
        const int l = tid % 128;
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            const int r = acc_row(l, i), c = acc_col(l, i);
            const float2 x0 = *reinterpret_cast<const float2*>(st + r * HEAD + c);
            const float2 x1 = *reinterpret_cast<const float2*>(st + r * HEAD + 64 + c);
            S0[i] = x0.x; S0[i + 1] = x0.y; S1[i] = x1.x; S1[i + 1] = x1.y;
        }
    }
    named_sync(3, 128 + 256);  // the staging area is free for the preparation warpgroup

    for (int c = 0; c < nch; ++c) {
        const int s = c & 1, L = min(CH, len - c * CH);
        int l;
        asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(l));
        l &= 127;
        const u32 kq = base + s * KQ_BYTES;
        const float* g = reinterpret_cast<const float*>(sm + OFF_GATES + s * 1024);
        ptxbench::mbarrier_wait(&full[s], (c >> 1) & 1);
        ptxbench::mbarrier_wait(&prep[s], (c >> 1) & 1);

        float XK[32], XQ[32];
        {
            u32 sf[32];
            to_frag(sf, S0);
            to_frag(sf + 16, S1);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 8; ++kk) {
                const u32 off = (kk >> 2) * 16384 + (kk & 3) * 32;
                mma_rs_n64(XK, sf + 4 * kk, desc_k(kq + off), kk > 0);
                mma_rs_n64(XQ, sf + 4 * kk, desc_k(kq + off + 8192), kk > 0);
            }
            wg_commit();
            wg_wait0();
            pin(XK); pin(XQ);
        }
        float U[32];
        {
            const unsigned char* vt = sm + OFF_V + s * V_BYTES + w * 8192;
            float rt[32];
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int v = acc_row(l, i), t = acc_col(l, i);
                const float vv = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(vt + swz(t, v)));
                rt[i] = g[64 + t] * (vv - g[128 + t] * XK[i]);
            }
            u32 rf[16];
            to_frag(rf, rt);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) mma_rs_n64(U, rf + 4 * kk, desc_k(base + OFF_T + s * 8192 + kk * 32), kk > 0);
            wg_commit();
            wg_wait0();
            pin(U);
        }
        {
            const float GC = g[128 + CH - 1];
            u32 uf[16], upf[16];
            to_frag(uf, U);
#pragma unroll
            for (int i = 0; i < 32; i += 2) {
                const int t = acc_col(l, i);
                XQ[i] *= g[128 + t];
                XQ[i + 1] *= g[128 + t + 1];
                upf[i / 2] = pack_bf16(U[i] * g[192 + t], U[i + 1] * g[192 + t + 1]);
            }
#pragma unroll
            for (int i = 0; i < 32; ++i) { S0[i] *= GC; S1[i] *= GC; }
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) mma_rs_n64(XQ, uf + 4 * kk, desc_k(base + OFF_P + s * 8192 + kk * 32), 1);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) mma_rs_n128<1>(S0, S1, upf + 4 * kk, desc_mn(kq + kk * 2048, 16384), 1);
            wg_commit();
            wg_wait0();
            pin(XQ); pin(S0); pin(S1);
        }
        ptxbench::mbarrier_arrive(&done[s]);  // stage s (K, Q, V, T, Pm, gates) is no longer read
        {
            __nv_bfloat16* so = reinterpret_cast<__nv_bfloat16*>(sm + OFF_O) + w * CH * O_STRIDE;
#pragma unroll
            for (int i = 0; i < 32; ++i) so[acc_col(l, i) * O_STRIDE + acc_row(l, i)] = __float2bfloat16(scale * XQ[i]);
            named_sync(1 + w, 128);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int idx = r * 128 + l, t = idx >> 3, c8 = idx & 7;
                if (t < L) {
                    const uint4 val = *reinterpret_cast<const uint4*>(so + t * O_STRIDE + 8 * c8);
                    *reinterpret_cast<uint4*>(output + ((size_t)(bos + c * CH + t) * num_v_heads + h) * HEAD + 64 * w + 8 * c8) = val;
                }
            }
            named_sync(1 + w, 128);  // the staging is read before the next chunk writes it
        }
    }

    const int l = tid % 128;
    float* dst = new_state + ((size_t)(n * num_v_heads + h) * HEAD + 64 * w) * HEAD;
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
        const int r = acc_row(l, i), c = acc_col(l, i);
        *reinterpret_cast<float2*>(dst + r * HEAD + c) = make_float2(S0[i], S0[i + 1]);
        *reinterpret_cast<float2*>(dst + r * HEAD + 64 + c) = make_float2(S1[i], S1[i + 1]);
    }
}
