"""Architecture knowledge: every doc snippet and helper header compiles with the real
toolchain and shows its declared features in SASS; mistake snippets produce exactly the
ptxas message the doc quotes; the retriever ranks, budgets and switches modes as promised."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from knowledge import retriever as kr
from knowledge.retriever import estimate_tokens, retrieve, snippets
from tools.compile import compile_source
from tools.features import FEATURES
from tools.sass import inspect
from tools.solution import parse_manifest

ALL_SNIPPETS = snippets()


def _compile(source: str, language: str, arch: str):
    result = compile_source(source, language, arch)
    return result, (inspect(result) if result.ok else None)


def _notes(result) -> list[str]:
    """ptxas messages a clean kernel must not have: errors and any coded info/warning."""
    return [d.render() for d in result.diagnostics if d.severity == "error" or d.code]


# ---------------------------------------------------------------- docs

def test_docs_load_with_front_matter():
    docs = kr.load_docs()
    assert {d.arch for d in docs} >= {"sm_90a", "sm_100a", "common"}
    for d in docs:
        assert d.title and d.sections, d.path
        assert set(d.features) <= set(FEATURES), (d.path, set(d.features) - set(FEATURES))
        for f in d.features:
            for arch in d.arches:
                if arch in ("sm_90a", "sm_100a"):
                    assert arch in FEATURES[f].arches, (d.path, arch, f)


def test_every_doc_with_code_has_snippets():
    """A doc whose code blocks are all marked nocompile holds fragments (patterns teach idioms,
    not kernels); every other doc with code has compiled snippets."""
    with_code = {s.doc for s in ALL_SNIPPETS}
    for d in kr.load_docs() + kr.load_examples():
        blocks = len(re.findall(r"^```(cuda|ptx)\s*$", d.body, re.M))
        fragments = len(re.findall(r"<!-- nocompile -->\s*\n```(cuda|ptx)\s*$", d.body, re.M))
        if blocks > fragments:
            assert d.path in with_code, d.path


@pytest.mark.parametrize("snip", ALL_SNIPPETS, ids=[f"{s.doc}:{s.heading[:40]}:{s.arch}" for s in ALL_SNIPPETS])
def test_doc_snippet(snip):
    result, info = _compile(snip.source, snip.language, snip.arch)
    if snip.expect:
        severity, what = snip.expect
        said = [d for d in result.diagnostics if d.severity == severity and (d.code == what or what in d.message)]
        assert said, f"expected {severity} {what!r}; ptxas said: {[d.render() for d in result.diagnostics]}"
        # a quoted message must appear verbatim in the doc's section text
        section = next(s for d in kr.load_docs() if d.path == snip.doc for s in d.sections if s.heading == snip.heading)
        doc_text = " ".join(section.text.split()) + " ".join(
            " ".join(s.text.split()) for d in kr.load_docs() if d.path == snip.doc for s in d.sections)
        assert what in doc_text
        return
    assert result.ok, result.error
    assert not _notes(result), _notes(result)
    assert info.status == "ok", info.reason
    assert not info.flags["wgmma_serialized"] and not info.flags["setmaxnreg_ignored"], info.flag_evidence
    missing = [f for f in snip.features if not info.feature_present(f)]
    assert not missing, f"features not in SASS: {missing}"


def test_quoted_ptxas_messages_are_real():
    """Every `(C75xx) Potential Performance Loss ...` text quoted in a doc was printed by
    ptxas for one of the mistake snippets (the messages are produced, not recalled)."""
    produced: set[str] = set()
    for snip in ALL_SNIPPETS:
        if snip.expect and snip.expect[0] == "info":
            result, _ = _compile(snip.source, snip.language, snip.arch)
            produced |= {f"({d.code}) {d.message}" for d in result.diagnostics if d.code}
    quoted = set()
    for d in kr.load_docs():
        for m in re.finditer(r"`(\(C\d{4}\) Potential Performance Loss[^`]*)`", d.body):
            quoted.add(" ".join(m[1].split()))
    assert quoted
    norm = {" ".join(p.split()) for p in produced}
    for q in quoted:
        assert q in norm, f"quoted but not produced by the snippets: {q}"


def test_manifest_examples_parse():
    n = 0
    for d in kr.load_docs() + kr.load_examples():
        for block in re.findall(r"```json\n(.*?)```", d.body, re.S):
            data = json.loads(block)
            if "launches" in data:
                parse_manifest(block, where=d.path)
                n += 1
    assert n >= 3  # the worked examples' manifests (docs hold none: see test_no_doc_is_a_solution)


# ---------------------------------------------------------------- helper headers

HEADER_KERNELS = {
    "sm_90a": ("""
