"""Which headers a candidate may include, and the private copy NVRTC reads them from.

The policy, enforced twice:
1. Before compiling, `refused_includes` scans the candidate's text for every directive that
   reads a file (#include, #include_next, #import, #embed, also spelled with %: or ??=, with
   comments or line splices inside) and every __has_include. Each must name a header
   literally, as a relative path without `..` (`<cuda_bf16.h>`, `"ptxbench/wgmma.cuh"`);
   a macro-built name, an absolute path or a `..` is refused with one error naming the
   directive. The scan looks everywhere, comments and strings included, so there is no
   lexer to fool: it may refuse a commented-out include, it never misses a real one.
2. NVRTC's only include folders are copies of the CUDA headers and the helper headers in a
   private temp folder (`header_root`), passed with --no-source-include, and the compile
   runs confined to that folder (tools/sandbox.py). The copies contain no symlinks, and a
   header that itself includes by macro, or reaches outside its tree with `..`, is left
   out, so a relative name without `..` can only resolve inside the copy.
Copies also keep machine paths out of diagnostics and PTX: the root's path is stripped
from both, so headers read as `cuda/cuda_bf16.hpp` or `helpers/ptxbench/wgmma.cuh`.
"""
from __future__ import annotations

import atexit
import bisect
import os
import posixpath
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

# A header name a candidate may write: relative, '/'-separated, each part starting with a
# letter, digit or underscore (so no '.', '..', empty part, leading '/', or backslash).
_HEADER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.+\-]*)*\Z")
_MAX_NAME = 200
_READS_FILES = ("include", "include_next", "import", "embed")
_SPLICE = re.compile(r"\\[ \t\f\v]*(?:\r\n|\r|\n)")  # backslash-newline (gcc also allows spaces before the newline)
_HASH = re.compile(r"#|%:|\?\?=")  # '#', its digraph and its trigraph
_BLANK = " \t\f\v\r\n\ufeff"


@dataclass(frozen=True)
class Include:
    """One file-reading directive (or __has_include) as found in the text."""

    line: int
    directive: str  # "include", "include_next", "import", "embed", "__has_include"
    name: str | None  # the header name, None when it is not written literally
    quoted: bool = True  # "name" rather than <name>

    def render(self) -> str:
        if self.name is None:
            return f"#{self.directive} <computed>"
        arg = f'"{self.name}"' if self.quoted else f"<{self.name}>"
        return f"{self.directive}({arg})" if self.directive.startswith("__") else f"#{self.directive} {arg}"


def refused_includes(source: str) -> list[tuple[Include, str]]:
    """Every include in `source` that the policy refuses, with the reason."""
    out = []
    for inc in find_includes(source):
        why = _why_refused(inc.name)
        if why:
            out.append((inc, why))
    return out


def _why_refused(name: str | None) -> str | None:
    if name is None:
        return "the header name must be written literally (<name> or \"name\"), not built by a macro"
    if len(name) > _MAX_NAME:
        return f"the header name is longer than {_MAX_NAME} characters"
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        return "absolute paths are not allowed; only the CUDA and ptxbench helper headers can be included"
    if ".." in name.replace("\\", "/").split("/"):
        return "'..' is not allowed; only the CUDA and ptxbench helper headers can be included"
    if not _HEADER_NAME.match(name):
        return "a header name may only use letters, digits, '_', '.', '+', '-' and '/' between names"
    return None


def find_includes(source: str) -> list[Include]:
    """All file-reading directives and __has_include uses in `source`, anywhere in it.

    Line splices are removed first (as the preprocessor does), so `#inc\\<newline>lude`
    is found; line numbers are those of the original text."""
    text, splice_at = _splice(source)

    def line_of(pos: int) -> int:
        return 1 + text.count("\n", 0, pos) + bisect.bisect_right(splice_at, pos)

    # Skipping more blank than the preprocessor does (newlines, lone CRs) only finds more.
    found: list[Include] = []
    for m in _HASH.finditer(text):
        i = _skip_blank(text, m.end())
        word = re.match(r"[A-Za-z_\\][\w\\]*", text[i:i + 64])
        if word and "\\" in word[0]:  # a directive name spelled with \u escapes: refuse, whatever it is
            found.append(Include(line_of(m.start()), word[0], None))
        elif word and word[0] in _READS_FILES:
            name, quoted = _header_name(text, _skip_blank(text, i + len(word[0])))
            found.append(Include(line_of(m.start()), word[0], name, quoted))
    for m in re.finditer(r"__has_include(?:_next)?", text):
        i = _skip_blank(text, m.end())
        name, quoted = (None, True)
        if text.startswith("(", i):
            name, quoted = _header_name(text, _skip_blank(text, i + 1))
        found.append(Include(line_of(m.start()), m[0], name, quoted))
    return sorted(found, key=lambda inc: inc.line)


