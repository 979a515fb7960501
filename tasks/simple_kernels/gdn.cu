// Simple SIMT Gated DeltaNet kernels (correct, not fast), the one source of every gdn_* task's
// simple solution: decode, prefill and MTP (each task's simple/kernel.cu links here and its
// launch.json names its kernel). One block of 128 threads per (sequence, value head). The [V, K]
// state is k-last, so a state row S[v, :] is 128 contiguous floats: warp w owns rows w, w+4, ...,
// and lane l holds columns 4l..4l+3 of a row (one float4), so a row's dot products with k and q
// are 32 partial sums joined by 5 shuffles. Rows are independent (a row's update needs only
// itself, the token's k, q, v[row] and gates), so no warp waits for another. Per token, fp32:
//   S = g * S;  S += beta * (v - S k) k^T;  o = scale * S q
// Head counts (and MTP's seq_len) come as arguments, so the same kernels serve qk4_v8 and qk8_v16.
#include <cuda_bf16.h>

#define HEAD 128   // head_size: K = V = 128
#define MAX_T 16   // MTP: seq_len at most this (the task's is 4)

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

// Decode: one token per sequence; the state is read from `state` and written to `new_state`, each
// row as one coalesced 512-byte access.
extern "C" __global__ void __launch_bounds__(128)
gdn_decode_simple(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                  const __nv_bfloat16* __restrict__ v, const float* __restrict__ state,
                  const float* __restrict__ A_log, const __nv_bfloat16* __restrict__ a,
                  const float* __restrict__ dt_bias, const __nv_bfloat16* __restrict__ b,
                  __nv_bfloat16* __restrict__ output, float* __restrict__ new_state,
                  int num_q_heads, int num_v_heads, float scale) {
    const int bh = blockIdx.x;  // sequence * num_v_heads + value head: indexes a, b, v, output, state
    const int n = bh / num_v_heads, h = bh % num_v_heads;
    const int hq = h / (num_v_heads / num_q_heads);  // the query/key head this value head reads
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    const size_t qk = ((size_t)n * num_q_heads + hq) * HEAD + 4 * lane;
    const float4 kk = load4(k + qk), qq = load4(q + qk);
    const float g = expf(-expf(A_log[h]) * softplus(__bfloat162float(a[bh]) + dt_bias[h]));
    const float beta = 1.0f / (1.0f + expf(-__bfloat162float(b[bh])));

    const float4* S = reinterpret_cast<const float4*>(state + (size_t)bh * HEAD * HEAD);
    float4* S_new = reinterpret_cast<float4*>(new_state + (size_t)bh * HEAD * HEAD);
    for (int row = warp; row < HEAD; row += 4) {
        float4 s = S[row * (HEAD / 4) + lane];
        s.x *= g; s.y *= g; s.z *= g; s.w *= g;                              // decay first
        const float old = warp_sum(dot4(s, kk));                             // (S k)[row]
        const float delta = beta * (__bfloat162float(v[(size_t)bh * HEAD + row]) - old);
        s.x += delta * kk.x; s.y += delta * kk.y; s.z += delta * kk.z; s.w += delta * kk.w;  // S += delta k^T
        const float o = warp_sum(dot4(s, qq));                               // (S q)[row]
        S_new[row * (HEAD / 4) + lane] = s;
        if (lane == 0) output[(size_t)bh * HEAD + row] = __float2bfloat16(scale * o);
    }
}

// Prefill: the plain token-by-token recurrence over variable-length sequences. The head's state
// (64 KB of fp32) stays in dynamic shared memory for the whole sequence. Sequence n is tokens
// cu_seqlens[n] .. cu_seqlens[n+1]-1; any length works (no chunking).
extern "C" __global__ void __launch_bounds__(128)
gdn_prefill_simple(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                   const __nv_bfloat16* __restrict__ v, const float* __restrict__ state,
                   const float* __restrict__ A_log, const __nv_bfloat16* __restrict__ a,
                   const float* __restrict__ dt_bias, const __nv_bfloat16* __restrict__ b,
                   const int64_t* __restrict__ cu_seqlens, __nv_bfloat16* __restrict__ output,
                   float* __restrict__ new_state, int num_q_heads, int num_v_heads, float scale) {
    extern __shared__ float4 S[];  // [HEAD][HEAD / 4]: this head's state, row v = S[v, 0..127]
    const int n = blockIdx.x / num_v_heads, h = blockIdx.x % num_v_heads;
    const int hq = h / (num_v_heads / num_q_heads);  // the query/key head this value head reads
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const size_t head_state = ((size_t)n * num_v_heads + h) * HEAD * HEAD / 4;  // in float4

    // Each warp loads (and later stores) only its own rows: nobody else reads them.
    const float4* S0 = reinterpret_cast<const float4*>(state) + head_state;
    for (int row = warp; row < HEAD; row += 4) S[row * (HEAD / 4) + lane] = S0[row * (HEAD / 4) + lane];

    const float A = expf(A_log[h]), bias = dt_bias[h];
    const int64_t bos = cu_seqlens[n], eos = cu_seqlens[n + 1];
    for (int64_t t = bos; t < eos; ++t) {
        const size_t qk = ((size_t)t * num_q_heads + hq) * HEAD + 4 * lane;
        const float4 kk = load4(k + qk), qq = load4(q + qk);
        const size_t th = (size_t)t * num_v_heads + h;  // (token, value head): indexes a, b, v, output
        const float g = expf(-A * softplus(__bfloat162float(a[th]) + bias));
        const float beta = 1.0f / (1.0f + expf(-__bfloat162float(b[th])));
#pragma unroll 4  // (fully unrolled, ptxas spills a register across the token loop)
        for (int row = warp; row < HEAD; row += 4) {
            float4 s = S[row * (HEAD / 4) + lane];
            s.x *= g; s.y *= g; s.z *= g; s.w *= g;                          // decay first
            const float old = warp_sum(dot4(s, kk));                         // (S k)[row]
            const float delta = beta * (__bfloat162float(v[th * HEAD + row]) - old);
            s.x += delta * kk.x; s.y += delta * kk.y; s.z += delta * kk.z; s.w += delta * kk.w;  // S += delta k^T
            const float o = warp_sum(dot4(s, qq));                           // (S q)[row]
            S[row * (HEAD / 4) + lane] = s;
            if (lane == 0) output[th * HEAD + row] = __float2bfloat16(scale * o);
        }
    }
    float4* S_out = reinterpret_cast<float4*>(new_state) + head_state;
    for (int row = warp; row < HEAD; row += 4) S_out[row * (HEAD / 4) + lane] = S[row * (HEAD / 4) + lane];
}

// MTP (speculative verification): the sequence's state is the pool slot
// initial_state[initial_state_indices[n]]; each row runs all seq_len tokens in registers, and
// the pool is only read: a verification step does not commit its state.
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