#include <ptxbench/wgmma.cuh>
#include <ptxbench/tma.cuh>
#include <ptxbench/mbarrier.cuh>
#include <ptxbench/cluster.cuh>
using namespace ptxbench;
extern "C" __global__ void __launch_bounds__(256, 1) __cluster_dims__(2, 1, 1)
headers_h(const __grid_constant__ CUtensorMap t2, const __grid_constant__ CUtensorMap t3,
          const __grid_constant__ CUtensorMap t4, const __grid_constant__ CUtensorMap t5, float* out) {
  __shared__ __align__(1024) unsigned short a[64 * 64];
  __shared__ __align__(1024) unsigned short b[256 * 64];
  __shared__ __align__(8) unsigned long long bar;
  griddep_wait();
  tma_prefetch_descriptor(&t2);
  if (threadIdx.x == 0) { mbarrier_init(&bar, 1); mbarrier_init_fence(); }
  cluster_sync();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, 5 * 4096);
    tma_load_2d(a, &t2, &bar, 0, 0);
    tma_load_3d(a, &t3, &bar, 0, 0, 0);
    tma_load_4d(a, &t4, &bar, 0, 0, 0, 0);
    tma_load_5d(a, &t5, &bar, 0, 0, 0, 0, 0);
    tma_load_1d(a, &t2, &bar, 0);
    if (cluster_ctarank() == 0) tma_load_2d_multicast(b, &t2, &bar, 3, 0, 0);
    bulk_load(b, out, 256, &bar);
    mbarrier_expect_tx(&bar, 0);
  }
  while (!mbarrier_try_wait(&bar, 0)) {}
  if (warpgroup_idx() == 0) {
    setmaxnreg_dec<40>();
    if (elect_one() && warp_idx() == 0) {
      tma_store_2d(&t2, a, 0, 0); tma_store_3d(&t3, a, 0, 0, 0); tma_store_4d(&t4, a, 0, 0, 0, 0);
      tma_store_5d(&t5, a, 0, 0, 0, 0, 0); tma_store_1d(&t2, a, 0); tma_reduce_add_2d(&t2, a, 0, 0);
      tma_store_commit(); tma_store_wait<0>();
      mbarrier_arrive(&bar);
      mbarrier_arrive_cluster(&bar, cluster_ctarank() ^ 1);
    }
  } else {
    setmaxnreg_inc<232>();
    float d64[32], d128[64], d256[128];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma_m64n64k16_bf16_ss(d64, wgmma_desc_kmajor_sw128(a + kk * 16), wgmma_desc_kmajor_sw128(b + kk * 16), kk > 0);
      wgmma_m64n128k16_bf16_ss(d128, wgmma_desc_kmajor_sw128(a + kk * 16), wgmma_desc(b + kk * 16, 16, 1024, WGMMA_SWIZZLE_128B), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    const int t = threadIdx.x % 128;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) s += d64[i];
#pragma unroll
    for (int i = 0; i < 64; ++i) s += d128[i];
    unsigned pa[4] = {pack_bf16x2(d64[0], d64[1]), pack_bf16x2(d64[2], d64[3]), pack_bf16x2(d64[4], d64[5]), pack_bf16x2(d64[6], d64[7])};
    {
      wgmma_fence();
      wgmma_m64n256k16_bf16_ss<0, 0>(d256, wgmma_desc_kmajor_sw128(a), wgmma_desc_kmajor_sw128(b), 0);
      wgmma_commit();
      wgmma_fence_operands(d256);
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) s += d256[i];
    }
    {
      float e64[32], e128[64];
      wgmma_fence();
      wgmma_m64n64k16_bf16_rs(e64, pa, wgmma_desc_kmajor_sw128(b), 0);
      wgmma_m64n128k16_bf16_rs<1>(e128, pa, wgmma_desc(b, 8192, 1024, WGMMA_SWIZZLE_128B), 0);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) s += e64[i];
