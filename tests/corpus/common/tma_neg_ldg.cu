// tma negative: the same tile copied with plain global loads and shared stores.
// features:
// negative control for: tma bulk_copy cp_async
extern "C" __global__ void tma_neg_ldg(const float* in, float* out, int ld) {
  __shared__ float tile[32 * 32];
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) tile[i] = in[(i / 32) * ld + i % 32];
  __syncthreads();
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) out[(i / 32) * ld + i % 32] = tile[i];
}
