// wgmma serialized by the source: one wgmma per commit group and wait_group 0 after
// each, so no two ever overlap. ptxas says nothing (it did what it was told), but the
// SASS has the same shape as a ptxas-serialized pipeline, and the tensor cores idle the
// same way, so the flag is raised from the SASS alone. `unroll 1` keeps a single HGMMA
// in the loop body: the rule must see the loop (a backward branch), not count copies.
// features: wgmma
// flags: wgmma_serialized
extern "C" __global__ void wgmma_waited_each(float* out, uint64_t desc_a, uint64_t desc_b, int k_steps) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
#pragma unroll 1
  for (int i = 0; i < k_steps; ++i) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}"
                 : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc_a + 2 * i), "l"(desc_b + 2 * i), "r"(i));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