def _splice(source: str) -> tuple[str, list[int]]:
    """Remove backslash-newlines; return the text and, for each removed newline, the
    position in the new text where it was (to map positions back to original lines)."""
    parts, where, pos, removed = [], [], 0, 0
    for m in _SPLICE.finditer(source):
        parts.append(source[pos:m.start()])
        removed += m.start() - pos
        where.append(removed)
        pos = m.end()
    parts.append(source[pos:])
    return "".join(parts), where


def _skip_blank(text: str, i: int) -> int:
    """Skip whitespace and /* */ comments (which may span lines even inside a directive)."""
    n = len(text)
    while i < n:
        c = text[i]
        if c in _BLANK:
            i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                return n
            i = end + 2
        else:
            return i
    return n


def _header_name(text: str, i: int) -> tuple[str | None, bool]:
    """The literal header name at text[i] ("name" or <name> on one line), else None."""
    close = {'"': '"', "<": ">"}.get(text[i:i + 1])
    if close is None:
        return None, True
    end = text.find(close, i + 1, i + 2 + 4 * _MAX_NAME)
    if end < 0 or "\n" in text[i + 1:end] or "\r" in text[i + 1:end]:
        return None, close == '"'
    return text[i + 1:end], close == '"'


# ---------------------------------------------------------------- the private header root

@dataclass(frozen=True)
class HeaderRoot:
    """A private copy of the allowed header trees: `dirs` are the -I folders inside `path`."""

    path: str
    dirs: tuple[str, ...]
    left_out: tuple[str, ...]  # headers not copied, and why (symlinks out, computed includes)


_lock = threading.Lock()
_roots: dict[tuple, tuple[tuple, HeaderRoot]] = {}  # trees -> (signature, copy)
_base: str | None = None


def header_root(trees: list[tuple[str, str]]) -> HeaderRoot:
    """A private copy of `trees` ([(label, source folder)]), one subfolder per label.

    Cached per process and rebuilt when a file in a tree changes (size or mtime), so an
    edited helper header is seen at the next compile; old copies stay until exit because
    a concurrent compile may still read them."""
    key = tuple((label, str(Path(src).resolve())) for label, src in trees)
    signature = tuple(_signature(src) for _, src in key)
    with _lock:
        cached = _roots.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        root = _build(key)
        _roots[key] = (signature, root)
        return root


def _signature(src: str) -> tuple:
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for f in sorted(filenames):
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            out.append((dirpath, f, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _base_dir() -> str:
    global _base
    if _base is None:
        _base = tempfile.mkdtemp(prefix="ptxbench-headers-")
        atexit.register(shutil.rmtree, _base, True)
    return _base


def _build(key: tuple) -> HeaderRoot:
    path = tempfile.mkdtemp(dir=_base_dir())
    left_out: list[str] = []
    dirs = []
    for label, src in key:
        dest = os.path.join(path, label)
        os.makedirs(dest)
        left_out += _copy_tree(src, dest, label)
        dirs.append(dest)
    left_out += _drop_unsafe_headers(path, dirs)
    return HeaderRoot(path, tuple(dirs), tuple(left_out))


def _copy_tree(src: str, dest: str, label: str) -> list[str]:
    """Copy regular files; a symlink is copied as the file it points to only when that
    file is inside `src` (so the copy has no links and nothing from elsewhere)."""
    left_out = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        for d in list(dirnames):
            if os.path.islink(os.path.join(dirpath, d)):
                dirnames.remove(d)
                left_out.append(f"{label}/{os.path.join(rel_dir, d)}: a symlinked folder")
        os.makedirs(os.path.join(dest, rel_dir), exist_ok=True)
        for f in filenames:
            s = os.path.join(dirpath, f)
            real = os.path.realpath(s)
            if not (os.path.isfile(real) and _inside(real, os.path.realpath(src))):
                left_out.append(f"{label}/{os.path.normpath(os.path.join(rel_dir, f))}: links outside its folder")
                continue
            shutil.copyfile(real, os.path.join(dest, rel_dir, f))
    return left_out


def _drop_unsafe_headers(root: str, include_dirs: list[str]) -> list[str]:
    """Remove copied headers whose own includes are built by macros (a candidate could
    define the macro) or climb out of the root with '..'. (Removing a header never makes
    another unsafe: the others just fail to find it.)"""
    dropped = []
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            p = os.path.join(dirpath, f)
            try:
                text = Path(p).read_text(errors="replace")
            except OSError:
                continue
            # __has_include only tests existence: a header may build its argument with a macro
            bad = next((inc for inc in find_includes(text) if inc.directive in _READS_FILES
                        and not _stays_inside(inc, dirpath, include_dirs, root)), None)
            if bad:
                os.remove(p)
                dropped.append(f"{os.path.relpath(p, root)}: {bad.render()} could leave the header folders")
    return dropped


def _stays_inside(inc: Include, from_dir: str, include_dirs: list[str], root: str) -> bool:
    if inc.name is None or inc.name.startswith("/") or "\\" in inc.name:
        return False
    bases = ([from_dir] if inc.quoted else []) + include_dirs
    return all(_inside(posixpath.normpath(posixpath.join(b, inc.name)), root) for b in bases)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
