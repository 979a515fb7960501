"""Feature verdicts and flags on the corpus, with the real ptxas and cuobjdump."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.compile import compile_source
from tools.features import (FEATURES, SENSING_FLAGS, executed_opcodes, features_for, module_globals, ptx_features,
                            sensing)
from tools.results import CompileResult
from tools.sass import inspect, parse_sass
from tools.toolchain import ARCHES

CORPUS = Path(__file__).parent / "corpus"


def _header(path: Path, key: str) -> set[str] | None:
    m = re.search(rf"^// {key}:(.*)$", path.read_text(), re.M)
    return set(m[1].split()) if m else None


def corpus(arch: str) -> list[Path]:
    return sorted([*(CORPUS / "common").glob("*.cu"), *(CORPUS / arch).glob("*.cu"), *(CORPUS / arch).glob("*.ptx")])


CASES = [pytest.param(arch, p, id=f"{arch}/{p.name}") for arch in ARCHES for p in corpus(arch)]


def _inspect(path: Path, arch: str):
    language = "ptx" if path.suffix == ".ptx" else "cuda"
    result = compile_source(path.read_text(), language, arch)
    assert result.ok, result.error
    return result, inspect(result)


@pytest.mark.parametrize("arch,path", CASES)
def test_corpus_features_and_flags(arch, path):
    expected = _header(path, "features")
    assert expected is not None, f"{path} has no '// features:' line"
    result, info = _inspect(path, arch)
    assert info.status == "ok", info.reason
    present = {name for name, v in info.features.items() if v.present}
    assert present == expected, f"present {sorted(present)}, expected {sorted(expected)}"
    assert set(info.features) == set(features_for(arch))
    raised = {k for k, v in info.flags.items() if v}
    assert raised == (_header(path, "flags") or set()), info.flag_evidence
    for flag in raised:
        assert info.flag_evidence[flag]
    # the PTX asked for at least what the SASS shows (a feature cannot appear from nowhere)
    assert present <= ptx_features(result.ptx, arch)


@pytest.mark.parametrize("arch", ARCHES)
def test_every_feature_has_positive_and_negative_controls(arch):
    for feature in features_for(arch):
        files = corpus(arch)
        assert any(feature in (_header(p, "features") or ()) for p in files), f"no positive for {feature}"
        assert any(feature in (_header(p, "negative control for") or ()) for p in files), f"no negative for {feature}"


def test_wgmma_does_not_exist_on_sm_100a():
    result = compile_source((CORPUS / "sm_90a" / "wgmma_pos.cu").read_text(), "cuda", "sm_100a")
    assert result.status == "failed"
    assert "not supported on .target 'sm_100a'" in result.error
    assert "wgmma" not in features_for("sm_100a")
    assert inspect(result).status == "skipped"


def test_serialized_wgmma_evidence_names_ptxas_and_sass():
    _, info = _inspect(CORPUS / "sm_90a" / "wgmma_serialized.cu", "sm_90a")
    evidence = info.flag_evidence["wgmma_serialized"]
    assert "wgmma.mma_async instructions are serialized" in evidence
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x0" in evidence
    _, info = _inspect(CORPUS / "sm_90a" / "wgmma_waited_each.cu", "sm_90a")
    assert "ptxas" not in info.flag_evidence["wgmma_serialized"]  # raised from the SASS alone


def test_setmaxnreg_ignored_is_reported_by_ptxas_as_info():
    result, info = _inspect(CORPUS / "common" / "setmaxnreg_ignored.cu", "sm_90a")
    (c7508,) = [d for d in result.diagnostics if d.code == "C7508"]
    assert c7508.severity == "info" and c7508.tool == "ptxas" and "setmaxnreg" in c7508.message
    assert "C7508" in info.flag_evidence["setmaxnreg_ignored"]
    assert "setmaxnreg_ignored: the PTX has setmaxnreg but the SASS has no USETMAXREG" in info.flag_evidence["setmaxnreg_ignored"]


def test_opcodes_are_parsed_exactly():
    sass = """
        Function : k
        /*0040*/              @!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;  /* 0x0 */
        /*0050*/                   HFMA2.MMA R3, -RZ, RZ, 0, 0 ;                          /* 0x0 */
        /*0060*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;                  /* 0x0 */
        /*0070*/              @UP0 UTMALDG.2D [UR8], [UR4] ;                              /* 0x0 */
    """
    (insns,) = parse_sass(sass).values()
    assert [(i.predicate, i.opcode) for i in insns] == [("@!P0", "HGMMA"), (None, "HFMA2"), (None, "HMMA"), ("@UP0", "UTMALDG")]
    assert insns[0].modifiers == ("64x128x16", "F32", "BF16") and insns[0].full_opcode == "HGMMA.64x128x16.F32.BF16"
    # HFMA2.MMA is not an MMA and HMMA is not a wgmma: verdicts compare base opcodes
    assert "HFMA2" not in FEATURES["mma_sync"].sass_opcodes and "HMMA" not in FEATURES["wgmma"].sass_opcodes


def test_kernel_resources_and_opcode_counts():
    result, info = _inspect(CORPUS / "common" / "tma_pos.cu", "sm_90a")
    k = info.kernels["tma_pos"]
    assert k.registers == result.kernels["tma_pos"].registers > 0
    assert k.shared_bytes >= 32 * 32 * 4
    assert k.opcodes["UTMALDG"] == 1 and k.opcodes["UTMASTG"] == 1 and k.instructions >= sum(k.opcodes.values()) > 0
    assert info.features["tma"].opcodes == {"UTMALDG": 1, "UTMASTG": 1}
    assert info.tool.startswith(("cuobjdump", "nvdisasm"))


def test_executed_opcodes():
    assert executed_opcodes("wgmma") == {"HGMMA", "QGMMA", "IGMMA", "BGMMA"}
    assert executed_opcodes("tma") >= {"UTMALDG"}
    assert all(executed_opcodes(f) for f in FEATURES)
    with pytest.raises(KeyError):
        executed_opcodes("warp_magic")


def test_inspect_skips_without_a_cubin():
    failed = CompileResult(status="failed", arch="sm_90a", language="cuda", error="x")
    info = inspect(failed)
    assert info.status == "skipped" and info.reason


def test_inspect_skips_without_a_disassembler(monkeypatch, tmp_path):
    from tools import toolchain

    result = compile_source((CORPUS / "common" / "pdl_pos.cu").read_text(), "cuda", "sm_90a")
    toolchain.find_toolchain.cache_clear()
    monkeypatch.setenv("PTXBENCH_CUOBJDUMP", str(tmp_path / "nope"))
    monkeypatch.setenv("PTXBENCH_NVDISASM", str(tmp_path / "nope"))
    try:
        info = inspect(result)
    finally:
        toolchain.find_toolchain.cache_clear()
    assert info.status == "skipped" and "PTXBENCH_CUOBJDUMP" in info.reason


ADVERSARIAL = Path(__file__).resolve().parent / "fixtures" / "adversarial"
# One folder per distinct expert: the GEMM tasks' experts are copies of one (tests/test_gemm_experts.py).
_FOLDERS = sorted(p for p in (Path(__file__).resolve().parents[1] / "tasks").glob("*/expert") if (p / "launch.json").exists())
EXPERTS = sorted({(p / "kernel.cu").read_text(): p for p in reversed(_FOLDERS)}.values())  # the first of equals


@pytest.mark.parametrize("folder", [*EXPERTS, ADVERSARIAL / "good"], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_kernels_raise_no_sensing_flag(folder):
    """The audit flags (clock, launch id, perf counters, state across launches) stay quiet on
    honest kernels: the expert kernels and the control (simple solutions:
    tests/test_simple_solutions.py)."""
    from tools.compile import compile_solution
    from tools.solution import Solution

    r = compile_solution(Solution.from_dir(folder), "sm_90a")
    assert r.ok, r.error
    info = inspect(r)
    assert not any(info.flags[f] for f in SENSING_FLAGS), info.flag_evidence


def test_sensing_flags_name_what_a_kernel_could_tell_its_runs_apart_by():
    """A launch counter in a `__device__` variable (the adversarial fixtures that skip work on
    the runs they guess are timed), the clock, %gridid and the performance counters, in CUDA
    and in hand-written PTX, comments and instruction spellings (`st.global`) not counted."""
    from tools.compile import compile_solution
    from tools.solution import Solution

    counter = compile_solution(Solution.from_dir(ADVERSARIAL / "lazy_launch_counter"), "sm_90a")
    info = inspect(counter)
    assert info.flags["module_state"] and "launches" in info.flag_evidence["module_state"]
    src = ('extern "C" __global__ void k(long long* p) { unsigned g, c;\n'
           '  asm volatile("mov.u32 %0, %%gridid;" : "=r"(g)); asm volatile("mov.u32 %0, %%pm0;" : "=r"(c));\n'
           '  p[0] = clock64() + g + c; }\n')
    found = sensing(compile_source(src, "cuda", "sm_90a").ptx)
    assert set(found) == {"reads_clock", "reads_launch_id", "reads_perf_counters"}, found
    ptx = (".version 8.0\n.target sm_90a\n.address_size 64\n// .global .u32 in_a_comment;\n"
           "/* %globaltimer */\n.visible .global .align 4 .u32 seen;\n"
           ".visible .entry k(.param .u64 .ptr .global .align 16 p)\n{\n .global .u32 inside;\n"
           " .reg .b64 %rd<3>;\n ld.param.u64 %rd1, [p];\n st.global.u64 [%rd1], %rd1;\n ret;\n}\n")
    assert module_globals(ptx) == ["seen", "inside"]
    assert set(sensing(ptx)) == {"module_state"}
