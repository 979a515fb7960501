// ldmatrix negative: the same fragments gathered with plain shared loads.
// features:
// negative control for: ldmatrix
extern "C" __global__ void ldmatrix_neg_lds(const uint32_t* in, uint32_t* out) {
  __shared__ alignas(16) uint32_t tile[512];
  for (int i = threadIdx.x; i < 512; i += blockDim.x) tile[i] = in[i];
  __syncthreads();
  uint32_t acc = 0;
  for (int i = 0; i < 4; ++i) acc ^= tile[(threadIdx.x % 32) * 4 + i];
  out[threadIdx.x] = acc;
}
