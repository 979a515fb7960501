"""Compile a candidate: CUDA C++ -> PTX with NVRTC (in process), PTX -> cubin with ptxas.

Every line NVRTC and ptxas print becomes a Diagnostic; errors carry the line in the
user's own file (CUDA: mapped through the `.loc` debug lines that -lineinfo puts in the
PTX; raw PTX: the PTX line). ptxas -v gives per-kernel registers, shared memory, spills.
A bad kernel is a CompileResult with status "failed", never an exception.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterable

from tools.results import CompileResult, Diagnostic, KernelResources
from tools.toolchain import ARCHES, ToolchainError, find_toolchain

SOURCE_NAME = {"cuda": "kernel.cu", "ptx": "kernel.ptx"}
PTXAS_TIMEOUT_S = 300

# NVRTC has no libc headers and no cuda.h (FACTS.md). The prelude gives kernels the
# fixed-width integers and a CUtensorMap with the driver's layout (128 bytes, 64-byte
# aligned) so `const __grid_constant__ CUtensorMap` parameters work. It is force-included;
# <stdint.h>, <cstdint> and <cuda.h> resolve to it too (NVRTC's in-memory headers win
# over -I), so kernels written for nvcc still compile.
PRELUDE = """\
#ifndef PTXBENCH_PRELUDE_H
#define PTXBENCH_PRELUDE_H
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef long intptr_t;
typedef unsigned long uintptr_t;
typedef unsigned int cuuint32_t;
typedef unsigned long long cuuint64_t;
#ifndef CU_TENSOR_MAP_NUM_QWORDS
#define CU_TENSOR_MAP_NUM_QWORDS 16
typedef struct alignas(64) CUtensorMap_st { unsigned long long opaque[CU_TENSOR_MAP_NUM_QWORDS]; } CUtensorMap;
#endif
#endif
"""
_PRELUDE_NAME = "ptxbench_prelude.h"
_HEADERS = {_PRELUDE_NAME: PRELUDE, "stdint.h": f'#include "{_PRELUDE_NAME}"\n',
            "cstdint": f'#include "{_PRELUDE_NAME}"\n', "cuda.h": f'#include "{_PRELUDE_NAME}"\n'}


def knowledge_include_dir() -> Path:
    """knowledge/include: ptxbench's helper headers, always on the include path. Located
    without importing the knowledge package (tools depends only on tasks)."""
    spec = importlib.util.find_spec("knowledge")
    root = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else \
        Path(__file__).resolve().parent.parent / "knowledge"
    d = root / "include"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _nvrtc_log(nvrtc, prog) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = bytearray(size)  # NVRTC writes into it: never hand it an (interned) bytes object
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def nvrtc_to_ptx(source: str, arch: str, include_dirs: Iterable[str] = (), extra_flags: Iterable[str] = (),
                 with_prelude: bool = True) -> tuple[str | None, str, float]:
    """CUDA C++ -> PTX in process. Returns (ptx or None, NVRTC log, seconds)."""
    from cuda.bindings import nvrtc

    tc = find_toolchain()
    incs = [tc.include_dir] if tc.include_dir else []
    incs += [str(knowledge_include_dir()), *include_dirs]
    opts = [f"-arch=compute_{arch.removeprefix('sm_')}", "-std=c++17", "-lineinfo", "-DPTXBENCH=1",
            *(f"-I{d}" for d in incs), *extra_flags]
    headers = _HEADERS if with_prelude else {}
    if with_prelude:
        opts.append(f"--pre-include={_PRELUDE_NAME}")
    t0 = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), SOURCE_NAME["cuda"].encode(), len(headers),
                                         [h.encode() for h in headers.values()], [n.encode() for n in headers])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return None, f"nvrtcCreateProgram failed: {err.name}", 0.0
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _nvrtc_log(nvrtc, prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, log or result.name, time.perf_counter() - t0
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        buf = bytearray(size)
        nvrtc.nvrtcGetPTX(prog, buf)
        return bytes(buf).rstrip(b"\0").decode(), log, time.perf_counter() - t0
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# ---------------------------------------------------------------- diagnostics

_NVRTC_LINE = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark)"
                         r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$")


def parse_nvrtc_log(log: str) -> list[Diagnostic]:
    """One Diagnostic per NVRTC message; the echoed source line and caret under it are
    folded into the message they belong to, other lines ("1 error detected ...") are info."""
    diags: list[Diagnostic] = []
    context: list[str] = []

    def flush():
        if context and diags:
            snippet = " | ".join(c.strip() for c in context if c.strip() and c.strip() != "^")
            if snippet:
                diags[-1].message += f"  [{snippet}]"
            # an error inside a header names the user's line in its context ("... at line 4 of kernel.cu")
            at = re.search(rf"at line (\d+) of {re.escape(SOURCE_NAME['cuda'])}", snippet)
            if diags[-1].line is None and at:
                diags[-1].line = int(at[1])
        context.clear()

    for raw in log.splitlines():
        m = _NVRTC_LINE.match(raw)
        if m:
            flush()
            sev = {"catastrophic error": "error", "remark": "info"}.get(m["sev"], m["sev"])
            line = int(m["line"]) if Path(m["file"]).name == SOURCE_NAME["cuda"] else None
            where = "" if line else f"{m['file']}({m['line']}): "
            diags.append(Diagnostic(tool="nvrtc", severity=sev, code=m["code"], message=where + m["msg"], line=line))
        elif raw.startswith("  ") and diags:
            context.append(raw)  # the source line NVRTC echoes, the caret, "detected during ..." notes
        elif raw.strip():
            flush()
            diags.append(Diagnostic(tool="nvrtc", severity="info", message=raw.strip()))
    flush()
    return diags


_PTXAS_LINE = re.compile(r"^ptxas(?: (?P<file>[^,]+), line (?P<line>\d+);)? *(?P<sev>error|warning|info|fatal)\s*: "
                         r"(?:\((?P<code>C\d+)\) )?(?P<msg>.*)$")
_KERNEL_IN_MSG = re.compile(r"(?:function|entry function|properties for) '?([A-Za-z_$][\w$]*)'?")


def ptx_line_to_source(ptx: str, source_name: str = SOURCE_NAME["cuda"]) -> list[int | None]:
    """For each PTX line (index = line number - 1) the user source line of the `.loc` in force."""
    files = {m[1] for m in re.finditer(r'^\s*\.file\s+(\d+)\s+"([^"]*)"', ptx, re.M) if Path(m[2]).name == source_name}
    out: list[int | None] = []
    current = None
    for line in ptx.splitlines():
        m = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)(?:.*\binlined_at\s+(\d+)\s+(\d+))?", line)
        if m:
            # code inlined from a header maps to the user's line that called it
            current = int(m[2]) if m[1] in files else (int(m[4]) if m[3] in files else None)
        elif re.match(r"\s*(\.visible\s+|\.weak\s+)?\.(entry|func)\b", line):
            current = None
        out.append(current)
    return out


def parse_ptxas_output(text: str, line_map: list[int | None] | None = None) -> tuple[list[Diagnostic], dict[str, KernelResources]]:
    """ptxas output -> diagnostics (every line) and per-kernel resources from -v.

    line_map: PTX line -> user line (from ptx_line_to_source); None when the user wrote the PTX."""
    diags: list[Diagnostic] = []
    kernels: dict[str, KernelResources] = {}
    current: str | None = None  # the function the -v lines are about
    entries: set[str] = set()
    for raw in text.splitlines():
        if not raw.strip():
            continue
        m = _PTXAS_LINE.match(raw.strip())
        if not m:  # e.g. "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
            if current in entries:
                res = kernels[current]
                for n, what in re.findall(r"(\d+) bytes (stack frame|spill stores|spill loads)", raw):
                    setattr(res, what.replace(" ", "_"), int(n))
            diags.append(Diagnostic(tool="ptxas", severity="info", message=raw.strip(), kernel=current))
            continue
        sev = "error" if m["sev"] == "fatal" else m["sev"]
        msg = m["msg"].strip()
        if (k := re.match(r"Compiling entry function '([^']+)'", msg)):
            current = k[1]
            entries.add(current)
            kernels.setdefault(current, KernelResources())
        elif (k := re.match(r"Function properties for (\S+)", msg)):
            current = k[1]
        elif current in entries and (u := re.match(r"Used (\d+) registers", msg)):
            res = kernels[current]
            res.registers = int(u[1])
            if s := re.search(r"(\d+) bytes smem", msg):
                res.shared_bytes = int(s[1])
            res.constant_bytes = sum(int(c) for c in re.findall(r"(\d+) bytes cmem\[\d+\]", msg))
        named = _KERNEL_IN_MSG.search(msg)
        kernel = named[1] if named else current
        ptx_line = int(m["line"]) if m["line"] else None
        if ptx_line is None or line_map is None:
            src_line = ptx_line  # raw PTX: the user's file is the PTX
        else:
            src_line = line_map[ptx_line - 1] if 0 < ptx_line <= len(line_map) else None
        diags.append(Diagnostic(tool="ptxas", severity=sev, code=m["code"], message=msg,
                                ptx_line=ptx_line, line=src_line, kernel=kernel))
    return diags, kernels


# ---------------------------------------------------------------- compile

def _failed(arch: str, language: str, error: str, **kw) -> CompileResult:
    return CompileResult(status="failed", arch=arch, language=language if language in SOURCE_NAME else "cuda",
                         error=error, **kw)


def _first_error(diags: list[Diagnostic], tool: str) -> str:
    errs = list({d.render(): d for d in diags if d.severity == "error"}.values())  # unrolled copies repeat
    if not errs:
        return f"{tool} failed"
    first = errs[0]
    more = f" (+{len(errs) - 1} more errors)" if len(errs) > 1 else ""
    return f"{tool}: {first.render().split(': ', 1)[-1]}{more}"


def _mangled_name(sym: str) -> str | None:
    """The unqualified function name in an Itanium-mangled symbol: _Z4gemmPf -> gemm,
    _ZN2ns5innerEPf -> inner, _Z2tkILi3EEvPf -> tk. None when it is not that simple."""
    if not sym.startswith("_Z"):
        return None
    rest, nested, name = sym[2:], sym[2:3] == "N", None
    rest = rest[1:] if nested else rest
    while (m := re.match(r"(\d+)", rest)):
        n, rest = int(m[1]), rest[len(m[1]):]
        name, rest = rest[:n], rest[n:]
        if not nested:
            break
    return name or None


def _symbols(ptx: str) -> dict[str, str]:
    """Plain kernel name -> PTX entry name, for kernels NVRTC mangled (C++ linkage).

    Lets a manifest say "gemm" for `__global__ void gemm(...)` declared without extern "C";
    names that are ambiguous (overloads, several template instances) are left out."""
    found: dict[str, list[str]] = {}
    for sym in re.findall(r"\.entry\s+([\w$]+)", ptx):
        if (name := _mangled_name(sym)):
            found.setdefault(name, []).append(sym)
    return {name: syms[0] for name, syms in found.items() if len(syms) == 1}


def compile_source(source: str, language: str, arch: str, include_dirs: Iterable[str] = (),
                   extra_flags: Iterable[str] = ()) -> CompileResult:
    """CUDA C++ or PTX source -> PTX -> cubin for `arch` (sm_90a, sm_100a). Never raises for a bad kernel."""
    if language not in SOURCE_NAME:
        return _failed(arch, "cuda", f"unknown language {language!r} (use 'cuda' or 'ptx')")
    if arch not in ARCHES:
        return _failed(arch, language, f"unknown arch {arch!r} (known: {', '.join(ARCHES)})")
    if not source or not source.strip():
        return _failed(arch, language, "the kernel source is empty")
    tc = find_toolchain()
    versions = tc.versions()
    seconds: dict[str, float] = {}
    diags: list[Diagnostic] = []
    try:
        ptxas = tc.require("ptxas")
        if language == "cuda":
            tc.require("nvrtc")
    except ToolchainError as exc:
        return _failed(arch, language, str(exc), toolchain=versions)

    if language == "cuda":
        try:
            ptx, log, seconds["nvrtc"] = nvrtc_to_ptx(source, arch, include_dirs, extra_flags)
        except Exception as exc:  # noqa: BLE001 - a broken NVRTC install must not crash a run
            return _failed(arch, language, f"NVRTC could not run: {type(exc).__name__}: {exc}", toolchain=versions)
        diags += parse_nvrtc_log(log)
        if ptx is None:
            return _failed(arch, language, _first_error(diags, "nvrtc"), diagnostics=diags,
                           seconds=seconds, toolchain=versions)
        line_map = ptx_line_to_source(ptx)
    else:
        if not source.isascii():
            bad = next(i for i, line in enumerate(source.splitlines(), 1) if not line.isascii())
            return _failed(arch, language, f"PTX must be ASCII; line {bad} has non-ASCII characters", toolchain=versions)
        ptx, line_map = source, None

    with tempfile.TemporaryDirectory(prefix="ptxbench-") as tmp:
        ptx_path, cubin_path = Path(tmp) / SOURCE_NAME["ptx"], Path(tmp) / "kernel.cubin"
        ptx_path.write_text(ptx)
        t0 = time.perf_counter()
        try:
            # run in the temp folder with relative names so messages say "kernel.ptx", not a temp path
            proc = subprocess.run([ptxas, f"-arch={arch}", "-v", ptx_path.name, "-o", cubin_path.name], cwd=tmp,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # one stream keeps the order
                                  text=True, errors="replace", timeout=PTXAS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return _failed(arch, language, f"ptxas ran longer than {PTXAS_TIMEOUT_S} s", ptx=ptx,
                           diagnostics=diags, seconds=seconds, toolchain=versions)
        except OSError as exc:
            return _failed(arch, language, f"ptxas could not run: {exc}", ptx=ptx, toolchain=versions)
        seconds["ptxas"] = time.perf_counter() - t0
        pdiags, kernels = parse_ptxas_output(proc.stdout, line_map)
        diags += pdiags
        cubin = cubin_path.read_bytes() if proc.returncode == 0 and cubin_path.exists() else None

    common = dict(ptx=ptx, diagnostics=diags, kernels=kernels, seconds=seconds, toolchain=versions,
                  symbols=_symbols(ptx))
    if cubin is None:
        return _failed(arch, language, _first_error(diags, "ptxas"), **common)
    return CompileResult(status="ok", arch=arch, language=language, cubin=cubin, **common)


def compile_solution(solution, arch: str) -> CompileResult:
    """Compile a tools.solution.Solution's kernel source for `arch`."""
    return compile_source(solution.source, solution.language, arch)
