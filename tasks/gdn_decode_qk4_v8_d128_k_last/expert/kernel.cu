// Expert sm_90a Gated DeltaNet decode, head size 128, k-last fp32 state [batch, value head, V, K].
// One module serves both head configurations (qk4_v8 and qk8_v16: the head counts are arguments).
// Two entry points, both launched by launch.json, one per workload (its launches' `when`): gdn_decode_tma (the
// first expert, one CTA per 16-row tile, 40 registers) where that grid fits the SMs in one wave and is at least
// 512 CTAs (64 to num_sms (sequence, value head) pairs: qk4 B8-B16, qk8 B4-B8), gdn_decode_ring (below the first:
// a persistent grid with a ring of TMA stages, the tile height chosen per workload, 94 registers) everywhere
// else. Separate entries because a register count is one per entry point: the one-tile body wants 8+ CTAs per
// SM, the ring the registers of 5 (NOTES.md, gdn8). One source for each body: tile_body (inlined here, called by
// the ring's RING_TILE_BODY variants) and ring_tiles<R, W>.
//
// The op is memory-bound: per (sequence, value head) it reads a 64 KiB fp32 state and writes 64 KiB
// back; everything else (q, k, v, gates, output) is < 1% of the traffic. So the kernel is one pass
// over the state at the bandwidth of the HBM.
//
// gdn_decode_tma, one CTA per tile:
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
// The body, apart from its entry point: gdn_decode_ring runs it too (RING_TILE_BODY) where every CTA has one tile.
// The tensor maps come by address (the entry's __grid_constant__ parameters: TMA reads them there).
__device__ __forceinline__ void tile_body(const CUtensorMap* tmState, const CUtensorMap* tmNewState,
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
            load_tile(tile + (size_t)w * part * (HEAD / 4), tmState, &bar[w], 0, t * rows + w * part);
        }
#else
        ptxbench::mbarrier_init(&bar[0], 1);
        ptxbench::mbarrier_init_fence();
        ptxbench::mbarrier_arrive_expect_tx(&bar[0], (unsigned)rows * HEAD * 4);
        load_tile(tile, tmState, &bar[0], 0, t * rows);
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
        ptxbench::tma_store_2d(tmNewState, tile, 0, t * rows);
        ptxbench::tma_store_commit();
        ptxbench::tma_store_wait<0>();  // the tile must outlive the store's reads of it
    }
#endif
}

// The manifest launches this entry where the one-tile grid fits the SMs in one wave (launch.json's `one_tile`:
// 64 to num_sms (sequence, value head) pairs, 512 to 8 x num_sms CTAs of 16 rows). Its own entry point, so its own
// register count (one per entry point: the ring's 94 hold 5 CTAs per SM, where qk8 B8's 1024 one-tile CTAs take
// two waves, NOTES.md). A floor of TILE_MIN_BLOCKS resident CTAs per SM (8 at 4 warps) caps it at 65536 / (128 x 8)
// = 64 registers, so the one wave holds whatever the body becomes; ptxas takes all 64 (the body as `rc_tb8`
// measured it: 8 CTAs per SM). 0: no floor; ptxas then picks 40 (12 CTAs per SM), the `tile` variants' build.
#ifndef TILE_MIN_BLOCKS
#define TILE_MIN_BLOCKS (32 / WARPS)  // 1024 threads per SM at any WARPS: a 64-register cap
#endif
#if TILE_MIN_BLOCKS > 0
extern "C" __global__ void __launch_bounds__(WARPS * 32, TILE_MIN_BLOCKS)
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
    tile_body(&tmState, &tmNewState, q, k, v, A_log, a, dt_bias, b, output, new_state, num_q_heads, num_v_heads, rows, scale);
}

