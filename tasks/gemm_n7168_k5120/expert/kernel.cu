// Expert sm_90a GEMM (every gemm_n*_k* task): C[M,N] = A[M,K] * B[N,K]^T, bf16 in/out, fp32 accumulate.
//
// Design (see NOTES.md for the measurements behind each choice):
//  - 128x256 output tile per CTA (128x128 where the manifest passes bn = 128), K sliced by 64
//    (one 128-byte swizzled row per operand row).
//  - A 192 KiB shared-memory ring filled by TMA (cp.async.bulk.tensor): STAGES stages of
//    128x256 tiles or STAGES128 of 128x128 ones, a full and an empty mbarrier per stage.
//  - Warp specialisation, 384 threads: warpgroup 0 is the producer (one thread issues TMA;
//    setmaxnreg.dec frees its registers), warpgroups 1 and 2 are consumers (setmaxnreg.inc),
//    each owning 64 rows x 256 columns: one wgmma m64n256k16 per 16-wide K step, 128 fp32
//    accumulators per thread.
//  - Persistent grid walking the tiles in groups of GROUP_M row tiles, so the CTAs resident
//    at one moment share A and B panels in L2.
//  - Stream-K for the last `sk_tiles` tiles (the launch manifest picks how many: all of them
//    when the tiles are too few to fill the SMs, i.e. small M): their K iterations, laid end
//    to end, are cut into gridDim.x equal ranges, one per CTA, so every SM streams the same
//    share of B whatever M is (the manifest makes gridDim.x a multiple of sk_tiles there, so each
//    range is one of equal splits of one tile, give or take one K slice). A CTA whose range covers only part of a tile writes its fp32
//    partial to `ws` (slot 0: the first tile of its range, slot 1: the last); the CTA that
//    arrives last at the tile's counter adds the others' partials and stores the tile.
//    The tiles before those are data-parallel: tile t on CTA t mod gridDim.x, whole K.
//  - Epilogue (EPI_TMA=1): accumulators -> bf16 pairs in registers -> swizzled shared staging
//    (conflict-free) -> TMA store, which clips rows >= M and columns >= N; double-buffered so the
//    store engine drains while the warpgroup goes on. With EPI_DEFER (shipped) the staging and
//    the store of a tile wait until the next tile's first wgmmas are issued, so the tensor pipe
//    works through them. EPI_TMA=0: bounds-checked global stores.
// M and N may be any positive values with N a multiple of 8 (TMA wants 16-byte row strides):
// loads zero-fill rows past M or N, stores clip. K: a multiple of 8, the tail past a multiple
// of 64 zero-filled.

typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef STAGES
#define STAGES 4  // ring depth of 128x256 tiles (48 KiB a stage)
#endif
#ifndef STAGES128
#define STAGES128 6  // ring depth of 128x128 tiles: the same ring bytes, 32 KiB a stage
#endif
#ifndef EPI_TMA
#define EPI_TMA 1
#endif
#ifndef EPI_DEFER
#define EPI_DEFER 1  // 1 (with EPI_TMA): a tile's bf16 values wait in registers and are staged and stored while the
                     // next tile's first wgmmas run, so the tensor pipe does not idle through the shared stores
#endif
#ifndef GROUP_M
#define GROUP_M 16  // row tiles per raster group
#endif
#ifndef FIXUP_RED
#define FIXUP_RED 0  // 1: stream-K partials summed in L2 by red.add (ws: one zeroed tile per stream-K tile)
#endif
#ifndef FIXUP_ORDERED
#define FIXUP_ORDERED 0  // 1: stream-K partials summed in contributor order whoever arrives last (same bits every
                         // run; 2 contributors are order-free anyway). Off: measured 0.826 against 0.854 at M = 70
                         // (H200, 2026-12-03 W2; the ordered run with credit on, not yet re-timed apart)
#endif
#ifndef FIXUP_DSMEM
#define FIXUP_DSMEM 1  // where the launch is in clusters of 2 and every stream-K tile is split in two halves, one
                       // per CTA of a cluster, the second half's partial goes to the first CTA's shared memory (DSMEM):
                       // no ws traffic and no counters, so the manifest asks for no memset (`pair`; v7 in NOTES.md)
