"""compile_source with the real NVRTC and ptxas: diagnostics mapped to the user's lines,
resources from ptxas -v, clean failures for bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.compile import compile_solution, compile_source, parse_nvrtc_log, parse_ptxas_output
from tools.solution import LaunchManifest, Solution

CORPUS = Path(__file__).parent / "corpus"

BROKEN_INLINE_PTX = """\
#include <cuda_bf16.h>
extern "C" __global__ void broken(float* out) {
  float x = out[threadIdx.x];
  // the next line is fine C++, but its inline PTX names a register that does not exist
  asm volatile("add.f32 %0, %0, %%bogus;" : "+f"(x));
  out[threadIdx.x] = x;
}
"""


def test_ptxas_error_maps_to_the_users_line():
    r = compile_source(BROKEN_INLINE_PTX, "cuda", "sm_90a")
    assert r.status == "failed" and r.cubin is None and r.ptx  # the PTX is kept for feedback
    errors = r.errors()
    assert errors and all(e.tool == "ptxas" for e in errors)
    bogus = next(e for e in errors if "bogus" in e.message)
    assert bogus.line == 5  # the asm statement in the user's file
    assert bogus.ptx_line and "bogus" in r.ptx.splitlines()[bogus.ptx_line - 1]
    assert r.error.startswith("ptxas: line 5:")
    assert "\n" not in r.error


def test_nvrtc_error_and_warning_lines():
    src = 'extern "C" __global__ void k(float* p) {\n  int unused = 3;\n  p[0] = undefined_name;\n}\n'
    r = compile_source(src, "cuda", "sm_90a")
    assert r.status == "failed" and "nvrtc" in r.error and "undefined_name" in r.error
    (err,) = r.errors()
    assert (err.tool, err.line) == ("nvrtc", 3)
    warn = next(d for d in r.diagnostics if d.severity == "warning")
    assert warn.line == 2 and warn.code == "177-D"
    assert "p[0] = undefined_name" in err.message  # the echoed source line is folded in, not a separate diagnostic


def test_raw_ptx_error_line_is_the_ptx_line():
    ptx = (CORPUS / "sm_90a" / "setmaxnreg_pos.ptx").read_text().replace("mov.u32 \t%r1, %tid.x;", "mov.u32 \t%r1, %tid.q;")
    r = compile_source(ptx, "ptx", "sm_90a")
    assert r.status == "failed"
    (line,) = {e.line for e in r.errors() if e.line}
    assert "%tid.q" in ptx.splitlines()[line - 1]


def test_resources_seconds_and_toolchain():
    r = compile_source((CORPUS / "common" / "tma_pos.cu").read_text(), "cuda", "sm_90a")
    assert r.ok and r.cubin and r.cubin[:4] == b"\x7fELF"
    k = r.kernels["tma_pos"]
    assert k.registers and k.shared_bytes >= 4096 and k.spill_stores == 0 and k.stack_frame == 0
    assert set(r.seconds) == {"nvrtc", "ptxas"} and all(0 < s < 60 for s in r.seconds.values())
    assert r.toolchain["ptxas"] and r.toolchain["nvrtc"]
    assert ".target sm_90a" in r.ptx


def test_ptxas_info_lines_keep_their_codes():
    r = compile_source((CORPUS / "sm_90a" / "wgmma_serialized.cu").read_text(), "cuda", "sm_90a")
    assert r.ok
    serial = [d for d in r.diagnostics if "wgmma.mma_async instructions are serialized" in d.message]
    assert serial and all(d.severity == "info" and d.code and d.code.startswith("C75") for d in serial)
    assert serial[0].kernel == "wgmma_serialized"


def test_spills_and_stack_are_parsed():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'big' for 'sm_90a'
ptxas info    : Function properties for big
    40 bytes stack frame, 36 bytes spill stores, 32 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0], 8 bytes cmem[2]
ptxas kernel.ptx, line 7; warning : some warning
"""
    diags, kernels = parse_ptxas_output(text, line_map=None)
    big = kernels["big"]
    assert (big.registers, big.shared_bytes, big.stack_frame, big.spill_stores, big.spill_loads, big.constant_bytes) == \
        (255, 2048, 40, 36, 32, 408)
    assert len(diags) == 6 and diags[-1].severity == "warning" and diags[-1].line == 7