// The same, not inlined: the ring's entry calls it (its own register allocation, as ring_tiles' instantiations).
__device__ __noinline__ void tile_body_call(const CUtensorMap* tmState, const CUtensorMap* tmNewState,
               const __nv_bfloat16* __restrict__ q,
               const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
               const float* __restrict__ A_log, const __nv_bfloat16* __restrict__ a,
               const float* __restrict__ dt_bias, const __nv_bfloat16* __restrict__ b,
               __nv_bfloat16* __restrict__ output, float* __restrict__ new_state,
               int num_q_heads, int num_v_heads, int rows, float scale) {
    tile_body(tmState, tmNewState, q, k, v, A_log, a, dt_bias, b, output, new_state, num_q_heads, num_v_heads, rows, scale);
}

// ---------------------------------------------------------------------------------------------------
// gdn_decode_ring: a persistent form of the same step. Each CTA walks tiles blockIdx.x, +gridDim.x, ...
// through a ring of RING_STAGES shared-memory stages, so a CTA always has the next tiles' loads in
// flight while it updates one (no per-tile CTA launch, barrier set-up or descriptor fetch, and no
// partial last wave: the manifest sizes the grid so every CTA gets the same number of tiles).
// Everything a tile needs lands on the stage's one mbarrier: the R x 128 state rows by one TMA load, and
// (as shipped, RING_SIDE 1) the head's k and q rows, the R values v[r0 .. r0+R-1] and the four gate inputs
// (a, b, A_log, dt_bias: the 16-byte row holding the one needed) by 16-byte cp.async copies of warp 0, each
// lane's arriving on the barrier when its copies land; so a tile never waits on a plain load. (RING_SIDE 0:
// those by eight more TMA loads a tile, the kernel shipped until 2026-12-03: the TMA unit then handles 9
// loads per tile instead of 1, and the ring with 16-row tiles ran 1-2% behind; NOTES.md.)
// The tile height is a template parameter: the manifest passes R (its last argument) and the kernel runs the
// instantiation for it, RING_ROWS or RING_ROWS_SMALL (as shipped 32 rows from 256 heads up, 16 below: big tiles
// halve the per-tile work where there are many, small ones spread a small batch over more SMs).
// Layout: 8 lanes per row, lane c8 holding float4 columns c8, c8+8, c8+16, c8+24 of its row, so a
// warp updates 4 rows at once and each dot product is reduced in 3 shuffle steps (not 5 per row): 6
// shuffles per 4 rows instead of 40. Shared-memory reads stay conflict-free (each quarter-warp reads
// 128 contiguous bytes of one row).
#ifndef RING_ROWS
#define RING_ROWS 32     // tile height R: 8 to 64, a multiple of 4 * RING_WARPS (the manifest's boxes and tile count match it)
#endif
#ifndef RING_WARPS
#define RING_WARPS 4     // warps per CTA (the manifest's block is 32 * RING_WARPS)
#endif
#ifndef RING_STAGES
#define RING_STAGES 5    // the most tiles in flight per CTA; the stages used are as many as the dynamic shared
                         // memory holds (launch.json: 4 CTAs per SM, 5 x 9 KiB stages each)
#endif
#ifndef RING_STORE_TMA
#define RING_STORE_TMA 0 // 1: the updated tile is written back in place and sent by one TMA store
#endif
#ifndef RING_CHUNKED
#define RING_CHUNKED 0   // 1: CTA b takes a contiguous run of tiles (b*n .. b*n+n-1), not b, b+G, b+2G, ...
#endif
#ifndef RING_SIDE
#define RING_SIDE 1       // the side inputs (k, q, v, gates): 0 TMA loads on the state's barrier; 1 cp.async by warp 0
#endif                    // on the state's barrier; 2 cp.async on a barrier of their own (gates computed in the state's flight)
#ifndef RING_STORE_HINT
#define RING_STORE_HINT 0 // direct stores' L2 policy: 0 none, 1 evict_last (keep the written lines), 2 evict_first
#endif

