// tmem positive: tensor-memory traffic: tcgen05.ld (tmem -> registers), tcgen05.st
// (registers -> tmem) and tcgen05.cp (shared -> tmem). The tmem address is a parameter so
// that this kernel allocates nothing (it is the negative control for tcgen05_alloc).
// features: tmem
// negative control for: tcgen05_alloc tcgen05_mma
extern "C" __global__ void tmem_pos(uint32_t taddr, uint64_t sdesc, float* out) {
  uint32_t v;
  asm volatile("tcgen05.ld.sync.aligned.32x32b.x1.b32 {%0}, [%1];" : "=r"(v) : "r"(taddr));
  asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory");
  v = v * 3 + 1;
  asm volatile("tcgen05.st.sync.aligned.32x32b.x1.b32 [%0], {%1};" :: "r"(taddr + 32), "r"(v));
  asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory");
  if (threadIdx.x == 0) asm volatile("tcgen05.cp.cta_group::1.128x256b [%0], %1;" :: "r"(taddr + 64), "l"(sdesc));
  out[threadIdx.x] = __int_as_float(v);
}
