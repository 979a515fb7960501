// Simple SIMT attention forward (correct, not fast), the one source of every mha_fwd_* and
// fp8_mha_with_lse_* task's simple solution (each task's simple/kernel.cu links here and its
// launch.json names its own kernel below). One (batch, head) per blockIdx.y:
//   O = softmax(sm_scale * Q K^T [causal]) V,  LSE = natural-log logsumexp of the scaled scores.
// bf16 inputs, or e4m3 inputs with one descale each (FP8): then the scores are
// (Q K^T) * descale_q * descale_k * sm_scale and O is softmax(S) V * descale_v, in bf16. Every
// input value is widened to fp32 exactly, so the only rounding is fp32 arithmetic and the final
// bf16 store: for FP8 this is the precision a tensor-core kernel is judged against, not an example
// of one (no wgmma, no e4m3 P). The descales are read on the device (they are inputs, fresh with
// every run), folded into the query (dq * dk) and into 1/l (dv).
// Plain CUDA cores, fp32 math. A block of 128 threads owns ROWS query rows; each row belongs to
// LANES consecutive lanes, and lane `part` of them holds the columns 4*LANES*f + 4*part + {0..3}
// (f < CHUNKS) of the row, so a row's dot product is LANES partial sums joined by shuffles.
// Keys and values stream through shared memory KEYS at a time; the softmax is online (running
// max and sum, in the log2 domain), so O is written once. Any S works: keys past S and rows
// past S are masked, not assumed away. Everything follows from HEAD_DIM and CAUSAL, template
// arguments: each kernel is compiled for one head dimension and one mask.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#define LOG2E 1.4426950408889634f

__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(__nv_fp8_e4m3 x) { return float(x); }

template <int LANES>
__device__ __forceinline__ float row_sum(float x) {  // sum over the LANES lanes that share a row
#pragma unroll
    for (int offset = 1; offset < LANES; offset *= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// q_scale: what turns a query element into log2 units of the scores (sm_scale * log2 e, times
// descale_q * descale_k for FP8). descale_v: V's descale (FP8); bf16 passes nullptr, never read.
template <typename In, int HEAD_DIM, bool CAUSAL>
__device__ __forceinline__ void attn_fwd(const In* __restrict__ Q, const In* __restrict__ K, const In* __restrict__ V,
                                         const float* __restrict__ descale_v, __nv_bfloat16* __restrict__ O,
                                         float* __restrict__ LSE, int S, float q_scale) {
    // Lanes per row: 8 above d128 keeps a lane's share of a row (q and acc) at 32 floats, as at
    // d128, so nothing spills; then a block of 128 threads owns 16 rows instead of 32.
    constexpr int LANES = HEAD_DIM > 128 ? 8 : 4;
    constexpr int ROWS = 128 / LANES;  // query rows per block (LANES lanes each: 128 threads)
    // Keys per shared-memory tile: K and V tiles in fp32 must fit the 48 KB of static shared memory.
    constexpr int KEYS = HEAD_DIM > 128 ? 16 : 32;
    constexpr int CHUNKS = HEAD_DIM / (4 * LANES);  // float4 chunks of a row each lane holds
    constexpr bool FP8 = sizeof(In) == 1;  // e4m3 inputs: known at compile time, so bf16 has no descale code
    __shared__ __align__(16) float Ks[KEYS][HEAD_DIM];
    __shared__ __align__(16) float Vs[KEYS][HEAD_DIM];
    const float NEG_INF = -__int_as_float(0x7f800000);
    const int part = threadIdx.x % LANES;
    const int row = blockIdx.x * ROWS + threadIdx.x / LANES;
    const bool valid = row < S;
    const size_t head = (size_t)blockIdx.y * S * HEAD_DIM;  // start of this (batch, head)

    // This lane's part of the query row, pre-scaled so that dot products come out in log2 units.
    float q[4 * CHUNKS], acc[4 * CHUNKS];
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int d = 4 * LANES * f + 4 * part + e;
            q[4 * f + e] = valid ? widen(Q[head + (size_t)row * HEAD_DIM + d]) * q_scale : 0.0f;
            acc[4 * f + e] = 0.0f;
        }
    float m = NEG_INF, l = 0.0f;  // running max (log2 units) and running sum of exp2(s - m)

    // Causal: no row of this block sees keys past its last row.
    const int kv_end = CAUSAL ? min(S, (int)(blockIdx.x + 1) * ROWS) : S;
    for (int k0 = 0; k0 < kv_end; k0 += KEYS) {
        __syncthreads();  // everyone is done with the previous tile
        for (int i = threadIdx.x; i < KEYS * HEAD_DIM; i += 128) {
            const int j = k0 + i / HEAD_DIM;
            const size_t g = head + (size_t)j * HEAD_DIM + i % HEAD_DIM;
            Ks[i / HEAD_DIM][i % HEAD_DIM] = j < S ? widen(K[g]) : 0.0f;  // raw values: V's descale comes last
            Vs[i / HEAD_DIM][i % HEAD_DIM] = j < S ? widen(V[g]) : 0.0f;
        }
        __syncthreads();

        float s[KEYS];
        float tile_max = NEG_INF;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            const float4* k4 = reinterpret_cast<const float4*>(Ks[j]);
            float dot = 0.0f;
#pragma unroll
            for (int f = 0; f < CHUNKS; ++f) {
                const float4 kv = k4[LANES * f + part];
                dot += q[4 * f] * kv.x + q[4 * f + 1] * kv.y + q[4 * f + 2] * kv.z + q[4 * f + 3] * kv.w;
            }
            dot = row_sum<LANES>(dot);  // all LANES lanes now hold the full score
            const int key = k0 + j;
            const bool masked = key >= S || (CAUSAL && key > row);
            s[j] = masked ? NEG_INF : dot;
            tile_max = fmaxf(tile_max, s[j]);
        }
        const float m_new = fmaxf(m, tile_max);
        if (m_new == NEG_INF) continue;  // every key so far is masked for this row: nothing to add
        const float alpha = exp2f(m - m_new);  // rescales what was accumulated under the old max
        float p_sum = 0.0f;
#pragma unroll
        for (int c = 0; c < 4 * CHUNKS; ++c) acc[c] *= alpha;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            const float p = exp2f(s[j] - m_new);
            p_sum += p;
            const float4* v4 = reinterpret_cast<const float4*>(Vs[j]);
#pragma unroll
            for (int f = 0; f < CHUNKS; ++f) {
                const float4 vv = v4[LANES * f + part];
                acc[4 * f] += p * vv.x;
                acc[4 * f + 1] += p * vv.y;
                acc[4 * f + 2] += p * vv.z;
                acc[4 * f + 3] += p * vv.w;
            }
        }
        l = l * alpha + p_sum;
        m = m_new;
    }

    if (!valid) return;
    // softmax normalisation and (FP8) V's descale in one multiply
    const float out_scale = (FP8 ? descale_v[0] : 1.0f) / l;
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            O[head + (size_t)row * HEAD_DIM + 4 * LANES * f + 4 * part + e] = __float2bfloat16(acc[4 * f + e] * out_scale);
    if (part == 0) LSE[(size_t)blockIdx.y * S + row] = (m + log2f(l)) * 0.6931471805599453f;  // log2 -> ln
}

