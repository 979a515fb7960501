// pdl negative: the same kernel relying on ordinary stream ordering.
// features:
// negative control for: pdl
extern "C" __global__ void pdl_neg(const float* in, float* out) {
  out[threadIdx.x] = in[threadIdx.x] * 2.f;
}
