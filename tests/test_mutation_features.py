"""The feature and SASS verdicts (tools/features.py, tools/sass.py) on the corpus, fast enough
to run once per mutant (scripts/mutation.sh).

tests/test_features.py compiles and disassembles every corpus kernel in every test: right for
the suite, 30 s a mutant for mutation testing. Here each corpus kernel is compiled by the real
NVRTC + ptxas and disassembled by the real cuobjdump and nvdisasm once per source and toolchain
(kept under $PTXBENCH_TEST_BUILDS, default <tmp>/ptxbench-test-builds, keyed by the source, the
tool versions and tools/compile.py), and each test runs the verdict code on those real outputs.
The builds call the tools directly, never tools/sass.py, so a mutant of it cannot get into them.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from tools import features as F
from tools import sass
from tools.compile import compile_source
from tools.results import CompileResult, Diagnostic, KernelResources
from tools.toolchain import ARCHES, ToolchainError, find_toolchain

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"


def _header(path: Path, key: str) -> set[str] | None:
    m = re.search(rf"^// {key}:(.*)$", path.read_text(), re.M)
    return set(m[1].split()) if m else None


def corpus(arch: str) -> list[Path]:
    return sorted([*(CORPUS / "common").glob("*.cu"), *(CORPUS / arch).glob("*.cu"), *(CORPUS / arch).glob("*.ptx")])


def _disassemble(tool: str, args: list[str], cubin: bytes) -> str:
    with tempfile.TemporaryDirectory(prefix="ptxbench-test-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([tool, *args, str(path)], capture_output=True, text=True, check=True).stdout


def build(source: str, language: str, arch: str) -> dict:
    """{"result": CompileResult (with its cubin), "cuobjdump": text, "nvdisasm": text}, from the
    real tools, cached on disk."""
    tc = find_toolchain()
    if not (tc.ptxas.path and tc.cuobjdump.path and tc.nvdisasm.path):
        pytest.skip("needs ptxas, cuobjdump and nvdisasm")
    key = hashlib.sha256(json.dumps([source, language, arch, tc.ptxas.version, tc.nvrtc.version, tc.cuobjdump.version,
                                     (ROOT / "tools" / "compile.py").read_text()]).encode()).hexdigest()[:24]
    cache = Path(os.environ.get("PTXBENCH_TEST_BUILDS") or Path(tempfile.gettempdir()) / "ptxbench-test-builds")
    path = cache / f"{key}.json"
    if path.exists():
        data = json.loads(path.read_text())
    else:
        result = compile_source(source, language, arch)
        assert result.ok, result.error
        data = {"result": result.model_dump(mode="json"), "cubin": base64.b64encode(result.cubin).decode(),
                "cuobjdump": _disassemble(tc.cuobjdump.path, ["-sass"], result.cubin),
                "nvdisasm": _disassemble(tc.nvdisasm.path, ["-c"], result.cubin)}
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    result = CompileResult.model_validate(data["result"])
    result.cubin = base64.b64decode(data["cubin"])
    return {"result": result, "cuobjdump": data["cuobjdump"], "nvdisasm": data["nvdisasm"],
            "tool": f"cuobjdump {tc.cuobjdump.version}"}


def build_file(path: Path, arch: str) -> dict:
    return build(path.read_text(), "ptx" if path.suffix == ".ptx" else "cuda", arch)


@pytest.fixture
def inspect_built(monkeypatch):
    """tools.sass.inspect, with the disassembly the real cuobjdump gave for that cubin."""
    texts: dict[bytes, tuple[str, str]] = {}

    def disassemble(cubin: bytes) -> tuple[str, str]:
        return texts[cubin]

    monkeypatch.setattr(sass, "disassemble", disassemble)

    def run(b: dict, kernels=None):
        texts[b["result"].cubin] = (b["cuobjdump"], b["tool"])
        return sass.inspect(b["result"], kernels)

    return run


@pytest.mark.parametrize("arch,path", [pytest.param(a, p, id=f"{a}/{p.name}") for a in ARCHES for p in corpus(a)])
def test_corpus_verdicts(arch, path, inspect_built):
    b = build_file(path, arch)
    info = inspect_built(b)
    assert info.status == "ok" and info.tool == b["tool"]
    present = {name for name, v in info.features.items() if v.present}
    assert present == _header(path, "features")
    assert list(info.features) == F.features_for(arch)
    for name, verdict in info.features.items():  # the proving opcodes, counted over the kernels
        want = {op: sum(k.opcodes.get(op, 0) for k in info.kernels.values())
                for op in sorted(F.FEATURES[name].sass_opcodes)}
        assert verdict.opcodes == {op: n for op, n in want.items() if n}
    for name, k in info.kernels.items():  # ptxas's resources joined to the SASS counts
        assert k.registers == b["result"].kernels[name].registers is not None
        assert k.shared_bytes == b["result"].kernels[name].shared_bytes
    raised = {k for k, v in info.flags.items() if v}
    assert raised == (_header(path, "flags") or set()), info.flag_evidence
    assert set(info.flag_evidence) == raised
    assert set(info.flags) == {"wgmma_serialized", "setmaxnreg_ignored", *F.SENSING_FLAGS}
    assert present <= F.ptx_features(b["result"].ptx, arch)
    # both disassemblers read the same program
    ours = {k: [(i.offset, i.full_opcode, i.target) for i in v] for k, v in sass.parse_sass(b["cuobjdump"]).items()}
    theirs = {k: [(i.offset, i.full_opcode, i.target) for i in v] for k, v in sass.parse_sass(b["nvdisasm"]).items()}
    assert ours == theirs and ours


def test_disassemble_runs_cuobjdump_then_nvdisasm_then_says_why_not(monkeypatch, tmp_path):
    from tools import toolchain

    b = build_file(CORPUS / "common" / "pdl_pos.cu", "sm_90a")
    assert sass.disassemble(b["result"].cubin) == (b["cuobjdump"], b["tool"])
    toolchain.find_toolchain.cache_clear()
    try:
        monkeypatch.setenv("PTXBENCH_CUOBJDUMP", str(tmp_path / "none"))
        text, tool = sass.disassemble(b["result"].cubin)
        assert (text, tool) == (b["nvdisasm"], f"nvdisasm {find_toolchain().nvdisasm.version}")
        with pytest.raises(ToolchainError, match="SASS disassembly failed: nvdisasm: .*"):
            sass.disassemble(b"not a cubin")
        toolchain.find_toolchain.cache_clear()
        monkeypatch.setenv("PTXBENCH_NVDISASM", str(tmp_path / "none"))
        with pytest.raises(ToolchainError, match=r"^no SASS disassembler: cuobjdump .*PTXBENCH_CUOBJDUMP.*; "
                                                 r"nvdisasm .*PTXBENCH_NVDISASM"):
            sass.disassemble(b["result"].cubin)
    finally:
        toolchain.find_toolchain.cache_clear()


def test_a_failing_disassembler_is_named_with_its_first_line(monkeypatch, tmp_path):
    from tools import toolchain

    cuobjdump = tmp_path / "cuobjdump"
    cuobjdump.write_text("#!/bin/sh\necho 'first line' >&2\necho second >&2\nexit 3\n")
    cuobjdump.chmod(0o755)
    empty = tmp_path / "nvdisasm"
    empty.write_text("#!/bin/sh\nexit 0\n")  # succeeds and prints nothing: no disassembly either
    empty.chmod(0o755)
    toolchain.find_toolchain.cache_clear()
    monkeypatch.setenv("PTXBENCH_CUOBJDUMP", str(cuobjdump))
    monkeypatch.setenv("PTXBENCH_NVDISASM", str(empty))
    try:
        with pytest.raises(ToolchainError) as e:
            sass.disassemble(b"\x7fELF")
    finally:
        toolchain.find_toolchain.cache_clear()
    assert str(e.value) == "SASS disassembly failed: cuobjdump: ['first line']; nvdisasm: []"


def test_branch_targets_and_padding():
    """A loop's back edge resolves to its target in both spellings (cuobjdump's hex offset,
    nvdisasm's label), and the padding after EXIT (the branch-to-self and the NOPs) is dropped."""
    b = build_file(CORPUS / "sm_90a" / "wgmma_serialized.cu", "sm_90a")
    for text in (b["cuobjdump"], b["nvdisasm"]):
        (insns,) = sass.parse_sass(text).values()
        assert insns[-1].opcode != "NOP" and not (insns[-1].opcode == "BRA" and insns[-1].target == insns[-1].offset)
        assert "NOP" in text and insns[-1].opcode in ("EXIT", "BRA")
        back = [i for i in insns if i.opcode == "BRA" and i.target is not None and i.target <= i.offset]
        assert back, "the k-loop's back edge"
        offsets = [i.offset for i in insns]
        assert offsets == sorted(offsets) and all(i.target in offsets for i in back)
    lines = ["        Function : k",
             "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
             "        /*0010*/              @!UPT BRA 0x0 ;",
             "        /*0020*/                   EXIT ;",
             "        /*0030*/                   BRA 0x30;",
             "        /*0040*/                   NOP;",
             "        /*0050*/                   NOP;"]
    (insns,) = sass.parse_sass("\n".join(lines)).values()
    assert [(i.offset, i.predicate, i.opcode, i.target) for i in insns] == [
        (0, None, "MOV", None), (0x10, "@!UPT", "BRA", 0), (0x20, None, "EXIT", None)]
    assert insns[0].operands == "R1, c[0x0][0x28]"
    # a kernel of padding only is empty; a branch to itself inside the code stays
    assert sass.parse_sass("Function : z\n /*0000*/ NOP ;\n /*0010*/ NOP ;\n") == {"z": []}
    (insns,) = sass.parse_sass("Function : w\n /*0000*/ BRA 0x0 ;\n /*0010*/ EXIT ;\n").values()
    assert [(i.opcode, i.target) for i in insns] == [("BRA", 0), ("EXIT", None)]


