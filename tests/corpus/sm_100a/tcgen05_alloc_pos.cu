// tcgen05_alloc positive: warp 0 allocates 32 tensor-memory columns, gives up the right to
// allocate more, and frees them; no tmem loads/stores (the negative control for tmem).
// features: tcgen05_alloc
// negative control for: tmem tcgen05_mma
extern "C" __global__ void tcgen05_alloc_pos(uint32_t* out) {
  __shared__ uint32_t taddr;
  if (threadIdx.x < 32) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], 32;"
                 :: "r"((uint32_t)__cvta_generic_to_shared(&taddr)) : "memory");
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;");
  }
  asm volatile("tcgen05.fence::before_thread_sync;");
  __syncthreads();
  asm volatile("tcgen05.fence::after_thread_sync;");
  if (threadIdx.x == 0) out[blockIdx.x] = taddr;
  __syncthreads();
  if (threadIdx.x < 32) asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, 32;" :: "r"(taddr));
}