#ifndef RING_MIN_BLOCKS
#define RING_MIN_BLOCKS 0   // > 0: a resident-CTA floor for ptxas's register budget (8: 64 registers, 8 CTAs per SM
#endif                      // instead of 5; W2 2026-12-04: the ring then ran 13% slower at B64, NOTES.md)
#ifndef RING_TILE_BODY
#define RING_TILE_BODY 0    // 1: where the grid gives every CTA one tile, gdn_decode_ring runs gdn_decode_tma's body
#endif                      // (variants rc_tb*, NOTES.md; shipped instead: gdn_decode_tma's own entry)
#ifndef RING_ROWS_SMALL
#define RING_ROWS_SMALL 16  // > 0: a second tile height (with RING_WARPS_SMALL warps) the launch may choose by its `rows`
#endif
#ifndef RING_WARPS_SMALL
#define RING_WARPS_SMALL 4
#endif

// A tile height R (rows of the state) worked by W warps, and a stage's layout.
// (Enumerators, not constexpr variables: NVRTC would emit those as module globals.)
template <int R_, int W_> struct RingShape {
    enum : int {
        R = R_, ST_MAX = RING_STAGES, TILE_BYTES = R * HEAD * 4,
        // A stage: the state rows, then the side data, each at a 128-byte aligned offset (TMA destinations).
        OFF_K = TILE_BYTES, OFF_Q = OFF_K + 256, OFF_V = OFF_Q + 256, OFF_A = OFF_V + 128, OFF_B = OFF_A + 128,
        OFF_ALOG = OFF_B + 128, OFF_DT = OFF_ALOG + 128, STAGE_BYTES = OFF_DT + 128,
        TX_BYTES = RING_SIDE ? TILE_BYTES : TILE_BYTES + 256 + 256 + R * 2 + 4 * 16,  // what one stage's TMA loads deliver
        V_CHUNKS = R * 2 / 16,  // v[r0 .. r0+R-1] in 16-byte cp.async chunks (RING_SIDE)
        WARPS_R = W_, TILES_PER_HEAD = HEAD / R, STEPS = R / (4 * WARPS_R),  // a warp updates 4 rows per step
    };
    static_assert(R % (4 * WARPS_R) == 0 && HEAD % R == 0 && R >= 8 && R <= 64, "R: 8..64, a multiple of 4 * warps");
    static_assert(ST_MAX >= (RING_STORE_TMA ? 2 : 1), "a stage is refilled one tile late with RING_STORE_TMA");
    static_assert(!(RING_SIDE && RING_STORE_TMA), "RING_SIDE refills without RING_STORE_TMA's deferral");
};