def test_mangled_kernels_are_resolved():
    src = "__global__ void plain(float* p) { p[0] = 1; }\nnamespace ns { __global__ void inner(float* p) { p[0] = 2; } }\n"
    r = compile_source(src, "cuda", "sm_90a")
    assert r.ok and r.symbols["plain"] == "_Z5plainPf" and r.symbols["inner"] == "_ZN2ns5innerEPf"
    assert set(r.kernels) == {"_Z5plainPf", "_ZN2ns5innerEPf"}


def test_nvcc_style_includes_work_under_nvrtc():
    src = ("#include <stdint.h>\n#include <cuda.h>\n#include <cuda_bf16.h>\n"
           'extern "C" __global__ void k(const __grid_constant__ CUtensorMap m, __nv_bfloat16* p, uint64_t n) {\n'
           "  static_assert(sizeof(CUtensorMap) == 128 && alignof(CUtensorMap) == 64, \"driver layout\");\n"
           "  p[threadIdx.x] = __float2bfloat16((float)n);\n}\n")
    r = compile_source(src, "cuda", "sm_100a")
    assert r.ok, r.error


@pytest.mark.parametrize("source,language,arch,needle", [
    ("", "cuda", "sm_90a", "empty"),
    ("   \n", "ptx", "sm_90a", "empty"),
    ('extern "C" __global__ void k() {}', "cuda", "sm_80", "unknown arch 'sm_80'"),
    ('extern "C" __global__ void k() {}', "fortran", "sm_90a", "unknown language"),
    (".version 8.0\n.target sm_90a // caf\u00e9\n", "ptx", "sm_90a", "line 2 has non-ASCII"),
])
def test_bad_input_fails_with_one_line(source, language, arch, needle):
    r = compile_source(source, language, arch)
    assert r.status == "failed" and needle in r.error and "\n" not in r.error


def test_ptx_for_another_target_fails_cleanly():
    r = compile_source((CORPUS / "sm_100a" / "tcgen05_alloc_pos.ptx").read_text(), "ptx", "sm_90a")
    assert r.status == "failed" and r.errors() and "\n" not in r.error


def test_compile_solution():
    sol = Solution(language="cuda", source=(CORPUS / "common" / "pdl_pos.cu").read_text(),
                   manifest=LaunchManifest(launches=[{"kernel": "pdl_pos", "grid": [1], "block": [32]}]))
    r = compile_solution(sol, "sm_100a")
    assert r.ok and r.arch == "sm_100a" and "pdl_pos" in r.kernels


def test_nvrtc_log_parser_keeps_every_line():
    log = ('kernel.cu(3): error: identifier "x" is undefined\n  p[0] = x;\n         ^\n\n'
           'other.h(9): warning #550-D: set but never used\n\n1 error detected in the compilation of "kernel.cu".\n')
    d = parse_nvrtc_log(log)
    assert [(x.severity, x.line) for x in d] == [("error", 3), ("warning", None), ("info", None)]
    assert d[1].message.startswith("other.h(9): ")


def test_errors_inside_a_header_map_to_the_calling_line(tmp_path):
    (tmp_path / "helpers.cuh").write_text(
        "#pragma once\n"
        "__device__ __forceinline__ void bad_add(float& x) { asm volatile(\"add.f32 %0, %0, %%nope;\" : \"+f\"(x)); }\n"
        "template <int N> __device__ void checked() { static_assert(N % 8 == 0, \"N must be a multiple of 8\"); }\n")
    src = '#include "helpers.cuh"\nextern "C" __global__ void k(float* p) {\n  float x = p[0];\n  bad_add(x);\n  p[1] = x;\n}\n'
    r = compile_source(src, "cuda", "sm_90a", include_dirs=[str(tmp_path)])
    assert r.status == "failed" and any(e.line == 4 and "nope" in e.message for e in r.errors())  # via inlined_at
    r = compile_source(src.replace("bad_add(x);", "checked<7>();"), "cuda", "sm_90a", include_dirs=[str(tmp_path)])
    (err,) = r.errors()
    assert err.tool == "nvrtc" and err.line == 4 and "multiple of 8" in err.message
