// setmaxnreg negative: the same warp specialisation without register reallocation.
// features:
// negative control for: setmaxnreg
extern "C" __global__ void __launch_bounds__(384, 1) setmaxnreg_neg(float* out) {
  out[threadIdx.x] = threadIdx.x < 128 ? 1.f : 2.f;
}
