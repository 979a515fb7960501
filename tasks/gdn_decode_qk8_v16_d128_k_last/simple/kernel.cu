// Simple SIMT Gated DeltaNet decode (correct, not fast). One block of 128 threads per
// (sequence, value head). The [V, K] state is k-last, so a state row S[v, :] is 128 contiguous
// floats: warp w owns rows w, w+4, ..., and lane l holds columns 4l..4l+3 of a row (one float4),
// so each row is read and written as one coalesced 512-byte access and a row's dot products
// with k and q are 32 partial sums joined by 5 shuffles. Rows are independent (each depends only
// on itself, k, q, v[row] and the gates), so no synchronisation is needed. Plain fp32 math:
//   S = g * S;  S += beta * (v - S k) k^T;  o = scale * S q
// Head counts come as arguments, so the same kernel serves qk4_v8 and qk8_v16.
#include <cuda_bf16.h>

#define HEAD 128  // head_size: K = V = 128

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
