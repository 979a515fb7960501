"""Compile a candidate: CUDA C++ -> PTX with NVRTC, PTX -> cubin with ptxas, both in a
confined child process (tools/sandbox.py) with time, memory and output limits.

Before anything runs, the candidate's includes are checked against the include policy
(tools/includes.py): only literal, relative names without `..`, resolved in a private copy
of the CUDA and helper headers. A refused include is one error naming the directive.

Every line NVRTC and ptxas print becomes a Diagnostic; errors carry the line in the
user's own file (CUDA: mapped through the `.loc` debug lines that -lineinfo puts in the
PTX; raw PTX: the PTX line). ptxas -v gives per-kernel registers, shared memory, spills.
Diagnostics are capped (MAX_DIAGNOSTICS, MAX_MESSAGE_CHARS) and so is the stored PTX.
A bad kernel is a CompileResult with status "failed", never an exception.
"""
from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from tools.includes import header_root, refused_includes
from tools.results import CompileResult, Diagnostic, KernelResources
from tools.sandbox import Job, Limits, Outcome, run_toolchain
from tools.toolchain import ARCHES, Toolchain, ToolchainError, find_toolchain

SOURCE_NAME = {"cuda": "kernel.cu", "ptx": "kernel.ptx"}
MAX_SOURCE_CHARS = 2_000_000  # the expert kernels are ~30 kB
MAX_DIAGNOSTICS = 200  # errors first, then the rest in order; one info line says what was left out
MAX_MESSAGE_CHARS = 500
MAX_STORED_PTX_CHARS = 2_000_000  # CompileResult.ptx; the cubin is built from the whole PTX

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


def _include_trees(include_dirs: Iterable[str]) -> list[tuple[str, str]]:
    """The header trees NVRTC may read, in -I order, with the label each has in messages."""
    tc = find_toolchain()
    trees = [("cuda", tc.include_dir)] if tc.include_dir else []
    trees.append(("helpers", str(knowledge_include_dir())))
    return trees + [(f"include{i}", str(d)) for i, d in enumerate(include_dirs)]


def _nvrtc_library() -> str | None:
    """The libnvrtc the toolchain found (the sandbox child loads it directly). When only a
    soname is known, the copy that cuda.bindings mapped into this process."""
    path = find_toolchain().nvrtc.path
    if path and Path(path).is_file():
        return path
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = re.search(r"(/\S*/libnvrtc\.so[\d.]*)$", maps, re.M)
    return found[1] if found else None


def _nvrtc_job(source: str, arch: str, include_dirs: Iterable[str], extra_flags: Iterable[str],
               with_prelude: bool) -> Job:
    root = header_root(_include_trees(include_dirs))
    # --no-source-include: the folder of the source is not searched; only the copies are
    opts = [f"-arch=compute_{arch.removeprefix('sm_')}", "-std=c++17", "-lineinfo", "-DPTXBENCH=1",
            "--no-source-include", *(f"-I{d}" for d in root.dirs), *extra_flags]
    if with_prelude:
        opts.append(f"--pre-include={_PRELUDE_NAME}")
    return Job(source=source, source_name=SOURCE_NAME["cuda"], nvrtc_library=_nvrtc_library(), nvrtc_options=opts,
               headers=dict(_HEADERS) if with_prelude else {}, read_dirs=[root.path], strip_prefixes=[root.path])


