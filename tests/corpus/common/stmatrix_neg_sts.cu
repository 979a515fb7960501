// stmatrix negative (and ldmatrix negative): plain per-thread shared stores and loads.
// features:
// negative control for: stmatrix ldmatrix
extern "C" __global__ void stmatrix_neg_sts(const uint32_t* in, uint32_t* out) {
  __shared__ alignas(16) uint32_t tile[512];
  for (int i = 0; i < 4; ++i) tile[threadIdx.x * 4 + i] = in[threadIdx.x + 32 * i];
  __syncwarp();
  out[threadIdx.x] = tile[(threadIdx.x * 7) % 128];
}
