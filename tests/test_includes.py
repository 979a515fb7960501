"""The include policy (tools/includes.py) on its own, without a compiler: every spelling of a
file-reading directive is found with its line, every header name is read as the preprocessor
would, and the header copy drops what could leave it. (The sandbox tests compile; this is the
policy's mutation-testing suite, fast.)"""
from __future__ import annotations

import os

import pytest

from tools.includes import Include, _drop_unsafe_headers, _inside, _stays_inside, find_includes, refused_includes


def found(src: str) -> list[tuple[int, str, str | None, bool]]:
    return [(i.line, i.directive, i.name, i.quoted) for i in find_includes(src)]


@pytest.mark.parametrize("src, want", [
    ('#include "a.h"\n', [(1, "include", "a.h", True)]),
    ("#include <a.h>\n", [(1, "include", "a.h", False)]),
    ("x\n  #  include_next <b/c.h>\n", [(2, "include_next", "b/c.h", False)]),
    ('#import "m.h"\n#embed "data.bin"\n', [(1, "import", "m.h", True), (2, "embed", "data.bin", True)]),
    ('%:include "d.h"\n', [(1, "include", "d.h", True)]),  # digraph
    ('??=include "t.h"\n', [(1, "include", "t.h", True)]),  # trigraph
    ('#/* c */include/* d\n e */"c.h"\n', [(1, "include", "c.h", True)]),  # comments, even across lines
    ("#\tinclude\f<f.h>\n", [(1, "include", "f.h", False)]),
    ('#inc\\\nlude "s.h"\n', [(1, "include", "s.h", True)]),  # a line splice inside the word
    ('a\\\nb\n#include "after.h"\n', [(3, "include", "after.h", True)]),  # lines counted in the original text
    ('#include \\\n  "n.h"\n', [(1, "include", "n.h", True)]),
    ("#define X 1\n#pragma once\n#if 1\n#endif\n", []),  # other directives read no file
    ("#include MACRO\n", [(1, "include", None, True)]),
    ('#include "unterminated\n.h"\n', [(1, "include", None, True)]),
    ("#include <unterminated\n.h>\n", [(1, "include", None, False)]),
    ('#include "cr\r.h"\n', [(1, "include", None, True)]),
    ("#include /* never closed", [(1, "include", None, True)]),
    ("#\\u0069nclude <x.h>\n", [(1, "\\u0069nclude", None, True)]),  # a \u-spelled directive: refused whatever it is
    ('#if __has_include("h.h")\n#endif\n', [(1, "__has_include", "h.h", True)]),
    ("#if __has_include_next( <h.h> )\n", [(1, "__has_include_next", "h.h", False)]),
    ("#if __has_include\n", [(1, "__has_include", None, True)]),
    ('// #include "in_a_comment.h"\n', [(1, "include", "in_a_comment.h", True)]),  # looks everywhere
    ('\n\n#include "b.h"\n#if __has_include("a.h")\n', [(3, "include", "b.h", True), (4, "__has_include", "a.h", True)]),
])
def test_every_spelling_is_found(src, want):
    assert found(src) == want


def test_a_header_name_is_searched_only_so_far():
    near = '#include "' + "a" * 800 + '"\n'  # 4 x the 200-character limit: still read, then refused for length
    assert found(near)[0][2] == "a" * 800
    assert "longer than 200" in refused_includes(near)[0][1]
    far = '#include "' + "a" * 801 + '"\n'
    assert found(far)[0][2] is None


def test_render_says_what_was_found():
    assert Include(1, "include", "a.h").render() == '#include "a.h"'
    assert Include(1, "include", "a.h", quoted=False).render() == "#include <a.h>"
    assert Include(1, "include", None).render() == "#include <computed>"
    assert Include(1, "__has_include", "a.h", quoted=False).render() == "__has_include(<a.h>)"
    assert Include(1, "__has_include", "a.h").render() == '__has_include("a.h")'


def test_inside():
    assert _inside("/r/a/b.h", "/r") and _inside("/r", "/r") and _inside("/r/x", "/r/")
    assert not _inside("/rx/b.h", "/r") and not _inside("/", "/r")


def test_stays_inside():
    root, inc_dir, here = "/root", "/root/cuda", "/root/cuda/sub"
    assert _stays_inside(Include(1, "include", "a.h"), here, [inc_dir], root)
    assert _stays_inside(Include(1, "include", "../a.h"), here, [inc_dir], root)  # cuda/a.h and a.h: inside
    assert not _stays_inside(Include(1, "include", "../../a.h"), here, [inc_dir], root)  # from cuda/: /a.h
    assert not _stays_inside(Include(1, "include", "../../../a.h"), here, [here], root)
    assert not _stays_inside(Include(1, "include", "/etc/passwd"), here, [inc_dir], root)
    assert not _stays_inside(Include(1, "include", "a\\b.h"), here, [inc_dir], root)
    assert not _stays_inside(Include(1, "include", None), here, [inc_dir], root)
    # a <name> is looked up in the include folders only, not next to the header
    assert _stays_inside(Include(1, "include", "../../x.h", quoted=False), "/root/cuda/a/b", ["/root/cuda/a/b"],
                         root)
    assert not _stays_inside(Include(1, "include", "../../x.h", quoted=True), "/root/cuda/a/b", [inc_dir], root)