def nvrtc_to_ptx(source: str, arch: str, include_dirs: Iterable[str] = (), extra_flags: Iterable[str] = (),
                 with_prelude: bool = True, limits: Limits | None = None) -> tuple[str | None, str, float]:
    """CUDA C++ -> PTX in the sandbox, no ptxas. Returns (ptx or None, NVRTC log, seconds)."""
    out = run_toolchain(_nvrtc_job(source, arch, include_dirs, extra_flags, with_prelude), limits)
    log = "\n".join(x for x in (out.nvrtc_log, out.error) if x)
    return (out.ptx if out.nvrtc_ok and not out.error else None), log, out.seconds.get("nvrtc", 0.0)


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
_AROUND_LINE = re.compile(r"\baround line (\d+)")
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
        if ptx_line is None and (around := _AROUND_LINE.search(msg)):
            # C7517/C7519/C7520 ... name a line in the text ("injected in around line 4917"): a PTX
            # line. From CUDA it is mapped like a prefixed one and said to be a PTX line, so it is
            # never read as a line of kernel.cu; from raw PTX it is the user's own line.
            ptx_line = int(around[1])
            if line_map is not None:
                msg = msg[:around.start()] + f"around PTX line {ptx_line}" + msg[around.end():]
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
                   extra_flags: Iterable[str] = (), limits: Limits | None = None) -> CompileResult:
    """CUDA C++ or PTX source -> PTX -> cubin for `arch` (sm_90a, sm_100a). Never raises for a bad kernel.

    include_dirs and extra_flags are the caller's (trusted); the source is not."""
    if language not in SOURCE_NAME:
        return _failed(arch, "cuda", f"unknown language {language!r} (use 'cuda' or 'ptx')")
    if arch not in ARCHES:
        return _failed(arch, language, f"unknown arch {arch!r} (known: {', '.join(ARCHES)})")
    if not source or not source.strip():
        return _failed(arch, language, "the kernel source is empty")
    if len(source) > MAX_SOURCE_CHARS:
        return _failed(arch, language, f"the kernel source has {len(source)} characters; at most {MAX_SOURCE_CHARS}")
    tc = find_toolchain()
    versions = tc.versions()
    try:
        ptxas = tc.require("ptxas")
        if language == "cuda":
            tc.require("nvrtc")
    except ToolchainError as exc:  # ours, not the source's: no verdict (tools/results.py)
        return _failed(arch, language, str(exc), toolchain=versions, infra_error=str(exc))

    if language == "cuda":
        if (refused := refused_includes(source)):
            return _refused(arch, refused, versions)
        job = _nvrtc_job(source, arch, include_dirs, extra_flags, with_prelude=True)
    else:
        if not source.isascii():
            bad = next(i for i, line in enumerate(source.splitlines(), 1) if not line.isascii())
            return _failed(arch, language, f"PTX must be ASCII; line {bad} has non-ASCII characters", toolchain=versions)
        job = Job(ptx=source)
    job.ptxas, job.ptxas_args = ptxas, [f"-arch={arch}", "-v"]
    out = run_toolchain(job, limits)
    return _result(out, language, arch, source, versions)


def _result(out: Outcome, language: str, arch: str, source: str, versions: dict) -> CompileResult:
    """The sandbox's outcome -> CompileResult: parsed and capped diagnostics, mapped lines."""
    diags: list[Diagnostic] = []
    common = dict(seconds=out.seconds, toolchain=versions)
    if language == "cuda":
        diags += parse_nvrtc_log(out.nvrtc_log)
        if not out.nvrtc_ok or out.failed_tool in ("nvrtc", "sandbox"):
            error = out.error if out.failed_tool in ("nvrtc", "sandbox") and out.error else _first_error(diags, "nvrtc")
            return _failed(arch, language, error, diagnostics=_cap_diagnostics(diags),
                           infra_error=error if out.infra else None, **common)
        ptx, line_map = out.ptx, ptx_line_to_source(out.ptx)
    else:
        ptx, line_map = source, None
    pdiags, kernels = parse_ptxas_output(out.ptxas_output or "", line_map)
    diags += pdiags
    common.update(ptx=_cap_ptx(ptx), diagnostics=_cap_diagnostics(diags), kernels=kernels, symbols=_symbols(ptx))
    if out.error:
        return _failed(arch, language, out.error, infra_error=out.error if out.infra else None, **common)
    if out.cubin is None:
        if (broken := _ptxas_could_not_run(out, pdiags)):
            return _failed(arch, language, broken, infra_error=broken, **common)
        return _failed(arch, language, _first_error(diags, "ptxas"), **common)
    return CompileResult(status="ok", arch=arch, language=language, cubin=out.cubin, **common)


# exit statuses a shell and the loader use for "could not be executed" / "not found"
_NOT_RUN_STATUSES = (126, 127)


def _ptxas_could_not_run(out: Outcome, pdiags: list[Diagnostic]) -> str | None:
    """Why ptxas made no cubin without judging the PTX, or None when it rejected the PTX.

    A rejection is ptxas naming an error (an `error` or `fatal` line). A ptxas that exits
    non-zero without naming one (a missing shared library: exit 127 "error while loading
    shared libraries"; an exit of 126) never read the kernel: the toolchain's fault, with
    the tool's own words, so the model is neither charged nor told (tools/results.py)."""
    rejected = any(d.severity == "error" for d in pdiags)
    status = out.ptxas_returncode
    if rejected and status not in _NOT_RUN_STATUSES:
        return None
    said = " | ".join(line.strip() for line in (out.ptxas_output or "").strip().splitlines()[-3:] if line.strip())
    if status is None or status == 0:
        return f"ptxas wrote no cubin and no error{': ' + said[:300] if said else ''}"
    return f"ptxas could not run (exit status {status}){': ' + said[:300] if said else ''}"


