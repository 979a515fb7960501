// pdl positive: programmatic dependent launch: wait for the previous grid's memory,
// then let the next grid start early.
// features: pdl
extern "C" __global__ void pdl_pos(const float* in, float* out) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  out[threadIdx.x] = in[threadIdx.x] * 2.f;
  asm volatile("griddepcontrol.launch_dependents;");
}