#pragma unroll
      for (int i = 0; i < 64; ++i) s += e128[i];
    }
    {
      float r256[128];
      wgmma_fence();
      wgmma_m64n256k16_bf16_rs(r256, pa, wgmma_desc_kmajor_sw128(b), 0);
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) s += r256[i];
    }
    unsigned frag[4] = {pa[0], pa[1], pa[2], pa[3]}, back[4], back_t[4];
    stmatrix_x4(&b[(t % 32) * 8], frag);
    stmatrix_x4_trans(&b[2048 + (t % 32) * 8], frag);
    ldmatrix_x4(back, &b[(t % 32) * 8]);
    ldmatrix_x4_trans(back_t, &b[2048 + (t % 32) * 8]);
    fence_proxy_async_smem();
    fence_proxy_async();
    out[wgmma_acc_row(t, 0) * 64 + wgmma_acc_col(t, 0)] = s + back[0] + back_t[1];
    dsmem_st_f32(dsmem_addr(&out, cluster_ctarank() ^ 1), dsmem_ld_f32(dsmem_addr(&out, 0)) + cluster_nctarank());
  }
  cluster_arrive();
  cluster_wait();
  griddep_launch_dependents();
}
""", ["wgmma", "tma", "bulk_copy", "mbarrier", "setmaxnreg", "stmatrix", "ldmatrix", "cluster", "pdl"]),
    "sm_100a": ("""
#include <ptxbench/tcgen05.cuh>
#include <ptxbench/mbarrier.cuh>
#include <ptxbench/tma.cuh>
#include <ptxbench/cluster.cuh>
using namespace ptxbench;
extern "C" __global__ void __launch_bounds__(128, 1)
headers_b(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb, float* out) {
  __shared__ __align__(1024) unsigned short a[128 * 64], b[128 * 64];
  __shared__ __align__(8) unsigned long long bar_load, bar_mma;
  __shared__ unsigned tmem_base;
  if (warp_idx() == 0) { tcgen05_alloc(&tmem_base, 256); tcgen05_relinquish_alloc_permit(); }
  if (threadIdx.x == 0) { mbarrier_init(&bar_load, 1); mbarrier_init(&bar_mma, 1); mbarrier_init_fence(); }
  tcgen05_fence_before();
  __syncthreads();
  tcgen05_fence_after();
  const unsigned tmem = tmem_base;
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar_load, sizeof(a) + sizeof(b));
    tma_load_2d(a, &ta, &bar_load, 0, blockIdx.y * 128);
    tma_load_2d(b, &tb, &bar_load, 0, blockIdx.x * 128);
    mbarrier_wait(&bar_load, 0);
    tcgen05_fence_after();
    constexpr unsigned idesc = tcgen05_idesc_bf16_f32(128, 128);
    for (int kk = 0; kk < 4; ++kk)
      tcgen05_mma_f16_ss(tmem, tcgen05_desc_kmajor_sw128(a + kk * 16),
                         tcgen05_smem_desc(b + kk * 16, 16, 1024, TC05_SWIZZLE_128B), idesc, kk > 0);
    tcgen05_mma_f16_ts(tmem + 128, tmem, tcgen05_desc_kmajor_sw128(b), tcgen05_idesc_bf16_f32(128, 64, 0, 1), 0);
    tcgen05_mma_f8f6f4_ss(tmem + 192, tcgen05_desc_kmajor_sw128(a), tcgen05_desc_kmajor_sw128(b),
                          tcgen05_idesc_e4m3_f32(128, 64), 0);
    tcgen05_commit(&bar_mma);
  }
  __syncwarp();
  mbarrier_wait(&bar_mma, 0);
  tcgen05_fence_after();
  const unsigned lane_base = tmem_addr(tmem, (threadIdx.x / 32) * 32, 0);
  unsigned r32[32], r16[16], r8[8];
  tcgen05_ld_32x32b_x32(r32, lane_base);
  tcgen05_ld_32x32b_x16(r16, lane_base + 32);
  tcgen05_ld_32x32b_x8(r8, lane_base + 48);
  tcgen05_wait_ld();
  tcgen05_st_32x32b_x8(lane_base + 64, r8);
  tcgen05_st_32x32b_x16(lane_base + 80, r16);
  tcgen05_wait_st();
  float s = 0.f;
  for (int j = 0; j < 32; ++j) s += __uint_as_float(r32[j]);
  out[blockIdx.x * 128 + threadIdx.x] = s + __uint_as_float(r16[3]) + __uint_as_float(r8[1]);
  tcgen05_fence_before();
  __syncthreads();
  if (warp_idx() == 0) tcgen05_dealloc(tmem, 256);
}
""", ["tcgen05_mma", "tmem", "tcgen05_alloc", "tma", "mbarrier"]),
}


# The head-dim-96 and e4m3 wgmma shapes in a kernel of their own (in the big one above they
# push it past the registers wgmma's pipeline needs, C7512); the docs write these shapes out as PTX.
HEADER_SHAPE_KERNEL = """
#include <ptxbench/wgmma.cuh>
using namespace ptxbench;
extern "C" __global__ void __launch_bounds__(128) header_shapes(float* out) {
  __shared__ __align__(1024) unsigned char a[64 * 128], b[128 * 128];
  const unsigned pa[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  float n96[48], q8[64];
  wgmma_fence();
  wgmma_m64n96k16_bf16_ss(n96, wgmma_desc_kmajor_sw128(a), wgmma_desc_kmajor_sw128(b), 0);
  wgmma_m64n96k16_bf16_rs(n96, pa, wgmma_desc_kmajor_sw128(b), 1);
  wgmma_m64n128k32_e4m3_ss(q8, wgmma_desc_kmajor_sw128(a), wgmma_desc_kmajor_sw128(b), 0);
  wgmma_m64n128k32_e4m3_rs(q8, pa, wgmma_desc_kmajor_sw128(b), 1);
  wgmma_commit();
  wgmma_wait<0>();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 48; ++i) s += n96[i] + q8[i];
  out[threadIdx.x] = s;
}
"""


def test_helper_wgmma_shapes_compile():
    result, info = _compile(HEADER_SHAPE_KERNEL, "cuda", "sm_90a")
    assert result.ok, result.error
    assert not _notes(result), _notes(result)
    assert info.status == "ok" and info.feature_present("wgmma"), info.reason
    assert not info.flags["wgmma_serialized"]


@pytest.mark.parametrize("arch", sorted(HEADER_KERNELS))
def test_helper_headers_compile_and_show_features(arch):
    source, features = HEADER_KERNELS[arch]
    result, info = _compile(source, "cuda", arch)
    assert result.ok, result.error
    assert not _notes(result), _notes(result)
    assert info.status == "ok", info.reason
    missing = [f for f in features if not info.feature_present(f)]
    assert not missing, missing
    assert not info.flags["wgmma_serialized"] and not info.flags["setmaxnreg_ignored"]


def test_every_header_function_is_exercised():
    """Each helper in the headers is called by the header test kernels or a doc snippet."""
    used = "\n".join([src for src, _ in HEADER_KERNELS.values()] + [HEADER_SHAPE_KERNEL]
                     + [s.source for s in ALL_SNIPPETS])
    for path in sorted(kr.INCLUDE_DIR.glob("ptxbench/*.cuh")):
        for name in re.findall(r"PTXBENCH_DEVICE [^(]*?\b(\w+)\(", path.read_text()):
            if name in ("smem_u32",):  # used inside the other helpers
                continue
            assert re.search(rf"\b{name}\b", used), f"{path.name}: {name} is never compiled in a test"


def test_common_header_is_arch_neutral():
    result, info = _compile("""
