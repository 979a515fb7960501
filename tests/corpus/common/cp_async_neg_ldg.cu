// cp_async negative: the same staging with a global load and a shared store.
// features:
// negative control for: cp_async
extern "C" __global__ void cp_async_neg_ldg(const float4* in, float4* out) {
  __shared__ alignas(16) float4 buf[256];
  buf[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = buf[255 - threadIdx.x];
}
