// mbarrier positive: init, arrive, and a parity wait loop on a shared-memory mbarrier.
// features: mbarrier
extern "C" __global__ void mbarrier_pos(float* out) {
  __shared__ alignas(8) uint64_t bar;
  uint32_t mbar = (uint32_t)__cvta_generic_to_shared(&bar);
  if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(mbar), "r"(blockDim.x));
  __syncthreads();
  out[threadIdx.x] = 1.f;
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(mbar) : "memory");
  asm volatile("{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
               "@!done bra wait;\n}" :: "r"(mbar) : "memory");
  out[threadIdx.x + blockDim.x] = 2.f;
}
