// ptxbench/common.cuh -- small building blocks shared by the other helper headers.
// Built-in types only (no <stdint.h>), so it compiles under NVRTC and nvcc alike.
#pragma once

#ifndef PTXBENCH_DEVICE
#define PTXBENCH_DEVICE __device__ __forceinline__
#endif

namespace ptxbench {

// 32-bit shared-window address of a generic pointer to shared memory (what every
// .shared:: operand, descriptor and mbarrier wants).
PTXBENCH_DEVICE unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Index of this thread's warpgroup (4 consecutive warps) and warp within the block;
// __shfl_sync makes the value provably warp-uniform, which keeps branches on it uniform.
PTXBENCH_DEVICE int warpgroup_idx() { return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); }
PTXBENCH_DEVICE int warp_idx() { return __shfl_sync(0xffffffffu, (int)threadIdx.x / 32, 0); }

// One lane of the warp returns true (elect.sync, sm_90+). Use it to pick the thread that
// issues TMA, mbarrier expect_tx or a tensor-core MMA on behalf of the warp.
PTXBENCH_DEVICE bool elect_one() {
  unsigned pred = 0;
  asm volatile(
      "{\n\t.reg .pred p;\n\t.reg .b32 lane;\n\t"
      "elect.sync lane|p, 0xffffffff;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}\n"
      : "=r"(pred));
  return pred != 0;
}

// Warp-specialised register budgets (sm_90a / sm_100a). N must be a multiple of 8 in
// [24, 256], and every warp of a warpgroup must execute the same call. ptxas ignores
// these (info C7508) unless it knows the register count at entry: give the kernel
// __launch_bounds__(threads, 1).
template <int N> PTXBENCH_DEVICE void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> PTXBENCH_DEVICE void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Order this thread's generic-proxy writes to shared memory before later async-proxy
// reads of it (TMA store, tensor-core MMA operand reads).
PTXBENCH_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Same, for every state space (also global memory written and then read by TMA).
PTXBENCH_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async;\n" ::: "memory"); }

// ldmatrix / stmatrix: 8x8 b16 matrices between shared memory and registers, warp-wide.
// Lane l supplies the row address for row (l % 8) of matrix (l / 8).
PTXBENCH_DEVICE void ldmatrix_x4(unsigned (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row_ptr)));
}
PTXBENCH_DEVICE void ldmatrix_x4_trans(unsigned (&r)[4], const void* row_ptr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row_ptr)));
}
PTXBENCH_DEVICE void stmatrix_x4(void* row_ptr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :: "r"(smem_u32(row_ptr)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
PTXBENCH_DEVICE void stmatrix_x4_trans(void* row_ptr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :: "r"(smem_u32(row_ptr)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

// Two floats -> packed bf16x2 (low half = a), the register format wgmma A fragments,
// stmatrix and bf16 stores want.
PTXBENCH_DEVICE unsigned pack_bf16x2(float a, float b) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(b), "f"(a));
  return r;
}

}  // namespace ptxbench
