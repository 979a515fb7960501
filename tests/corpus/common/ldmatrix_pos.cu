// ldmatrix positive: four 8x8 b16 matrices loaded from shared memory, transposed and not.
// features: ldmatrix
// negative control for: stmatrix
extern "C" __global__ void ldmatrix_pos(const uint32_t* in, uint32_t* out) {
  __shared__ alignas(16) uint32_t tile[512];
  for (int i = threadIdx.x; i < 512; i += blockDim.x) tile[i] = in[i];
  __syncthreads();
  uint32_t addr = (uint32_t)__cvta_generic_to_shared(&tile[(threadIdx.x % 32) * 4]);
  uint32_t r0, r1, r2, r3, t0;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(t0) : "r"(addr));
  out[threadIdx.x] = r0 ^ r1 ^ r2 ^ r3 ^ t0;
}
