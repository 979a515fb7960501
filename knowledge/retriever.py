"""Pick the architecture-doc sections that go into a model's context (the context ablation).

Docs are markdown files under knowledge/docs/<arch>/ (and knowledge/docs/common/ for
every arch) with YAML front matter (title, arch, features, keywords, and optionally `ops`:
the task families, by op type, a doc is written for; a doc without `ops` is for every task).
A *section* is the text under one `## ` heading (the part before the first `## ` is the
doc's intro section). A section may narrow its doc's `ops` with a marker line under its
heading, `<!-- ops: fp8_gemm, fp8_mha_fwd -->`: the FP8 section of a doc written for every
attention task then reaches only the FP8 tasks, in every arm (the marker line itself is not
part of the text). knowledge/examples/ holds worked kernels in the same format: they are
compile-checked like the docs but never retrieved (no arm may hold a ready solution).

The four arms are nested, and differ only in architecture knowledge (everything about the
harness is in the task statement, tasks/describe.py):
  none          nothing;
  docs          the ranked sections below, within `token_budget`;
  docs+headers  the same sections plus the helper-header API of the arch (its own budget,
                `header_budget`, so it never displaces a doc section);
  full          every section of the arch's docs for the task's family, plus the header API,
                within FULL_MODE_BUDGET (and never less than what docs+headers holds).
A separate arm, outside the nesting, measures copying a worked solution:
  docs+example  the docs arm plus the worked example(s) of knowledge/examples written for
                the task's family on this arch (nothing more where there is none).
`Retrieval.parts` says how many tokens and sections each layer added.

The query is the task as a model reads it (`task_query`: the description and the op
type), never the task's id, and `op_type` keeps other families' docs (FP8, GDN) out.

Ranking, in order:
  1. exact matches: a section whose doc declares a requested feature or is written for the
     task's family (`ops` holds its op type), or a feature / ptxas
     message code (C7515 ...) / instruction named in the feedback, or whose own text
     contains an error code found in the feedback. More exact hits rank higher, and a
     hit from the feedback outranks one from the requested features (the feedback is
     about the model's current mistake);
     Above every other section of the docs (on turn 1): the `<!-- core: FEATURE -->` sections of
     each requested feature and of its companions (knowledge/docs/features.yaml: tma needs
     mbarrier), the minimal pipeline a feature cannot be used without;
  2. BM25 (SQLite FTS5's bm25()) over the sections of the arch with query = task + features +
     feedback.
A section reaches a task only if it is written for the task's family (`ops`), its arch (a
section holding an `<!-- arch: X -->` marker is arch X's only) and its variant (`<!-- variants:
d96 -->`: a held-out head dimension's recipe reaches only that variant's tasks). No `<!-- -->`
markup reaches a prompt (Section.text is stripped; Section.source keeps it for the snippet checks).
Sections are added in that order while they fit the token budget, counted with the model's own
tokenizer where litellm knows it (tokenizer_for), else ceil(chars / 4), a marked fallback
(`Retrieval.tokenizer` says which). Ties break on (doc path, section index), so the result is
deterministic.

This module imports nothing of agent/, tools/ or tasks/.
"""
from __future__ import annotations

import functools
import hashlib
import re
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

ROOT = Path(__file__).parent
DOCS_DIR = ROOT / "docs"
INCLUDE_DIR = ROOT / "include"
COMMON = "common"

EXAMPLES_DIR = ROOT / "examples"
HINTS_DIR = ROOT / "hints"  # named pattern docs, added whole on top of any arm (--hint)

Mode = Literal["none", "docs", "docs+headers", "full", "docs+example"]
NESTED_MODES: tuple[str, ...] = ("none", "docs", "docs+headers", "full")  # the ablation's four nested arms
MODES: tuple[str, ...] = NESTED_MODES + ("docs+example",)
FULL_MODE_BUDGET = 200_000  # "full" includes every doc of the arch unless it passes this
HEADER_BUDGET = 4000  # the header API's own budget in docs+headers and full (≈2,600-2,800 tokens per arch today)

_CODE_RE = re.compile(r"\bC\d{4}\b")
_WORD_RE = re.compile(r"[a-z0-9_]+(?:(?:\.|::?)[a-z0-9_]+)*")  # `shared::cta` stays inside its word
# Instruction names in feedback (ptxas errors quote them) -> the feature vocabulary.
_INSTRUCTION_FEATURES = {
    "wgmma": "wgmma", "hgmma": "wgmma", "cp.async.bulk.tensor": "tma", "utmaldg": "tma", "tensormap": "tma",
    "mbarrier": "mbarrier", "setmaxnreg": "setmaxnreg", "stmatrix": "stmatrix", "ldmatrix": "ldmatrix",
    "tcgen05.mma": "tcgen05_mma", "tcgen05.alloc": "tcgen05_alloc", "tcgen05.ld": "tmem", "tcgen05.st": "tmem",
    "tcgen05.cp": "tmem", "tcgen05": "tcgen05_mma", "griddepcontrol": "pdl", "barrier.cluster": "cluster",
    "mapa": "cluster", "cp.async.bulk": "bulk_copy",
}


def estimate_tokens(text: str) -> int:
    """ceil(len/4): the marked fallback where no tokenizer of the model is known (count_tokens)."""
    return (len(text) + 3) // 4


FALLBACK_TOKENIZER = "chars/4"


