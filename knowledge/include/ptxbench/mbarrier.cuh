// ptxbench/mbarrier.cuh -- shared-memory mbarriers (sm_90+): the completion mechanism of
// TMA loads (complete_tx) and of tensor-core MMA commits, and the producer/consumer handshake.
// An mbarrier is a 64-bit word in shared memory, 8-byte aligned.
#pragma once
#include <ptxbench/common.cuh>

namespace ptxbench {

// Set the expected arrival count of a fresh barrier (one thread, before anyone uses it;
// follow with mbarrier_init_fence() and a __syncthreads()/cluster barrier).
PTXBENCH_DEVICE void mbarrier_init(unsigned long long* bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// Make initialised barriers visible to the async proxy (TMA) and to the cluster.
PTXBENCH_DEVICE void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Plain arrive (counts one of the `arrivals`).
PTXBENCH_DEVICE void mbarrier_arrive(unsigned long long* bar) {
  asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}\n" ::"r"(smem_u32(bar)) : "memory");
}
// Arrive on the barrier at the same offset in another CTA of the cluster (e.g. a consumer
// releasing a multicast stage back to the producer CTA).
PTXBENCH_DEVICE void mbarrier_arrive_cluster(unsigned long long* bar, unsigned cta_rank) {
  asm volatile(
      "{\n\t.reg .b32 remote;\n\tmapa.shared::cluster.u32 remote, %0, %1;\n\t"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n\t}\n" ::"r"(smem_u32(bar)),
      "r"(cta_rank) : "memory");
}
// Arrive and add `bytes` to the transaction count the current phase waits for: the
// producer calls this once per stage, then issues TMA loads totalling exactly `bytes`.
PTXBENCH_DEVICE void mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Add to the expected transaction count without arriving.
PTXBENCH_DEVICE void mbarrier_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// One non-blocking probe: true once the phase with this parity has completed.
PTXBENCH_DEVICE bool mbarrier_try_wait(unsigned long long* bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}\n"
      : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return done != 0;
}
// Block until the phase with this parity completed. Parity starts at 0 and flips each
// time the barrier completes a phase: stage s of a ring is waited with (iteration / stages) & 1.
PTXBENCH_DEVICE void mbarrier_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT_%=;\n\t}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

}  // namespace ptxbench