__device__ __forceinline__ float4 bf16x4_to_float4(uint2 w) {  // element 0 is the low half of w.x
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                       __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {  // 16 bytes global -> shared, cached in L2 only
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(ptxbench::smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ float bf16_at(const unsigned char* p) {
    return __uint_as_float((unsigned)*reinterpret_cast<const unsigned short*>(p) << 16);
}

// One instantiation's work: tiles of R_ rows, W_ warps. Not inlined: with two heights inlined into one entry
// point ptxas spilled (80 registers); apart, each gets its own allocation (94 at most, no spill). The tensor maps
// come by address (the kernel's __grid_constant__ parameters: TMA reads them there, never from a local copy).
template <int R_, int W_>
__device__ __noinline__ void ring_tiles(const CUtensorMap* tmState, const CUtensorMap* tmNewState,
#if RING_SIDE  // the side inputs by cp.async: plain pointers (the tile kernel's order)
                const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                const __nv_bfloat16* __restrict__ v, const float* __restrict__ A_log,
                const __nv_bfloat16* __restrict__ a, const float* __restrict__ dt_bias,
                const __nv_bfloat16* __restrict__ b,
#else
                const CUtensorMap* tmQ, const CUtensorMap* tmK,
                const CUtensorMap* tmV, const CUtensorMap* tmA,
                const CUtensorMap* tmB, const CUtensorMap* tmAlog,
                const CUtensorMap* tmDt,
#endif
                __nv_bfloat16* __restrict__ output, float* __restrict__ new_state,
                int num_q_heads, int num_v_heads, int num_tiles, float scale) {
    using C = RingShape<R_, W_>;
    enum : int {
        R = C::R, ST_MAX = C::ST_MAX, TILE_BYTES = C::TILE_BYTES, OFF_K = C::OFF_K, OFF_Q = C::OFF_Q, OFF_V = C::OFF_V,
        OFF_A = C::OFF_A, OFF_B = C::OFF_B, OFF_ALOG = C::OFF_ALOG, OFF_DT = C::OFF_DT, STAGE_BYTES = C::STAGE_BYTES,
        TX_BYTES = C::TX_BYTES, V_CHUNKS = C::V_CHUNKS, WARPS_R = C::WARPS_R, TILES_PER_HEAD = C::TILES_PER_HEAD, STEPS = C::STEPS,
    };
    extern __shared__ unsigned char ring_smem[];  // (its own name: the tile kernel's has another type's linkage)
    __shared__ __align__(8) unsigned long long full[ST_MAX];
#if RING_SIDE == 2
    __shared__ __align__(8) unsigned long long side[ST_MAX];  // the side inputs' own barriers: 32 cp.async arrivals each
#endif
    unsigned char* base = ring_smem + ((128 - (ptxbench::smem_u32(ring_smem) & 127)) & 127);
    // The stages: as many as the launch's dynamic shared memory holds (a manifest expression may choose them per
    // workload), at most RING_STAGES. (The slack: 128 bytes, for the 128-byte alignment of TMA destinations.)
    unsigned dyn_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
    const int ST = min((int)ST_MAX, (int)((dyn_bytes - 128) / STAGE_BYTES));
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c8 = lane % 8;
    const int G = gridDim.x;
#if RING_CHUNKED
    const int per = (num_tiles + G - 1) / G, first = blockIdx.x * per;
    const int mine = min(per, num_tiles - first);  // >= 1: the manifest's grid is cdiv(num_tiles, per)
    auto tile_of = [&](int i) { return first + i; };
#else
    const int mine = (num_tiles - 1 - (int)blockIdx.x) / G + 1;  // the grid is at most num_tiles
    auto tile_of = [&](int i) { return (int)blockIdx.x + i * G; };
#endif
#if RING_STORE_HINT
    unsigned long long store_policy;
#if RING_STORE_HINT == 1
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(store_policy));
#else
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(store_policy));
#endif
#endif

#if RING_SIDE
    // Thread 0: the state rows of `tile` into stage s by TMA, on that stage's barrier.
    auto issue_state = [&](int tile, int s) {
        ptxbench::mbarrier_arrive_expect_tx(&full[s], TX_BYTES);
        load_tile(base + s * STAGE_BYTES, tmState, &full[s], 0, tile * R);
    };
    // Warp 0: the side inputs of `tile` into stage s, 16-byte cp.async chunks (LDGSTS: no TMA-unit work per tile,
    // ~0.07x the state's bytes), each lane's chunks arriving on the barrier when they land (.noinc: the barrier's
    // count holds these 32 arrivals). Lane l: chunk l of k (l < 16) or q; lanes 0 .. V_CHUNKS+3 also one of v's
    // chunks or the 16-byte row holding a[bh], b[bh], A_log[h] or dt_bias[h].
    auto issue_side = [&](int tile, int s, unsigned long long* bar) {
        unsigned char* st = base + s * STAGE_BYTES;
        const int bh = tile / TILES_PER_HEAD, r0 = (tile % TILES_PER_HEAD) * R;
        const int h = bh % num_v_heads, n = bh / num_v_heads;
        const size_t qk = (size_t)n * num_q_heads + h / (num_v_heads / num_q_heads);
        const __nv_bfloat16* kq_src = (lane < 16 ? k : q) + qk * HEAD + 8 * (lane % 16);
        cp_async16(st + (lane < 16 ? OFF_K : OFF_Q) + 16 * (lane % 16), kq_src);
        if (lane < V_CHUNKS + 4) {
            const void* src;
            int off;
            if (lane < V_CHUNKS) { src = v + (size_t)bh * HEAD + r0 + 8 * lane; off = OFF_V + 16 * lane; }
            else if (lane == V_CHUNKS) { src = a + (size_t)(bh / 8) * 8; off = OFF_A; }
            else if (lane == V_CHUNKS + 1) { src = b + (size_t)(bh / 8) * 8; off = OFF_B; }
            else if (lane == V_CHUNKS + 2) { src = A_log + (h / 4) * 4; off = OFF_ALOG; }
            else { src = dt_bias + (h / 4) * 4; off = OFF_DT; }
            cp_async16(st + off, src);
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(ptxbench::smem_u32(bar)) : "memory");
    };
#if RING_SIDE == 2
#define RING_SIDE_BAR(s) (&side[s])
#else
#define RING_SIDE_BAR(s) (&full[s])
#endif
#else
    // Thread 0: every load of `tile` into stage s, on that stage's barrier.
    auto issue = [&](int tile, int s) {
        unsigned char* st = base + s * STAGE_BYTES;
        const int bh = tile / TILES_PER_HEAD, r0 = (tile % TILES_PER_HEAD) * R;
        const int h = bh % num_v_heads, n = bh / num_v_heads;
        const int qk = n * num_q_heads + h / (num_v_heads / num_q_heads);  // the q/k row this value head reads
        ptxbench::mbarrier_arrive_expect_tx(&full[s], TX_BYTES);
        load_tile(st, tmState, &full[s], 0, tile * R);  // the state first: it needs no kernel argument
        ptxbench::tma_load_2d(st + OFF_K, tmK, &full[s], 0, qk);
        ptxbench::tma_load_2d(st + OFF_Q, tmQ, &full[s], 0, qk);
        ptxbench::tma_load_2d(st + OFF_V, tmV, &full[s], r0, bh);
        // the gate inputs as rows of 16 bytes (a, b: [.., 8] bf16; A_log, dt_bias: [.., 4] fp32): the row holding each
        ptxbench::tma_load_2d(st + OFF_A, tmA, &full[s], 0, bh / 8);
        ptxbench::tma_load_2d(st + OFF_B, tmB, &full[s], 0, bh / 8);
        ptxbench::tma_load_2d(st + OFF_ALOG, tmAlog, &full[s], 0, h / 4);
        ptxbench::tma_load_2d(st + OFF_DT, tmDt, &full[s], 0, h / 4);
    };
#endif

#if RING_SIDE
    if (warp == 0) {
        if (lane == 0) {
            for (int s = 0; s < ST; ++s) {
                ptxbench::mbarrier_init(&full[s], RING_SIDE == 1 ? 33 : 1);
#if RING_SIDE == 2
                ptxbench::mbarrier_init(&side[s], 32);
#endif
            }
            ptxbench::mbarrier_init_fence();
            issue_state(blockIdx.x, 0);  // no kernel argument is read before the first load
            for (int s = 1; s < ST && s < mine; ++s) issue_state(tile_of(s), s);
        }
        __syncwarp();  // the barriers are initialised (for this warp's cp.async arrivals)
        for (int s = 0; s < ST && s < mine; ++s) issue_side(tile_of(s), s, RING_SIDE_BAR(s));
    }
#else
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; ++s) ptxbench::mbarrier_init(&full[s], 1);
        ptxbench::mbarrier_init_fence();
#if RING_CHUNKED
        if (mine > 0) issue(tile_of(0), 0);
#else
        issue(blockIdx.x, 0);  // no kernel argument is read before the first load
#endif
        for (int s = 1; s < ST && s < mine; ++s) issue(tile_of(s), s);
    }
