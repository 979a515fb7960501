// tcgen05_mma positive: one CTA-local bf16 MMA into tensor memory (operands from shared
// memory descriptors), committed to an mbarrier that the thread then waits on.
// features: tcgen05_mma mbarrier
// negative control for: tmem tcgen05_alloc
extern "C" __global__ void tcgen05_mma_pos(uint32_t tmem_d, uint64_t desc_a, uint64_t desc_b, uint32_t idesc, int accumulate) {
  __shared__ alignas(8) uint64_t bar;
  uint32_t mbar = (uint32_t)__cvta_generic_to_shared(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mbar));
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
                 "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}"
                 :: "r"(tmem_d), "l"(desc_a), "l"(desc_b), "r"(idesc), "r"(accumulate));
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" :: "r"(mbar) : "memory");
    asm volatile("{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
                 "@!done bra wait;\n}" :: "r"(mbar));
  }
}
