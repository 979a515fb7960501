"""Find the CUDA tools ptxbench drives: NVRTC (in process), ptxas, cuobjdump, nvdisasm.

Search order for each binary: an explicit override (PTXBENCH_PTXAS, PTXBENCH_CUOBJDUMP,
PTXBENCH_NVDISASM, or a folder in PTXBENCH_CUDA_BIN), then CUDA_HOME/bin, then PATH, then
NVIDIA's wheels (site-packages/nvidia/cu13/bin, via cuda.pathfinder). Among the
non-override candidates the first whose release is at least NVRTC's wins, because an
older ptxas rejects the newer PTX ISA that NVRTC emits (FACTS.md: 13.5 NVRTC vs 13.0 ptxas).
`Toolchain.isa_check()` proves the pair works by compiling a tiny kernel once per process.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("ptxas", "cuobjdump", "nvdisasm")
ARCHES = ("sm_90a", "sm_100a")


class ToolchainError(RuntimeError):
    """A tool ptxbench needs is missing or unusable; the message is one line saying which and how to fix it."""


@dataclass(frozen=True)
class Tool:
    name: str
    path: str | None  # binary path, or the shared library for nvrtc
    version: str | None = None  # e.g. "13.0.88"
    found_via: str | None = None  # "PTXBENCH_PTXAS", "CUDA_HOME", "PATH", "wheel"
    reason: str | None = None  # why it is missing

    @property
    def release(self) -> tuple[int, int] | None:
        m = re.match(r"(\d+)\.(\d+)", self.version or "")
        return (int(m[1]), int(m[2])) if m else None


@dataclass(frozen=True)
class Toolchain:
    ptxas: Tool
    nvrtc: Tool
    cuobjdump: Tool
    nvdisasm: Tool
    include_dir: str | None  # CUDA headers (cuda_bf16.h, ...) for NVRTC's -I
    notes: tuple[str, ...] = field(default_factory=tuple)

    def tools(self) -> list[Tool]:
        return [self.nvrtc, self.ptxas, self.cuobjdump, self.nvdisasm]

    def require(self, name: str) -> str:
        """Path of a tool, or ToolchainError with the reason it is missing."""
        tool = getattr(self, name)
        if tool.path is None:
            raise ToolchainError(f"{name} not found: {tool.reason}")
        return tool.path

    def versions(self) -> dict[str, str]:
        return {t.name: t.version for t in self.tools() if t.path and t.version}


def _run(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")


def _binary_version(path: str) -> str | None:
    try:
        out = _run([path, "--version"]).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return m[1] if m else None


def _wheel_bin_dirs() -> list[Path]:
    """site-packages/nvidia/cu13/bin (and cu12) for every site dir of this interpreter."""
    dirs = []
    for sp in sys.path:
        for sub in ("cu13", "cu12", "cuda_nvcc", "cuda_cuobjdump", "cuda_nvdisasm"):
            d = Path(sp) / "nvidia" / sub / "bin"
            if d.is_dir():
                dirs.append(d)
    return dirs


def _candidates(name: str) -> list[tuple[str, str]]:
    """(path, found_via) in search order, overrides excluded."""
    out: list[tuple[str, str]] = []
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / name).is_file():
        out.append((str(Path(cuda_home) / "bin" / name), "CUDA_HOME"))
    on_path = shutil.which(name)
    if on_path:
        out.append((on_path, "PATH"))
    for d in _wheel_bin_dirs():
        if (d / name).is_file():
            out.append((str(d / name), "wheel"))
    try:  # cuda.pathfinder knows conda and other layouts too
        from cuda.pathfinder import find_nvidia_binary_utility

        p = find_nvidia_binary_utility(name)
        if p:
            out.append((str(p), "cuda.pathfinder"))
    except Exception:
        pass
    seen, unique = set(), []
    for p, via in out:
        real = os.path.realpath(p)
        if real not in seen and os.access(p, os.X_OK):
            seen.add(real)
            unique.append((p, via))
    return unique


def _find_binary(name: str, min_release: tuple[int, int] | None) -> Tool:
    env_var = f"PTXBENCH_{name.upper()}"
    override = os.environ.get(env_var)
    if not override and os.environ.get("PTXBENCH_CUDA_BIN"):
        override, env_var = str(Path(os.environ["PTXBENCH_CUDA_BIN"]) / name), "PTXBENCH_CUDA_BIN"
    if override:  # explicit choice: use it or say why not, never fall back silently
        if not (Path(override).is_file() and os.access(override, os.X_OK)):
            return Tool(name, None, reason=f"{env_var} points to {override}, which is not an executable file")
        return Tool(name, override, _binary_version(override), env_var)
    found = [Tool(name, p, _binary_version(p), via) for p, via in _candidates(name)]
    if not found:
        return Tool(name, None, reason=f"not in CUDA_HOME/bin, on PATH or in the nvidia wheels; "
                                       f"install the project's CUDA wheels or set {env_var}")
    if min_release:
        for t in found:
            if t.release and t.release >= min_release:
                return t
    return found[0]


def _find_nvrtc() -> Tool:
    try:
        from cuda.bindings import nvrtc
    except Exception as exc:  # noqa: BLE001 - any import failure means "no NVRTC"
        return Tool("nvrtc", None, reason=f"cuda.bindings.nvrtc cannot be imported ({type(exc).__name__}: {exc})")
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - libnvrtc missing raises from the loader
        return Tool("nvrtc", None, reason=f"libnvrtc could not be loaded ({type(exc).__name__}: {exc}); "
                                          "install the nvidia-cuda-nvrtc wheel")
    path, via = "libnvrtc", None
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        loaded = load_nvidia_dynamic_lib("nvrtc")
        path, via = loaded.abs_path or path, loaded.found_via
    except Exception:
        pass
    return Tool("nvrtc", path, f"{major}.{minor}", via or "cuda.bindings")


def _find_include_dir(nvrtc: Tool) -> tuple[str | None, str | None]:
    """Headers matching NVRTC: next to its library first, then CUDA_HOME, then cuda.pathfinder."""
    candidates = []
    if os.environ.get("PTXBENCH_CUDA_INCLUDE"):
        candidates.append(Path(os.environ["PTXBENCH_CUDA_INCLUDE"]))
    if nvrtc.path and nvrtc.path != "libnvrtc":
        candidates.append(Path(nvrtc.path).resolve().parent.parent / "include")
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(Path(cuda_home) / "include")
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        d = find_nvidia_header_directory("cudart")
        if d:
            candidates.append(Path(d))
    except Exception:
        pass
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda_bf16.h").is_file():
            return str(c), None
    return None, "no CUDA include folder with cuda_bf16.h (set CUDA_HOME or PTXBENCH_CUDA_INCLUDE)"


@functools.lru_cache(maxsize=1)
def find_toolchain() -> Toolchain:
    """Discover the tools once per process. Never raises: missing tools carry a reason;
    `Toolchain.require(name)` turns that into a ToolchainError where the tool is needed."""
    nvrtc = _find_nvrtc()
    tools = {name: _find_binary(name, nvrtc.release) for name in BINARIES}
    include_dir, why = _find_include_dir(nvrtc)
    notes = [f"cuda headers: {why}"] if why else []
    p = tools["ptxas"]
    if p.release and nvrtc.release and p.release < nvrtc.release:
        notes.append(f"ptxas {p.version} is older than NVRTC {nvrtc.version}: it may reject NVRTC's PTX")
    return Toolchain(ptxas=p, nvrtc=nvrtc, cuobjdump=tools["cuobjdump"], nvdisasm=tools["nvdisasm"],
                     include_dir=include_dir, notes=tuple(notes))

