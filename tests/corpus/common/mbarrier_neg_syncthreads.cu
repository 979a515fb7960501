// mbarrier negative: the same ordering with a CTA barrier (bar.sync).
// features:
// negative control for: mbarrier cluster
extern "C" __global__ void mbarrier_neg_syncthreads(float* out) {
  out[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x + blockDim.x] = 2.f;
}
