// setmaxnreg positive: producer warpgroup gives registers back, consumers take more.
// __launch_bounds__ lets ptxas know the register count at entry (without it: C7508).
// features: setmaxnreg
extern "C" __global__ void __launch_bounds__(384, 1) setmaxnreg_pos(float* out) {
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    out[threadIdx.x] = 1.f;
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    out[threadIdx.x] = 2.f;
  }
}