def test_nvdisasm_labels_and_braces():
    text = "\n".join(["\t.text.k:", ".L_x_0:", ".L_x_1:", "        /*0000*/ { IADD3 R0, R0, 0x1, RZ ;",
                      "        /*0010*/   @P0 BRA `(.L_x_1) ;", "        /*0020*/   BRA `(.L_x_9) ;",
                      ".L_x_2:", "        /*0030*/   EXIT ;", "  \t.text.j:", " /*0000*/ @!P1 EXIT ;"])
    programs = sass.parse_sass(text)
    assert list(programs) == ["k", "j"]
    k = programs["k"]
    assert [(i.offset, i.opcode, i.predicate, i.target) for i in k] == [
        (0, "IADD3", None, None), (0x10, "BRA", "@P0", 0), (0x20, "BRA", None, None), (0x30, "EXIT", None, None)]
    assert [(i.opcode, i.predicate) for i in programs["j"]] == [("EXIT", "@!P1")]
    # instructions before any function header belong to no kernel; a kernel header twice is one kernel
    text = " /*0000*/ EXIT ;\nFunction : a\n /*0000*/ MOV R0, R1 ;\nFunction : a\n /*0010*/ EXIT ;\n"
    assert {k: [i.opcode for i in v] for k, v in sass.parse_sass(text).items()} == {"a": ["MOV", "EXIT"]}