#endif
    __syncthreads();  // the barriers are initialised

    int s = 0;            // the stage of tile it: it % ST
    unsigned parity = 0;  // the phase of its barriers: (it / ST) & 1
    for (int it = 0; it < mine; ++it) {
        const int tile = tile_of(it);
        unsigned char* st = base + s * STAGE_BYTES;
#if RING_SIDE == 2
        ptxbench::mbarrier_wait(&side[s], parity);  // the gates and k.q while the state rows land
#else
        ptxbench::mbarrier_wait(&full[s], parity);
#endif
        const int bh = tile / TILES_PER_HEAD, r0 = (tile % TILES_PER_HEAD) * R;

        float4 kk[4], qq[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            kk[j] = bf16x4_to_float4(reinterpret_cast<const uint2*>(st + OFF_K)[c8 + 8 * j]);
            qq[j] = bf16x4_to_float4(reinterpret_cast<const uint2*>(st + OFF_Q)[c8 + 8 * j]);
        }
        const int h = bh % num_v_heads;
        const float g = expf(-expf(reinterpret_cast<const float*>(st + OFF_ALOG)[h % 4]) *
                             softplus(bf16_at(st + OFF_A + 2 * (bh % 8)) + reinterpret_cast<const float*>(st + OFF_DT)[h % 4]));
        const float beta = 1.0f / (1.0f + expf(-bf16_at(st + OFF_B + 2 * (bh % 8))));
        float kq = dot4(kk[0], qq[0]) + dot4(kk[1], qq[1]) + dot4(kk[2], qq[2]) + dot4(kk[3], qq[3]);
#pragma unroll
        for (int o = 4; o > 0; o /= 2) kq += __shfl_xor_sync(0xffffffffu, kq, o);  // over the row's 8 lanes
#if RING_SIDE == 2
        ptxbench::mbarrier_wait(&full[s], parity);
#endif

#pragma unroll
        for (int step = 0; step < STEPS; ++step) {
            const int row = warp * (R / WARPS_R) + step * 4 + lane / 8;  // row within the tile
            float4* S = reinterpret_cast<float4*>(st) + row * (HEAD / 4);
            float4 s4[4];
            float sk = 0.0f, sq = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                s4[j] = S[c8 + 8 * j];
                sk += dot4(s4[j], kk[j]);
                sq += dot4(s4[j], qq[j]);
            }
#pragma unroll
            for (int o = 4; o > 0; o /= 2) {
                sk += __shfl_xor_sync(0xffffffffu, sk, o);
                sq += __shfl_xor_sync(0xffffffffu, sq, o);
            }
            const float delta = beta * (bf16_at(st + OFF_V + 2 * row) - g * sk);  // delta rule on the decayed state
#if !RING_STORE_TMA
            float4* S_out = reinterpret_cast<float4*>(new_state) + ((size_t)tile * R + row) * (HEAD / 4);
#endif
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float4 u;  // S' = g S + delta k^T
                u.x = fmaf(delta, kk[j].x, g * s4[j].x);
                u.y = fmaf(delta, kk[j].y, g * s4[j].y);
                u.z = fmaf(delta, kk[j].z, g * s4[j].z);
                u.w = fmaf(delta, kk[j].w, g * s4[j].w);
#if RING_STORE_TMA
                S[c8 + 8 * j] = u;  // in place: only this lane touches this float4
#elif RING_STORE_HINT
                asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;\n"
                             ::"l"(&S_out[c8 + 8 * j]), "f"(u.x), "f"(u.y), "f"(u.z), "f"(u.w), "l"(store_policy) : "memory");
