// mma_sync positive: one warp-level m16n8k16 bf16 tensor-core MMA (legacy mma.sync).
// features: mma_sync
// negative control for: wgmma tcgen05_mma
extern "C" __global__ void mma_sync_pos(const uint32_t* a, const uint32_t* b, float* c) {
  int t = threadIdx.x;
  uint32_t a0 = a[t], a1 = a[t + 32], a2 = a[t + 64], a3 = a[t + 96], b0 = b[t], b1 = b[t + 32];
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  c[t * 4 + 0] = d0; c[t * 4 + 1] = d1; c[t * 4 + 2] = d2; c[t * 4 + 3] = d3;
}