def test_opcode_counts_and_resources():
    b = build_file(CORPUS / "common" / "tma_pos.cu", "sm_90a")
    (insns,) = sass.parse_sass(b["cuobjdump"]).values()
    k = sass.kernel_sass(insns, b["result"].kernels["tma_pos"])
    assert k.instructions == len(insns) == sum(k.opcodes.values())
    assert list(k.opcodes) == sorted(k.opcodes) and k.opcodes["UTMALDG"] == 1
    assert k.registers == b["result"].kernels["tma_pos"].registers > 0
    bare = sass.kernel_sass(insns)
    assert bare.opcodes == k.opcodes and bare.registers == KernelResources().registers
    # the TMA-pipe sites (pc offset -> full opcode): what the exact counts count one by one
    # (tools.credit.exact_count_sites); the real kernel's one tensor-map load is among them
    assert k.tma_sites == {i.offset: i.full_opcode for i in insns if i.opcode.startswith(("UTMA", "UBLK"))}
    assert list(k.tma_sites.values()).count(next(i.full_opcode for i in insns if i.opcode == "UTMALDG")) >= 1


def test_tma_sites_are_every_tma_pipe_instruction_and_nothing_else():
    """Tensor-map loads and stores (UTMA*), plain bulk copies (UBLK*: the loads no hardware counter
    tells apart from tensor-map ones) and their control instructions, each at its pc offset with its
    modifiers; no other instruction (a uniform move, a warpgroup MMA) is a site."""
    insns = [_insn(0x10, "UTMALDG", modifiers=("2D",)), _insn(0x20, "UBLKCP", modifiers=("S", "G")),
             _insn(0x30, "UTMACMDFLUSH"), _insn(0x40, "UMOV"), _insn(0x50, "HGMMA", modifiers=("64x128x16",)),
             _insn(0x60, "UBLKPF", modifiers=("L2",)), _insn(0x70, "LDG", modifiers=("E",))]
    assert sass.kernel_sass(insns).tma_sites == {0x10: "UTMALDG.2D", 0x20: "UBLKCP.S.G", 0x30: "UTMACMDFLUSH",
                                                 0x60: "UBLKPF.L2"}
    assert sass.kernel_sass(insns[3:5]).tma_sites == {}


