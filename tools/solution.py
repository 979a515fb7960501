"""A solution: kernel source plus a declarative launch manifest.

No model-written host code ever runs. The manifest says which scratch buffers to
allocate, which TMA tensor maps to build (on the host, with cuTensorMapEncodeTiled), and
which kernels to launch in order, with grid/block/cluster as expressions over the task's
axes and `num_sms`. On disk a solution is a folder: kernel.cu or kernel.ptx + launch.json.
See docs/SOLUTION_FORMAT.md.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

# Names are short words; a bounded length keeps every message that quotes one a short line.
Name = Annotated[str, Field(max_length=256)]
DType = Literal["bfloat16", "float16", "float32", "float8_e4m3fn", "int32", "int64", "uint8"]
ScalarType = Literal["i32", "u32", "i64", "u64", "f32"]
Expr = Union[str, int]


class Buffer(BaseModel):
    """Scratch memory the kernels may use (e.g. dQ accumulators in fp32, semaphores)."""

    name: Name
    dtype: DType
    shape: list[Expr]
    zero: bool = True  # zero-filled before every run; otherwise filled with NaN/garbage


class TensorMap(BaseModel):
    """A TMA descriptor built on the host and passed to the kernel by value (128 bytes).

    `view` reshapes the tensor (row-major, same element count) before encoding, e.g. Q
    [B,H,S,D] viewed as [B*H*S, D]. `view` and `box` are outermost first, like shapes;
    the harness reverses them into the driver's innermost-first order.
    """

    name: Name
    tensor: Name  # an input, output or buffer name
    view: list[Expr] | None = None
    box: list[Expr]
    element_strides: list[int] | None = None
    swizzle: Literal["none", "32B", "64B", "128B"] = "none"
    l2_promotion: Literal["none", "64B", "128B", "256B"] = "none"
    oob_fill: Literal["zero", "nan"] = "zero"

    @model_validator(mode="after")
    def _ranks(self):
        if self.view is not None and len(self.view) != len(self.box):
            raise ValueError(f"tensor map {self.name!r}: box has {len(self.box)} dims but view has {len(self.view)}")
        if self.element_strides is not None and len(self.element_strides) != len(self.box):
            raise ValueError(f"tensor map {self.name!r}: element_strides must have one entry per box dim")
        if not 1 <= len(self.box) <= 5:
            raise ValueError(f"tensor map {self.name!r}: TMA supports 1 to 5 dims, got {len(self.box)}")
        return self


class ScalarArg(BaseModel):
    """An explicit by-value argument: {"type": "f32", "value": "sm_scale * 1.4426950408889634"}."""

    name: Name = ""
    type: ScalarType
    value: Expr


Arg = Union[Name, ScalarArg]


class Launch(BaseModel):
    kernel: Annotated[str, Field(max_length=1024)]  # room for a mangled C++ name
    grid: list[Expr] = Field(min_length=1, max_length=3)
    block: list[Expr] = Field(min_length=1, max_length=3)
    cluster: list[Expr] | None = Field(default=None, min_length=1, max_length=3)
    shared_bytes: Expr = 0  # dynamic shared memory; the per-kernel limit is raised for you
    # By name: an input/output tensor or buffer (passed as a device pointer), a tensor map
    # (passed by value), an axis (i32) or a task scalar (f32); or a ScalarArg.
    args: list[Arg] = Field(default_factory=list)


class LaunchManifest(BaseModel):
    buffers: list[Buffer] = Field(default_factory=list)
    tensor_maps: list[TensorMap] = Field(default_factory=list)
    launches: list[Launch] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self):
        seen: set[str] = set()
        for n in [b.name for b in self.buffers] + [t.name for t in self.tensor_maps]:
            if n in seen:
                raise ValueError(f"name {n!r} is declared twice (buffers and tensor_maps share one namespace)")
            seen.add(n)
        return self


class Solution(BaseModel):
    language: Literal["cuda", "ptx"]
    source: str
    manifest: LaunchManifest
    name: str = ""

    @field_validator("source")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("kernel source is empty")
        return v

    @property
    def source_filename(self) -> str:
        return "kernel.cu" if self.language == "cuda" else "kernel.ptx"

    def to_dir(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / self.source_filename).write_text(self.source)
        (path / "launch.json").write_text(self.manifest.model_dump_json(indent=2, exclude_defaults=True) + "\n")
        return path

    @classmethod
    def from_dir(cls, path: str | Path) -> "Solution":
        """Load kernel.cu|kernel.ptx + launch.json; raises SolutionError with one clear line."""
        path = Path(path)
        if not path.is_dir():
            raise SolutionError(f"{path}: not a solution folder (expected kernel.cu or kernel.ptx + launch.json)")
        sources = [p for p in (path / "kernel.cu", path / "kernel.ptx") if p.exists()]
        if len(sources) != 1:
            raise SolutionError(f"{path}: expected exactly one of kernel.cu, kernel.ptx; found {len(sources)}")
        manifest_path = path / "launch.json"
        if not manifest_path.exists():
            raise SolutionError(f"{path}: launch.json is missing")
        manifest = parse_manifest(manifest_path.read_text(), where=str(manifest_path))
        language = "cuda" if sources[0].suffix == ".cu" else "ptx"
        try:
            return cls(language=language, source=sources[0].read_text(), manifest=manifest, name=path.name)
        except ValidationError as exc:
            raise SolutionError(f"{sources[0]}: {_first_error(exc)}") from None


class SolutionError(ValueError):
    """A solution that cannot be used; the message is one line meant for a person or a model."""


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors()
    parts = []
    for e in errs[:3]:
        loc = ".".join(str(x) for x in e["loc"]) or "manifest"
        parts.append(f"{loc}: {e['msg']}")
    more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
    return "; ".join(parts) + more


MAX_MANIFEST_CHARS = 100_000  # a real manifest is a few kB


def parse_manifest(text: str, where: str = "launch manifest") -> LaunchManifest:
    """JSON text -> LaunchManifest; raises SolutionError (and nothing else) with one line."""
    if len(text) > MAX_MANIFEST_CHARS:
        raise SolutionError(f"{where}: {len(text)} characters; a manifest may have at most {MAX_MANIFEST_CHARS}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SolutionError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # json's C scanner refuses deep nesting with RecursionError
        raise SolutionError(f"{where}: the JSON is nested too deeply") from None
    try:
        return LaunchManifest.model_validate(data)
    except ValidationError as exc:
        raise SolutionError(f"{where}: {_first_error(exc)}") from None


_FENCE = re.compile(r"```([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```", re.S)
_SOURCE_LANGS = {"cuda": "cuda", "cu": "cuda", "c++": "cuda", "cpp": "cuda", "c": "cuda", "ptx": "ptx", "asm": "ptx"}


def extract_solution(reply: str, language: str | None = None) -> Solution:
    """Parse an LLM reply: one fenced code block with the kernel source, one with the JSON manifest.

    When several source blocks are present the last one wins (models restate drafts);
    raises SolutionError explaining what was missing.
    """
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(reply)]
    if not blocks:
        raise SolutionError("the reply contains no fenced code block; send the kernel in ```cuda``` (or ```ptx```) and the manifest in ```json```")
    manifest_blocks = [b for t, b in blocks if t == "json"]
    source_blocks = [(t, b) for t, b in blocks if t in _SOURCE_LANGS]
    if not source_blocks:  # an untagged block that is not JSON may be the source
        source_blocks = [(t, b) for t, b in blocks if t == "" and not b.lstrip().startswith("{")]
    if not source_blocks:
        raise SolutionError("no kernel source block found: tag it ```cuda``` or ```ptx```")
    if not manifest_blocks:
        manifest_blocks = [b for t, b in blocks if t == "" and b.lstrip().startswith("{")]
    if not manifest_blocks:
        raise SolutionError("no launch manifest found: send it as a ```json``` block")
    tag, source = source_blocks[-1]
    lang = language or _SOURCE_LANGS.get(tag) or ("ptx" if re.search(r"^\s*\.version\s", source, re.M) else "cuda")
    if _SOURCE_LANGS.get(tag) == "ptx" or re.search(r"^\s*\.target\s+sm_", source, re.M):
        lang = "ptx"
    manifest = parse_manifest(manifest_blocks[-1], where="json manifest block")
    try:
        return Solution(language=lang, source=source, manifest=manifest)
    except ValidationError as exc:
        raise SolutionError(_first_error(exc)) from None
