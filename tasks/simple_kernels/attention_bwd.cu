// Simple SIMT attention backward (correct, not fast), the one source of every mha_bwd_* task's
// simple solution (each task's simple/kernel.cu links here and its launch.json names its own
// kernels below). One (batch, head) per blockIdx.y.
// Given Q, K, V, O, dO and the forward's LSE (natural log), with P = exp(sm_scale*Q K^T - LSE):
//   Delta = rowsum(dO * O)                     attn_bwd_delta_d<D>          (one warp per query row)
//   dV = P^T dO,  dK = sm_scale * dS^T Q        attn_bwd_dkdv_d<D>[_causal]  (a block per ROWS keys)
//   dQ = sm_scale * dS K                        attn_bwd_dq_d<D>[_causal]    (a block per ROWS queries)
// with dS = P * (dO V^T - Delta). P is recomputed in each kernel; nothing is accumulated with
// atomics. Plain CUDA cores, fp32 math. In the last two kernels each row (a key's or a
// query's) belongs to LANES consecutive lanes, and lane `part` of them holds the columns
// 4*LANES*f + 4*part + {0..3} of it, so a dot product is LANES partial sums joined by shuffles.
// The other side streams through shared memory TILE rows at a time. Any S works: rows and
// keys past S are masked, not assumed away. Everything below follows from HEAD_DIM and CAUSAL,
// template arguments: each kernel is compiled for one head dimension and one mask.
#include <cuda_bf16.h>

// LANES, ROWS, TILE and CHUNKS read the template parameter HEAD_DIM of the function they stand in.
// Lanes per row: 8 above d128 keeps a lane's share of the four rows dK/dV holds (k, v, dk, dv)
// at 32 floats each, as at d128, so nothing spills; then a block of 128 threads owns 16 rows.
#define LANES (HEAD_DIM > 128 ? 8 : 4)
#define ROWS (128 / LANES)      // rows owned per block (LANES lanes each: 128 threads)
// Rows of the other side per shared-memory tile: two fp32 tiles must fit the 48 KB of static
// shared memory.
#define TILE (HEAD_DIM > 128 ? 16 : 32)
#define CHUNKS (HEAD_DIM / (4 * LANES))  // float4 chunks of a row each lane holds

template <int HEAD_DIM>
__device__ __forceinline__ float row_sum(float x) {  // sum over the LANES lanes that share a row
#pragma unroll
    for (int offset = 1; offset < LANES; offset *= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Dot product of this lane's columns (r[]) with the same columns of a shared-memory row, over the row's lanes.
template <int HEAD_DIM>
__device__ __forceinline__ float row_dot(const float* r, const float* smem_row, int part) {
    const float4* s4 = reinterpret_cast<const float4*>(smem_row);
    float dot = 0.0f;
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f) {
        const float4 v = s4[LANES * f + part];
        dot += r[4 * f] * v.x + r[4 * f + 1] * v.y + r[4 * f + 2] * v.z + r[4 * f + 3] * v.w;
    }
    return row_sum<HEAD_DIM>(dot);
}

// acc[] += w * (this lane's columns of a shared-memory row)
template <int HEAD_DIM>
__device__ __forceinline__ void row_axpy(float* acc, float w, const float* smem_row, int part) {
    const float4* s4 = reinterpret_cast<const float4*>(smem_row);
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f) {
        const float4 v = s4[LANES * f + part];
        acc[4 * f] += w * v.x;
        acc[4 * f + 1] += w * v.y;
        acc[4 * f + 2] += w * v.z;
        acc[4 * f + 3] += w * v.w;
    }
}

// This lane's columns of row `row` of a [S, HEAD_DIM] bf16 matrix (zeros past S).
template <int HEAD_DIM>
__device__ __forceinline__ void load_row(float* r, const __nv_bfloat16* M, int row, int S, int part) {
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            r[4 * f + e] = row < S ? __bfloat162float(M[(size_t)row * HEAD_DIM + 4 * LANES * f + 4 * part + e]) : 0.0f;
}

template <int HEAD_DIM>
__device__ __forceinline__ void store_row(__nv_bfloat16* M, int row, const float* r, float scale, int part) {
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            M[(size_t)row * HEAD_DIM + 4 * LANES * f + 4 * part + e] = __float2bfloat16(r[4 * f + e] * scale);
}

// Rows [r0, r0 + TILE) of two [S, HEAD_DIM] bf16 matrices into shared memory as fp32 (zeros past S).
template <int HEAD_DIM>
__device__ __forceinline__ void load_tile(float (*A)[HEAD_DIM], float (*B)[HEAD_DIM],
                                          const __nv_bfloat16* Ag, const __nv_bfloat16* Bg, int r0, int S) {
    for (int i = threadIdx.x; i < TILE * HEAD_DIM; i += 128) {
        const int r = r0 + i / HEAD_DIM;
        const size_t g = (size_t)r * HEAD_DIM + i % HEAD_DIM;
        A[i / HEAD_DIM][i % HEAD_DIM] = r < S ? __bfloat162float(Ag[g]) : 0.0f;
        B[i / HEAD_DIM][i % HEAD_DIM] = r < S ? __bfloat162float(Bg[g]) : 0.0f;
    }
}