def test_inspect_counts_only_the_launched_kernels(inspect_built):
    """Two kernels, one with mma.sync: naming the other as launched counts no mma_sync."""
    src = ((CORPUS / "common" / "mma_sync_pos.cu").read_text() + "\n" +
           'extern "C" __global__ void plain(float* p) { p[threadIdx.x] += 1.0f; }\n')
    b = build(src, "cuda", "sm_90a")
    every = inspect_built(b)
    assert every.features["mma_sync"].present and every.uncounted_kernels == []
    mma = next(k for k in every.kernels if k != "plain")
    only_plain = inspect_built(b, ["plain"])
    assert not only_plain.features["mma_sync"].present and only_plain.features["mma_sync"].opcodes == {}
    assert only_plain.uncounted_kernels == [mma] and set(only_plain.kernels) == {mma, "plain"}
    both = inspect_built(b, ["plain", mma])
    assert both.features["mma_sync"] == every.features["mma_sync"] and both.uncounted_kernels == []
    # the same opcode in two launched kernels: counted over both
    twice = build(src.replace("plain(float* p) { p[threadIdx.x] += 1.0f; }", "plain(float* p) { p[0] = 1; }")
                  + (CORPUS / "common" / "mma_sync_pos.cu").read_text().split("\n", 3)[3].replace(
                      "mma_sync_pos", "mma_again").replace("#include", "// #include"), "cuda", "sm_90a")
    both = inspect_built(twice)
    hmma = both.kernels["mma_sync_pos"].opcodes["HMMA"]
    assert both.kernels["mma_again"].opcodes["HMMA"] == hmma
    assert both.features["mma_sync"].opcodes == {"HMMA": 2 * hmma}
    nothing = inspect_built(b, ["not_there"])
    assert not any(v.present for v in nothing.features.values()) and nothing.uncounted_kernels == sorted(every.kernels)


