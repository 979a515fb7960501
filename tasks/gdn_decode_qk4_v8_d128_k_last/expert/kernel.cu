// Expert sm_90a Gated DeltaNet decode, head size 128, k-last fp32 state [batch, value head, V, K].
// One kernel serves both head configurations (qk4_v8 and qk8_v16: the head counts are arguments).
//
// The op is memory-bound: per (sequence, value head) it reads a 64 KiB fp32 state and writes 64 KiB
// back; everything else (q, k, v, gates, output) is < 1% of the traffic. So the kernel is one pass
// over the state at the bandwidth of the HBM (NOTES.md has the numbers):
//  - A CTA owns one tile of ROWS consecutive rows S[v0 .. v0+ROWS-1, :] of one head (ROWS from the
//    manifest: 16 or 32, so small batches still spread over every SM). Rows are independent: row v's
//    update needs only itself, k, q, v[v] and the head's gates.
//  - The tile arrives by one TMA bulk tensor load (box ROWS x 128 fp32 of the state viewed as
//    [batch * heads * 128, 128]) into shared memory, completing on an mbarrier. One thread issues it
//    first thing, before any other global load, so the CTA's 8-16 KiB are in flight at once; many
//    CTAs per SM (small tiles, 128 threads) keep ~200 KiB per SM in flight.
//  - While the tile lands: k and q go to shared memory as fp32, the gates g and beta are computed,
//    and each warp forms k.q (a scalar per head).
//  - Warp w takes rows [w*ROWS/4, (w+1)*ROWS/4); lane l holds columns 4l..4l+3 of a row (one float4:
//    a row is 512 contiguous bytes, so the shared-memory read is conflict-free and the global store
//    of the new row is one coalesced 512-byte access of 16-byte stores).
//  - Both dot products come from the state before the update, reduced together:
//        sk = S k, sq = S q;  old = g sk;  delta = beta (v - old);
//        S' = g S + delta k^T;  o = scale S' q = scale (g sq + delta (k.q))
//    which is the reference's decay-first recurrence (S' q expanded), so the output needs no second
//    pass over the updated row: one reduction round (2 x 5 shuffles, 4 rows interleaved) per row.
//  - The state stays fp32 throughout and all arithmetic is fp32; only the output rounds to bf16.
#include <cuda_bf16.h>
#include <ptxbench/mbarrier.cuh>
#include <ptxbench/tma.cuh>

#define HEAD 128   // head_size: K = V = 128
#define GROUP 4    // rows a warp processes together (independent shuffle chains)

#ifndef WARPS
#define WARPS 4     // 128 threads per CTA (the manifest's block must match)
#endif
#ifndef STORE_CS
#define STORE_CS 0  // 1: new_state stored with st.global.cs (streaming: evict first)
#endif
#ifndef SPLIT_TMA
#define SPLIT_TMA 0  // 1: one TMA load (and mbarrier) per warp's rows, so each warp starts when its own rows land
#endif                // (the manifest's tmState box is then rows / WARPS high)
#ifndef LOAD_EVICT_FIRST
#define LOAD_EVICT_FIRST 0  // 1: the state loads carry an L2 evict-first policy (read once, never again)
#endif
#ifndef STORE_TMA
#define STORE_TMA 0  // 1: updated rows written back into the tile, which one TMA store sends to new_state
#endif

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // as torch's

// The state tile load: a plain TMA 2D load, or with LOAD_EVICT_FIRST one with an L2 cache-policy hint.
__device__ __forceinline__ void load_tile(void* dst, const CUtensorMap* tm, unsigned long long* bar, int c0, int c1) {
#if LOAD_EVICT_FIRST
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5;\n"
        ::"r"(ptxbench::smem_u32(dst)), "l"(tm), "r"(ptxbench::smem_u32(bar)), "r"(c0), "r"(c1), "l"(policy)
        : "memory");
#else
    ptxbench::tma_load_2d(dst, tm, bar, c0, c1);