#else
                S_out[c8 + 8 * j] = u;
#endif
            }
            if (c8 == 0) output[(size_t)bh * HEAD + r0 + row] = __float2bfloat16(scale * fmaf(delta, kq, g * sq));
        }
#if RING_STORE_TMA
        ptxbench::fence_proxy_async_smem();  // this thread's in-place writes, visible to the TMA unit
        __syncthreads();
        if (threadIdx.x == 0) {
            ptxbench::tma_store_2d(tmNewState, st, 0, tile * R);
            ptxbench::tma_store_commit();
            if (it > 0) {  // refill the previous stage once its store has read it (this one's may still run)
                ptxbench::tma_store_wait<1>();
                if (it - 1 + ST < mine) issue(tile_of(it - 1 + ST), (it - 1) % ST);
            }
        }
#else
        __syncthreads();  // every thread is done with stage s
#if RING_SIDE
        if (warp == 0 && it + ST < mine) {
            if (lane == 0) issue_state(tile_of(it + ST), s);
            issue_side(tile_of(it + ST), s, RING_SIDE_BAR(s));
        }
#else
        if (threadIdx.x == 0 && it + ST < mine) issue(tile_of(it + ST), s);
#endif
#endif
        if (++s == ST) { s = 0; parity ^= 1; }
    }