def test_inspect_without_functions_fails_and_without_a_cubin_skips(monkeypatch):
    b = build_file(CORPUS / "common" / "pdl_pos.cu", "sm_90a")
    monkeypatch.setattr(sass, "disassemble", lambda cubin: ("no functions here\n", "cuobjdump 13.2.86"))
    info = sass.inspect(b["result"])
    assert (info.status, info.reason, info.tool) == ("failed", "cuobjdump 13.2.86 printed no functions",
                                                     "cuobjdump 13.2.86")
    no_cubin = b["result"].model_copy(update={"cubin": None})
    assert sass.inspect(no_cubin).model_dump(exclude_defaults=True) == {
        "status": "skipped", "arch": "sm_90a", "reason": "did not compile"}
    failed = CompileResult(status="failed", arch="sm_100a", language="cuda", error="x")
    assert (sass.inspect(failed).status, sass.inspect(failed).arch) == ("skipped", "sm_100a")

    def missing(cubin):
        raise ToolchainError("no SASS disassembler: here")

    monkeypatch.setattr(sass, "disassemble", missing)
    info = sass.inspect(b["result"])
    assert (info.status, info.reason, info.infra_error, info.arch) == (
        "skipped", "no SASS disassembler: here", "no SASS disassembler: here", "sm_90a")


# --- features.py's own functions --------------------------------------------------------------

def test_features_by_arch_and_executed_opcodes():
    assert F.features_for("sm_90a") == [n for n in F.FEATURES if "sm_90a" in F.FEATURES[n].arches]
    assert "wgmma" in F.features_for("sm_90a") and "wgmma" not in F.features_for("sm_100a")
    assert "tcgen05_mma" in F.features_for("sm_100a") and F.features_for("sm_80") == []
    assert F.executed_opcodes("tma") == {"UTMALDG", "UTMASTG", "UTMAREDG"}
    with pytest.raises(KeyError) as e:
        F.executed_opcodes("warp_magic")
    assert e.value.args[0] == f"unknown feature 'warp_magic' (known: {', '.join(F.FEATURES)})"
    assert F.executed_opcodes("pdl") is not F.FEATURES["pdl"].sass_opcodes  # a copy the caller may change


def test_comments_ask_for_nothing():
    ptx = ("// wgmma.mma_async.sync is only a comment\n/* cp.async.bulk.tensor.2d\n mbarrier.init */\n"
           "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1}, [%r2]; // setmaxnreg.inc\n"
           "/* one */ stmatrix.sync.aligned.m8n8.x4.shared.b16 [%r2], {%r1}; /* two */ griddepcontrol.wait;\n")
    assert F.ptx_features(ptx) == {"ldmatrix", "stmatrix", "pdl"}
    assert F.ptx_features(ptx, "sm_100a") == {"ldmatrix", "stmatrix", "pdl"}
    assert F._code_lines("a // b\nc /* d\ne */ f") == "a \nc   f"
    assert F.ptx_features("wgmma.mma_async.sync.aligned;", "sm_100a") == set()
    assert F.ptx_features("wgmma.mma_async.sync.aligned;", "sm_90a") == {"wgmma"}


def test_ptx_entries_end_at_the_next_entry_or_function():
    ptx = (".visible .entry a(\n)\n{ ret; }\n.func helper()\n{ ret; }\n.entry b$1()\n{ ret; }\n"
           "  .weak .func w()\n{ ret; }\n.visible .entry c()\n{ ret; }\n")
    entries = F.ptx_entries(ptx)
    assert list(entries) == ["a", "b$1", "c"]
    assert entries["a"] == ".entry a(\n)\n{ ret; }\n"
    assert entries["b$1"] == ".entry b$1()\n{ ret; }\n"
    assert entries["c"] == ".entry c()\n{ ret; }\n"
    assert F.ptx_entries(".entry only() { ret; }") == {"only": ".entry only() { ret; }"}


def test_module_globals():
    ptx = (".global .align 4 .u32 counter = 0;\n.global .f32 table[16] = {0};\n.visible .global .b8 buf[4];\n"
           ".visible .entry k(.param .u64 .ptr .global .align 16 p)\n{\n st.global.u32 [p], 1;\n"
           " ld.global.u32 %r1, [g];\n}\n.global .u32;\n")
    assert F.module_globals(ptx) == ["counter", "table", "buf"]
    many = "".join(f".global .u32 v{i};\n" for i in range(7))
    assert F.sensing(many) == {"module_state": "module-scope .global variables outlive a launch: "
                                               "v0, v1, v2, v3, v4 and 2 more"}
    five = "".join(f".global .u32 v{i};\n" for i in range(5))
    assert F.sensing(five)["module_state"].endswith("v0, v1, v2, v3, v4")