def _refused(arch: str, refused: list, versions: dict) -> CompileResult:
    """One error per refused include, naming the directive as the candidate wrote it."""
    diags = [Diagnostic(tool="harness", severity="error", line=inc.line, message=f"{inc.render()} refused: {why}")
             for inc, why in refused]
    first = diags[0]
    more = f" (+{len(diags) - 1} more)" if len(diags) > 1 else ""
    return _failed(arch, "cuda", f"include refused: line {first.line}: {first.message}{more}",
                   diagnostics=_cap_diagnostics(diags), toolchain=versions)


def _cap_diagnostics(diags: list[Diagnostic]) -> list[Diagnostic]:
    """At most MAX_DIAGNOSTICS, errors kept first, each message at most MAX_MESSAGE_CHARS,
    then one info line counting what was left out (a flood of warnings must not bury the
    error or fill the run's records)."""
    for d in diags:
        if len(d.message) > MAX_MESSAGE_CHARS:
            d.message = d.message[:MAX_MESSAGE_CHARS - 1] + "\u2026"
    if len(diags) <= MAX_DIAGNOSTICS:
        return diags
    errors = [i for i, d in enumerate(diags) if d.severity == "error"][:MAX_DIAGNOSTICS - 1]
    others = [i for i, d in enumerate(diags) if d.severity != "error"][:MAX_DIAGNOSTICS - 1 - len(errors)]
    kept = sorted(errors + others)
    kept_set = set(kept)
    left = [d for i, d in enumerate(diags) if i not in kept_set]
    n_err = sum(d.severity == "error" for d in left)
    n_warn = sum(d.severity == "warning" for d in left)
    summary = Diagnostic(tool="harness", severity="info",
                         message=f"\u2026 {len(left)} more diagnostics not shown ({n_err} errors, {n_warn} warnings)")
    return [diags[i] for i in kept] + [summary]


def _cap_ptx(ptx: str) -> str:
    if len(ptx) <= MAX_STORED_PTX_CHARS:
        return ptx
    return ptx[:MAX_STORED_PTX_CHARS] + f"\n// [ptxbench: PTX truncated, {len(ptx) - MAX_STORED_PTX_CHARS} more characters]\n"


def compile_solution(solution, arch: str) -> CompileResult:
    """Compile a tools.solution.Solution's kernel source for `arch`."""
    return compile_source(solution.source, solution.language, arch)


@dataclass(frozen=True)
class IsaCheck:
    """Does ptxas accept the PTX NVRTC emits, for each arch?"""

    ok: bool
    ptx_version: str | None  # the `.version` NVRTC wrote
    detail: str  # one line: what was checked, or what failed


_TINY_KERNEL = 'extern "C" __global__ void ptxbench_isa_probe(int* p) { p[threadIdx.x] = 1; }\n'


@functools.lru_cache(maxsize=4)
def isa_check(tc: Toolchain) -> IsaCheck:
    """Does ptxas accept the PTX NVRTC emits? A tiny kernel compiled with NVRTC and assembled
    with ptxas for every arch (`agent doctor`)."""
    if tc.nvrtc.path is None or tc.ptxas.path is None:
        missing = [t.name for t in (tc.nvrtc, tc.ptxas) if t.path is None]
        return IsaCheck(False, None, f"not checked: {', '.join(missing)} missing")
    version = None
    for arch in ARCHES:
        ptx, log, _ = nvrtc_to_ptx(_TINY_KERNEL, arch, include_dirs=(), with_prelude=False)
        if ptx is None:
            return IsaCheck(False, None, f"NVRTC failed on a tiny kernel for {arch}: {log.strip()[:200]}")
        m = re.search(r"^\s*\.version\s+(\S+)", ptx, re.M)
        version = m[1] if m else None
        with tempfile.TemporaryDirectory(prefix="ptxbench-isa-") as tmp:
            src = Path(tmp) / "probe.ptx"
            src.write_text(ptx)
            try:
                r = subprocess.run([tc.ptxas.path, f"-arch={arch}", str(src), "-o", str(Path(tmp) / "probe.cubin")], capture_output=True,
                                   text=True, timeout=60, errors="replace")
            except (OSError, subprocess.SubprocessError) as exc:
                return IsaCheck(False, version, f"ptxas could not run: {exc}")
        if r.returncode != 0:
            first = (r.stderr or r.stdout).strip().splitlines()[:1]
            return IsaCheck(False, version, f"ptxas {tc.ptxas.version} rejects NVRTC {tc.nvrtc.version}'s "
                                            f"PTX .version {version} for {arch}: {' '.join(first)}")
    return IsaCheck(True, version, f"ptxas {tc.ptxas.version} accepts NVRTC {tc.nvrtc.version}'s PTX "
                                   f".version {version} for {', '.join(ARCHES)}")
