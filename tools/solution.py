"""A solution: kernel source plus a declarative launch manifest.

No model-written host code ever runs. The manifest says which scratch buffers to
allocate, which TMA tensor maps to build (on the host, with cuTensorMapEncodeTiled), and
which kernels to launch in order, with grid/block/cluster as expressions over the task's
axes and `num_sms`. On disk a solution is a folder: kernel.cu or kernel.ptx + launch.json.
In an LLM reply it is fenced blocks, read by `extract_solution` (the reply parser below).
See docs/SOLUTION_FORMAT.md.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator,
                      model_validator)

from tasks.validation_words import plain_validation_errors

# Names are short words; a bounded length keeps every message that quotes one a short line.
Name = Annotated[str, Field(max_length=256)]
DType = Literal["bfloat16", "float16", "float32", "float8_e4m3fn", "int32", "int64", "uint8"]
ScalarType = Literal["i32", "u32", "i64", "u64", "f32"]
Expr = Union[str, int]
Language = Literal["cuda", "ptx"]


# ---------------------------------------------------------------------------------------
# The manifest schema
# ---------------------------------------------------------------------------------------

def unknown_key_message(key: str, known: list[str], what: str) -> str:
    """`unknown key 'shared_byte' in a launch (did you mean 'shared_bytes'?); ...` — one line."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {str(key)[:80]!r} in {what}{hint}; {what} takes: {', '.join(known)}"


class _Strict(BaseModel):
    """A manifest object: a key the schema does not know is an error, never ignored.

    The model writes these files; a misspelt key ("shared_byte") silently ignored would run
    the kernel with the default and blame the kernel for it."""

    model_config = ConfigDict(extra="forbid")
    what: ClassVar[str] = "this object"  # how messages name the object ("a launch")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = list(cls.model_fields)
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(unknown_key_message(key, known, cls.what))
        return data


class Buffer(_Strict):
    """Scratch memory the kernels may use (e.g. dQ accumulators in fp32, semaphores)."""

    what: ClassVar[str] = "a buffer"
    name: Name
    dtype: DType
    shape: list[Expr]
    # zero-filled before every run (timed: a memset on the launch stream), otherwise filled with random bytes,
    # new each run (untimed); an expression picks per workload (nonzero: zeroed), e.g. no memset where a
    # schedule never reads the buffer
    zero: Union[bool, Expr] = True


class TensorMap(_Strict):
    """A TMA descriptor built on the host and passed to the kernel by value (128 bytes).

    `view` reshapes the tensor (row-major, same element count) before encoding, e.g. Q
    [B,H,S,D] viewed as [B*H*S, D]. `view` and `box` are outermost first, like shapes;
    the harness reverses them into the driver's innermost-first order.
    """

    what: ClassVar[str] = "a tensor map"
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


class ScalarArg(_Strict):
    """An explicit by-value argument: {"type": "f32", "value": "sm_scale * 1.4426950408889634"}."""

    what: ClassVar[str] = "a by-value argument"
    name: Name = ""
    type: ScalarType
    value: Expr


def _arg_kind(v: Any) -> str:
    return "by_value" if isinstance(v, (dict, ScalarArg)) else "by_name"


# A name, or an object for a by-value scalar. Routed by shape, so an object with a bad key
# reports that key instead of also "Input should be a valid string".
Arg = Annotated[Union[Annotated[Name, Tag("by_name")], Annotated[ScalarArg, Tag("by_value")]],
                Discriminator(_arg_kind)]


class Launch(_Strict):
    what: ClassVar[str] = "a launch"
    kernel: Annotated[str, Field(max_length=1024)]  # room for a mangled C++ name
    grid: list[Expr] = Field(min_length=1, max_length=3)
    block: list[Expr] = Field(min_length=1, max_length=3)
    cluster: list[Expr] | None = Field(default=None, min_length=1, max_length=3)
    shared_bytes: Expr = 0  # dynamic shared memory; the per-kernel limit is raised for you
    # By name: an input/output tensor or buffer (passed as a device pointer), a tensor map
    # (passed by value), an axis (i32), a task scalar (f32) or an integer `let` name (i32); or a ScalarArg.
    args: list[Arg] = Field(default_factory=list)
    # Whether the launch runs for a workload: an expression, 0 (false) skips it. One manifest can
    # so pick its kernel per shape (a split-K kernel where M is small, one tile path per batch size),
    # as libraries do by heuristics; every workload must run at least one launch.
    when: Expr = 1