// Delta[row] = sum_d dO[row, d] * O[row, d] over all B*H*S rows; one warp per row.
template <int HEAD_DIM>
__device__ __forceinline__ void attn_bwd_delta(const __nv_bfloat16* __restrict__ O, const __nv_bfloat16* __restrict__ dO,
                                               float* __restrict__ Delta, int rows) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;  // the whole warp leaves together
    float sum = 0.0f;
    for (int d = lane; d < HEAD_DIM; d += 32)
        sum += __bfloat162float(O[(size_t)row * HEAD_DIM + d]) * __bfloat162float(dO[(size_t)row * HEAD_DIM + d]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) Delta[row] = sum;
}

// dK and dV for ROWS keys: loop over query tiles, accumulate in registers.
template <int HEAD_DIM, bool CAUSAL>
__device__ __forceinline__ void attn_bwd_dkdv(const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K,
                                              const __nv_bfloat16* __restrict__ V, const __nv_bfloat16* __restrict__ dO,
                                              const float* __restrict__ LSE, const float* __restrict__ Delta,
                                              __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S,
                                              float sm_scale) {
    __shared__ __align__(16) float Qs[TILE][HEAD_DIM];
    __shared__ __align__(16) float dOs[TILE][HEAD_DIM];
    __shared__ float lse_s[TILE], delta_s[TILE];
    const float LOG2E = 1.4426950408889634f;
    const int part = threadIdx.x % LANES;
    const int key = blockIdx.x * ROWS + threadIdx.x / LANES;
    const size_t head = (size_t)blockIdx.y * S * HEAD_DIM;
    const size_t head_rows = (size_t)blockIdx.y * S;

    float k[4 * CHUNKS], v[4 * CHUNKS], dk[4 * CHUNKS], dv[4 * CHUNKS];
    load_row<HEAD_DIM>(k, K + head, key, S, part);
    load_row<HEAD_DIM>(v, V + head, key, S, part);
#pragma unroll
    for (int c = 0; c < 4 * CHUNKS; ++c) dk[c] = dv[c] = 0.0f;

    // Causal: queries before this block's first key see none of its keys.
    const int q_begin = CAUSAL ? blockIdx.x * ROWS : 0;
    for (int i0 = q_begin; i0 < S; i0 += TILE) {
        __syncthreads();  // everyone is done with the previous tile
        load_tile<HEAD_DIM>(Qs, dOs, Q + head, dO + head, i0, S);
        for (int r = threadIdx.x; r < TILE; r += 128) {
            const bool in = i0 + r < S;
            lse_s[r] = in ? LSE[head_rows + i0 + r] * LOG2E : 0.0f;  // log2 units
            delta_s[r] = in ? Delta[head_rows + i0 + r] : 0.0f;
        }
        __syncthreads();
        for (int r = 0; r < TILE; ++r) {
            const int qi = i0 + r;
            const float s = row_dot<HEAD_DIM>(k, Qs[r], part);   // q_i . k_j
            const float dp = row_dot<HEAD_DIM>(v, dOs[r], part); // dO_i . v_j
            const bool masked = qi >= S || key >= S || (CAUSAL && key > qi);
            const float p = masked ? 0.0f : exp2f(s * (sm_scale * LOG2E) - lse_s[r]);
            const float ds = p * (dp - delta_s[r]);
            row_axpy<HEAD_DIM>(dv, p, dOs[r], part);
            row_axpy<HEAD_DIM>(dk, ds, Qs[r], part);
        }
    }
    if (key < S) {
        store_row<HEAD_DIM>(dK + head, key, dk, sm_scale, part);
        store_row<HEAD_DIM>(dV + head, key, dv, 1.0f, part);
    }
}

