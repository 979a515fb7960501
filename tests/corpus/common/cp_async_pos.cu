// cp_async positive: 16-byte asynchronous global -> shared copies (Ampere-style cp.async).
// features: cp_async
// negative control for: tma bulk_copy
extern "C" __global__ void cp_async_pos(const float4* in, float4* out) {
  __shared__ alignas(16) float4 buf[256];
  uint32_t dst = (uint32_t)__cvta_generic_to_shared(&buf[threadIdx.x]);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(in + threadIdx.x) : "memory");
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
  __syncthreads();
  out[threadIdx.x] = buf[255 - threadIdx.x];
}