#endif
#ifndef PROMOTE
#define PROMOTE 0  // > 0: 128-wide tiles add their wgmma accumulator into an fp32 sum (IEEE adds) every PROMOTE K slices
#endif
#ifndef DIAG
#define DIAG 0  // timing diagnostics only (wrong results): 1 no stream-K fix-up or epilogue for partial tiles, 2 also no wgmma
#endif

#define BM 128
#define BN 256
#define BK 64
#define A_STAGE_BYTES (BM * BK * 2)  // 16 KiB
#define B_STAGE_BYTES (BN * BK * 2)  // 32 KiB
#define C_BUF_BYTES (64 * 64 * 2)     // one 64x64 bf16 staging box, 8 KiB
#define EPI_BYTES (EPI_TMA ? 2 * 2 * C_BUF_BYTES : 0)
#define CONSUMER_REGS 232
#define PRODUCER_REGS 40
#define PARTIAL_FLOATS (BM * BN)      // one fp32 partial tile in `ws`: 128 KiB
// The ring: STAGES stages of 128x256 tiles, or (as many bytes) STAGES128 stages of 128x128 ones:
// every A tile of the ring first, then every B tile. A 128-wide tile streams the same B bytes per
// K slice as half a 256-wide one, so at small M (where those tiles are chosen and B's HBM stream is
// the whole cost) the deeper ring keeps ~1.5x the bytes in flight per SM.
#define RING_BYTES (STAGES * (A_STAGE_BYTES + B_STAGE_BYTES))
#define MAX_STAGES (STAGES > STAGES128 ? STAGES : STAGES128)
static_assert(STAGES128 * (A_STAGE_BYTES + 128 * BK * 2) <= RING_BYTES, "STAGES128 stages of 128x128 tiles overflow the ring");
// (macros, not static constexpr members: those become module-scope .global variables)
#define RING_STAGES(TN) ((TN) == 256 ? STAGES : STAGES128)
#define B_TILE_BYTES(TN) ((TN) * BK * 2)  // one B tile: TN rows of 128 bytes


