// ptxbench/tcgen05.cuh -- Blackwell 5th-generation tensor cores (tcgen05.*), sm_100a only.
// The accumulator lives in tensor memory (TMEM: 128 lanes x 512 columns of 32 bits per SM),
// not registers. One thread issues tcgen05.mma for the whole CTA; completion is signalled
// on an mbarrier by tcgen05.commit; warps then copy D out with tcgen05.ld (warp w of a
// warpgroup may only touch lanes 32*(w%4) .. 32*(w%4)+31).
// TMEM address: bits 31-16 lane, bits 15-0 column.
#pragma once
#include <ptxbench/common.cuh>

namespace ptxbench {

// ---- allocation (whole warp executes these; the same warp allocates and frees) ----
// Allocate `ncols` columns (power of two, 32..512); the TMEM base address is written to
// *smem_result (a shared-memory word). Read it after a __syncthreads() with
// tcgen05_fence_after() on the reading side.
PTXBENCH_DEVICE void tcgen05_alloc(unsigned* smem_result, unsigned ncols) {
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n"
               ::"r"(smem_u32(smem_result)), "r"(ncols) : "memory");
}
// Give up the right to allocate again, so other CTAs on the SM waiting in alloc can proceed.
PTXBENCH_DEVICE void tcgen05_relinquish_alloc_permit() {
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}
// Free what tcgen05_alloc gave (same column count). Every allocation must be freed before exit.
PTXBENCH_DEVICE void tcgen05_dealloc(unsigned taddr, unsigned ncols) {
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(taddr), "r"(ncols) : "memory");
}

// ---- ordering of tcgen05 operations around thread synchronisation ----
PTXBENCH_DEVICE void tcgen05_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory"); }
PTXBENCH_DEVICE void tcgen05_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory"); }

// ---- descriptors ----
// Shared-memory descriptor (sm_100 layout): bits 0-13 start >> 4, 16-29 LBO >> 4,
// 32-45 SBO >> 4, 46-47 version = 1 (required), 49-51 base offset, 52 LBO mode,
// 61-63 layout: 0 none, 1 128B with 32B atoms, 2 128B, 4 64B, 6 32B.
// NOTE: different from Hopper's wgmma descriptor (2-bit swizzle at 62-63, 128B = 1).
enum Tcgen05Swizzle : unsigned { TC05_SWIZZLE_NONE = 0, TC05_SWIZZLE_128B_BASE32B = 1, TC05_SWIZZLE_128B = 2,
                                 TC05_SWIZZLE_64B = 4, TC05_SWIZZLE_32B = 6 };
