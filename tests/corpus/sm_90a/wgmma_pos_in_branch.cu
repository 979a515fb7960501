// wgmma in a branch that is never taken at run time is still in the SASS: the static
// check says present; only the executed-instruction check (ncu, on a GPU) can tell.
// features: wgmma
extern "C" __global__ void wgmma_pos_in_branch(float* out, uint64_t desc_a, uint64_t desc_b, int never) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  if (never == 123456789) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, 0, 1, 1, 0, 0;"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc_a), "l"(desc_b));
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