static __device__ __forceinline__ __attribute__((unused)) u32 smem_addr(const void* p) {
  u32 a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// ---------------------------------------------------------------- mbarrier
static __device__ __forceinline__ __attribute__((unused)) void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ __attribute__((unused)) void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ __attribute__((unused)) void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ __attribute__((unused)) void mbar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// Cluster (FIXUP_DSMEM): a shared address in CTA `rank` of this cluster, a remote arrival, and a wait
// that acquires at cluster scope (what another CTA released before arriving is visible after it).
static __device__ __forceinline__ __attribute__((unused)) u32 map_rank(u32 addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
static __device__ __forceinline__ __attribute__((unused)) void mbar_arrive_remote(u32 cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}
static __device__ __forceinline__ __attribute__((unused)) void mbar_wait_cluster(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---------------------------------------------------------------- TMA
static __device__ __forceinline__ __attribute__((unused)) void tma_load_2d(u32 dst, const CUtensorMap* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
static __device__ __forceinline__ __attribute__((unused)) void tma_store_2d(const CUtensorMap* map, u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map), "r"(src), "r"(c0),
               "r"(c1)
               : "memory");
}

// ---------------------------------------------------------------- wgmma
// K-major tile, rows of 128 bytes written with 128B swizzle: LBO unused (1), SBO = 1024 B
// between 8-row groups, layout type 1 (128B swizzle) in bits 62-63. Tile base 1024-aligned.
static __device__ __forceinline__ __attribute__((unused)) u64 desc_sw128(u32 saddr) {
  return (u64)((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
static __device__ __forceinline__ __attribute__((unused)) void wgmma_m64n256k16(float (&d)[128], u64 desc_a, u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// The same for a 128-wide tile (bn = 128): 64 accumulators a thread, the same layout.
static __device__ __forceinline__ __attribute__((unused)) void wgmma_m64n128k16(float (&d)[64], u64 desc_a, u64 desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// One K16 step of a warpgroup's 64 x TN tile, the shape picked by the accumulator array's size.
static __device__ __forceinline__ void wgmma_tile(float (&d)[128], u64 da, u64 db, int scale_d) {
  wgmma_m64n256k16(d, da, db, scale_d);
}
static __device__ __forceinline__ void wgmma_tile(float (&d)[64], u64 da, u64 db, int scale_d) {
  wgmma_m64n128k16(d, da, db, scale_d);
}

static __device__ __forceinline__ __attribute__((unused)) u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Tile t -> (row tile, column tile). Groups of GROUP_M row tiles are walked column by column
// so the CTAs working at one moment share A and B panels in L2.
static __device__ __forceinline__ __attribute__((unused)) void tile_coords(int t, int num_m, int num_n, int& m, int& n) {
  const int per_group = GROUP_M * num_n;
  const int g = t / per_group;
  const int first = g * GROUP_M;
  const int size = min(num_m - first, GROUP_M);
  const int r = t - g * per_group;
  m = first + r % size;
  n = r / size;
}

// What every CTA works on, in order; the producer and the consumers walk the same list.
// Tiles [0, dp_tiles): data-parallel, whole K, tile t on CTA t mod ctas. Tiles [dp_tiles,
// num_tiles): stream-K, their sk_total K iterations cut into `ctas` ranges that differ by at
// most one (CTA c: [sk_start(c), sk_start(c + 1)); the first sk_rem CTAs take one more).
struct Schedule {
  int num_m, num_n, num_k, num_tiles, dp_tiles, ctas, cta;
  int pair;  // FIXUP_DSMEM: tile u is CTAs 2u and 2u + 1 (one cluster), K halves; the partial goes by DSMEM
  int sk_total, sk_quot, sk_rem;
  __device__ __forceinline__ int sk_start(int c) const { return c * sk_quot + min(c, sk_rem); }
  // The CTA whose range holds stream-K iteration i (< sk_total).
  __device__ __forceinline__ int sk_owner(int i) const {
    const int big = sk_rem * (sk_quot + 1);
    return i < big ? i / (sk_quot + 1) : sk_rem + (i - big) / sk_quot;
  }
};

// One CTA's place in its list. next() gives the next (tile, K slices [kb0, kb1), slot): slot -1
// for a data-parallel tile, else where this CTA's partial of the tile goes in `ws` (0: the first
// tile of its stream-K range, 1: a later one; only the first and the last can be partial).
struct Cursor {
  int dp_next, it, end, slot;
  __device__ __forceinline__ Cursor(const Schedule& s)
      : dp_next(s.cta), it(s.sk_start(s.cta)), end(s.sk_start(s.cta + 1)), slot(0) {}
  __device__ __forceinline__ bool next(const Schedule& s, int& tile, int& kb0, int& kb1, int& seg_slot) {
    if (dp_next < s.dp_tiles) {
      tile = dp_next, kb0 = 0, kb1 = s.num_k, seg_slot = -1;
      dp_next += s.ctas;
      return true;
    }
    if (it >= end) return false;
    const int u = it / s.num_k;
    kb0 = it - u * s.num_k;
    kb1 = min(s.num_k, kb0 + (end - it));
    tile = s.dp_tiles + u, seg_slot = slot;
    slot = 1;
    it += kb1 - kb0;
    return true;
  }
};

// One work item as the producer hands it to the consumers (in shared memory, with the stage of
// its first K slice; the full barrier's arrival publishes it). slices == 0: no more work.
struct WorkMeta {
  int m0, n0, slices, slot;  // slot: -1 (the tile is this CTA's alone) or its partial's ws slot
  int u, lo, c_first, c_last;  // stream-K: tile index, its first iteration, the contributing CTAs
  __device__ __forceinline__ void store(u32 at) const {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(at), "r"(m0), "r"(n0), "r"(slices), "r"(slot) : "memory");
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(at + 16), "r"(u), "r"(lo), "r"(c_first), "r"(c_last)
                 : "memory");
  }
  __device__ __forceinline__ void load(u32 at) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(m0), "=r"(n0), "=r"(slices), "=r"(slot) : "r"(at) : "memory");
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(u), "=r"(lo), "=r"(c_first), "=r"(c_last) : "r"(at + 16)
                 : "memory");
  }
};

// The producer thread: walks this CTA's work list, fills the ring by TMA (tiles bn wide), and hands
// each work item to the consumers with the stage of its first K slice. The ring position advances
// by a counter (stage s, phase ph), never a division: this code runs once per K slice.
static __device__ __forceinline__ void producer(const CUtensorMap* tmA, const CUtensorMap* tmB, const Schedule& sch,
                                                u32 bars, u32 ring, u32 meta, int bn) {
  const int nst = RING_STAGES(bn);
  const u32 b_bytes = B_TILE_BYTES(bn);
  const u32 sA = ring, sB = ring + nst * A_STAGE_BYTES;
  int s = 0, t, kb0, kb1, slot;
  u32 ph = 0;
  for (Cursor cur(sch); cur.next(sch, t, kb0, kb1, slot);) {
    WorkMeta w{};
    int mt, nt;
    tile_coords(t, sch.num_m, sch.num_n, mt, nt);
    w.m0 = mt * BM, w.n0 = nt * bn, w.slices = kb1 - kb0, w.slot = -1;
    if (slot >= 0 && w.slices < sch.num_k) {  // part of a stream-K tile: the fix-up's facts
      w.slot = slot, w.u = t - sch.dp_tiles;
      w.lo = w.u * sch.num_k;
      w.c_first = sch.sk_owner(w.lo), w.c_last = sch.sk_owner(w.lo + sch.num_k - 1);
    }
    for (int kb = kb0; kb < kb1; ++kb) {
      const u32 full = bars + 8 * s;
      mbar_wait(bars + 8 * (MAX_STAGES + s), ph ^ 1);  // both consumers released the slot
      if (kb == kb0) w.store(meta + s * sizeof(WorkMeta));
      mbar_expect_tx(full, A_STAGE_BYTES + b_bytes);
      tma_load_2d(sA + s * A_STAGE_BYTES, tmA, full, kb * BK, w.m0);
      tma_load_2d(sB + s * b_bytes, tmB, full, kb * BK, w.n0);
      if (++s == nst) s = 0, ph ^= 1;
    }
  }
  // The end: a stage with no data whose work item has no slices.
  mbar_wait(bars + 8 * (MAX_STAGES + s), ph ^ 1);
  WorkMeta end{};  // slices 0
  end.store(meta + s * sizeof(WorkMeta));
  mbar_arrive(bars + 8 * s);
}

// The consumer warpgroups' side (warpgroups 1 and 2) with tiles TN wide: per work item the main
// loop (wgmma m64nTNk16 into d, one wgmma group kept in flight, each slot released to the producer
// as soon as the group that read it retired), the stream-K fix-up, the epilogue.
template <int TN>
static __device__ __forceinline__ void consumer(const CUtensorMap* tmC, unsigned short* __restrict__ C,
                                                float* __restrict__ ws, int* __restrict__ counters, int M, int N,
                                                const Schedule& sch, u32 bars, u32 ring, u32 sC, u32 meta,
                                                u32 flag_slot, int tid, int wg) {
  constexpr int NST = RING_STAGES(TN);
  const u32 sA = ring, sB = ring + NST * A_STAGE_BYTES;
  const int cw = wg - 1;          // consumer warpgroup: rows cw*64 .. cw*64+63 of the tile
  const int t128 = tid & 127;     // thread within the warpgroup
  const int warp = t128 >> 5, lane = tid & 31;
  const int row = warp * 16 + (lane >> 2);  // this thread's rows within the warpgroup's 64: row, row + 8
  const int q = lane & 3;
  float d[TN / 2];  // the warpgroup's 64 x TN accumulator tile: TN / 2 fp32 a thread
#pragma unroll
  for (int i = 0; i < TN / 2; ++i) d[i] = 0.f;
  // PROMOTE: only 128-wide tiles have the registers for a second accumulator
  constexpr int promote = TN == 128 ? PROMOTE : 0;
  float total[promote ? TN / 2 : 1];
  (void)total;
#if EPI_TMA
  // Staging buffer of the next 64-column chunk, counted across tiles: the last column tile may
  // hold an odd number of chunks (N % 256 of 1..64 or 129..192), so `chunk & 1` alone would hand
  // the next tile's first chunk the buffer whose store is still the one in flight.
  u32 epi_buf = 0;
  // A tile's output as bf16 pairs (float4 j of the accumulator -> packed[2j], packed[2j + 1]: rows row
  // and row + 8), and where it goes; with EPI_DEFER it waits here until the next tile's first wgmmas
  // are issued (pend_m0 >= 0: a tile is waiting).
  u32 packed[TN / 4];
  int pend_m0 = -1, pend_n0 = 0;
  // Stage the packed tile through the two 64x64 buffers and store it by TMA, a 64-column chunk at a time.
  auto store_packed = [&](int sm0, int sn0) {
    const u32 cbuf = sC + cw * (2 * C_BUF_BYTES);
#pragma unroll
    for (int chunk = 0; chunk < TN / 64; ++chunk) {
      if (sn0 + chunk * 64 >= N) break;  // past the last column (N not a multiple of the tile width)
      const u32 buf = cbuf + epi_buf * C_BUF_BYTES;
      epi_buf ^= 1;
      // The store issued two chunks ago (same buffer) must have finished reading it.
      if (t128 == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int j = chunk * 8 + jj;
        // 128B swizzle: 16-byte unit jj of row r lives at unit jj ^ (r & 7); rows r and r+8 share it.
        const u32 a0 = buf + row * 128 + ((jj ^ (row & 7)) << 4) + q * 4;
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(a0), "r"(packed[2 * j]) : "memory");
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(a0 + 8 * 128), "r"(packed[2 * j + 1]) : "memory");
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // make st.shared visible to the TMA engine
      asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
      if (t128 == 0) {
        tma_store_2d(tmC, buf, sn0 + chunk * 64, sm0 + cw * 64);
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
    }
  };
#endif
  int s = 0;  // the ring position of the next K slice: stage s, phase ph (the producer's count)
  u32 ph = 0;
  for (;;) {
    mbar_wait(bars + 8 * s, ph);
    WorkMeta w{};
    w.load(meta + s * sizeof(WorkMeta));
    if (w.slices == 0) break;
    const int m0 = w.m0, n0 = w.n0;
    // K slices in groups of `group` (all of them unless promoting), each group into a fresh accumulator
    const int group = promote ? promote : w.slices;
    for (int g0 = 0; g0 < w.slices; g0 += group) {
      const int g1 = min(w.slices, g0 + group);
      int prev_s = -1;
      for (int i = g0; i < g1; ++i) {
        if (i > 0) mbar_wait(bars + 8 * s, ph);  // slice 0's stage: waited for with the work item
        const u64 da = desc_sw128(sA + s * A_STAGE_BYTES + cw * (64 * 128));
        const u64 db = desc_sw128(sB + s * B_TILE_BYTES(TN));
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)  // +32 bytes along the swizzled row = +2 in the descriptor
          if (DIAG < 2) wgmma_tile(d, da + 2 * kk, db + 2 * kk, (i > g0 || kk > 0) ? 1 : 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#if EPI_TMA && EPI_DEFER
        if (pend_m0 >= 0) {  // the previous tile's stores, while this tile's first wgmmas run
          store_packed(pend_m0, pend_n0);
          pend_m0 = -1;
        }
#endif
        // Keep one group in flight; the previous slice's wgmmas are done reading its slot.
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        if (prev_s >= 0 && t128 == 0) mbar_arrive(bars + 8 * (MAX_STAGES + prev_s));
        prev_s = s;
        if (++s == NST) s = 0, ph ^= 1;
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      if (t128 == 0) mbar_arrive(bars + 8 * (MAX_STAGES + prev_s));
      if (promote) {
        // The group's sum joins the fp32 total with round-to-nearest adds: the tensor core's own
        // accumulation is less exact (NOTES.md, "Why gemm_n5376_k21504 failed once").
#pragma unroll
        for (int j = 0; j < TN / 2; ++j) total[j] = g0 == 0 ? d[j] : total[j] + d[j];
      }
    }
    // the tile's sum: the total when promoting (d is left to the wgmmas alone), else the accumulator
    float* const res = promote ? total : d;

    // ---------------------------------------------------------- stream-K fix-up
    if (DIAG && w.slot >= 0) continue;
    if (w.slot >= 0) {
      // This CTA holds part of the tile's K range. Partials are written in the accumulator's
      // own order (float4 j of consumer thread ct at [j * 256 + ct]), so every store and load
      // is a 512-byte run per warp; warps whose rows are all past M skip both sides.
      const int ct = cw * 128 + t128;
      const bool row_ok = m0 + cw * 64 + warp * 16 < M;
#if FIXUP_DSMEM
      if (TN == 128 && sch.pair) {  // (pairs are 128 wide: the 256-wide instantiation carries no copy of this)
        // The two halves of this tile's K range are this cluster's two CTAs. Rank 0 lets rank 1 write its
        // partial into rank 0's ring (free: rank 0's slices are all consumed, its wgmmas retired) and adds
        // it; rank 1 is done after its stores. Counters and ws are not touched.
        const u32 ready = meta + MAX_STAGES * sizeof(WorkMeta), data = ready + 8;
        u32 rank;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        if (rank == 0) {
          if (t128 == 0) mbar_arrive_remote(map_rank(ready, 1));  // this warpgroup is off the ring
          mbar_wait_cluster(data, 0);
          if (row_ok) {
#pragma unroll
            for (int j = 0; j < TN / 8; ++j) {
              float a, b, c, e;
              asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(a), "=f"(b), "=f"(c), "=f"(e)
                           : "r"(ring + (j * 256 + ct) * 16) : "memory");
              res[4 * j] += a, res[4 * j + 1] += b, res[4 * j + 2] += c, res[4 * j + 3] += e;
            }
          }
        } else {
          mbar_wait_cluster(ready, 0);  // both of rank 0's warpgroups are off its ring
          const u32 dst = map_rank(ring, 0);
          if (row_ok) {
#pragma unroll
            for (int j = 0; j < TN / 8; ++j)
              asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(dst + (j * 256 + ct) * 16),
                           "f"(res[4 * j]), "f"(res[4 * j + 1]), "f"(res[4 * j + 2]), "f"(res[4 * j + 3]) : "memory");
          }
          mbar_arrive_remote(map_rank(data, 0));  // every thread: its own stores released
          continue;
        }
      } else {
#endif
#if FIXUP_RED
      // Every contributor adds its partial into the tile's zeroed sum in L2 (no data comes back);
      // the last to arrive reads the sum: one read at the tail, not one per contributor.
      float4* sum = reinterpret_cast<float4*>(ws + (size_t)w.u * PARTIAL_FLOATS) + ct;
      if (row_ok) {
#pragma unroll
        for (int j = 0; j < TN / 8; ++j)
          asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(sum + j * 256), "f"(res[4 * j]),
                       "f"(res[4 * j + 1]), "f"(res[4 * j + 2]), "f"(res[4 * j + 3]) : "memory");
      }
#else
      float4* mine = reinterpret_cast<float4*>(ws + ((size_t)blockIdx.x * 2 + w.slot) * PARTIAL_FLOATS) + ct;
      if (row_ok) {
#pragma unroll
        for (int j = 0; j < TN / 8; ++j) mine[j * 256] = make_float4(res[4 * j], res[4 * j + 1], res[4 * j + 2], res[4 * j + 3]);
      }
#endif
      // The CTAs whose ranges meet this tile: c_first (holds its first iteration) to c_last.
      __threadfence();
      asm volatile("bar.sync 3, 256;" ::: "memory");
      if (tid == 128) {
        const int arrived = atomicAdd(counters + w.u, 1);
        const u32 last = arrived == w.c_last - w.c_first;  // every other contributor arrived before
        if (last) counters[w.u] = 0;  // ready for the next launch
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(flag_slot), "r"(last) : "memory");
      }
      asm volatile("bar.sync 3, 256;" ::: "memory");
      u32 last;
      asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag_slot) : "memory");
      if (!last) continue;  // another CTA finishes this tile
      __threadfence();
#if FIXUP_RED
      if (row_ok) {
#pragma unroll
        for (int j = 0; j < TN / 8; ++j) {
          const float4 a = __ldcg(sum + j * 256);
          res[4 * j] = a.x, res[4 * j + 1] = a.y, res[4 * j + 2] = a.z, res[4 * j + 3] = a.w;
        }
      }
#else
      if (row_ok) {
        // c's segment of this tile is its first (slot 0) if c's range starts inside the tile.
        auto partial = [&](int c) {
          const int c_slot = sch.sk_start(c) >= w.lo ? 0 : 1;
          return reinterpret_cast<const float4*>(ws + ((size_t)c * 2 + c_slot) * PARTIAL_FLOATS) + ct;
        };
        // The tile's sum in one order whichever contributor arrives last: ((P[c_first] + P[c_first+1])
        // + ...) + P[c_last], so every run gives the same bits. This CTA's own partial (in res, and in
        // ws bit for bit) can start that sum if it is P[c_first], or P[c_first+1] (a + b == b + a);
        // from the third contributor on, the sum starts again from P[c_first] and reads its own back.
        const int me = blockIdx.x;
        const bool restart = FIXUP_ORDERED && me >= w.c_first + 2;
        if (restart) {
          const float4* p = partial(w.c_first);
#pragma unroll
          for (int j = 0; j < TN / 8; ++j) {
            const float4 a = __ldcg(p + j * 256);
            res[4 * j] = a.x, res[4 * j + 1] = a.y, res[4 * j + 2] = a.z, res[4 * j + 3] = a.w;
          }
        }
        for (int c = w.c_first + restart; c <= w.c_last; ++c) {
          if (c == me && !restart) continue;
          const float4* p = partial(c);
#pragma unroll
          for (int j = 0; j < TN / 8; ++j) {
            const float4 a = __ldcg(p + j * 256);
            res[4 * j] += a.x, res[4 * j + 1] += a.y, res[4 * j + 2] += a.z, res[4 * j + 3] += a.w;
          }
        }
      }
#endif
#if FIXUP_DSMEM
      }