# A `let` name: a word, at most MAX_LETS of them (each a bounded expression: tools/expressions.py).
LET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_LETS = 32


class LaunchManifest(_Strict):
    what: ClassVar[str] = "the manifest"
    # Named sizes, evaluated in order per workload over the axes, scalars, num_sms and the names
    # before them ("bn": "128 if N <= 128 else 256"), then usable in every expression below: a
    # design's tile choice written once instead of copied into every grid, box and argument.
    let: dict[str, Expr] = Field(default_factory=dict)
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
        if len(self.let) > MAX_LETS:
            raise ValueError(f"`let` names {len(self.let)} values; at most {MAX_LETS}")
        for n in self.let:
            if not LET_NAME.fullmatch(n):
                raise ValueError(f"`let` name {n[:80]!r} is not a word (letters, digits, _; at most 64)")
            if n in seen:
                raise ValueError(f"`let` name {n!r} is also a buffer or tensor map")
        return self


# ---------------------------------------------------------------------------------------
# A solution and its folder
# ---------------------------------------------------------------------------------------

class Solution(BaseModel):
    language: Language
    source: str
    manifest: LaunchManifest
    name: str = ""
    # How it was read from an LLM reply (which blocks, their languages); None for a folder.
    extraction: "Extraction | None" = Field(default=None, exclude=True)

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
    """A solution that cannot be used; the message is one line meant for a person or a model.

    From `extract_solution`, `extraction` says what the reply held (its blocks, their
    languages); None elsewhere."""

    def __init__(self, message: str, extraction: "Extraction | None" = None):
        super().__init__(message)
        self.extraction = extraction


def _first_error(exc: ValidationError) -> str:
    return plain_validation_errors(exc.errors(), root="manifest")


MAX_MANIFEST_CHARS = 100_000  # a real manifest is a few kB

# JSON strings (kept whole), // and /* */ comments, and commas before a closing bracket:
# the JSONC that editors and models write. One pass each keeps a comment marker inside a
# string ("a//b") a string.
# Every alternative matches where it starts (an unterminated string or comment runs to the end of
# its line or of the text), so each pass is linear however odd the text.
_JSON_STRING = r'"(?:\\.|[^"\\\n])*(?:"|$)'
_JSONC_COMMENT = re.compile(_JSON_STRING + r"|//[^\n]*|/\*.*?(?:\*/|\Z)", re.S | re.M)
_TRAILING_COMMA = re.compile(_JSON_STRING + r"|,(?=\s*[}\]])", re.M)


def strip_jsonc(text: str) -> str:
    """JSONC -> JSON: comments become spaces (line and column numbers stay right), trailing
    commas go."""
    def blank(m: re.Match) -> str:
        s = m.group(0)
        return s if s.startswith('"') else re.sub(r"[^\n]", " ", s)

    text = _JSONC_COMMENT.sub(blank, text)
    return _TRAILING_COMMA.sub(lambda m: m.group(0) if m.group(0).startswith('"') else " ", text)


class ManifestError(SolutionError):
    """The launch manifest is there but wrong (not JSON, not the schema): the kernel's fault, as a
    wrong expression in it is (`agent check` / `agent eval` exit 1, not 2)."""


def parse_manifest(text: str, where: str = "launch manifest") -> LaunchManifest:
    """JSON (or JSONC: comments, trailing commas) text -> LaunchManifest; raises SolutionError
    (and nothing else) with one line."""
    if len(text) > MAX_MANIFEST_CHARS:
        raise ManifestError(f"{where}: {len(text)} characters; a manifest may have at most {MAX_MANIFEST_CHARS}")
    try:
        data = _load_json(text, where)
    except SolutionError as exc:
        raise ManifestError(str(exc)) from None
    try:
        return LaunchManifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(f"{where}: {_first_error(exc)}") from None