def test_sensing_names_the_registers_read():
    ptx = ("mov.u64 %rd1, %globaltimer;\nmov.u32 %r1, %clock;\nmov.u64 %rd2, %clock64;\n"
           "mov.u32 %r2, %gridid;\nmov.u32 %r3, %pm3;\nmov.u64 %rd3, %pm7_64;\n// %pm0 in a comment\n")
    assert F.sensing(ptx) == {"reads_clock": "the PTX reads %clock, %clock64, %globaltimer",
                              "reads_launch_id": "the PTX reads %gridid",
                              "reads_perf_counters": "the PTX reads %pm3, %pm7_64"}
    assert F.sensing("mov.u32 %r1, %clocks;\nmov.u32 %r1, %pm8;\n") == {}


def _insn(offset, opcode, operands="", modifiers=(), target=None):
    return sass.Instruction(offset, None, opcode, tuple(modifiers), operands, target)


def _depbar(offset, operands="gsb0, 0x0"):
    return _insn(offset, "WARPGROUP", operands, ("DEPBAR", "LE"))


def test_wgmma_serialized_in_sass_cases():
    two_waited = [_insn(0, "HGMMA", "R0, gdesc[UR4], RZ, gsb0"), _depbar(0x10),
                  _insn(0x20, "QGMMA", "R0, gdesc[UR4], R0, gsb0"), _depbar(0x30)]
    why = F.wgmma_serialized_in_sass(two_waited)
    assert why == ("SASS: each of the 2 wgmma instructions (HGMMA...) is waited on (WARPGROUP.DEPBAR.LE gsb0, 0x0) "
                   "before the next one issues, so none overlap")
    # the second issued before the first is waited on: pipelined
    assert F.wgmma_serialized_in_sass([two_waited[0], two_waited[2], _depbar(0x30)]) is None
    # a wgmma without the gsb0 scoreboard is part of a group
    assert F.wgmma_serialized_in_sass([_insn(0, "HGMMA", "R0, gdesc[UR4], RZ"), *two_waited[2:]]) is None
    assert F.wgmma_serialized_in_sass([_insn(0, "HGMMA", "R0, gdesc[UR4], RZ, gsb01"), *two_waited[1:]]) is None
    # waiting until one group remains lets groups overlap
    assert F.wgmma_serialized_in_sass([two_waited[0], _depbar(0x10, "gsb0, 0x1"), *two_waited[2:]]) is None
    # still in flight at the end: nothing waited for it to finish before the next issue... and no verdict
    assert F.wgmma_serialized_in_sass(two_waited[:3]) is None
    # other WARPGROUP instructions (ARRIVE) are not the wait; a wait with no wgmma pending changes nothing
    arrive = _insn(0x08, "WARPGROUP", "", ("ARRIVE",))
    assert F.wgmma_serialized_in_sass([_depbar(0), two_waited[0], arrive, *two_waited[1:]]) == why
    assert F.wgmma_serialized_in_sass([two_waited[0], _insn(0x10, "WARPGROUP", "gsb0, 0x0", ("ARRIVE",)),
                                       *two_waited[2:]]) is None
    # one wgmma: only in a loop (a later branch back to or before it)
    once = [_insn(0x10, "HGMMA", "R0, gdesc[UR4], RZ, gsb0"), _depbar(0x20)]
    assert F.wgmma_serialized_in_sass(once) is None
    assert F.wgmma_serialized_in_sass([*once, _insn(0x30, "BRA", "0x40", target=0x40)]) is None
    assert F.wgmma_serialized_in_sass([_insn(0, "BRA", "0x10", target=0x10), *once]) is None  # a branch before it
    assert F.wgmma_serialized_in_sass([*once, _insn(0x30, "BRA", "`(.L_x_9)", target=None)]) is None
    looped = F.wgmma_serialized_in_sass([*once, _insn(0x30, "BRA", "0x10", target=0x10)])
    assert looped == ("SASS: the one wgmma instruction (HGMMA, in a loop) is waited on (WARPGROUP.DEPBAR.LE gsb0, 0x0) "
                      "before the next one issues, so none overlap")
    assert F.wgmma_serialized_in_sass([_insn(0, "NOP"), *once, _insn(0x30, "BRA", "0x0", target=0)]) == looped
    assert F.wgmma_serialized_in_sass([]) is None


