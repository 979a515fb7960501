// ptxbench/tma.cuh -- TMA (cp.async.bulk.tensor) loads and stores, sm_90+.
// The CUtensorMap is built on the host (in ptxbench: the launch manifest's "tensor_maps")
// and passed as a `const __grid_constant__ CUtensorMap` kernel parameter; pass its address
// here. Coordinates are in elements, innermost dimension first (c0 = column), the reverse
// of the manifest's outermost-first "box". Loads complete on an mbarrier: the issuing
// thread first calls mbarrier_arrive_expect_tx(bar, bytes of all loads of the stage).
#pragma once
#include <ptxbench/common.cuh>

namespace ptxbench {

// Pull the 128-byte descriptor into the cache ahead of its first use (optional).
PTXBENCH_DEVICE void tma_prefetch_descriptor(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tmap) : "memory");
}

// 1D tile load global -> shared::cta, completing `bar`'s transaction count.
PTXBENCH_DEVICE void tma_load_1d(void* smem_dst, const void* tmap, unsigned long long* bar, int c0) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];\n"
      ::"r"(smem_u32(smem_dst)), "l"(tmap), "r"(smem_u32(bar)), "r"(c0) : "memory");
}

// 2D tile load global -> shared::cta, completing `bar`'s transaction count.
PTXBENCH_DEVICE void tma_load_2d(void* smem_dst, const void* tmap, unsigned long long* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
      ::"r"(smem_u32(smem_dst)), "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1) : "memory");
}

// 3D tile load global -> shared::cta, completing `bar`'s transaction count.
PTXBENCH_DEVICE void tma_load_3d(void* smem_dst, const void* tmap, unsigned long long* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
      ::"r"(smem_u32(smem_dst)), "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// 4D tile load global -> shared::cta, completing `bar`'s transaction count.
PTXBENCH_DEVICE void tma_load_4d(void* smem_dst, const void* tmap, unsigned long long* bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
      ::"r"(smem_u32(smem_dst)), "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

// 5D tile load global -> shared::cta, completing `bar`'s transaction count.
PTXBENCH_DEVICE void tma_load_5d(void* smem_dst, const void* tmap, unsigned long long* bar, int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
      ::"r"(smem_u32(smem_dst)), "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}

// 1D tile store shared::cta -> global. Fence first (fence_proxy_async_smem) so the
// threads' smem writes are visible to TMA; then tma_store_commit() + tma_store_wait<0>().
PTXBENCH_DEVICE void tma_store_1d(const void* tmap, const void* smem_src, int c0) {
  asm volatile(
      "cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];\n"
      ::"l"(tmap), "r"(smem_u32(smem_src)), "r"(c0) : "memory");
}

// 2D tile store shared::cta -> global. Fence first (fence_proxy_async_smem) so the
// threads' smem writes are visible to TMA; then tma_store_commit() + tma_store_wait<0>().
PTXBENCH_DEVICE void tma_store_2d(const void* tmap, const void* smem_src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
      ::"l"(tmap), "r"(smem_u32(smem_src)), "r"(c0), "r"(c1) : "memory");
}

// 3D tile store shared::cta -> global. Fence first (fence_proxy_async_smem) so the
// threads' smem writes are visible to TMA; then tma_store_commit() + tma_store_wait<0>().
PTXBENCH_DEVICE void tma_store_3d(const void* tmap, const void* smem_src, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
      ::"l"(tmap), "r"(smem_u32(smem_src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// 4D tile store shared::cta -> global. Fence first (fence_proxy_async_smem) so the
// threads' smem writes are visible to TMA; then tma_store_commit() + tma_store_wait<0>().
PTXBENCH_DEVICE void tma_store_4d(const void* tmap, const void* smem_src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
      ::"l"(tmap), "r"(smem_u32(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

// 5D tile store shared::cta -> global. Fence first (fence_proxy_async_smem) so the
// threads' smem writes are visible to TMA; then tma_store_commit() + tma_store_wait<0>().
PTXBENCH_DEVICE void tma_store_5d(const void* tmap, const void* smem_src, int c0, int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
      ::"l"(tmap), "r"(smem_u32(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}

// 2D load multicast to every CTA in `cta_mask` (bit i = cluster rank i): the data and
// the complete_tx land at the same smem offsets in each destination CTA.
PTXBENCH_DEVICE void tma_load_2d_multicast(void* smem_dst, const void* tmap, unsigned long long* bar,
                                           unsigned short cta_mask, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5}], [%2], %3;\n"
      ::"r"(smem_u32(smem_dst)), "l"(tmap), "r"(smem_u32(bar)), "h"(cta_mask), "r"(c0), "r"(c1) : "memory");
}

// 2D reduce-add store: global += smem tile (e.g. fp32 dQ accumulation in attention backward).
PTXBENCH_DEVICE void tma_reduce_add_2d(const void* tmap, const void* smem_src, int c0, int c1) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [%0, {%2, %3}], [%1];\n"
               ::"l"(tmap), "r"(smem_u32(smem_src)), "r"(c0), "r"(c1) : "memory");
}

// Non-tensor bulk copy global -> shared (contiguous, bytes % 16 == 0, both 16-B aligned).
PTXBENCH_DEVICE void bulk_load(void* smem_dst, const void* gmem_src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_u32(smem_dst)), "l"(gmem_src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}

// Close the current group of TMA stores / bulk copies issued by this thread.
PTXBENCH_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Wait until at most N committed store groups still read their smem source (then the
// smem may be overwritten). Call tma_store_wait<0>() before the CTA exits too: its shared
// memory is released at exit while a store may still be reading it.
template <int N = 0> PTXBENCH_DEVICE void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

}  // namespace ptxbench
