// wgmma positive: a pipelined k-loop: per step four m64n8k16 bf16 wgmma (operands from
// shared-memory descriptors) in one commit group, then one wait. ptxas keeps them
// overlapped: only the last HGMMA of a group carries the gsb0 scoreboard.
// features: wgmma
// negative control for: mma_sync
#define WGMMA(k) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                                   \
    "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}"         \
    : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc_a + 2 * (k)), "l"(desc_b + 2 * (k)), "r"(1))

extern "C" __global__ void wgmma_pos(float* out, uint64_t desc_a, uint64_t desc_b, int k_steps) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  for (int i = 0; i < k_steps; ++i) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    WGMMA(0); WGMMA(1); WGMMA(2); WGMMA(3);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    desc_a += 8; desc_b += 8;
  }
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