def test_header_copy_drops_headers_that_could_leave_it(tmp_path):
    root = tmp_path / "root"
    inc = root / "cuda"
    (inc / "sub").mkdir(parents=True)
    files = {
        "ok.h": '#include "sub/fine.h"\n#include <other.h>\n',
        "sub/fine.h": '#include "../ok.h"\n',  # back up, still inside
        "sub/probe.h": "#if __has_include(MACRO)\n#endif\n",  # only tests existence: kept
        "macro.h": "#include MACRO\n",
        "climbs.h": '#include "../../outside.h"\n',
        "absolute.h": "#include </etc/passwd>\n",
    }
    for name, text in files.items():
        (inc / name).write_text(text)
    dropped = _drop_unsafe_headers(str(root), [str(inc)])
    assert sorted(d.split(":")[0] for d in dropped) == [os.path.join("cuda", n) for n in
                                                        ("absolute.h", "climbs.h", "macro.h")]
    assert "cuda/macro.h: #include <computed> could leave the header folders" in dropped
    assert 'cuda/climbs.h: #include "../../outside.h" could leave the header folders' in dropped
    left = sorted(str(p.relative_to(inc)) for p in inc.rglob("*.h"))
    assert left == ["ok.h", "sub/fine.h", "sub/probe.h"]


def test_edges_of_reading_a_name():
    assert found('#include ""\n') == [(1, "include", "", True)]  # empty: found, then refused by the name rule
    assert "may only use letters" in refused_includes('#include ""\n')[0][1]
    assert found('#include\n"a.h"\n') == [(1, "include", "a.h", True)]  # blank before the name is skipped
    assert found('#include\r"a.h"\n') == [(1, "include", "a.h", True)]
    assert found('#include "\na.h"\n') == [(1, "include", None, True)]  # a name never spans lines
    assert found('#include "\ra.h"\n') == [(1, "include", None, True)]
    assert found('#/**/include/**/"a.h"\n') == [(1, "include", "a.h", True)]  # the shortest comment
    assert found("#Inc\\u006cude <x.h>\n") == [(1, "Inc\\u006cude", None, True)]


def test_lines_after_several_splices():
    src = ('a \\\n#include "one.h"\nlong line \\\n \\\n#include "two.h"\n'
           '#include "three.h" \\\n  more\n#include "four.h"\n')
    assert [(i.line, i.name) for i in find_includes(src)] == [(2, "one.h"), (5, "two.h"), (6, "three.h"),
                                                              (8, "four.h")]
    assert found('x\\\n#include "a.h"\n') == [(2, "include", "a.h", True)]


def test_reasons_in_full():
    helper = "only the CUDA and ptxbench helper headers can be included"
    assert dict((i.name, why) for i, why in refused_includes(
        '#include "/a.h"\n#include "../a.h"\n#include "a b.h"\n#include MACRO\n')) == {
        "/a.h": f"absolute paths are not allowed; {helper}",
        "../a.h": f"'..' is not allowed; {helper}",
        "a b.h": "a header name may only use letters, digits, '_', '.', '+', '-' and '/' between names",
        None: "the header name must be written literally (<name> or \"name\"), not built by a macro",
    }
    assert refused_includes('#include "' + "a" * 198 + '.h"\n') == []  # 200 characters is the limit, allowed
    assert refused_includes('#include "' + "a" * 199 + '.h"\n')[0][1] == "the header name is longer than 200 characters"


def test_where_a_name_is_looked_up():
    root, shallow, deep = "/root", "/root/cuda", "/root/cuda/a/b"
    # <name>: the include folders only; "name": next to the header too
    assert _stays_inside(Include(1, "include", "../../x.h", quoted=False), shallow, [deep], root)
    assert not _stays_inside(Include(1, "include", "../../x.h", quoted=True), shallow, [deep], root)
    assert not _stays_inside(Include(1, "include", "/root/cuda/a.h"), shallow, [deep], root)  # absolute, even inside
    assert _inside("/rX/a.h", "/rX") and _inside("/r/a.h", "/r//")


def test_header_copy_reads_any_bytes(tmp_path):
    inc = tmp_path / "root" / "cuda"
    inc.mkdir(parents=True)
    (inc / "latin1.h").write_bytes(b'// \xff\xfe caf\xe9\n#include "../../outside.h"\n')
    (inc / "fine.h").write_bytes(b"// \xff\n#include <cuda_bf16.h>\n")
    dropped = _drop_unsafe_headers(str(tmp_path / "root"), [str(inc)])
    assert [d.split(":")[0] for d in dropped] == ["cuda/latin1.h"]
    assert sorted(p.name for p in inc.iterdir()) == ["fine.h"]