def _load_json(text: str, where: str) -> Any:
    try:
        return json.loads(strip_jsonc(text))
    except json.JSONDecodeError as exc:
        raise SolutionError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # json's C scanner refuses deep nesting with RecursionError
        raise SolutionError(f"{where}: the JSON is nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than int() takes (sys.get_int_max_str_digits)
        raise SolutionError(f"{where}: invalid JSON: {str(exc).split(';')[0]}") from None


# ---------------------------------------------------------------------------------------
# The reply parser: LLM text -> Solution
# ---------------------------------------------------------------------------------------
#
# The rules (docs/SOLUTION_FORMAT.md, "In an LLM reply"):
# 1. A fence is a line that starts (after indentation) with ``` or ~~~; it closes on a line
#    of the same fence characters only. ``` elsewhere in a line (prose, a code comment) is
#    text. A ```markdown block that holds fences is read inside (MAX_MARKDOWN_DEPTH levels).
# 2. The manifest is the last JSON block (```json, ```jsonc, or an untagged {...}) with a
#    "launches" key; JSON blocks without it (fragments) never win.
# 3. The kernel source is the source block of the run's language (a reply with only the
#    other language is an error saying what the run takes) that defines the most of the
#    kernels the manifest launches, the last one on a tie; if none defines any, the largest.
#    Untagged blocks count as source only when no block is tagged as source.
# 4. Other source blocks of the same language are joined in when the chosen block needs
#    them (they define a symbol it uses, or a kernel the manifest launches), redefine
#    nothing of it (an earlier draft) and hold no statements outside a function (a
#    fragment), the last such block first (a corrected helper); otherwise they are left out
#    and the note says why.
# 5. A block that never closes (a reply cut off) is used only when no closed block can
#    serve, and then it is an error; so is a JSON block cut off after a kernel restated after
#    the last whole manifest (that manifest is an earlier draft's).

_SOURCE_TAGS: dict[str, Language] = {
    "cuda": "cuda", "cu": "cuda", "cuh": "cuda", "c++": "cuda", "cpp": "cuda", "cxx": "cuda", "cc": "cuda",
    "c": "cuda", "h": "cuda", "hpp": "cuda", "ptx": "ptx", "asm": "ptx", "nvptx": "ptx"}
_JSON_TAGS = {"json", "jsonc", "json5"}
_MARKDOWN_TAGS = {"markdown", "md"}
_OPEN = re.compile(r"^([ \t]*)(`{3,}|~{3,})[ \t]*([^\s`]*)[^`\n]*$")
_PTX_MARKS = re.compile(r"^[ \t]*(?:\.version[ \t]+\d|\.target[ \t]+sm_|"
                        r"(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t])", re.M)
_CUDA_MARKS = re.compile(r"__global__|__device__|^[ \t]*#[ \t]*include\b|extern[ \t]+\"", re.M)  # strings blanked


class ReplyBlock(BaseModel):
    """One fenced block of a reply, as the parser saw it."""

    line: int  # of the opening fence, 1-based
    tag: str  # the fence's first word, lower case ("" when untagged)
    kind: Literal["source", "manifest", "json", "other"]  # manifest = JSON with "launches"
    language: Language | None = None  # source blocks: what the content is (the tag unless it says otherwise)
    kernels: list[str] = Field(default_factory=list)  # source: kernels it defines; manifest: kernels it launches
    chars: int = 0
    closed: bool = True
    used: Literal["source", "helper", "manifest"] | None = None

    def label(self) -> str:
        return f"```{self.tag or '(untagged)'} block at line {self.line}"


class Extraction(BaseModel):
    """What the parser found in a reply and what it used.

    `note` is one line for the model and for people, set when the reply held more than one
    source block or more than one JSON block (which were used, why the others were not), else ""."""

    blocks: list[ReplyBlock] = Field(default_factory=list)
    language: Language | None = None  # of the extracted solution
    run_language: Language | None = None  # what the run takes (None: either)
    note: str = ""

    @property
    def source_blocks(self) -> list[ReplyBlock]:
        return [b for b in self.blocks if b.kind == "source"]

    @property
    def manifest_blocks(self) -> list[ReplyBlock]:
        return [b for b in self.blocks if b.kind == "manifest"]


Solution.model_rebuild()


@dataclass
class _Fenced:
    line: int
    tag: str
    body: str
    closed: bool


# A reply wrapped in a ````markdown block is read inside, and one level more; a markdown block
# deeper than this is an "other" block. Unbounded, each level of a reply built of ever shorter
# fences was a recursion: a RecursionError, not a format error, at ~1,000 levels (a 1.4 MB reply).
MAX_MARKDOWN_DEPTH = 2


def _fenced_blocks(text: str, first_line: int = 1, depth: int = 0) -> list[_Fenced]:
    """Fenced blocks whose fences stand at the start of a line (CommonMark's rule: a closing
    fence is the same character, at least as long, and nothing else on its line)."""
    blocks: list[_Fenced] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, tag = len(m.group(1).expandtabs(4)), m.group(2), m.group(3).lower()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            line = lines[j].expandtabs(4) if indent else lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            j += 1
        closed = j < len(lines)
        text_of_block = "\n".join(body) + ("\n" if body else "")
        wraps = tag in _MARKDOWN_TAGS and re.search(r"^[ \t]*(```|~~~)", text_of_block, re.M)
        if wraps and depth < MAX_MARKDOWN_DEPTH:
            blocks += _fenced_blocks(text_of_block, first_line + i + 1, depth + 1)  # a reply in a markdown block
        else:
            blocks.append(_Fenced(first_line + i, _tag_word(tag), text_of_block, closed))
        i = j + 1
    return blocks


def _tag_word(tag: str) -> str:
    """```cuda, ```{.cuda}, ```kernel.cu, ```launch.json -> cuda, cuda, cu, json."""
    tag = tag.strip("{}.")
    if "." in tag:
        tag = tag.rsplit(".", 1)[1]
    return tag


def _sniff_language(tag: str, body: str) -> Language:
    """The content decides when it is clear (a ```cuda block holding raw PTX is PTX); else the tag."""
    ptx, cuda = bool(_PTX_MARKS.search(body)), bool(_CUDA_MARKS.search(_strip_c_comments(body)))
    if ptx != cuda:
        return "ptx" if ptx else "cuda"
    return _SOURCE_TAGS.get(tag) or ("ptx" if ptx else "cuda")


# ----------------------------------------------------------- symbols of a source block

_C_NOISE = re.compile(r'//[^\n]*|/\*.*?(?:\*/|\Z)|"(?:\\.|[^"\\\n])*(?:"|$)|\'(?:\\.|[^\'\\\n])*(?:\'|$)',
                      re.S | re.M)  # linear: every alternative matches where it starts
_IDENT = re.compile(r"[A-Za-z_]\w*")
_PTX_IDENT = re.compile(r"[A-Za-z_$][\w$]*")
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype", "asm",
                  "__asm__", "volatile", "__launch_bounds__", "__cluster_dims__", "__maxnreg__", "__align__",
                  "alignas", "static_assert", "defined", "do", "else"}


