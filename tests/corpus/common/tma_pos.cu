// tma positive: a 2-D tensor load (global -> shared, completes on an mbarrier) and a
// tensor store (shared -> global) through a CUtensorMap passed by value.
// features: tma mbarrier
// negative control for: bulk_copy cp_async
extern "C" __global__ void tma_pos(const __grid_constant__ CUtensorMap tmap, int x, int y) {
  __shared__ alignas(128) float tile[32 * 32];
  __shared__ alignas(8) uint64_t bar;
  uint32_t smem = (uint32_t)__cvta_generic_to_shared(tile);
  uint32_t mbar = (uint32_t)__cvta_generic_to_shared(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mbar));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 4096;" :: "r"(mbar));
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(smem), "l"(&tmap), "r"(x), "r"(y), "r"(mbar) : "memory");
    asm volatile("{\n.reg .pred done;\nwait:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
                 "@!done bra wait;\n}" :: "r"(mbar));
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(&tmap), "r"(x), "r"(y), "r"(smem) : "memory");
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group 0;" ::: "memory");
  }
}