// The kernels the manifests name: attn_fwd_simple_d<D>[_causal] (bf16, mha_fwd_* tasks) takes
// (Q, K, V, O, LSE, S, sm_scale); fp8_attn_fwd_simple_d<D>[_causal] (fp8_mha_with_lse_* tasks)
// takes (Q, K, V, descale_q, descale_k, descale_v, O, LSE, L, sm_scale).
#define BF16_PARAMS const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K, \
    const __nv_bfloat16* __restrict__ V, __nv_bfloat16* __restrict__ O, float* __restrict__ LSE, int S, float sm_scale
#define BF16_ARGS Q, K, V, nullptr, O, LSE, S, sm_scale * LOG2E
#define FP8_PARAMS const __nv_fp8_e4m3* __restrict__ Q, const __nv_fp8_e4m3* __restrict__ K, \
    const __nv_fp8_e4m3* __restrict__ V, const float* __restrict__ descale_q, const float* __restrict__ descale_k, \
    const float* __restrict__ descale_v, __nv_bfloat16* __restrict__ O, float* __restrict__ LSE, int L, float sm_scale
#define FP8_ARGS Q, K, V, descale_v, O, LSE, L, descale_q[0] * descale_k[0] * sm_scale * LOG2E

extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d64(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 64, false>(BF16_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d64_causal(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 64, true>(BF16_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d96(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 96, false>(BF16_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d96_causal(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 96, true>(BF16_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d128(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 128, false>(BF16_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d128_causal(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 128, true>(BF16_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d256(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 256, false>(BF16_ARGS); }
extern "C" __global__ void __launch_bounds__(128) attn_fwd_simple_d256_causal(BF16_PARAMS) { attn_fwd<__nv_bfloat16, 256, true>(BF16_ARGS); }

extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d64(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 64, false>(FP8_ARGS); }
extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d64_causal(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 64, true>(FP8_ARGS); }
extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d96(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 96, false>(FP8_ARGS); }
extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d96_causal(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 96, true>(FP8_ARGS); }
extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d128(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 128, false>(FP8_ARGS); }
extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d128_causal(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 128, true>(FP8_ARGS); }
extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d256(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 256, false>(FP8_ARGS); }
extern "C" __global__ void __launch_bounds__(128) fp8_attn_fwd_simple_d256_causal(FP8_PARAMS) { attn_fwd<__nv_fp8_e4m3, 256, true>(FP8_ARGS); }
