// wgmma serialized by ptxas: the same pipeline as wgmma_pos.cu, but a non-wgmma
// instruction writes an accumulator register between two wgmma of one group. ptxas then
// waits for every wgmma before the next (info C7511 "... wgmma.mma_async instructions are
// serialized ...") and the SASS shows gsb0 + WARPGROUP.DEPBAR.LE gsb0, 0x0 after each HGMMA.
// features: wgmma
// flags: wgmma_serialized
#define WGMMA(k) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"                                   \
    "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}"         \
    : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc_a + 2 * (k)), "l"(desc_b + 2 * (k)), "r"(1))

extern "C" __global__ void wgmma_serialized(float* out, uint64_t desc_a, uint64_t desc_b, int k_steps) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  for (int i = 0; i < k_steps; ++i) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    WGMMA(0);
    d0 += 1.0f;  // touches an accumulator while the pipeline is in flight
    WGMMA(1); WGMMA(2); WGMMA(3);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    desc_a += 8; desc_b += 8;
  }
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