// dQ for ROWS queries: loop over key tiles, accumulate in registers.
template <int HEAD_DIM, bool CAUSAL>
__device__ __forceinline__ void attn_bwd_dq(const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K,
                                            const __nv_bfloat16* __restrict__ V, const __nv_bfloat16* __restrict__ dO,
                                            const float* __restrict__ LSE, const float* __restrict__ Delta,
                                            __nv_bfloat16* __restrict__ dQ, int S, float sm_scale) {
    __shared__ __align__(16) float Ks[TILE][HEAD_DIM];
    __shared__ __align__(16) float Vs[TILE][HEAD_DIM];
    const float LOG2E = 1.4426950408889634f;
    const int part = threadIdx.x % LANES;
    const int row = blockIdx.x * ROWS + threadIdx.x / LANES;
    const bool valid = row < S;
    const size_t head = (size_t)blockIdx.y * S * HEAD_DIM;

    float q[4 * CHUNKS], d_o[4 * CHUNKS], dq[4 * CHUNKS];
    load_row<HEAD_DIM>(q, Q + head, row, S, part);
    load_row<HEAD_DIM>(d_o, dO + head, row, S, part);
#pragma unroll
    for (int c = 0; c < 4 * CHUNKS; ++c) dq[c] = 0.0f;
    const float lse = valid ? LSE[(size_t)blockIdx.y * S + row] * LOG2E : 0.0f;  // log2 units
    const float delta = valid ? Delta[(size_t)blockIdx.y * S + row] : 0.0f;

    // Causal: no row of this block sees keys past its last row.
    const int kv_end = CAUSAL ? min(S, (int)(blockIdx.x + 1) * ROWS) : S;
    for (int k0 = 0; k0 < kv_end; k0 += TILE) {
        __syncthreads();
        load_tile<HEAD_DIM>(Ks, Vs, K + head, V + head, k0, S);
        __syncthreads();
        for (int j = 0; j < TILE; ++j) {
            const int key = k0 + j;
            const float s = row_dot<HEAD_DIM>(q, Ks[j], part);
            const float dp = row_dot<HEAD_DIM>(d_o, Vs[j], part);
            const bool masked = !valid || key >= S || (CAUSAL && key > row);
            const float p = masked ? 0.0f : exp2f(s * (sm_scale * LOG2E) - lse);
            row_axpy<HEAD_DIM>(dq, p * (dp - delta), Ks[j], part);
        }
    }
    if (valid) store_row<HEAD_DIM>(dQ + head, row, dq, sm_scale, part);
}

// The kernels the manifests name, per head dimension D and mask (the tasks have no d256 causal):
// attn_bwd_delta_d<D> (Delta does not depend on the mask), attn_bwd_dkdv_d<D>[_causal] and
// attn_bwd_dq_d<D>[_causal]. dK/dV's min-blocks hint of 1 changes nothing at d128 and d256;
// without it ptxas spills 4 bytes at d96 causal.
#define DELTA_PARAMS const __nv_bfloat16* __restrict__ O, const __nv_bfloat16* __restrict__ dO, float* __restrict__ Delta, \
    int rows
#define DKDV_PARAMS const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K, \
    const __nv_bfloat16* __restrict__ V, const __nv_bfloat16* __restrict__ dO, const float* __restrict__ LSE, \
    const float* __restrict__ Delta, __nv_bfloat16* __restrict__ dK, __nv_bfloat16* __restrict__ dV, int S, float sm_scale
#define DKDV_ARGS Q, K, V, dO, LSE, Delta, dK, dV, S, sm_scale
#define DQ_PARAMS const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K, \
    const __nv_bfloat16* __restrict__ V, const __nv_bfloat16* __restrict__ dO, const float* __restrict__ LSE, \
    const float* __restrict__ Delta, __nv_bfloat16* __restrict__ dQ, int S, float sm_scale
#define DQ_ARGS Q, K, V, dO, LSE, Delta, dQ, S, sm_scale

extern "C" __global__ void attn_bwd_delta_d64(DELTA_PARAMS) { attn_bwd_delta<64>(O, dO, Delta, rows); }
extern "C" __global__ void attn_bwd_delta_d96(DELTA_PARAMS) { attn_bwd_delta<96>(O, dO, Delta, rows); }
extern "C" __global__ void attn_bwd_delta_d128(DELTA_PARAMS) { attn_bwd_delta<128>(O, dO, Delta, rows); }
extern "C" __global__ void attn_bwd_delta_d256(DELTA_PARAMS) { attn_bwd_delta<256>(O, dO, Delta, rows); }

extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv_d64(DKDV_PARAMS) { attn_bwd_dkdv<64, false>(DKDV_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv_d64_causal(DKDV_PARAMS) { attn_bwd_dkdv<64, true>(DKDV_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv_d96(DKDV_PARAMS) { attn_bwd_dkdv<96, false>(DKDV_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv_d96_causal(DKDV_PARAMS) { attn_bwd_dkdv<96, true>(DKDV_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv_d128(DKDV_PARAMS) { attn_bwd_dkdv<128, false>(DKDV_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv_d128_causal(DKDV_PARAMS) { attn_bwd_dkdv<128, true>(DKDV_ARGS); }
extern "C" __global__ void __launch_bounds__(128, 1) attn_bwd_dkdv_d256(DKDV_PARAMS) { attn_bwd_dkdv<256, false>(DKDV_ARGS); }

extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_d64(DQ_PARAMS) { attn_bwd_dq<64, false>(DQ_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_d64_causal(DQ_PARAMS) { attn_bwd_dq<64, true>(DQ_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_d96(DQ_PARAMS) { attn_bwd_dq<96, false>(DQ_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_d96_causal(DQ_PARAMS) { attn_bwd_dq<96, true>(DQ_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_d128(DQ_PARAMS) { attn_bwd_dq<128, false>(DQ_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_d128_causal(DQ_PARAMS) { attn_bwd_dq<128, true>(DQ_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_bwd_dq_d256(DQ_PARAMS) { attn_bwd_dq<256, false>(DQ_ARGS); }
