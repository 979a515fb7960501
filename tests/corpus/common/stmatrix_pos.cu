// stmatrix positive: four 8x8 b16 matrices stored from registers to shared memory.
// features: stmatrix
// negative control for: ldmatrix
extern "C" __global__ void stmatrix_pos(const uint32_t* in, uint32_t* out) {
  __shared__ alignas(16) uint32_t tile[512];
  uint32_t r0 = in[threadIdx.x], r1 = in[threadIdx.x + 32], r2 = in[threadIdx.x + 64], r3 = in[threadIdx.x + 96];
  uint32_t addr = (uint32_t)__cvta_generic_to_shared(&tile[(threadIdx.x % 32) * 4]);
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
  __syncwarp();
  out[threadIdx.x] = tile[threadIdx.x];
}
