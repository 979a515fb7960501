"""SASS inspection: cubin -> disassembly (cuobjdump -sass, or nvdisasm) -> per-kernel
opcode counts -> requested-feature verdicts and the wgmma_serialized /
setmaxnreg_ignored flags.

Opcodes are parsed exactly: the first token of each instruction after its predicate,
split at the first dot into base opcode and modifiers ("HGMMA.64x128x16.F32.BF16" ->
"HGMMA"). Verdicts compare base opcodes for equality, never substrings of the line.
"""
from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools import features as F
from tools.results import CompileResult, FeatureVerdict, InspectResult, KernelSass
from tools.toolchain import ToolchainError, find_toolchain

DISASM_TIMEOUT_S = 120


@dataclass(frozen=True)
class Instruction:
    offset: int
    predicate: str | None  # "@P0", "@!UPT" ...
    opcode: str  # base opcode, e.g. "HGMMA"
    modifiers: tuple[str, ...]  # ("64x128x16", "F32", "BF16")
    operands: str
    target: int | None = None  # branch target offset (BRA), when the disassembly names one

    @property
    def full_opcode(self) -> str:
        return ".".join((self.opcode, *self.modifiers))


# /*0040*/   @!P0 HGMMA.64x8x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;   /* 0x... */
_INSN = re.compile(r"^\s*/\*(?P<off>[0-9a-fA-F]+)\*/\s+(?:\{\s*)?(?P<pred>@!?U?P(?:T|\d+)\s+)?"
                   r"(?P<op>[A-Z][A-Z0-9_]*)(?P<mods>(?:\.[A-Za-z0-9_]+)*)(?P<rest>[^;]*);")
_CUOBJDUMP_FUNC = re.compile(r"^\s*Function : (\S+)")
_NVDISASM_FUNC = re.compile(r"^\s*\.text\.(\S+):")  # section label opening a function


_LABEL = re.compile(r"^\s*(\.L\w+):")  # nvdisasm's branch labels
_BRANCH_TARGET = re.compile(r"^(?:0x(?P<hex>[0-9a-fA-F]+)|`\((?P<label>[^)]+)\))")


def parse_sass(text: str) -> dict[str, list[Instruction]]:
    """cuobjdump -sass or nvdisasm -c text -> kernel name -> instructions in program order."""
    kernels: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    labels: dict[str, int] = {}  # nvdisasm label -> offset of the instruction after it
    pending_labels: list[str] = []
    for line in text.splitlines():
        f = _CUOBJDUMP_FUNC.match(line) or _NVDISASM_FUNC.match(line)
        if f:
            current = kernels.setdefault(f[1], [])
            continue
        if (lab := _LABEL.match(line)):
            pending_labels.append(lab[1])
            continue
        m = _INSN.match(line)
        if m and current is not None:
            offset = int(m["off"], 16)
            labels.update((name, offset) for name in pending_labels)
            pending_labels.clear()
            mods = tuple(x for x in m["mods"].split(".") if x)
            pred = m["pred"].strip() if m["pred"] else None
            current.append(Instruction(offset, pred, m["op"], mods, m["rest"].strip()))
    for name, insns in kernels.items():  # resolve branch targets once all labels are known
        for n, insn in enumerate(insns):
            t = _BRANCH_TARGET.match(insn.operands) if insn.opcode == "BRA" else None
            if t:
                target = int(t["hex"], 16) if t["hex"] else labels.get(t["label"])
                insns[n] = dataclasses.replace(insn, target=target)
        # drop the alignment padding after the code: NOPs and the branch-to-self before them
        while insns and insns[-1].opcode == "NOP":
            insns.pop()
        if insns and insns[-1].opcode == "BRA" and insns[-1].target == insns[-1].offset:
            insns.pop()
    return kernels