@functools.lru_cache(maxsize=64)
def tokenizer_for(model: str | None) -> str:
    """The tokenizer a model's budgets are counted with: `litellm:<model>` where litellm knows the
    model's own tokenizer (OpenAI models through tiktoken, the tokenizers litellm bundles:
    Anthropic, DeepSeek), else `chars/4`, the marked fallback (scripted, replayed and unknown
    models; litellm not installed). chars/4 undercounts code-heavy docs: a 6,000 budget is about
    7.7k real tokens of an OpenAI tokenizer."""
    if not model or model == "human" or re.match(r"(scripted|replay):", model):
        return FALLBACK_TOKENIZER
    try:
        import os

        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
        import litellm
        from litellm.utils import huggingface_tokenizer_kind
    except Exception:
        return FALLBACK_TOKENIZER
    bare = model.split("/", 1)[-1]
    known_openai = litellm.model_cost.get(bare, {}).get("litellm_provider") == "openai"
    bundled = huggingface_tokenizer_kind(model) in ("anthropic", "deepseek")  # shipped with litellm: no download
    return f"litellm:{model}" if known_openai or bundled else FALLBACK_TOKENIZER


@functools.lru_cache(maxsize=4096)
def count_tokens(text: str, tokenizer: str = FALLBACK_TOKENIZER) -> int:
    """Tokens of `text` under `tokenizer` (tokenizer_for): litellm's token_counter, or chars/4."""
    if tokenizer == FALLBACK_TOKENIZER or not text:
        return estimate_tokens(text)
    import litellm

    return int(litellm.token_counter(model=tokenizer.removeprefix("litellm:"), text=text))


@dataclass(frozen=True)
class Snippet:
    """A fenced cuda/ptx block of a doc and what the doc says about it (checked by the tests)."""

    doc: str
    heading: str
    language: str  # "cuda" | "ptx"
    source: str
    arch: str
    features: tuple[str, ...]  # must be present in SASS (none for mistake snippets)
    expect: tuple[str, str] | None  # ("error"|"info", code or message text) for mistakes


@dataclass(frozen=True)
class Section:
    doc: str  # path relative to knowledge/docs, e.g. "sm_90a/wgmma.md"
    index: int  # order in the doc (0 = intro)
    heading: str
    text: str  # the markdown a model reads, heading line included, every `<!-- ... -->` markup stripped
    arch: str
    features: tuple[str, ...]
    keywords: tuple[str, ...]
    tokens: int
    ops: tuple[str, ...] = ()  # a section's own `<!-- ops: ... -->` marker: the families it is for; () = the doc's
    source: str = ""  # the markdown as written, markers included (snippets() reads their markers here)
    core: tuple[str, ...] = ()  # `<!-- core: tma -->`: part of the minimal pipeline of these features
    arches: tuple[str, ...] = ()  # `<!-- arch: sm_100a -->` anywhere in it: only for these arches; () = the doc's
    variants: tuple[str, ...] = ()  # `<!-- variants: d96 -->`: only for tasks with one of these tags

    def for_op(self, op_type: str | None) -> bool:
        return op_type is None or not self.ops or op_type in self.ops

    def for_arch(self, arch: str) -> bool:
        return not self.arches or arch in self.arches

    def for_variant(self, tags: frozenset[str] | None) -> bool:
        """A variant-specific section (a head dimension's recipe) reaches only the tasks of that
        variant; `tags` None (`agent knowledge search`) sees everything."""
        return tags is None or not self.variants or bool(tags & set(self.variants))

    @property
    def flat(self) -> str:
        """The text with whitespace runs collapsed (quoted messages may wrap in the markdown)."""
        return " ".join(self.text.split())


@dataclass(frozen=True)
class Doc:
    path: str
    title: str
    arch: str  # the primary arch (the folder); "common" for docs of every arch
    arches: tuple[str, ...]  # every arch the doc applies to (front matter `arch` may be a list)
    features: tuple[str, ...]
    keywords: tuple[str, ...]
    sections: tuple[Section, ...]
    body: str
    ops: tuple[str, ...] = ()  # task op types the doc is for; () = every task
    # a worked example's `solves: {tags: [d128], not: [causal]}`: the variants it solves as written
    solves_tags: tuple[str, ...] = ()
    solves_not: tuple[str, ...] = ()

    def for_op(self, op_type: str | None) -> bool:
        return op_type is None or not self.ops or op_type in self.ops

    def solves(self, tags: frozenset[str] | None) -> bool:
        """Whether this worked example solves, as written, a task with these variant tags (None:
        unknown, as for `agent knowledge search`: yes)."""
        return tags is None or (set(self.solves_tags) <= tags and not set(self.solves_not) & tags)


@dataclass
class SectionRef:
    doc: str
    heading: str
    tokens: int
    score: float
    why: str  # "feature:wgmma", "code:C7515", "bm25", "full"


@dataclass
class Retrieval:
    sections: list[SectionRef] = field(default_factory=list)
    text: str = ""
    tokens: int = 0
    mode: str = "docs"
    truncated: bool = False  # a section or header block was left out for the budget
    # what each layer of the arm added: {"docs": {"tokens", "sections"}, "headers": {...}, "full": {...}}
    parts: dict[str, dict[str, int]] = field(default_factory=dict)
    tokenizer: str = FALLBACK_TOKENIZER  # what every token count here is in (tokenizer_for)
    example: str | None = None  # docs+example: which worked example was served, or why none
    focus: str = "none"  # the feedback's error class (feedback_focus): what turns 2+ add sections for


# ---------------------------------------------------------------- loading

def _front_matter(text: str, where: str) -> tuple[dict, str]:
    if not text.startswith("---\n"):
        raise ValueError(f"{where}: missing YAML front matter")
    end = text.index("\n---\n", 4)
    meta = yaml.safe_load(text[4:end]) or {}
    for key in ("title", "arch", "features", "keywords"):
        if key not in meta:
            raise ValueError(f"{where}: front matter lacks {key!r}")
    return meta, text[end + 5:]