def _strip_c_comments(code: str) -> str:
    return _C_NOISE.sub(lambda m: " " if m.group(0)[0] in "/" else '""', code)


def _closing_parens(code: str) -> dict[int, int]:
    """Index of each '(' -> the index after its ')' (one pass; unbalanced ones are absent)."""
    stack: list[int] = []
    after: dict[int, int] = {}
    for j, ch in enumerate(code):
        if ch == "(":
            stack.append(j)
        elif ch == ")" and stack:
            after[stack.pop()] = j + 1
    return after


_QUALIFIERS = re.compile(r"\s*(?:const|noexcept|override|final|volatile|&|&&|->\s*[\w:<>\s\*&]{1,200}?(?=\{))*\s*")


def _cuda_functions(code: str) -> tuple[set[str], set[str]]:
    """(functions defined, of which kernels) in comment- and string-free CUDA C++."""
    functions: set[str] = set()
    kernels: set[str] = set()
    after = _closing_parens(code)
    for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", code):
        name = m.group(1)
        if name in _NOT_FUNCTIONS or m.end() - 1 not in after:
            continue
        q = _QUALIFIERS.match(code, after[m.end() - 1])
        if q and code.startswith("{", q.end()):
            functions.add(name)
            head = code[max(0, code.rfind(";", 0, m.start()), code.rfind("}", 0, m.start())):m.start()]
            if "__global__" in head:
                kernels.add(name)
    return functions, kernels


