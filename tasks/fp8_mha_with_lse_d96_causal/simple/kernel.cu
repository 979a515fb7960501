// Simple SIMT FP8 attention forward (correct, not fast), one (batch, head) per blockIdx.y:
//   S = (Q K^T) * descale_q * descale_k * sm_scale [causal],  O = softmax(S) V * descale_v (bf16),
//   LSE = natural-log logsumexp of each row of S.
// Q, K, V are e4m3 with one descale each. Every e4m3 value is widened to fp32 exactly, so the
// only rounding is fp32 arithmetic and the final bf16 store: this is the precision a tensor-core
// kernel is judged against, not an example of one (no wgmma, no e4m3 P).
// Layout of the work as in the bf16 simple kernel: a block of 128 threads owns ROWS query rows,
// LANES consecutive lanes per row, lane `part` holding columns 4*LANES*f + 4*part + {0..3}; keys
// and values stream through shared memory KEYS at a time, widened to fp32; online softmax in the
// log2 domain. Any L works: keys and rows past L are masked. The descales are read on the device
// (they are inputs, fresh with every run), folded into the query (dq * dk) and into 1/l (dv).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#define HEAD_DIM 96
#define CAUSAL 1  // 1: query i attends to keys j <= i
// Lanes per row: 8 above d128 keeps a lane's share of a row (q and acc) at 32 floats.
#define LANES (HEAD_DIM > 128 ? 8 : 4)
#define ROWS (128 / LANES)      // query rows per block (LANES lanes each: 128 threads)
// Keys per shared-memory tile: K and V tiles in fp32 must fit the 48 KB of static shared memory.
#define KEYS (HEAD_DIM > 128 ? 16 : 32)
#define CHUNKS (HEAD_DIM / (4 * LANES))  // float4 chunks of a row each lane holds

__device__ __forceinline__ float row_sum(float x) {  // sum over the LANES lanes that share a row
#pragma unroll
    for (int offset = 1; offset < LANES; offset *= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

extern "C" __global__ void __launch_bounds__(128)
fp8_attn_fwd_simple(const __nv_fp8_e4m3* __restrict__ Q, const __nv_fp8_e4m3* __restrict__ K,
                    const __nv_fp8_e4m3* __restrict__ V, const float* __restrict__ descale_q,
                    const float* __restrict__ descale_k, const float* __restrict__ descale_v,
                    __nv_bfloat16* __restrict__ O, float* __restrict__ LSE, int L, float sm_scale) {
    __shared__ __align__(16) float Ks[KEYS][HEAD_DIM];
    __shared__ __align__(16) float Vs[KEYS][HEAD_DIM];
    const float LOG2E = 1.4426950408889634f, NEG_INF = -__int_as_float(0x7f800000);
    const int part = threadIdx.x % LANES;
    const int row = blockIdx.x * ROWS + threadIdx.x / LANES;
    const bool valid = row < L;
    const size_t head = (size_t)blockIdx.y * L * HEAD_DIM;  // start of this (batch, head)
    // Scores come out in log2 units of the dequantised values: fold both descales into q.
    const float q_scale = descale_q[0] * descale_k[0] * sm_scale * LOG2E;

    float q[4 * CHUNKS], acc[4 * CHUNKS];
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int d = 4 * LANES * f + 4 * part + e;
            q[4 * f + e] = valid ? float(Q[head + (size_t)row * HEAD_DIM + d]) * q_scale : 0.0f;
            acc[4 * f + e] = 0.0f;
        }
    float m = NEG_INF, l = 0.0f;  // running max (log2 units) and running sum of exp2(s - m)

    // Causal: no row of this block sees keys past its last row.
    const int kv_end = CAUSAL ? min(L, (int)(blockIdx.x + 1) * ROWS) : L;
    for (int k0 = 0; k0 < kv_end; k0 += KEYS) {
        __syncthreads();  // everyone is done with the previous tile
        for (int i = threadIdx.x; i < KEYS * HEAD_DIM; i += 128) {
            const int j = k0 + i / HEAD_DIM;
            const size_t g = head + (size_t)j * HEAD_DIM + i % HEAD_DIM;
            Ks[i / HEAD_DIM][i % HEAD_DIM] = j < L ? float(K[g]) : 0.0f;  // raw e4m3 values: V's descale comes last
            Vs[i / HEAD_DIM][i % HEAD_DIM] = j < L ? float(V[g]) : 0.0f;
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
            dot = row_sum(dot);  // all LANES lanes now hold the full score
            const int key = k0 + j;
            const bool masked = key >= L || (CAUSAL && key > row);
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
    const float out_scale = descale_v[0] / l;  // softmax normalisation and V's descale in one multiply
#pragma unroll
    for (int f = 0; f < CHUNKS; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            O[head + (size_t)row * HEAD_DIM + 4 * LANES * f + 4 * part + e] = __float2bfloat16(acc[4 * f + e] * out_scale);
    if (part == 0) LSE[(size_t)blockIdx.y * L + row] = (m + log2f(l)) * 0.6931471805599453f;  // log2 -> ln
}