def _split_sections(body: str) -> list[tuple[str, str]]:
    """(heading, text) per `## ` heading, ignoring headings inside code fences."""
    parts: list[tuple[str, list[str]]] = [("", [])]
    in_fence = False
    for line in body.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            parts.append((line[3:].strip(), [line]))
        else:
            parts[-1][1].append(line)
    out = []
    for heading, lines in parts:
        text = "\n".join(lines).strip()
        if not heading:  # intro: the "# Title" line and whatever precedes the first ##
            m = re.search(r"^# (.+)$", text, re.M)
            heading = m[1].strip() if m else "Introduction"
            if not re.sub(r"^# .+$", "", text, flags=re.M).strip():
                continue  # a bare title: the renderer prints it anyway
        if text:
            out.append((heading, text))
    return out


_SECTION_MARKER = {key: re.compile(rf"^<!--\s*{key}\s*:\s*(.*?)\s*-->[ \t]*$", re.M)
                   for key in ("ops", "core", "variants")}
_ARCH_MARKER = re.compile(r"^[ \t]*<!--\s*arch\s*:\s*(\S+?)\s*-->[ \t]*$", re.M)
_MARKUP_LINE = re.compile(r"^[ \t]*<!--.*?-->[ \t]*\n", re.M | re.S)
_MARKUP = re.compile(r"<!--.*?-->", re.S)


def strip_markup(text: str) -> str:
    """The text without doc markup (`<!-- expect: ... -->`, `<!-- arch: ... -->`, any `<!-- -->`):
    markers steer retrieval and the snippet checks; a model never reads them."""
    return _MARKUP.sub("", _MARKUP_LINE.sub("", text + "\n")).strip()


def _section_marker(text: str, key: str, where: str) -> tuple[str, ...]:
    """A section's `<!-- KEY: a, b -->` marker line (under its heading), at most one per key:
    `ops` (the task families it is for, within a doc written for more), `core` (the features
    whose minimal pipeline it teaches: every docs arm requesting them holds it) and `variants`
    (the task variants it is specific to, e.g. a held-out head dimension's recipe)."""
    found = _SECTION_MARKER[key].findall(text)
    if not found:
        return ()
    if len(found) > 1:
        raise ValueError(f"{where}: more than one {key} marker")
    values = tuple(o.strip() for o in found[0].split(",") if o.strip())
    if not values:
        raise ValueError(f"{where}: an empty {key} marker")
    return values


def _section(rel: str, index: int, heading: str, source: str, arch: str, feats: tuple[str, ...],
             kws: tuple[str, ...]) -> Section:
    where = f"{rel}#{heading}"
    ops, core, variants = (_section_marker(source, k, where) for k in ("ops", "core", "variants"))
    # a snippet compiled for one arch only (a mistake shown on the other arch) makes its section
    # that arch's: "wgmma compiled for Blackwell" is no lesson for a Hopper run
    arches = tuple(sorted(set(_ARCH_MARKER.findall(source))))
    text = strip_markup(source)
    return Section(rel, index, heading, text, arch, feats, kws, estimate_tokens(text), ops, source, core,
                   arches, variants)


def _load(folder: Path) -> tuple[Doc, ...]:
    docs = []
    for path in sorted(folder.glob("*/*.md")):
        rel = path.relative_to(folder).as_posix()
        meta, body = _front_matter(path.read_text(), rel)
        feats = tuple(meta.get("features") or ())
        kws = tuple(str(k) for k in (meta.get("keywords") or ()))
        arches = tuple(str(a) for a in meta["arch"]) if isinstance(meta["arch"], list) else (str(meta["arch"]),)
        arch = path.parent.name if path.parent.name in arches else arches[0]
        sections = tuple(_section(rel, i, h, t, arch, feats, kws) for i, (h, t) in enumerate(_split_sections(body)))
        ops = tuple(str(o) for o in (meta.get("ops") or ()))
        solves = meta.get("solves") or {}
        docs.append(Doc(rel, str(meta["title"]), arch, arches, feats, kws, sections, body, ops,
                        tuple(solves.get("tags") or ()), tuple(solves.get("not") or ())))
    return tuple(docs)


@functools.lru_cache(maxsize=1)
def load_docs() -> tuple[Doc, ...]:
    """The retrievable docs (knowledge/docs)."""
    return _load(DOCS_DIR)


@functools.lru_cache(maxsize=1)
def load_examples() -> tuple[Doc, ...]:
    """Worked kernels (knowledge/examples): compile-checked, never retrieved."""
    return _load(EXAMPLES_DIR) if EXAMPLES_DIR.is_dir() else ()


@dataclass(frozen=True)
class Hint:
    """A named pattern doc (knowledge/hints/NAME.md), the seed artifact's ablation variable: one
    pattern at a time, added whole on top of any arm, the none arm included (--hint NAME)."""

    name: str
    title: str
    arches: tuple[str, ...]
    text: str  # the markdown a model reads (markup stripped)


@functools.lru_cache(maxsize=1)
def load_hints() -> dict[str, Hint]:
    out = {}
    for path in sorted(HINTS_DIR.glob("*.md")) if HINTS_DIR.is_dir() else ():
        text = path.read_text()
        end = text.index("\n---\n", 4)
        meta = yaml.safe_load(text[4:end]) or {}
        arches = tuple(meta["arch"]) if isinstance(meta["arch"], list) else (str(meta["arch"]),)
        out[path.stem] = Hint(path.stem, str(meta["title"]), arches, strip_markup(text[end + 5:]))
    return out


