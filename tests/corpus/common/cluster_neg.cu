// cluster negative: the same exchange through global memory and a CTA barrier.
// features:
// negative control for: cluster
extern "C" __global__ void cluster_neg(float* out, const float* peer) {
  __shared__ float buf[128];
  buf[threadIdx.x] = peer[(blockIdx.x ^ 1) * 128 + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * 128 + threadIdx.x] = buf[127 - threadIdx.x];
}