PTXBENCH_DEVICE unsigned long long tcgen05_smem_desc(const void* smem, unsigned lbo_bytes, unsigned sbo_bytes,
                                                     unsigned layout) {
  const unsigned long long addr = (smem_u32(smem) & 0x3FFFFu) >> 4;
  return addr | ((unsigned long long)((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         ((unsigned long long)((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 46) |
         ((unsigned long long)(layout & 7u) << 61);
}
// K-major bf16 tile with 64-element (128-byte) rows written with 128B swizzle (TMA box inner
// dim 64, swizzle "128B"): SBO = 1024 B between 8-row groups; LBO unused (1). Advance K
// by 16 elements inside the row with +32 bytes on the pointer. 1024-byte aligned tile.
PTXBENCH_DEVICE unsigned long long tcgen05_desc_kmajor_sw128(const void* smem) {
  return tcgen05_smem_desc(smem, 16, 1024, TC05_SWIZZLE_128B);
}
// Instruction descriptor for kind::f16 (32 bits): bits 4-5 D format (1 = f32), 7-9 A format
// and 10-12 B format (0 = f16, 1 = bf16), 13/14 negate A/B, 15/16 A/B major (0 = K-major,
// 1 = MN-major), 17-22 N >> 3, 24-28 M >> 4. M = 64 or 128 (cta_group::1), N multiple of
// 16 in [16, 256] for M = 128 (multiple of 8 in [8, 256] for M = 64).
PTXBENCH_DEVICE constexpr unsigned tcgen05_idesc_bf16_f32(int M, int N, int a_mn_major = 0, int b_mn_major = 0) {
  return (1u << 4) | (1u << 7) | (1u << 10) | ((unsigned)a_mn_major << 15) | ((unsigned)b_mn_major << 16) |
         ((unsigned)(N >> 3) << 17) | ((unsigned)(M >> 4) << 24);
}

// ---- MMA: issued by ONE thread for the CTA ----
// D[tmem] (+)= A[smem] * B[smem]; K = 16 per instruction for 16-bit inputs.
// accumulate = 0 overwrites D (first K step).
PTXBENCH_DEVICE void tcgen05_mma_f16_ss(unsigned d_tmem, unsigned long long a_desc, unsigned long long b_desc,
                                        unsigned idesc, int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
      "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n\t}\n"
      ::"r"(d_tmem), "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(accumulate) : "memory");
}
// Same with A read from tensor memory (e.g. FlashAttention's P kept in TMEM).
PTXBENCH_DEVICE void tcgen05_mma_f16_ts(unsigned d_tmem, unsigned a_tmem, unsigned long long b_desc,
                                        unsigned idesc, int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
      "tcgen05.mma.cta_group::1.kind::f16 [%0], [%1], %2, %3, p;\n\t}\n"
      ::"r"(d_tmem), "r"(a_tmem), "l"(b_desc), "r"(idesc), "r"(accumulate) : "memory");
}
// Instruction descriptor for kind::f8f6f4 with e4m3 A and B and an f32 accumulator: the
// kind::f16 layout with A/B format 0 (e4m3; e5m2 would be 1). 8-bit operands may be MN-major.
PTXBENCH_DEVICE constexpr unsigned tcgen05_idesc_e4m3_f32(int M, int N, int a_mn_major = 0, int b_mn_major = 0) {
  return (1u << 4) | ((unsigned)a_mn_major << 15) | ((unsigned)b_mn_major << 16) |
         ((unsigned)(N >> 3) << 17) | ((unsigned)(M >> 4) << 24);
}
// D (+)= A * B for 8-bit floats (kind::f8f6f4), A and B from smem descriptors; K = 32 per call.
PTXBENCH_DEVICE void tcgen05_mma_f8f6f4_ss(unsigned d_tmem, unsigned long long a_desc, unsigned long long b_desc,
                                           unsigned idesc, int accumulate) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t"
      "tcgen05.mma.cta_group::1.kind::f8f6f4 [%0], %1, %2, %3, p;\n\t}\n"
      ::"r"(d_tmem), "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(accumulate) : "memory");
}
// Arrive once on `bar` when all tcgen05.mma issued so far by this thread have completed
// (also frees their smem operands for reuse). Issue from the same thread as the MMAs.
PTXBENCH_DEVICE void tcgen05_commit(unsigned long long* bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n"
               ::"r"(smem_u32(bar)) : "memory");
}

// ---- TMEM <-> registers (warp-wide; then tcgen05_wait_ld / tcgen05_wait_st) ----
PTXBENCH_DEVICE void tcgen05_wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory"); }
PTXBENCH_DEVICE void tcgen05_wait_st() { asm volatile("tcgen05.wait::st.sync.aligned;\n" ::: "memory"); }

// 32x32b.x8: thread `lane` of the warp gets TMEM lane (taddr lane + lane), columns
// taddr.col .. +7 as raw 32-bit words (f32 accumulators: __uint_as_float).
PTXBENCH_DEVICE void tcgen05_ld_32x32b_x8(unsigned (&r)[8], unsigned taddr) {
  asm volatile("tcgen05.ld.sync.aligned.32x32b.x8.b32 {%0, %1, %2, %3, %4, %5, %6, %7}, [%8];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]) : "r"(taddr) : "memory");
}

// 32x32b.x16: thread `lane` of the warp gets TMEM lane (taddr lane + lane), columns
// taddr.col .. +15 as raw 32-bit words (f32 accumulators: __uint_as_float).
PTXBENCH_DEVICE void tcgen05_ld_32x32b_x16(unsigned (&r)[16], unsigned taddr) {
  asm volatile("tcgen05.ld.sync.aligned.32x32b.x16.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, [%16];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15]) : "r"(taddr) : "memory");
}

// 32x32b.x32: thread `lane` of the warp gets TMEM lane (taddr lane + lane), columns
// taddr.col .. +31 as raw 32-bit words (f32 accumulators: __uint_as_float).
PTXBENCH_DEVICE void tcgen05_ld_32x32b_x32(unsigned (&r)[32], unsigned taddr) {
  asm volatile("tcgen05.ld.sync.aligned.32x32b.x32.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15]), "=r"(r[16]), "=r"(r[17]), "=r"(r[18]), "=r"(r[19]), "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]), "=r"(r[24]), "=r"(r[25]), "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]), "=r"(r[31]) : "r"(taddr) : "memory");
}

PTXBENCH_DEVICE void tcgen05_st_32x32b_x8(unsigned taddr, const unsigned (&r)[8]) {
  asm volatile("tcgen05.st.sync.aligned.32x32b.x8.b32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8};\n"
               :: "r"(taddr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[4]), "r"(r[5]), "r"(r[6]), "r"(r[7]) : "memory");
}

PTXBENCH_DEVICE void tcgen05_st_32x32b_x16(unsigned taddr, const unsigned (&r)[16]) {
  asm volatile("tcgen05.st.sync.aligned.32x32b.x16.b32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16};\n"
               :: "r"(taddr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[4]), "r"(r[5]), "r"(r[6]), "r"(r[7]), "r"(r[8]), "r"(r[9]), "r"(r[10]), "r"(r[11]), "r"(r[12]), "r"(r[13]), "r"(r[14]), "r"(r[15]) : "memory");
}

// TMEM address of (lane, column) relative to an allocation base.
PTXBENCH_DEVICE unsigned tmem_addr(unsigned base, unsigned lane, unsigned col) { return base + (lane << 16) + col; }

}  // namespace ptxbench