def _cuda_symbols(code: str) -> tuple[set[str], set[str]]:
    """(symbols defined, macros among them) in comment- and string-free CUDA C++."""
    functions, _ = _cuda_functions(code)
    macros = set(re.findall(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", code, re.M))
    types = set(re.findall(r"\b(?:struct|class|union|enum(?:\s+class)?)\s+"
                           r"(?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s*)?([A-Za-z_]\w*)\s*(?:final\s*)?[{:]", code))
    aliases = set(re.findall(r"\busing\s+([A-Za-z_]\w*)\s*=", code))
    aliases |= set(re.findall(r"\btypedef\b[^;{}]{0,300}?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*;", code))
    variables = set(re.findall(r"\b(?:constexpr|__constant__|__device__)\b[^;{}()=]{0,300}?\b([A-Za-z_]\w*)"
                               r"\s*(?:=|\[|;|\{)", code))
    return functions | macros | types | aliases | variables, macros


_PTX_DEFS = re.compile(r"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+|\.extern[ \t]+)?"
                       r"(?:\.entry[ \t]+|\.func[ \t]+(?:\([^)]*\)[ \t]*)?)([A-Za-z_$][\w$]*)", re.M)
_PTX_ENTRY = re.compile(r"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]+([A-Za-z_$][\w$]*)", re.M)
_PTX_MODULE_VARS = re.compile(r"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.(?:global|const|shared)\b[^;]{0,300}?"
                              r"([A-Za-z_$][\w$]*)\s*(?:\[[^\]]*\]\s*)*(?:=[^;]*)?;", re.M)
_PTX_HEADER = re.compile(r"^[ \t]*\.(?:version|target|address_size)\b[^\n]*\n?", re.M)


# A fragment ("the key change: for (...) { ... }") shown beside the kernel is no helper: at
# file scope it would not compile. These are what a fragment has outside any braces.
_C_STATEMENT = re.compile(r"\b(?:for|while|if|return|switch|do|break|continue)\b|__syncthreads\s*\(")
_PTX_TOP_LINE = re.compile(r"^\s*(?:$|[.()]|\w+\s*[,)]?\s*$)")


def _top_level(code: str) -> str | None:
    """The text outside all braces; None when the braces do not balance."""
    depth, out = 0, []
    for ch in code:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0:
            out.append(ch)
    return "".join(out) if depth == 0 else None


@dataclass
class _Source:
    """A source candidate with what it defines and uses (for choosing and joining blocks)."""

    index: int  # into the reply's block list
    block: _Fenced
    language: Language
    kernels: set[str] = field(default_factory=set)
    defines: set[str] = field(default_factory=set)
    macros: set[str] = field(default_factory=set)
    uses: set[str] = field(default_factory=set)
    file_scope: bool = False  # balanced, and no statements outside functions: it can stand before another block

    @classmethod
    def read(cls, index: int, block: _Fenced, language: Language) -> "_Source":
        s = cls(index, block, language)
        if language == "cuda":
            code = _strip_c_comments(block.body)
            _, s.kernels = _cuda_functions(code)
            s.defines, s.macros = _cuda_symbols(code)
            s.uses = set(_IDENT.findall(code)) - s.defines
            top = _top_level(code)
            s.file_scope = top is not None and not _C_STATEMENT.search(top)
        else:
            code = re.sub(r"//[^\n]*|/\*.*?(?:\*/|\Z)", " ", block.body, flags=re.S)
            s.kernels = set(_PTX_ENTRY.findall(code))
            s.defines = set(_PTX_DEFS.findall(code)) | set(_PTX_MODULE_VARS.findall(code))
            s.uses = set(_PTX_IDENT.findall(code)) - s.defines
            top = _top_level(code)
            s.file_scope = top is not None and all(_PTX_TOP_LINE.match(x) for x in top.split("\n"))
        return s


def _plain_kernel_name(name: str) -> str:
    """A mangled C++ name (_Z4gemmPKf...) -> gemm; any other name as it is."""
    m = re.match(r"_Z(\d+)", name)
    return name[m.end():m.end() + int(m.group(1))] if m else name


def _join(chosen: _Source, helpers: list[_Source]) -> str:
    """The chosen block with its helpers: in an order where each block follows the blocks
    it uses (reply order otherwise), so C++ sees declarations first; for PTX, after the
    chosen block's .version/.target lines, with the helpers' own header lines dropped."""
    parts = sorted([chosen, *helpers], key=lambda s: s.index)
    ordered: list[_Source] = []
    while parts:
        ready = next((p for p in parts if not any(p.uses & q.defines for q in parts if q is not p)), parts[0])
        ordered.append(ready)
        parts.remove(ready)
    if chosen.language == "cuda":
        return "\n".join(p.block.body.rstrip("\n") + "\n" for p in ordered)
    header = "".join(m.group(0) for m in _PTX_HEADER.finditer(chosen.block.body))
    bodies = [_PTX_HEADER.sub("", p.block.body).strip("\n") + "\n" for p in ordered]
    return header + "\n" + "\n".join(bodies)


def _pick_manifest(blocks: list[_Fenced], json_like: list[int]) -> tuple[int | None, str | None, dict[int, Any]]:
    """(index of the manifest block, error when none can serve, parsed JSON per block)."""
    parsed: dict[int, Any] = {}
    errors: dict[int, str] = {}
    has_launches: list[int] = []
    for i in json_like:
        b = blocks[i]
        try:
            parsed[i] = _load_json(b.body, "")
        except SolutionError as exc:
            errors[i] = str(exc).removeprefix(": ")
        if (isinstance(parsed.get(i), dict) and "launches" in parsed[i]) or (
                i in errors and re.search(r'"launches"\s*:', b.body)):
            has_launches.append(i)
    closed = [i for i in has_launches if blocks[i].closed]
    if closed or has_launches:
        return (closed or has_launches)[-1], None, parsed
    if errors:
        i = list(errors)[-1]
        return None, f"no launch manifest found: the ```{blocks[i].tag or 'json'} block at line {blocks[i].line} " \
                     f"is not valid JSON ({errors[i]})", parsed
    if json_like:
        i = json_like[-1]
        return None, (f"no launch manifest found: the JSON block at line {blocks[i].line} has no \"launches\"; "
                      "send the whole manifest (buffers, tensor_maps, launches) in one ```json block"), parsed
    return None, "no launch manifest found: send it as a ```json block", parsed


# What a run of each language asks for, in a language error.
_SEND = {"cuda": "send CUDA C++ (inline PTX in asm() is welcome) in one ```cuda block",
         "ptx": "send a PTX module (.version, .target, .entry) in one ```ptx block"}
_LANG_WORDS = {"cuda": "CUDA C++", "ptx": "raw PTX"}


def extract_solution(reply: str, language: Language | None = None) -> Solution:
    """Parse an LLM reply into a Solution, by the rules above; `language` is what the run
    takes (a kernel in the other language is a format error), None accepts either.

    Raises SolutionError with one line saying what is missing or wrong and what to send;
    the result's (and the error's) `extraction` says which blocks were found and used."""
    # Line ends as CommonMark reads them (\r\n, and a lone \r, end a line) and as the candidate's folder
    # reads back (universal newlines): a lone \r kept here put a line inside a `//` comment for NVRTC in the
    # reply's kernel (replay) and outside it in the folder's (the loop's judged one).
    fenced = _fenced_blocks(reply.replace("\r\n", "\n").replace("\r", "\n"))
    info = Extraction(run_language=language)
    if not fenced:
        raise SolutionError("the reply contains no fenced code block; send the kernel in ```cuda``` (or ```ptx```) "
                            "and the manifest in ```json```", info)

    any_tagged_source = any(b.tag in _SOURCE_TAGS for b in fenced)
    json_like, sources = [], []
    for i, b in enumerate(fenced):
        untagged_json = b.tag == "" and b.body.lstrip().startswith("{")
        if b.tag in _JSON_TAGS or untagged_json:
            json_like.append(i)
            info.blocks.append(ReplyBlock(line=b.line, tag=b.tag, kind="json", chars=len(b.body), closed=b.closed))
        elif b.tag in _SOURCE_TAGS or (b.tag == "" and not any_tagged_source):
            sources.append(_Source.read(i, b, _sniff_language(b.tag, b.body)))
            info.blocks.append(ReplyBlock(line=b.line, tag=b.tag, kind="source", language=sources[-1].language,
                                          kernels=sorted(sources[-1].kernels), chars=len(b.body), closed=b.closed))
        else:
            info.blocks.append(ReplyBlock(line=b.line, tag=b.tag, kind="other", chars=len(b.body), closed=b.closed))

    if not sources:
        raise SolutionError("no kernel source block found: tag it ```cuda``` or ```ptx```", info)
    usable = [s for s in sources if language is None or s.language == language]
    if not usable:
        other = sources[-1]
        raise SolutionError(f"this run takes {_LANG_WORDS[language]} (--lang {language}), but the kernel is "
                            f"{_LANG_WORDS[other.language]} (the {info.blocks[other.index].label()}): "
                            f"{_SEND[language]}, and the manifest in a ```json block", info)

    m_index, m_error, parsed = _pick_manifest(fenced, json_like)
    for i in json_like:
        data = parsed.get(i)
        if isinstance(data, dict) and "launches" in data or i == m_index:
            info.blocks[i].kind = "manifest"
            if isinstance(data, dict) and isinstance(data.get("launches"), list):
                info.blocks[i].kernels = list(dict.fromkeys(
                    str(lc["kernel"]) for lc in data["launches"] if isinstance(lc, dict) and "kernel" in lc))
    if m_index is None:
        raise SolutionError(m_error or "no launch manifest found", info)
    mblock = fenced[m_index]
    if not mblock.closed:
        raise SolutionError(f"the {info.blocks[m_index].label()} (the manifest) never closes: the reply was cut "
                            "off; send the whole manifest", info)
    # A JSON block cut off after a source block restated after this manifest: that was the
    # restated kernel's manifest. This one is an earlier draft's: run with the new kernel (the
    # last on a tie) it would launch a pair the reply never sent (the new kernel's shared memory
    # and block size with the old launch figures). Where nothing was restated (an unfinished extra
    # after a whole solution), this manifest is the solution's.
    cut = next((i for i in json_like if i > m_index and not fenced[i].closed), None)
    restated = [] if cut is None else [src for src in usable if m_index < src.index < cut]  # (closed: before cut)
    if restated:
        after = info.blocks[restated[-1].index].label()
        raise SolutionError(f"the {info.blocks[cut].label()} never closes: the reply was cut off in the manifest that "
                            f"follows the {after} (the manifest at line {mblock.line} is an earlier draft's, not used "
                            "with it); send the whole manifest", info)
    try:
        manifest = parse_manifest(mblock.body, where=f"json manifest block (line {mblock.line})")
    except SolutionError as exc:
        raise SolutionError(str(exc), info) from None
    info.blocks[m_index].used = "manifest"

    wanted = {_plain_kernel_name(lc.kernel) for lc in manifest.launches}
    closed = [s for s in usable if s.block.closed] or usable
    score = {s.index: len(s.kernels & wanted) for s in closed}
    best = max(score.values())
    if best:
        chosen = [s for s in closed if score[s.index] == best][-1]  # restated drafts: the last one
        why = "defines " + ", ".join(sorted(chosen.kernels & wanted))
    else:
        chosen = max(reversed(closed), key=lambda s: len(s.block.body.strip()))
        why = "the largest; no block defines " + ", ".join(sorted(wanted)) if len(closed) > 1 else ""
    if not chosen.block.closed:
        raise SolutionError(f"the {info.blocks[chosen.index].label()} (the kernel) never closes: the reply was cut "
                            "off; send the whole kernel", info)

    helpers, skipped = _helpers(chosen, [s for s in closed if s is not chosen], wanted)
    info.blocks[chosen.index].used = "source"
    for h in helpers:
        info.blocks[h.index].used = "helper"
    info.language = chosen.language
    info.note = _note(info, chosen, why, helpers, skipped, m_index)
    source = _join(chosen, helpers) if helpers else chosen.block.body
    try:
        return Solution(language=chosen.language, source=source, manifest=manifest, extraction=info)
    except ValidationError as exc:
        raise SolutionError(_first_error(exc), info) from None


def _helpers(chosen: _Source, others: list[_Source], wanted: set[str]) -> tuple[list[_Source], dict[int, str]]:
    """Blocks the chosen one needs (transitively: they define a symbol it uses or a kernel
    the manifest launches), and why needed blocks were left out (block index -> reason).
    The last block that defines a needed symbol is joined, as the last kernel block is chosen:
    a helper restated and corrected is used as corrected, its earlier draft left out."""
    helpers: list[_Source] = []
    skipped: dict[int, str] = {}
    candidates = [s for s in reversed(others) if s.language == chosen.language]
    changed = True
    while changed:
        changed = False
        joined = [chosen, *helpers]
        defined = set().union(*(s.defines for s in joined))
        plain = defined - set().union(*(s.macros for s in joined))  # an identical #define twice is legal
        missing_kernels = wanted - set().union(*(s.kernels for s in joined))
        needed = (set().union(*(s.uses for s in joined)) - defined) | missing_kernels
        for s in candidates:
            if s in helpers or not (s.defines & needed):
                continue
            if clash := (s.defines - s.macros) & plain:
                skipped[s.index] = f"it would define {', '.join(sorted(clash)[:3])} again"
            elif not s.file_scope:
                skipped[s.index] = (f"it defines {', '.join(sorted(s.defines & needed)[:3])} but holds statements "
                                    "outside a function, so it cannot be joined")
            else:
                helpers.append(s)
                skipped.pop(s.index, None)
                changed = True
                break
    joined_plain = set().union(*(h.defines - h.macros for h in helpers))
    for s in candidates:  # a draft of a joined helper, never needed once that was joined: the note says why
        if s not in helpers and s.index not in skipped and (again := (s.defines - s.macros) & joined_plain):
            skipped[s.index] = f"it would define {', '.join(sorted(again)[:3])} again"
    return helpers, skipped


MAX_NOTED_BLOCKS = 6  # the note stays one readable line however many drafts a reply restates


def _note(info: Extraction, chosen: _Source, why: str, helpers: list[_Source], skipped: dict[int, str],
          m_index: int) -> str:
    """One line saying which blocks were used and why the others were not, when the reply
    held more than one source or JSON block; "" otherwise."""
    b = info.blocks
    sources = info.source_blocks
    json_blocks = [x for x in b if x.kind in ("manifest", "json")]
    if len(sources) <= 1 and len(json_blocks) <= 1:
        return ""
    parts = [f"kernel from the {b[chosen.index].label()}" + (f" ({why})" if why else "")]
    if helpers:
        parts[-1] += ", joined with the block" + ("s" if len(helpers) > 1 else "") + " at line " + \
            ", ".join(str(b[h.index].line) for h in helpers)
    if len(json_blocks) > 1:
        parts.append(f"manifest from the {b[m_index].label()} (the last with \"launches\")")
    unused = [(i, x) for i, x in enumerate(b) if x.used is None and x.kind in ("source", "manifest", "json")]
    for i, x in unused[:MAX_NOTED_BLOCKS]:
        reason = _why_unused(x, skipped.get(i), info, chosen)
        parts.append(f"not used: the {x.label()}" + (f" ({reason})" if reason else ""))
    if len(unused) > MAX_NOTED_BLOCKS:
        parts.append(f"{len(unused) - MAX_NOTED_BLOCKS} more blocks not used")
    return f"the reply holds {_count(len(sources), 'source block')} and {_count(len(json_blocks), 'JSON block')}: " \
        + "; ".join(parts)


def _why_unused(x: ReplyBlock, clash: str | None, info: Extraction, chosen: _Source) -> str:
    if not x.closed:
        return "it never closes"
    if x.kind == "manifest":
        return "an earlier manifest"
    if x.kind == "json":
        return 'no "launches"'
    if info.run_language and x.language != info.run_language:
        return f"{_LANG_WORDS[x.language]}; this run takes {_LANG_WORDS[info.run_language]}"
    if clash:
        return clash
    if x.kernels and chosen.kernels & set(x.kernels):
        return f"{'an earlier' if x.line < chosen.block.line else 'a later'} version of " \
            + ", ".join(sorted(chosen.kernels & set(x.kernels)))
    launched = {k for m in info.manifest_blocks if m.used for k in map(_plain_kernel_name, m.kernels)}
    if x.kernels and not set(x.kernels) & launched:
        return "its kernel" + ("s" if len(x.kernels) > 1 else "") + f" {', '.join(x.kernels)} not launched"
    return ""


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
