// bulk_copy positive: non-tensor bulk copies (cp.async.bulk) global -> shared on an
// mbarrier, and shared -> global in a bulk group.
// features: bulk_copy mbarrier
// negative control for: tma
extern "C" __global__ void bulk_copy_pos(const float* in, float* out) {
  __shared__ alignas(128) float buf[1024];
  __shared__ alignas(8) uint64_t bar;
  uint32_t smem = (uint32_t)__cvta_generic_to_shared(buf);
  uint32_t mbar = (uint32_t)__cvta_generic_to_shared(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mbar));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 4096;" :: "r"(mbar));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 4096, [%2];"
                 :: "r"(smem), "l"(in), "r"(mbar) : "memory");
    asm volatile("{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
                 "@!done bra wait;\n}" :: "r"(mbar));
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 4096;" :: "l"(out), "r"(smem) : "memory");
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group 0;" ::: "memory");
  }
}