def hint_problem(names: list[str] | tuple[str, ...], arch: str) -> str | None:
    """What is wrong with a run's --hint names on `arch`, in one line, or None."""
    hints = load_hints()
    for n in names:
        if n not in hints:
            return f"unknown hint {n!r} (--hint); known: {', '.join(hints) or 'none'} (agent knowledge hints)"
        if arch not in hints[n].arches:
            return f"hint {n!r} is written for {', '.join(hints[n].arches)}, not {arch}"
    if len(set(names)) != len(names):
        return "a hint is named twice (--hint)"
    return None


def hint_block(names: list[str] | tuple[str, ...]) -> str:
    """The named hints, whole, in the order given (the text a prompt carries)."""
    hints = load_hints()
    return "\n\n".join(f"# {hints[n].title}  (hints/{n}.md)\n\n"
                         + hints[n].text.replace(f"# {hints[n].title.split(' (')[0]}", "", 1).strip()
                         for n in names) + ("\n" if names else "")


def docs_for(arch: str, op_type: str | None = None) -> list[Doc]:
    """The arch's own docs first, then the common ones; only those written for `op_type`'s family."""
    docs = [d for d in load_docs() if d.for_op(op_type)]
    return [d for d in docs if arch in d.arches] + [d for d in docs if d.arch in (COMMON, "any")]


def task_variants(name: str, tags: list[str] | tuple[str, ...] = ()) -> list[str]:
    """A task's variant tags for retrieval: its registry tags plus its head dimension as `dNN`
    (`mha_fwd_d96_causal` -> causal, d96), the vocabulary of `<!-- variants: ... -->` markers."""
    dims = re.findall(r"(?:^|_)(d\d+)(?:_|$)", name)
    return sorted(set(tags) | set(dims))


def task_query(description: str, op_type: str, family: str = "") -> str:
    """The retrieval query for a task: what a model reads about it (its description), its family
    ("attention backward") and its op type, also spelled as words (mha_bwd -> "mha bwd"). Never
    the task's id: `mha_bwd_d128` is one term that matches nothing."""
    return " ".join(p for p in (description, family, op_type, op_type.replace("_", " ")) if p)


