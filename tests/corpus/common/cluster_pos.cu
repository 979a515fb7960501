// cluster positive: read a neighbour CTA's shared memory (distributed shared memory)
// between two cluster-wide barriers.
// features: cluster
extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_pos(float* out) {
  __shared__ float buf[128];
  buf[threadIdx.x] = threadIdx.x;
  uint32_t rank, peer_addr;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  uint32_t local = (uint32_t)__cvta_generic_to_shared(&buf[threadIdx.x]);
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(peer_addr) : "r"(local), "r"(rank ^ 1));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(peer_addr) : "memory");
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  out[blockIdx.x * 128 + threadIdx.x] = v;
}