#endif
    }

    // ---------------------------------------------------------- epilogue
#if EPI_TMA
#pragma unroll
    for (int j = 0; j < TN / 8; ++j) {
      packed[2 * j] = pack_bf16x2(res[4 * j], res[4 * j + 1]);
      packed[2 * j + 1] = pack_bf16x2(res[4 * j + 2], res[4 * j + 3]);
    }
    if (EPI_DEFER) pend_m0 = m0, pend_n0 = n0;
    else store_packed(m0, n0);
#else
    const int r0 = m0 + cw * 64 + row;
    unsigned short* p0 = C + (size_t)r0 * N + n0 + q * 2;
    unsigned short* p1 = p0 + (size_t)8 * N;
#pragma unroll
    for (int j = 0; j < TN / 8; ++j) {
      if (n0 + 8 * j >= N) break;
      if (r0 < M) *reinterpret_cast<u32*>(p0 + 8 * j) = pack_bf16x2(res[4 * j], res[4 * j + 1]);
      if (r0 + 8 < M) *reinterpret_cast<u32*>(p1 + 8 * j) = pack_bf16x2(res[4 * j + 2], res[4 * j + 3]);
    }
#endif
  }
#if EPI_TMA
  if (pend_m0 >= 0) store_packed(pend_m0, pend_n0);  // EPI_DEFER: the last tile
  if (t128 == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
gemm_bf16_tn_sm90(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                  const __grid_constant__ CUtensorMap tmC, unsigned short* __restrict__ C, float* __restrict__ ws,
                  int* __restrict__ counters, int M, int N, int K, int sk_tiles, int bn) {
  extern __shared__ unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 128B swizzle wants 1024-aligned tiles
  const u32 ring = base;  // RING_BYTES: the A tiles of every stage, then the B tiles (RING_STAGES, B_TILE_BYTES)
  const u32 sC = ring + RING_BYTES;
  const u32 bars = sC + EPI_BYTES;
  const u32 flag_slot = bars + 8 * 2 * MAX_STAGES;  // stream-K: "this CTA finishes the tile"
  // full[s] at bars + 8s, empty[s] at bars + 8(MAX_STAGES + s). Work items (WorkMeta) ride with the
  // stage that holds their first K slice: the producer alone walks the schedule, so its integer
  // divisions exist once in the code, and the consumers hold no copy of it.
  const u32 meta = flag_slot + 16;

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  // Tile width: 256, or 128 (the manifest's choice where 256-wide tiles would be half empty or too
  // few). tmB's box must be [bn, 64]: the full barrier expects exactly that many bytes.
  bn = bn == 128 ? 128 : 256;

  if (tid == 0) {
    for (int s = 0; s < MAX_STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);                 // producer's expect_tx arrival
      mbar_init(bars + 8 * (MAX_STAGES + s), 2);  // one arrival per consumer warpgroup
    }
    if (FIXUP_DSMEM) {
      const u32 ready = bars + 8 * 2 * MAX_STAGES + 16 + MAX_STAGES * sizeof(WorkMeta);  // (meta's layout, below)
      mbar_init(ready, 2);       // rank 0's two consumer warpgroups, remotely
      mbar_init(ready + 8, 256);  // rank 1's consumer threads, remotely
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  u32 cluster_ctas = 1;
  if (FIXUP_DSMEM) {
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(cluster_ctas));
    // every barrier of both CTAs initialised before any remote arrival
    if (cluster_ctas > 1) asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  }

  Schedule sch;
  sch.num_m = (M + BM - 1) / BM;
  sch.num_n = (N + bn - 1) / bn;
  sch.num_k = (K + BK - 1) / BK;
  sch.num_tiles = sch.num_m * sch.num_n;
  sk_tiles = min(max(sk_tiles, 0), sch.num_tiles);
  if ((long long)sk_tiles * sch.num_k > 0x7fffffff) sk_tiles = 0;  // iteration indices are 32-bit
  sch.dp_tiles = sch.num_tiles - sk_tiles;
  sch.ctas = gridDim.x;
  sch.cta = blockIdx.x;
  sch.sk_total = sk_tiles * sch.num_k;
  sch.sk_quot = sch.sk_total / sch.ctas;
  sch.sk_rem = sch.sk_total % sch.ctas;
  // FIXUP_DSMEM: clusters of 2, every tile stream-K in two exact halves (CTA 2u: the first, 2u + 1: the second)
  sch.pair = FIXUP_DSMEM && bn == 128 && cluster_ctas == 2 && sch.dp_tiles == 0 && sch.ctas == 2 * sch.num_tiles && sch.num_k % 2 == 0;

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(&tmA) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(&tmB) : "memory");
      producer(&tmA, &tmB, sch, bars, ring, meta, bn);
    }
  } else {
    // ------------------------------------------------------------ consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    // One instantiation per tile width: each holds a single wgmma shape and its own accumulators
    // (a branch between two shapes on one accumulator array makes ptxas serialize the wgmmas, C7515).
    if (bn == 256) consumer<256>(&tmC, C, ws, counters, M, N, sch, bars, ring, sC, meta, flag_slot, tid, wg);
    else consumer<128>(&tmC, C, ws, counters, M, N, sch, bars, ring, sC, meta, flag_slot, tid, wg);
  }
}