def disassemble(cubin: bytes) -> tuple[str, str]:
    """cubin -> (SASS text, "cuobjdump 13.2.86"); ToolchainError if neither tool is usable."""
    tc = find_toolchain()
    choices = [(t, args) for t, args in ((tc.cuobjdump, ["-sass"]), (tc.nvdisasm, ["-c"])) if t.path]
    if not choices:
        raise ToolchainError(f"no SASS disassembler: cuobjdump {tc.cuobjdump.reason}; nvdisasm {tc.nvdisasm.reason}")
    errors = []
    with tempfile.TemporaryDirectory(prefix="ptxbench-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        for tool, args in choices:  # cuobjdump -sass runs nvdisasm underneath; fall back to it directly
            try:
                p = subprocess.run([tool.path, *args, str(path)], capture_output=True, text=True, errors="replace",
                                   timeout=DISASM_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError) as exc:
                errors.append(f"{tool.name}: {exc}")
                continue
            if p.returncode == 0 and p.stdout.strip():
                return p.stdout, f"{tool.name} {tool.version or ''}".strip()
            errors.append(f"{tool.name}: {(p.stderr or p.stdout).strip().splitlines()[:1]}")
    raise ToolchainError("SASS disassembly failed: " + "; ".join(errors))


def kernel_sass(instructions: list[Instruction], resources=None) -> KernelSass:
    counts: dict[str, int] = {}
    for insn in instructions:
        counts[insn.opcode] = counts.get(insn.opcode, 0) + 1
    base = resources.model_dump() if resources is not None else {}
    tma_sites = {i.offset: i.full_opcode for i in instructions if i.opcode.startswith(("UTMA", "UBLK"))}
    return KernelSass(**base, opcodes=dict(sorted(counts.items())), instructions=len(instructions),
                      tma_sites=tma_sites)


def inspect(compile_result: CompileResult, kernels: list[str] | None = None) -> InspectResult:
    """Feature verdicts and flags for a compiled module. skipped (with why) when there is
    no cubin or no disassembler; failed when the disassembly cannot be read.

    `kernels` (the names a launch manifest launches): only these count for the feature
    verdicts and the SASS-derived flags, so a wgmma in a kernel that is never launched
    cannot pass for a wgmma kernel. None counts every kernel (no manifest: `agent inspect`)."""
    arch = compile_result.arch
    if not compile_result.ok or compile_result.cubin is None:
        return InspectResult(status="skipped", arch=arch, reason="did not compile")
    try:
        text, tool = disassemble(compile_result.cubin)
    except ToolchainError as exc:  # the disassembler's fault (missing, or failing on ptxas's own cubin)
        return InspectResult(status="skipped", arch=arch, reason=str(exc), infra_error=str(exc))
    programs = parse_sass(text)
    if not programs:
        return InspectResult(status="failed", arch=arch, reason=f"{tool} printed no functions", tool=tool)
    all_kernels = {name: kernel_sass(insns, compile_result.kernels.get(name)) for name, insns in programs.items()}
    uncounted: list[str] = []
    if kernels is not None:
        from tools.kernel_names import AmbiguousKernel, resolve_kernel

        launched = set()
        for k in kernels:  # the same mapping as the launch and the executed check (an ambiguous name counts nothing)
            try:
                launched.add(resolve_kernel(k, programs, compile_result.symbols) or k)
            except AmbiguousKernel:
                pass
        uncounted = sorted(n for n in programs if n not in launched)
        programs = {n: insns for n, insns in programs.items() if n in launched}
    features = {}
    for name in F.features_for(arch):
        proving = F.FEATURES[name].sass_opcodes
        totals: dict[str, int] = {}
        for k in (all_kernels[n] for n in programs):
            for op in sorted(proving & k.opcodes.keys()):
                totals[op] = totals.get(op, 0) + k.opcodes[op]
        features[name] = FeatureVerdict(present=bool(totals), opcodes=totals)
    flags, evidence = F.flags(compile_result, programs)
    return InspectResult(status="ok", arch=arch, kernels=all_kernels, features=features, flags=flags,
                         flag_evidence=evidence, tool=tool, uncounted_kernels=uncounted)