#include <ptxbench/common.cuh>
#include <ptxbench/mbarrier.cuh>
extern "C" __global__ void k(float* out) { out[threadIdx.x] = ptxbench::warp_idx(); }
""", "cuda", "sm_100a")
    assert result.ok, result.error


# ---------------------------------------------------------------- retrieval

def _real_feedback(source: str, language: str, arch: str) -> str:
    result = compile_source(source, language, arch)
    return "\n".join(d.render() for d in result.diagnostics if d.severity == "error" or d.code)


WRONG_SHAPE = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 da, .param .u64 db)
{
  .reg .f32 %f<4>;
  .reg .b64 %rd<4>;
  .reg .pred p;
  ld.param.u64 %rd2, [da];
  ld.param.u64 %rd3, [db];
  setp.ne.u32 p, 0, 0;
  wgmma.fence.sync.aligned;
  wgmma.mma_async.sync.aligned.m64n20k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3}, %rd2, %rd3, p, 1, 1, 0, 0;
  wgmma.commit_group.sync.aligned;
  wgmma.wait_group.sync.aligned 0;
  ret;
}
"""


def test_wgmma_ptxas_error_retrieves_wgmma_section_first():
    feedback = _real_feedback(WRONG_SHAPE, "ptx", "sm_90a")
    assert "m64n20k16" in feedback  # a real ptxas error, not a made-up string
    r = retrieve("gemm bf16 C = A @ B.T", "sm_90a", ["wgmma", "tma"], feedback)
    assert r.sections[0].doc == "sm_90a/wgmma.md"
    assert "message" in r.sections[0].why or "feedback-feature" in r.sections[0].why


