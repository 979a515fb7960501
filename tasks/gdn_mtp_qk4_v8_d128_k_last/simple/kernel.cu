// Simple SIMT Gated DeltaNet MTP (speculative verification; correct, not fast). One block of 128
// threads per (sequence, value head), as the decode kernel: the sequence's state is the pool slot
// initial_state[initial_state_indices[n]], k-last [V, K], so a state row S[v, :] is 128 contiguous
// floats; warp w owns rows w, w+4, ..., lane l holds columns 4l..4l+3 of a row (one float4). Rows
// are independent across tokens too (row v's update needs only itself, k_t, q_t, v_t[v] and the
// gates), so each row runs all seq_len tokens in registers with no synchronisation:
//   per token t:  S = g_t * S;  S += beta_t * (v_t - S k_t) k_t^T;  o_t = scale * S q_t
// The pool is only read: a verification step does not commit its state. Head counts and seq_len
// come as arguments, so the same kernel serves qk4_v8 and qk8_v16.
#include <cuda_bf16.h>

#define HEAD 128   // head_size: K = V = 128
#define MAX_T 16   // seq_len at most this (the task's is 4)

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }  // as torch's

// Four consecutive bf16 values as floats (8-byte aligned: the offset is a multiple of 4 elements).
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
    const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(p);
    const float2 lo = __bfloat1622float2(p2[0]), hi = __bfloat1622float2(p2[1]);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

extern "C" __global__ void __launch_bounds__(128)
gdn_mtp_simple(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
               const __nv_bfloat16* __restrict__ v, const float* __restrict__ initial_state,
               const int* __restrict__ initial_state_indices, const float* __restrict__ A_log,
               const __nv_bfloat16* __restrict__ a, const float* __restrict__ dt_bias,
               const __nv_bfloat16* __restrict__ b, __nv_bfloat16* __restrict__ output,
               int seq_len, int num_q_heads, int num_v_heads, float scale) {
    __shared__ float4 ks[MAX_T][HEAD / 4], qs[MAX_T][HEAD / 4];  // each token's k and q, as float4 columns
    __shared__ float gs[MAX_T], betas[MAX_T];
    if (seq_len > MAX_T) return;  // outputs stay poisoned: the harness says incorrect

    const int n = blockIdx.x / num_v_heads, h = blockIdx.x % num_v_heads;
    const int hq = h / (num_v_heads / num_q_heads);  // the query/key head this value head reads
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    for (int i = threadIdx.x; i < seq_len * 32; i += blockDim.x) {
        const int t = i / 32, c = i % 32;
        const size_t qk = (((size_t)n * seq_len + t) * num_q_heads + hq) * HEAD + 4 * c;
        ks[t][c] = load4(k + qk);
        qs[t][c] = load4(q + qk);
    }
    if (threadIdx.x < seq_len) {
        const int t = threadIdx.x;
        const size_t th = ((size_t)n * seq_len + t) * num_v_heads + h;  // indexes a, b
        gs[t] = expf(-expf(A_log[h]) * softplus(__bfloat162float(a[th]) + dt_bias[h]));
        betas[t] = 1.0f / (1.0f + expf(-__bfloat162float(b[th])));
    }
    __syncthreads();

    const int slot = initial_state_indices[n];
    const float4* S = reinterpret_cast<const float4*>(initial_state + ((size_t)slot * num_v_heads + h) * HEAD * HEAD);
    for (int row = warp; row < HEAD; row += 4) {
        float4 s = S[row * (HEAD / 4) + lane];
        for (int t = 0; t < seq_len; ++t) {
            const float4 kk = ks[t][lane], qq = qs[t][lane];
            const float g = gs[t];
            s.x *= g; s.y *= g; s.z *= g; s.w *= g;                              // decay first
            const float old = warp_sum(dot4(s, kk));                             // (S k)[row]
            const size_t tv = (((size_t)n * seq_len + t) * num_v_heads + h) * HEAD + row;  // indexes v, output
            const float delta = betas[t] * (__bfloat162float(v[tv]) - old);
            s.x += delta * kk.x; s.y += delta * kk.y; s.z += delta * kk.z; s.w += delta * kk.w;  // S += delta k^T
            const float o = warp_sum(dot4(s, qq));                               // (S q)[row]
            if (lane == 0) output[tv] = __float2bfloat16(scale * o);
        }
    }
}