#endif
}

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// rows: the tile height, the same expression as the tensor maps' box[0]; a multiple of WARPS * GROUP
// that divides HEAD (16, 32, 64 or 128). Grid: batch * num_v_heads * (HEAD / rows) CTAs.
// tmNewState (new_state, same view and box) is used only with STORE_TMA.
#ifdef MIN_BLOCKS  // a resident-CTA floor for ptxas's register budget (variants only)
extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
#else
extern "C" __global__ void __launch_bounds__(WARPS * 32)
#endif
gdn_decode_tma(const __grid_constant__ CUtensorMap tmState, const __grid_constant__ CUtensorMap tmNewState,
               const __nv_bfloat16* __restrict__ q,
               const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
               const float* __restrict__ A_log, const __nv_bfloat16* __restrict__ a,
               const float* __restrict__ dt_bias, const __nv_bfloat16* __restrict__ b,
               __nv_bfloat16* __restrict__ output, float* __restrict__ new_state,
               int num_q_heads, int num_v_heads, int rows, float scale) {
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bar[SPLIT_TMA ? WARPS : 1];
    __shared__ float4 ks[HEAD / 4], qs[HEAD / 4];
    __shared__ float gates[2];  // g, beta

    // TMA writes to a 128-byte aligned destination: the manifest gives 128 bytes of slack for this.
    // (Offset from smem_raw itself, not through an integer: the compiler then still knows the tile is
    // shared memory and reads it with LDS, not with generic loads.)
    float4* tile = reinterpret_cast<float4*>(smem_raw + ((128 - (ptxbench::smem_u32(smem_raw) & 127)) & 127));

    const int tiles_per_head = HEAD / rows;
    const int t = blockIdx.x;                    // tile index = first row / rows in the [B*HV*128, 128] view
    const int bh = t / tiles_per_head;           // sequence * num_v_heads + value head
    const int r0 = (t % tiles_per_head) * rows;  // first row of the tile within the head
    const int h = bh % num_v_heads, n = bh / num_v_heads;
    const int hq = h / (num_v_heads / num_q_heads);  // the query/key head this value head reads
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    if (threadIdx.x == 0) {  // the state tile first: everything else overlaps its flight
#if SPLIT_TMA
        const int part = rows / WARPS;
        for (int w = 0; w < WARPS; ++w) ptxbench::mbarrier_init(&bar[w], 1);
        ptxbench::mbarrier_init_fence();
#pragma unroll 1
        for (int w = 0; w < WARPS; ++w) {
            ptxbench::mbarrier_arrive_expect_tx(&bar[w], (unsigned)part * HEAD * 4);
            load_tile(tile + (size_t)w * part * (HEAD / 4), &tmState, &bar[w], 0, t * rows + w * part);
        }
#else
        ptxbench::mbarrier_init(&bar[0], 1);
        ptxbench::mbarrier_init_fence();
        ptxbench::mbarrier_arrive_expect_tx(&bar[0], (unsigned)rows * HEAD * 4);
        load_tile(tile, &tmState, &bar[0], 0, t * rows);
#endif
    }
    if (threadIdx.x < 64) {  // k (threads 0-31) and q (32-63), four bf16 each, as fp32 in shared memory
        const __nv_bfloat16* src = (threadIdx.x < 32 ? k : q) + ((size_t)n * num_q_heads + hq) * HEAD + 4 * lane;
        const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(src);
        const float2 lo = __bfloat1622float2(p2[0]), hi = __bfloat1622float2(p2[1]);
        (threadIdx.x < 32 ? ks : qs)[lane] = make_float4(lo.x, lo.y, hi.x, hi.y);
    }
    if (threadIdx.x == WARPS * 32 - 1) {  // the last thread (any WARPS >= 2)
        gates[0] = expf(-expf(A_log[h]) * softplus(__bfloat162float(a[bh]) + dt_bias[h]));
        gates[1] = 1.0f / (1.0f + expf(-__bfloat162float(b[bh])));
    }
    // This warp's rows' values v[row], one per lane (broadcast by shuffle when used).
    const int rpw = rows / WARPS;                // rows per warp
    const int wrow = r0 + warp * rpw;            // the warp's first row within the head
    const float vmine = lane < rpw ? __bfloat162float(v[(size_t)bh * HEAD + wrow + lane]) : 0.0f;
    __syncthreads();  // the barrier is initialised; k, q and the gates are in shared memory

    const float4 kk = ks[lane], qq = qs[lane];
    const float g = gates[0], beta = gates[1];
    float kq = dot4(kk, qq);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) kq += __shfl_xor_sync(0xffffffffu, kq, o);

    ptxbench::mbarrier_wait(&bar[SPLIT_TMA ? ptxbench::warp_idx() : 0], 0);  // (warp_idx: provably uniform, 64 -> 40 registers)

    float4* S = tile + (size_t)warp * rpw * (HEAD / 4);
#if !STORE_TMA
    float4* S_out = reinterpret_cast<float4*>(new_state) + ((size_t)bh * HEAD + wrow) * (HEAD / 4);
#endif
    float omine = 0.0f;  // lane i ends with the output of the warp's row i
    for (int j = 0; j < rpw; j += GROUP) {
        float4 s[GROUP];
        float sk[GROUP], sq[GROUP];
#pragma unroll
        for (int i = 0; i < GROUP; ++i) {
            s[i] = S[(j + i) * (HEAD / 4) + lane];
            sk[i] = dot4(s[i], kk);
            sq[i] = dot4(s[i], qq);
        }
#pragma unroll
        for (int o = 16; o > 0; o /= 2) {
#pragma unroll
            for (int i = 0; i < GROUP; ++i) {
                sk[i] += __shfl_xor_sync(0xffffffffu, sk[i], o);
                sq[i] += __shfl_xor_sync(0xffffffffu, sq[i], o);
            }
        }
#pragma unroll
        for (int i = 0; i < GROUP; ++i) {
            const float vr = __shfl_sync(0xffffffffu, vmine, j + i);
            const float delta = beta * (vr - g * sk[i]);          // delta rule on the decayed state
            float4 u;                                             // S' = g S + delta k^T
            u.x = fmaf(delta, kk.x, g * s[i].x);
            u.y = fmaf(delta, kk.y, g * s[i].y);
            u.z = fmaf(delta, kk.z, g * s[i].z);
            u.w = fmaf(delta, kk.w, g * s[i].w);
#if STORE_TMA
            S[(j + i) * (HEAD / 4) + lane] = u;  // in place: only this lane ever touches this float4
#elif STORE_CS
            __stcs(&S_out[(j + i) * (HEAD / 4) + lane], u);
#else
            S_out[(j + i) * (HEAD / 4) + lane] = u;
#endif
            const float o = scale * fmaf(delta, kq, g * sq[i]);   // S' q = g S q + delta (k.q)
            if (lane == j + i) omine = o;
        }
    }
    if (lane < rpw) output[(size_t)bh * HEAD + wrow + lane] = __float2bfloat16(omine);
#if STORE_TMA
    ptxbench::fence_proxy_async_smem();  // this thread's tile writes, visible to the TMA unit
    __syncthreads();
    if (threadIdx.x == 0) {
        ptxbench::tma_store_2d(&tmNewState, tile, 0, t * rows);
        ptxbench::tma_store_commit();
        ptxbench::tma_store_wait<0>();  // the tile must outlive the store's reads of it
    }
#endif
}