def test_wgmma_on_blackwell_retrieves_what_changed():
    source = next(s.source for s in ALL_SNIPPETS if s.arch == "sm_100a" and s.expect and "wgmma" in s.expect[1])
    feedback = _real_feedback(source, "cuda", "sm_100a")
    r = retrieve("gemm bf16", "sm_100a", ["tcgen05_mma", "tmem", "tma"], feedback)
    assert r.sections[0].doc == "sm_100a/tcgen05.md"
    assert "wgmma" in kr.load_docs()[[d.path for d in kr.load_docs()].index(r.sections[0].doc)].sections[
        [s.heading for d in kr.load_docs() if d.path == r.sections[0].doc for s in d.sections].index(
            r.sections[0].heading)].text


def test_ptxas_info_code_retrieves_its_mistake_section():
    c7515 = next(s for s in ALL_SNIPPETS if s.expect == ("info", "C7515"))
    feedback = _real_feedback(c7515.source, c7515.language, "sm_90a")
    r = retrieve("gemm", "sm_90a", ["wgmma"], feedback)
    assert r.sections[0].doc == "sm_90a/wgmma.md" and "C7515" in r.sections[0].why
    c7508 = next(s for s in ALL_SNIPPETS if s.expect == ("info", "C7508"))
    r = retrieve("gemm", "sm_90a", ["wgmma"], _real_feedback(c7508.source, "cuda", "sm_90a"))
    assert r.sections[0].doc == "sm_90a/warp_specialization.md"


def test_requested_features_come_first_without_feedback():
    r = retrieve("matrix multiply", "sm_100a", ["tcgen05_mma"], None, op_type="gemm")
    assert r.sections[0].doc == "sm_100a/tcgen05.md"
    assert not any("attention" in s.doc or "gdn" in s.doc for s in r.sections)  # other families' docs
    arches = {d.path: d.arches for d in kr.load_docs()}
    assert all("sm_100a" in arches[s.doc] or s.doc.startswith("common/") for s in r.sections)
    assert not any(s.doc == "sm_90a/wgmma.md" for s in r.sections)  # no wgmma on Blackwell


def test_deterministic():
    args = ("attention backward dQ dK dV", "sm_90a", ["wgmma", "tma"], "ptxas info (C7514) wgmma serialized")
    a, b = retrieve(*args), retrieve(*args)
    assert a.text == b.text and [vars(s) for s in a.sections] == [vars(s) for s in b.sections]
    kr._index.cache_clear()
    c = retrieve(*args)
    assert c.text == a.text


@pytest.mark.parametrize("budget", [0, 300, 1500, 6000, 12000])
@pytest.mark.parametrize("mode", ["docs", "docs+headers"])
def test_token_budget_respected(budget, mode):
    r = retrieve("GEMM C = A B^T with wgmma and TMA", "sm_90a", ["wgmma", "tma"], None, mode=mode, token_budget=budget)
    assert r.tokens == estimate_tokens(r.text)
    if mode == "docs" or budget == 0:
        assert r.tokens <= budget
    else:  # the header API has its own budget, so it never displaces a doc section
        assert r.parts["docs"]["tokens"] <= budget and r.parts["headers"]["tokens"] <= kr.HEADER_BUDGET
        assert r.tokens <= budget + kr.HEADER_BUDGET + 1
        docs_only = retrieve("GEMM C = A B^T with wgmma and TMA", "sm_90a", ["wgmma", "tma"], None, mode="docs",
                             token_budget=budget)
        assert [vars(s) for s in r.sections] == [vars(s) for s in docs_only.sections]
    if budget >= 1500:
        assert r.sections


def test_modes():
    args = ("attention forward", "sm_90a", ["wgmma", "tma"])
    none = retrieve(*args, mode="none")
    assert none.text == "" and none.tokens == 0 and not none.sections
    docs = retrieve(*args, mode="docs")
    assert docs.sections and "Helper headers" not in docs.text
    with_headers = retrieve(*args, mode="docs+headers")
    assert "Helper headers" in with_headers.text and "wgmma_m64n128k16_bf16_ss" in with_headers.text
    assert "tcgen05_alloc" not in with_headers.text  # the arch's own API only: no tcgen05 on Hopper
    assert "tcgen05_alloc" in retrieve("attention forward", "sm_100a", ["tcgen05_mma"], mode="docs+headers").text
    full = retrieve(*args, mode="full")
    for d in kr.docs_for("sm_90a"):
        assert f"({d.path})" in full.text
    assert "(sm_100a/" not in full.text and not full.truncated
    assert kr.header_api("sm_90a") in full.text and full.tokens > with_headers.tokens > docs.tokens
    with pytest.raises(ValueError):
        retrieve(*args, mode="everything")


