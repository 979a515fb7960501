// setmaxnreg ignored: the same kernel as setmaxnreg_pos.cu without __launch_bounds__.
// ptxas cannot know the register count at entry, drops both setmaxnreg (info C7508
// "Potential Performance Loss: 'setmaxnreg' ignored ...") and the SASS has no USETMAXREG.
// features:
// negative control for: setmaxnreg
// flags: setmaxnreg_ignored
extern "C" __global__ void setmaxnreg_ignored(float* out) {
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    out[threadIdx.x] = 1.f;
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    out[threadIdx.x] = 2.f;
  }
}