def test_flags_from_ptxas_messages_and_the_ptx():
    serialized = Diagnostic(tool="ptxas", severity="warning", code="C7511", kernel="k",
                            message="wgmma.mma_async instructions are serialized due to x")
    ignored = Diagnostic(tool="ptxas", severity="info", code=None, kernel="k",
                         message="Potential Performance Loss: 'setmaxnreg' ignored; x")
    not_ptxas = Diagnostic(tool="nvrtc", severity="warning", code=None, kernel=None,
                           message="wgmma.mma_async instructions are serialized; setmaxnreg ignored")
    ptx = (".visible .entry k()\n{\n setmaxnreg.inc.sync.aligned.u32 240;\n ret;\n}\n"
           ".visible .entry j()\n{\n setmaxnreg.dec.sync.aligned.u32 40;\n ret;\n}\n"
           ".visible .entry m()\n{\n ret;\n}\n")
    result = CompileResult(status="ok", arch="sm_90a", language="ptx", ptx=ptx,
                           diagnostics=[serialized, ignored, not_ptxas])
    programs = {"k": [_insn(0, "EXIT")], "j": [_insn(0, "USETMAXREG", modifiers=("DEALLOC",))], "m": [_insn(0, "EXIT")]}
    raised, evidence = F.flags(result, programs)
    assert raised == {"wgmma_serialized": True, "setmaxnreg_ignored": True, **{f: False for f in F.SENSING_FLAGS}}
    assert evidence == {
        "wgmma_serialized": "ptxas (C7511): wgmma.mma_async instructions are serialized due to x",
        "setmaxnreg_ignored": "ptxas: Potential Performance Loss: 'setmaxnreg' ignored; x [kernel k]; "
                              "k: the PTX has setmaxnreg but the SASS has no USETMAXREG"}
    # a kernel that is not counted (not launched) raises nothing from its PTX; no diagnostics, no PTX: nothing
    raised, evidence = F.flags(result.model_copy(update={"diagnostics": []}), {"j": programs["j"]})
    assert not any(raised.values()) and evidence == {}
    raised, evidence = F.flags(CompileResult(status="ok", arch="sm_90a", language="ptx"), {})
    assert not any(raised.values()) and evidence == {}
    unnamed = ignored.model_copy(update={"kernel": None, "message": "setmaxnreg ignored"})
    assert F.flags(result.model_copy(update={"diagnostics": [unnamed], "ptx": None}), {})[1] == {
        "setmaxnreg_ignored": "ptxas: setmaxnreg ignored"}


def test_flags_join_sass_evidence_per_kernel_and_sensing():
    waited = [_insn(0, "HGMMA", "R0, gdesc[UR4], RZ, gsb0"), _depbar(0x10),
              _insn(0x20, "HGMMA", "R0, gdesc[UR4], R0, gsb0"), _depbar(0x30)]
    ptx = "mov.u32 %r1, %gridid;\n.global .u32 seen;\n"
    result = CompileResult(status="ok", arch="sm_90a", language="ptx", ptx=ptx)
    raised, evidence = F.flags(result, {"a": waited, "b": waited, "c": waited[:1]})
    assert raised["wgmma_serialized"] and raised["reads_launch_id"] and raised["module_state"]
    why = F.wgmma_serialized_in_sass(waited)
    assert evidence["wgmma_serialized"] == f"a: {why}; b: {why}"
    assert evidence["reads_launch_id"] == "the PTX reads %gridid"
    assert set(evidence) == {"wgmma_serialized", "reads_launch_id", "module_state"}