def test_knowledge_imports_nothing_of_the_other_packages():
    code = ("import sys, knowledge, knowledge.retriever as r; r.retrieve('gemm', 'sm_90a', ['wgmma']); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('agent', 'tools', 'tasks')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_search_and_list():
    from typer.testing import CliRunner

    from agent import cli

    cli._register()
    runner = CliRunner()
    out = runner.invoke(cli.app, ["knowledge", "search", "wgmma descriptor swizzle", "--arch", "sm_90a", "--json",
                                  "--budget", "2000"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["tokens"] <= 2000 and data["sections"][0]["doc"].startswith("sm_90a/")
    out = runner.invoke(cli.app, ["knowledge", "list", "--json"])
    assert out.exit_code == 0 and any(r["doc"] == "sm_90a/wgmma.md" for r in json.loads(out.output))


# ---------------------------------------------------------------- no worked solutions in any arm

def _code_blocks(body: str) -> list[tuple[str, str]]:
    """Every ```cuda / ```ptx block of a doc, fragments (nocompile) included."""
    return re.findall(r"^```(cuda|ptx)\s*\n(.*?)^```", body, re.S | re.M)


def _doc_manifests(body: str) -> list[dict]:
    out = []
    for block in re.findall(r"^```json\s*\n(.*?)^```", body, re.S | re.M):
        try:
            data = json.loads(block)
        except ValueError:
            continue
        if isinstance(data, dict) and "launches" in data:
            out.append(data)
    return out


def _is_solution(source: str, language: str, manifest: dict, task, arch: str, comp, info) -> bool:
    """On CPU: the manifest plans for the task's visible workload, names kernels of the compiled
    module, and the SASS has every feature the task requests on this arch."""
    from tools.evaluator import static_check
    from tools.launch import NOMINAL_LIMITS
    from tools.solution import Solution

    if not comp.ok or info is None or info.status != "ok":
        return False
    if not all(info.feature_present(f) for f in task.features_for(arch)):
        return False
    try:
        sol = Solution(language=language, source=source, manifest=manifest)
    except Exception:  # noqa: BLE001 - a manifest that does not parse is no solution
        return False
    axes = task.axis_values(task.workloads_for("visible")[0])
    return static_check(sol, comp, task, axes, NOMINAL_LIMITS[arch]) is None


_RETRIEVABLE_WITH_CODE = [d for d in kr.load_docs() if _code_blocks(d.body)]


@pytest.mark.parametrize("doc", _RETRIEVABLE_WITH_CODE, ids=[d.path for d in _RETRIEVABLE_WITH_CODE])
def test_no_doc_is_a_solution(doc):
    """No retrievable doc holds a kernel + manifest that solves a benchmark task (issue 25): every
    code block of the doc, fragments included, is compiled for each arch of the doc and tried with
    every manifest of the doc and every task's own example manifest from its statement."""
    from tasks import list_tasks
    from tasks.describe import example_manifest

    tasks = list_tasks()
    arches = [a for a in doc.arches if a in ("sm_90a", "sm_100a")] or ["sm_90a", "sm_100a"]
    doc_manifests = _doc_manifests(doc.body)
    assert not doc_manifests or all("launches" not in m for m in doc_manifests), \
        f"{doc.path} holds a launch manifest: docs teach fragments; worked examples live in knowledge/examples/"
    for language, source in _code_blocks(doc.body):
        for arch in arches:
            comp, info = _compile(source, language, arch)
            for task in tasks:
                for manifest in doc_manifests + [example_manifest(task, arch)]:
                    assert not _is_solution(source, language, manifest, task, arch, comp, info), \
                        f"{doc.path}: a code block solves {task.name} on {arch}"


def test_the_solution_check_catches_a_worked_example():
    """The check above has teeth: the worked GEMM example (kept out of every arm) is a solution."""
    from tasks import get_task

    example = next(d for d in kr.load_examples() if "gemm" in d.path)
    [(language, source)] = [b for b in _code_blocks(example.body) if "gemm_tn" in b[1]]
    [manifest] = _doc_manifests(example.body)
    comp, info = _compile(source, language, "sm_90a")
    assert _is_solution(source, language, manifest, get_task("gemm"), "sm_90a", comp, info)