def knowledge_version(root: Path = ROOT) -> str:
    """sha256 over every file an arm can put into a prompt: the docs (and their companion table),
    the worked examples, the pattern hints and the helper headers (names and bytes). Two runs of
    one arm with different versions read different text under the same arm name (issue 25 rewrote
    most docs); a run's config is the place to record it, as it records the prompt templates' hash."""
    h = hashlib.sha256()
    for sub, pattern in (("docs", "*/*.md"), ("docs", "*.yaml"), ("examples", "*/*.md"), ("hints", "*.md"),
                         ("include", "ptxbench/*.cuh")):
        for path in sorted((root / sub).glob(pattern)):
            h.update(f"{sub}/{path.relative_to(root / sub).as_posix()}".encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def companions() -> dict[str, tuple[str, ...]]:
    """knowledge/docs/features.yaml: feature -> the features it cannot be used without."""
    data = yaml.safe_load((DOCS_DIR / "features.yaml").read_text()) or {}
    return {str(k): tuple(str(x) for x in v) for k, v in (data.get("companions") or {}).items()}


def with_companions(features: list[str] | tuple[str, ...]) -> list[str]:
    """The requested features and, transitively, their companions (requested ones first)."""
    out = list(dict.fromkeys(features))
    i = 0
    while i < len(out):
        out.extend(c for c in companions().get(out[i], ()) if c not in out)
        i += 1
    return out


def known_arches() -> list[str]:
    return sorted({a for d in load_docs() for a in d.arches if a not in (COMMON, "any")})


_MARKER = re.compile(r"<!--\s*(features|expect|arch|nocompile)\s*:?\s*(.*?)\s*-->")


def snippets(doc: Doc | None = None) -> list[Snippet]:
    """Every ```cuda / ```ptx block of the docs with its markers, once per arch it targets.

    Markers are HTML comments on the lines right before the fence:
    `<!-- features: wgmma, tma -->` (overrides the front matter's features),
    `<!-- expect: info C7515 -->` / `<!-- expect: error <message text> -->` (a mistake: the
    compiler must say exactly that), `<!-- arch: sm_100a -->`, `<!-- nocompile -->`.
    Without a features marker a working snippet must show the doc's front-matter features.
    Snippets are compile-and-SASS checks (tests/test_knowledge.py), not claims of a result; the
    worked examples, which do claim one, also run on the GPU (tests/gpu/test_knowledge_examples_gpu.py).
    """
    out = []
    for d in ([doc] if doc else load_docs() + load_examples()):
        arch_defaults = [a for a in d.arches if a not in (COMMON, "any")] or ["sm_90a"]
        for sec in d.sections:
            lines = sec.source.splitlines()
            i = 0
            while i < len(lines):
                m = re.match(r"```(cuda|ptx)\s*$", lines[i])
                if not m:
                    i += 1
                    continue
                markers: dict[str, str] = {}
                j = i - 1
                while j >= 0 and (lines[j].strip() == "" or _MARKER.fullmatch(lines[j].strip())):
                    mm = _MARKER.fullmatch(lines[j].strip())
                    if mm:
                        markers.setdefault(mm[1], mm[2])
                    j -= 1
                end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
                src = "\n".join(lines[i + 1:end]) + "\n"
                i = end + 1
                if "nocompile" in markers:
                    continue
                expect = None
                if "expect" in markers:
                    sev, _, what = markers["expect"].partition(" ")
                    expect = (sev, what.strip())
                feats = tuple(f.strip() for f in markers["features"].split(",") if f.strip()) \
                    if "features" in markers else (() if expect else d.features)
                # a raw-PTX snippet names its own .target; a CUDA one is checked on every arch of the doc
                ptx_target = re.search(r"^\s*\.target\s+(sm_\w+)", src, re.M) if m[1] == "ptx" else None
                arches = [markers["arch"]] if "arch" in markers else ([ptx_target[1]] if ptx_target else arch_defaults)
                for arch in arches:
                    out.append(Snippet(d.path, sec.heading, m[1], src, arch, feats, expect))
    return out


# ---------------------------------------------------------------- helper headers

def _first_sentence(comment_lines: list[str]) -> str:
    text = " ".join(comment_lines)
    m = re.search(r"^(.+?[.;:])(\s+[A-Z(`]|$)", text)
    return (m[1] if m else text)[:240]


def header_arches(path: Path) -> tuple[str, ...] | None:
    """The arches a header is for: its first line says "sm_90a only" / "sm_100a only"; None = every arch."""
    first = path.read_text().split("\n", 1)[0]
    m = re.search(r"\b(sm_\d+a) only\b", first)
    return (m[1],) if m else None


def _starts_declaration(lines: list[str], i: int) -> bool:
    """A helper function (`PTXBENCH_DEVICE`, after a `template <...>` on its line or the line
    above) or an enum starts at line i."""
    s = lines[i].strip()
    if s.startswith(("PTXBENCH_DEVICE", "enum ")):
        return True
    return s.startswith("template") and ("PTXBENCH_DEVICE" in s or
                                         (i + 1 < len(lines) and lines[i + 1].strip().startswith("PTXBENCH_DEVICE")))


def _declaration(lines: list[str], i: int) -> tuple[str, int]:
    """The declaration starting at line i, whole however many lines it wraps over (a function up
    to its parameter list's closing parenthesis, an enum up to its closing brace), and the
    index of the line after it."""
    text, j = "", i
    while j < len(lines):
        text = (text + " " + lines[j].strip()).strip()
        j += 1
        if text.startswith("enum "):
            if "}" in text:
                return text[:text.index("}") + 1], j
            continue
        if "(" in text:
            depth = 0
            for k in range(text.index("("), len(text)):
                depth += {"(": 1, ")": -1}.get(text[k], 0)
                if depth == 0:
                    return text[:k + 1].replace("PTXBENCH_DEVICE ", ""), j
    return text.replace("PTXBENCH_DEVICE ", ""), j


@functools.lru_cache(maxsize=8)
def header_api(arch: str | None = None) -> str:
    """The helper headers' API for `arch` (every header when None): each function signature
    with the comment above it. A header for another arch (wgmma.cuh on sm_100a) is left out."""
    parts = ["## Helper headers (#include <ptxbench/NAME.cuh>, namespace ptxbench)"]
    for path in sorted(INCLUDE_DIR.glob("ptxbench/*.cuh")):
        only = header_arches(path)
        if arch is not None and only is not None and arch not in only:
            continue
        lines = path.read_text().splitlines()
        head = []
        for ln in lines:
            if not ln.startswith("//"):
                break
            head.append(ln[2:].strip())
        summary = _first_sentence(head).split(" -- ", 1)[-1] if head else ""
        parts.append(f"\n### <ptxbench/{path.name}>\n{summary}")
        comment: list[str] = []
        i = 0
        while i < len(lines):
            s = lines[i].strip()
            if s.startswith("//"):
                comment.append(s[2:].strip())
                i += 1
                continue
            if _starts_declaration(lines, i):
                sig, i = _declaration(lines, i)
                parts.append(f"- `{sig}`" + (f" — {_first_sentence(comment)}" if comment else ""))
            else:
                i += 1
            comment = []
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- ranking

def _terms(text: str) -> list[str]:
    words = _WORD_RE.findall(text.lower())
    out = []
    for w in words:
        out.append(w)
        if "." in w or ":" in w:  # wgmma.mma_async -> also wgmma, mma_async
            out.extend(p for p in re.split(r"[.:]+", w) if p)
    return out


class _BM25:
    """Okapi BM25 from SQLite's FTS5 (its `bm25()` rank function: k1 = 1.2, b = 0.75), over
    documents already split into our terms (`_terms`: `wgmma.mma_async` is one term and also
    `wgmma`, `mma_async`), so the FTS5 tokenizer keeps `.`, `:` and `_` inside tokens. A query
    term repeated weighs more (the query repeats the requested features and the feedback). The
    standard library's sqlite3 has FTS5; nothing to install, the same on the GPU host."""

    def __init__(self, corpus: list[list[str]]):
        self.n = len(corpus)
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.lock = threading.Lock()
        self.db.execute("CREATE VIRTUAL TABLE s USING fts5(body, tokenize = \"unicode61 tokenchars '._:'\")")
        self.db.executemany("INSERT INTO s(rowid, body) VALUES (?, ?)",
                            [(i, " ".join(toks)) for i, toks in enumerate(corpus)])
        self.vocab = {t for toks in corpus for t in toks}

    def scores(self, query: list[str]) -> list[float]:
        """BM25 of every section (0 where no term matches). FTS5's bm25() of an OR query is the
        sum of its phrases' contributions, so a term that occurs c times in the query is asked
        once, in the group of terms occurring c times, and that group's score is weighed by c:
        the same sum as repeating it, without the cost of a query thousands of phrases long."""
        out = [0.0] * self.n
        counts: dict[str, int] = {}
        for q in query:
            if q in self.vocab:  # a term no section holds adds nothing
                counts[q] = counts.get(q, 0) + 1
        groups: dict[int, list[str]] = {}
        for q, c in counts.items():
            groups.setdefault(c, []).append(f'"{q}"')
        with self.lock:
            for c, phrases in groups.items():
                for rowid, score in self.db.execute("SELECT rowid, -bm25(s) FROM s WHERE s MATCH ?",
                                                    (" OR ".join(phrases),)):
                    out[rowid] += c * max(0.0, score)
        return out


def eligible(section: Section, arch: str, op_type: str | None, variants: frozenset[str] | None) -> bool:
    """Whether a section of the arch's docs may reach this task at all (its family, its arch, its variant)."""
    return section.for_op(op_type) and section.for_arch(arch) and section.for_variant(variants)


@functools.lru_cache(maxsize=64)
def _index(arch: str, op_type: str | None = None,
           variants: frozenset[str] | None = None) -> tuple[tuple[Section, ...], _BM25]:
    sections = tuple(s for d in docs_for(arch, op_type) for s in d.sections if eligible(s, arch, op_type, variants))
    corpus = [_terms(s.text + " " + " ".join(s.keywords) + " " + " ".join(s.features)) for s in sections]
    return sections, _BM25(corpus)


_MSG_RE = re.compile(r"(?:error|fatal)\s*(?:\(C\d+\))?\s*:\s*(?:(?:ptx )?line \d+:\s*)?(.+)$", re.I)


def feedback_messages(feedback: str | None) -> list[str]:
    """Compiler error messages quoted in the feedback, without tool / line prefixes."""
    out = []
    for line in (feedback or "").splitlines():
        m = _MSG_RE.search(line.strip())
        if m and len(m[1].strip()) >= 12 and "aborted due to errors" not in m[1]:
            out.append(" ".join(m[1].split()).rstrip("."))
    return sorted(set(out))


_DIAG_RE = re.compile(r"^\s*(?:-\s*)?(nvrtc|ptxas)\s+(error|warning|info)\b(?:\s*\((C\d{4})\))?\s*:", re.I)
# A PTX instruction quoted on a diagnostic line (in its message or in the `[ptx: ...]` quote)
_CONSTRUCT_RE = re.compile(r"\b((?:wgmma|mbarrier|tcgen05|cp\.async|cp\.reduce\.async|fence|setmaxnreg|stmatrix|"
                           r"ldmatrix|elect|griddepcontrol|barrier\.cluster|mapa|tensormap|ld\.shared|st\.shared|"
                           r"mma|ldgsts)(?:\.[a-z0-9_:]+)+|setmaxnreg|mapa)", re.I)
_NOT_CARRIED_RE = re.compile(r"^\s*-\s*`(\w+)`:\s*(MISSING|in the SASS but never executed|executed, but did not carry)",
                             re.M)
SERIALIZATION_CODES = re.compile(r"\bC75\d\d\b|\bC7508\b")


@dataclass(frozen=True)
class FeedbackFocus:
    """What a turn's feedback is about, so the docs added after it follow its error class:
    compile_error (the construct on the failing line, the error's message and code), serialization
    (ptxas's C75xx performance notes: the sections on those codes), carried_work (a requested
    instruction missing, never executed or not carrying the work: that feature's pipeline), other
    (a wrong or slow result: BM25 over the feedback, no exact hits)."""

    kind: str
    text: str  # what the BM25 query reads: the failing lines, not the whole feedback
    codes: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    constructs: tuple[str, ...] = ()
    features: tuple[str, ...] = ()


def feedback_focus(feedback: str | None) -> FeedbackFocus:
    if not feedback or not feedback.strip():
        return FeedbackFocus("none", "")
    lines = feedback.splitlines()
    diags = [(m, ln) for ln in lines if (m := _DIAG_RE.match(ln))]
    errors = [ln for m, ln in diags if m[2].lower() == "error"]
    if errors:
        text = "\n".join(errors)
        constructs = tuple(dict.fromkeys(c.lower() for ln in errors for c in _CONSTRUCT_RE.findall(ln)))
        feats = tuple(sorted({f for key, f in _INSTRUCTION_FEATURES.items() if key in text.lower()}))
        return FeedbackFocus("compile_error", text, tuple(sorted(set(_CODE_RE.findall(text)))),
                             tuple(feedback_messages(text)), constructs, feats)
    serial = [ln for m, ln in diags if m[3] and SERIALIZATION_CODES.search(m[3])]
    if serial:
        text = "\n".join(serial)
        return FeedbackFocus("serialization", text, tuple(sorted(set(_CODE_RE.findall(text)))))
    missing = _NOT_CARRIED_RE.findall(feedback)
    if missing:
        feats = tuple(sorted({f for f, _ in missing}))
        text = "\n".join(ln for ln in lines if _NOT_CARRIED_RE.match(ln))
        return FeedbackFocus("carried_work", text, features=feats)
    return FeedbackFocus("other", feedback)


FOCUS_KINDS = ("compile-error", "serialization", "carried-work")


def follows_feedback(why: str) -> bool:
    """Whether a section was ranked for the feedback's error class (its `why` names the class):
    the only sections a turn after the first adds."""
    return any(part.startswith(k + ":") for part in why.split() for k in FOCUS_KINDS)


def _code_of(text: str) -> str:
    return "\n".join(re.findall(r"```(?:cuda|ptx)\n(.*?)```", text, re.S)).lower()


def _construct_hit(construct: str, code: str) -> int:
    """How many dot-separated parts of the failing construct a section's code shows (at least
    two: `wgmma.mma_async`, not a bare `wgmma`), 0 if none."""
    parts = construct.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in code:
            return n
    return 0


def _rank(task: str, arch: str, features: list[str], feedback: str | None,
          op_type: str | None = None, variants: frozenset[str] | None = None) -> list[tuple[Section, float, str]]:
    sections, bm25 = _index(arch, op_type, variants)
    family_docs = {d.path for d in load_docs() if op_type is not None and op_type in d.ops}
    focus = feedback_focus(feedback)
    fb_codes, fb_msgs = set(focus.codes), list(focus.messages)
    # a carried-work failure asks for the pipeline of the features that failed, and their companions
    fb_feats = set(with_companions(list(focus.features))) if focus.kind == "carried_work" else set(focus.features)
    req = set(with_companions(features))
    query = _terms(" ".join([task, *features, *features, focus.text, focus.text]))
    bm = bm25.scores(query)
    top = max(bm) if bm and max(bm) > 0 else 1.0
    ranked = []
    for sec, b in zip(sections, bm):
        exact, why = 0.0, []
        # feedback first: the current mistake matters most, and only what its error class points at
        # (a syntax error is no reason for the serialization sections)
        kind = focus.kind.replace("_", "-")
        codes = [c for c in sorted(fb_codes) if re.search(rf"\b{c}\b", sec.text)]
        if codes:
            exact += 4 + len(codes)
            why.append(f"{kind}:code:" + ",".join(codes))
        msgs = [m for m in fb_msgs if m in sec.flat]
        if msgs:
            exact += 4 + len(msgs)
            why.append(f"{kind}:message:{len(msgs)}")
        if focus.constructs:
            code = _code_of(sec.text)
            hits = {c: _construct_hit(c, code) for c in focus.constructs}
            best = max(hits.values())
            if best:
                exact += 4 + best / 10
                why.append(f"{kind}:construct:" + max(hits, key=hits.get).rsplit(".", max(0, len(
                    max(hits, key=hits.get).split(".")) - best))[0])
        if focus.kind == "carried_work":
            pipeline = sorted(fb_feats & set(sec.core))
            if pipeline:
                exact += 4
                why.append("carried-work:core:" + ",".join(pipeline))
        fbf = sorted(fb_feats & set(sec.features))
        if fbf:
            exact += 2
            why.append(f"{kind}:feature:" + ",".join(fbf))
        core = sorted(req & set(sec.core))
        if core:  # the minimal pipeline of a requested feature: above any other section of the docs
            exact += 3
            why.append("core:" + ",".join(core))
        rq = sorted(req & set(sec.features))
        if rq:
            exact += 1  # flat: BM25 decides among the sections of requested features
            why.append("feature:" + ",".join(rq))
        if sec.doc in family_docs or (op_type is not None and op_type in sec.ops):  # written for this family
            exact += 1
            why.append(f"family:{op_type}")
        # bm25 is normalised to [0, 1) so it orders within an exact tier, never across tiers
        score = exact + 0.99 * b / top
        ranked.append((sec, score, " ".join(why) if why else "bm25"))
    ranked.sort(key=lambda x: (-round(x[1], 9), x[0].doc, x[0].index))
    return ranked


def _render(sections: list[Section]) -> str:
    """Sections grouped per doc (in ranked order of first appearance), each doc under its title."""
    titles = {d.path: d.title for d in load_docs()}
    by_doc: dict[str, list[Section]] = {}
    for s in sections:
        by_doc.setdefault(s.doc, []).append(s)
    parts = []
    for doc, secs in by_doc.items():
        parts.append(f"# {titles[doc]}  ({doc})")
        parts.extend(s.text if s.index else s.text.replace(f"# {titles[doc]}", "", 1).strip() or "" for s in secs)
    return "\n\n".join(p for p in parts if p) + "\n"


def _ranked_selection(task: str, arch: str, features: list[str], feedback: str | None, budget: int,
                      op_type: str | None, variants: frozenset[str] | None = None,
                      tz: str = FALLBACK_TOKENIZER) -> tuple[list[Section], list[SectionRef], bool]:
    """The docs arm: ranked sections added in order while they (and their doc titles) fit `budget`."""
    titles = {d.path: d.title for d in load_docs()}
    chosen, refs, truncated = [], [], False
    used = 0
    seen_docs: set[str] = set()
    for sec, score, why in _rank(task, arch, features, feedback, op_type, variants):
        if score <= 0:
            break
        title_cost = 0 if sec.doc in seen_docs else count_tokens(f"# {titles[sec.doc]}  ({sec.doc})", tz) + 1
        tokens = count_tokens(sec.text, tz)
        if used + tokens + title_cost + 1 > budget:
            truncated = True
            continue
        chosen.append(sec)
        seen_docs.add(sec.doc)
        used += tokens + title_cost + 1
        refs.append(SectionRef(sec.doc, sec.heading, tokens, round(score, 4), why))
    return chosen, refs, truncated


def _headers(arch: str, budget: int, tz: str = FALLBACK_TOKENIZER) -> tuple[str, bool]:
    """The arch's header API if it fits its own budget; else as many whole headers as fit."""
    api = header_api(arch)
    if count_tokens(api, tz) <= budget:
        return api, False
    blocks = api.split("\n### ")
    kept = blocks[0]
    for b in blocks[1:]:
        if count_tokens(kept + "\n### " + b, tz) > budget:
            return kept + "\n(Some helper headers were left out for the budget.)\n", True
        kept += "\n### " + b
    return kept, True


def retrieve(task: str, arch: str, features: list[str], feedback: str | None = None, mode: Mode = "docs",
             token_budget: int = 12000, op_type: str | None = None, header_budget: int = HEADER_BUDGET,
             variants: list[str] | tuple[str, ...] | None = None, model: str | None = None,
             hints: list[str] | tuple[str, ...] = ()) -> Retrieval:
    """Doc sections for a model writing `task` on `arch` (see the module docstring).

    `task` is the query text (task_query() for a benchmark task); `op_type` restricts the docs
    to those written for that task family (None: every doc, as `agent knowledge search` does);
    `variants` are the task's variant tags (task_variants()): a section written for one variant
    (a head dimension's recipe) reaches only tasks that carry its tag (None: every section);
    `model` picks the tokenizer the budgets and counts are in (tokenizer_for; None: chars/4);
    `hints` (load_hints) are added whole after the arm's text, outside its budget, in any arm."""
    if mode not in MODES:
        raise ValueError(f"unknown knowledge mode {mode!r} (use one of {', '.join(MODES)})")
    if mode == "none" or token_budget <= 0:
        out = Retrieval(mode=mode, parts={}, tokenizer=tokenizer_for(model))
    else:
        out = _retrieve(task, arch, features, feedback, mode, token_budget, op_type, header_budget, variants, model)
    out.focus = feedback_focus(feedback).kind
    if hints:  # one named pattern at a time (the seed's variable), on top of whatever the arm holds
        block = hint_block(hints)
        out.parts["hints"] = {"tokens": count_tokens(block, out.tokenizer), "sections": len(hints)}
        out.sections = out.sections + [SectionRef(f"hints/{n}.md", load_hints()[n].title,
                                                  count_tokens(load_hints()[n].text, out.tokenizer), 0.0, f"hint:{n}")
                                       for n in hints]
        out.text = (out.text.rstrip("\n") + "\n\n" + block) if out.text else block
        out.tokens = count_tokens(out.text, out.tokenizer)
    return out


def _retrieve(task: str, arch: str, features: list[str], feedback: str | None, mode: str, token_budget: int,
              op_type: str | None, header_budget: int, variants: list[str] | tuple[str, ...] | None,
              model: str | None) -> Retrieval:
    tags = frozenset(variants) if variants is not None else None
    tz = tokenizer_for(model)
    tok = functools.partial(count_tokens, tokenizer=tz)
    chosen, refs, truncated = _ranked_selection(task, arch, features, feedback, token_budget, op_type, tags, tz)
    parts = {"docs": {"tokens": tok(_render(chosen)) if chosen else 0, "sections": len(chosen)}}
    if mode == "docs":
        text = _render(chosen) if chosen else ""
        return Retrieval(refs, text, tok(text), mode, truncated, parts, tz)
    if mode == "docs+example":
        family = [d for d in load_examples() if op_type is not None and op_type in d.ops and arch in d.arches]
        examples = [d for d in family if d.solves(tags)]  # pasted into a variant it does not solve, it fails
        notes = [f"served examples/{d.path}" for d in examples] + [
            f"examples/{d.path} left out: it solves {', '.join(d.solves_tags) or 'every variant'}"
            + (f" (not {', '.join(d.solves_not)})" if d.solves_not else "") + " as written"
            for d in family if d not in examples]
        block = "\n\n".join(f"# {d.title}  (examples/{d.path})\n\n{strip_markup(d.body)}" for d in examples)
        parts["example"] = {"tokens": tok(block) if block else 0, "sections": len(examples)}
        refs = refs + [SectionRef(f"examples/{d.path}", d.title, tok(strip_markup(d.body)), 0.0, "example")
                       for d in examples]
        text = "\n".join(t for t in (_render(chosen) if chosen else "", block) if t)
        return Retrieval(refs, text, tok(text), mode, truncated, parts, tz,
                         "; ".join(notes) or f"no worked example for {op_type} on {arch}")

    api, api_cut = _headers(arch, header_budget, tz)
    parts["headers"] = {"tokens": tok(api), "sections": api.count("\n### ")}
    if mode == "docs+headers":
        text = (_render(chosen) + "\n" + api) if chosen else api
        return Retrieval(refs, text, tok(text), mode, truncated or api_cut, parts, tz)

    # full: the docs arm's sections first (so full holds everything docs+headers holds, whatever
    # the feedback ranked), then every other section of the family's docs in doc order.
    picked = {(s.doc, s.index) for s in chosen}
    truncated = False  # what the docs arm left out for its budget, full adds back
    limit = max(token_budget, FULL_MODE_BUDGET)
    used = sum(tok(s.text) for s in chosen)
    extra: list[Section] = []
    for d in docs_for(arch, op_type):
        for s in d.sections:
            if (s.doc, s.index) in picked or not eligible(s, arch, op_type, tags):
                continue
            if used + tok(s.text) > limit:
                truncated = True
                continue
            extra.append(s)
            used += tok(s.text)
    refs = refs + [SectionRef(s.doc, s.heading, tok(s.text), 0.0, "full") for s in extra]
    docs_text = _render(_doc_order(chosen + extra, arch, op_type))
    parts["full"] = {"tokens": tok(docs_text) - parts["docs"]["tokens"], "sections": len(extra)}
    text = docs_text + "\n" + api
    if truncated:
        text += f"\n(Some sections were left out: the full docs exceed {limit} tokens.)\n"
    total = tok(text)
    text = f"(All {len(chosen) + len(extra)} sections of the {arch} docs for this task and the helper headers: " \
           f"about {total} tokens.)\n\n" + text
    return Retrieval(refs, text, tok(text), mode, truncated or api_cut, parts, tz)


def _doc_order(sections: list[Section], arch: str, op_type: str | None) -> list[Section]:
    """Sections in the order of the docs (the arch's own docs first) and of each doc."""
    order = {d.path: i for i, d in enumerate(docs_for(arch, op_type))}
    return sorted(sections, key=lambda s: (order.get(s.doc, len(order)), s.index))