def test_a_cxx_kernel_is_counted_by_its_plain_name(inspect_built):
    """A kernel without extern "C" has a mangled entry; the manifest names it plainly."""
    b = build((CORPUS / "common" / "mma_sync_pos.cu").read_text().replace('extern "C" ', "")
              + '\nextern "C" __global__ void plain(float* p) { p[0] = 1; }\n', "cuda", "sm_90a")
    (mangled,) = [k for k in b["result"].symbols.values() if "mma_sync_pos" in k]
    info = inspect_built(b, ["mma_sync_pos"])
    assert info.features["mma_sync"].present and info.uncounted_kernels == ["plain"]
    assert mangled in info.kernels


def _fake_tool(path, script: str):
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_disassemblers(monkeypatch, tmp_path):
    from tools import toolchain

    def use(cuobjdump: str, nvdisasm: str):
        for name, script in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)):
            monkeypatch.setenv(f"PTXBENCH_{name.upper()}", str(_fake_tool(tmp_path / name, script)))
        toolchain.find_toolchain.cache_clear()

    yield use
    toolchain.find_toolchain.cache_clear()


def test_a_tool_that_cannot_start_or_hangs_falls_through(fake_disassemblers, tmp_path, monkeypatch):
    # cuobjdump cannot be executed (its interpreter is missing); nvdisasm prints bytes that are not UTF-8
    fake_disassemblers("exit 0\n", "printf 'Function : k\\n\\377\\n'\n")
    (tmp_path / "cuobjdump").write_text("#!/nonexistent/interpreter\n")
    assert sass.disassemble(b"x") == ("Function : k\n\ufffd\n", "nvdisasm")  # no version: the name alone
    fake_disassemblers("exit 0\n", "exit 0\n")
    (tmp_path / "cuobjdump").write_text("#!/nonexistent/interpreter\n")
    (tmp_path / "nvdisasm").write_text("#!/nonexistent/interpreter\n")
    with pytest.raises(ToolchainError) as e:
        sass.disassemble(b"x")
    assert re.fullmatch(r"SASS disassembly failed: cuobjdump: \[Errno \d+\] [^;]*; nvdisasm: \[Errno \d+\] [^;]*",
                        str(e.value)), str(e.value)
    # a disassembler that hangs is stopped at the time limit
    monkeypatch.setattr(sass, "DISASM_TIMEOUT_S", 0.3)
    fake_disassemblers('[ "$1" = --version ] || exec sleep 5\n', "echo bad >&2; exit 1\n")
    with pytest.raises(ToolchainError) as e:
        sass.disassemble(b"x")
    assert "timed out after 0.3 seconds" in str(e.value) and str(e.value).endswith("; nvdisasm: ['bad']")


def test_flags_skip_other_tools_messages_wherever_they_stand():
    nvrtc = Diagnostic(tool="nvrtc", severity="warning", message="setmaxnreg ignored")
    ptxas = Diagnostic(tool="ptxas", severity="info", code="C7508", message="'setmaxnreg' ignored")
    result = CompileResult(status="ok", arch="sm_90a", language="cuda", diagnostics=[nvrtc, ptxas])
    assert F.flags(result, {})[1] == {"setmaxnreg_ignored": "ptxas (C7508): 'setmaxnreg' ignored"}


def test_module_globals_spelling():
    assert F.module_globals(".global .u32 n=0;\n.global .f32 t[4]={0};\n") == ["n", "t"]
    assert F.module_globals(".visible .func f(.param .u64 .ptr .global .align 16 p)\n{\n ret;\n}\n") == []
    six = "".join(f".global .u32 v{i};\n" for i in range(6))
    assert F.sensing(six)["module_state"].endswith("v0, v1, v2, v3, v4 and 1 more")