#if RING_STORE_TMA
    if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // stores done before exit
#endif
}

// Grid: any number of CTAs up to num_tiles (= batch * num_v_heads * 128 / rows); block 32 x the warps of that tile
// height; dynamic shared memory stages x the stage's bytes + 128 (alignment slack). `rows`: the tile height, the
// tensor maps' box height (RING_ROWS, or RING_ROWS_SMALL when the module has a second one).
#if RING_SIDE
#define RING_ARGS &tmState, &tmNewState, q, k, v, A_log, a, dt_bias, b, output, new_state, num_q_heads, num_v_heads, num_tiles, scale
#else
#define RING_ARGS &tmState, &tmNewState, &tmQ, &tmK, &tmV, &tmA, &tmB, &tmAlog, &tmDt, output, new_state, num_q_heads, num_v_heads, num_tiles, scale
#endif
#if RING_MIN_BLOCKS > 0  // a resident-CTA floor for ptxas's register budget (variants)
extern "C" __global__ void __launch_bounds__(32 * RING_WARPS, RING_MIN_BLOCKS)
#else
extern "C" __global__ void __launch_bounds__(32 * RING_WARPS)
#endif
gdn_decode_ring(const __grid_constant__ CUtensorMap tmState, const __grid_constant__ CUtensorMap tmNewState,
#if RING_SIDE  // the side inputs by cp.async: plain pointers (the tile kernel's order)
                const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                const __nv_bfloat16* __restrict__ v, const float* __restrict__ A_log,
                const __nv_bfloat16* __restrict__ a, const float* __restrict__ dt_bias,
                const __nv_bfloat16* __restrict__ b,
#else
                const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmA,
                const __grid_constant__ CUtensorMap tmB, const __grid_constant__ CUtensorMap tmAlog,
                const __grid_constant__ CUtensorMap tmDt,
#endif
                __nv_bfloat16* __restrict__ output, float* __restrict__ new_state,
                int num_q_heads, int num_v_heads, int num_tiles, float scale, int rows) {
#if RING_TILE_BODY && RING_SIDE
    // A CTA per tile (the manifest's grid at small batches): no ring to fill, so the first expert's body, which
    // computes the gates and k.q while the state rows land (the ring waits for the stage first).
    if ((int)gridDim.x == num_tiles) {
        tile_body_call(&tmState, &tmNewState, q, k, v, A_log, a, dt_bias, b, output, new_state, num_q_heads,
                       num_v_heads, rows, scale);
        return;
    }
#endif
#if RING_ROWS_SMALL
    if (rows == RING_ROWS_SMALL) {
        ring_tiles<RING_ROWS_SMALL, RING_WARPS_SMALL>(RING_ARGS);
        return;
    }
#endif
    ring_tiles<RING_ROWS, RING_WARPS>(RING_ARGS);
}
