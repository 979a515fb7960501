// ptxbench/cluster.cuh -- thread-block clusters, distributed shared memory (DSMEM) and
// programmatic dependent launch (sm_90+). A kernel runs as clusters when the launch
// manifest gives "cluster": [x, y, z] (or the kernel says __cluster_dims__(x, y, z)).
#pragma once
#include <ptxbench/common.cuh>

namespace ptxbench {

// Rank of this CTA in its cluster (0 .. cluster_size-1) and the cluster's size.
PTXBENCH_DEVICE unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
PTXBENCH_DEVICE unsigned cluster_nctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
// Whole-cluster barrier (every thread of every CTA arrives, then waits). The release /
// acquire pair makes shared-memory writes before it visible to the cluster after it.
// Call it once after mbarrier init when other CTAs will signal this CTA's barriers, and
// before exit when other CTAs may still read this CTA's shared memory.
PTXBENCH_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
PTXBENCH_DEVICE void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
PTXBENCH_DEVICE void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// The shared::cluster address of the same variable in CTA `cta_rank` of the cluster.
PTXBENCH_DEVICE unsigned dsmem_addr(const void* local_smem, unsigned cta_rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_u32(local_smem)), "r"(cta_rank));
  return r;
}
PTXBENCH_DEVICE float dsmem_ld_f32(unsigned cluster_addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(cluster_addr) : "memory");
  return v;
}
PTXBENCH_DEVICE void dsmem_st_f32(unsigned cluster_addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(cluster_addr), "f"(v) : "memory");
}

// Programmatic dependent launch. griddep_wait(): block until the previous kernel in the
// stream has completed and its memory is visible (its launch_dependents only lets this
// kernel start early; it never releases the wait); a no-op when the launch was not made
// with the programmatic-serialization attribute. griddep_launch_dependents(): let the next
// kernel start its prologue early.
PTXBENCH_DEVICE void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
PTXBENCH_DEVICE void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace ptxbench
