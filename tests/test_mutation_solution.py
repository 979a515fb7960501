"""The reply parser's parts (tools/solution.py) pinned to exact answers: the symbols a block
defines, how blocks are joined, the note that says which blocks were used and why the others
were not, and the solution folder. tests/test_reply_parser.py drives whole reply shapes from
its corpus; these name the exact words and orders those cases leave open, and are fast enough
to run once per mutant (scripts/mutation.sh)."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tools import solution as S
from tools.solution import LaunchManifest, Solution, SolutionError, extract_solution, parse_manifest

MANIFEST = {"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": ["C"]}]}


def manifest(*kernels: str) -> str:
    return "```json\n" + json.dumps({"launches": [{"kernel": k, "grid": [1], "block": [32]} for k in kernels]}) + "\n```\n"


def cuda(body: str, tag: str = "cuda") -> str:
    return f"```{tag}\n{body.strip()}\n```\n"


def source(code: str, language: str = "cuda", index: int = 0) -> S._Source:
    return S._Source.read(index, S._Fenced(index + 1, language, code, True), language)


# --- symbols ----------------------------------------------------------------------------------

def test_functions_and_kernels():
    code = S._strip_c_comments(
        'extern "C" __global__ void __launch_bounds__(128) k1(float* p) { if (p) p[0] = f(1); }\n'
        "__device__ inline float f(int x) { return x; }\n"
        "struct S { __device__ int get() const { return 1; } };\n"
        "template <int N> __global__ void k2(int* q) { for (int i = 0; i < N; ++i) q[i] = g(i); }\n"
        "__device__ int g(int);\n"
        "auto h(int a) -> int { return a; }\n"
        "__global__ void only_declared(int*);\n")
    functions, kernels = S._cuda_functions(code)
    assert functions == {"k1", "f", "get", "k2", "h"}
    assert kernels == {"k1", "k2"}
    # a kernel's __global__ is looked for since the last ';' or '}' before its name, not further back
    code = "__global__ void a(int* p) { p[0] = 1; }\nvoid b(int* p) { p[0] = 2; }\n"
    assert S._cuda_functions(code) == ({"a", "b"}, {"a"})
    code = "__global__ void a(int* p);\nvoid b(int* p) { p[0] = 2; }\n"
    assert S._cuda_functions(code) == ({"b"}, set())
    code = "__global__ void a(int* p) { p[0] = 1; } void c(int* p) { p[0] = 2; }\n"
    assert S._cuda_functions(code) == ({"a", "c"}, set("a"))
    code = "void B(int* p) { p[0] = 1; }\n__global__ void Kern(int* p) { B(p); }\n"
    assert S._cuda_functions(code) == ({"B", "Kern"}, {"Kern"})
    assert S._cuda_functions("void f(int x { }") == (set(), set())
    # the nearest ';' or '}' bounds the look-back, whichever is later
    code = "int x;\n__global__ void a(int* p);\nint y;\nvoid b(int* p) { p[0] = 2; }\n"
    assert S._cuda_functions(code) == ({"b"}, set())
    code = "void c() { }\n__global__ void a() { }\nvoid b() { }\n"
    assert S._cuda_functions(code) == ({"a", "b", "c"}, {"a"})
    code = "int x;\n__global__ void a() { }\nvoid b() { }\n"
    assert S._cuda_functions(code) == ({"a", "b"}, {"a"})


def test_closing_parens():
    assert S._closing_parens("f(a(b)c)") == {1: 8, 3: 6}
    assert S._closing_parens(")(") == {}
    assert S._closing_parens("((x)") == {1: 4}


def test_symbols_a_block_defines():
    code = S._strip_c_comments(
        "#define TILE 64\n  # define  WIDE(x) (x)\n"
        "struct Pair { int a; };\nclass __align__(16) Vec : public Base { };\nunion U{ int i; };\n"
        "enum class Mode { A };\nstruct Done final { };\nstruct Fwd;\n"
        "using Elem = float;\ntypedef unsigned int U32;\ntypedef float Row[4];\n"
        "constexpr int kDepth = 3;\n__constant__ float table[16];\n__device__ int counter;\n__device__ int Total;\n"
        "__device__ float twice(float x) { return 2 * x; }\n")
    defines, macros = S._cuda_symbols(code)
    assert macros == {"TILE", "WIDE"}
    assert defines == {"TILE", "WIDE", "Pair", "Vec", "U", "Mode", "Done", "Elem", "U32", "Row", "kDepth", "table",
                       "counter", "Total", "twice"}
    # a #define not at a line's start is no definition
    assert S._cuda_symbols("int x; #define LATE 1\n") == (set(), set())


@pytest.mark.parametrize("code,defined", [
    ("#define TILE 64\n", {"TILE"}),
    ("struct Pair { int a; };", {"Pair"}),
    ("using Elem = float;", {"Elem"}),
    ("typedef unsigned int U32;", {"U32"}),
    ("constexpr int kDepth = 3;", {"kDepth"}),
    ("__device__ float twice(float x) { return 2 * x; }", {"twice"}),
])
def test_each_kind_of_definition_alone(code, defined):
    assert S._cuda_symbols(code)[0] == defined


def test_ptx_symbols():
    code = (".version 8.0\n.target sm_90a\n.global .align 4 .u32 counter = 0;\n.const .f32 scale[4];\n"
            ".shared .b8 smem[1024];\n.visible .func (.reg .b32 r) helper(.reg .b32 x)\n{ ret; }\n"
            ".weak .func cleanup()\n{ ret; }\n.visible .entry k$1(.param .u64 p)\n{\n call.uni cleanup, ();\n ret;\n}\n")
    s = source(code, "ptx")
    assert s.kernels == {"k$1"}
    assert s.defines == {"counter", "scale", "smem", "helper", "cleanup", "k$1"}
    assert s.file_scope


def test_what_can_stand_at_file_scope():
    assert source("__device__ int f() { return 1; }\n").file_scope
    assert not source("for (int i = 0; i < 4; ++i) { x += i; }\n").file_scope
    assert not source("__syncthreads();\n").file_scope
    assert not source("__device__ int f() { return 1; }}\n").file_scope  # unbalanced
    assert S._top_level("a{b{c}d}e") == "ae" and S._top_level("a}{") is None and S._top_level("{") is None
    assert not source("ld.global.u32 %r1, [p];\n", "ptx").file_scope
    assert source(".func f()\n{\n ld.global.u32 %r1, [p];\n}\n", "ptx").file_scope


def test_uses_are_what_a_block_names_but_does_not_define():
    s = source("#define T 4\n__device__ float f(float x) { return g(x) * T; }\n")
    assert s.defines == {"T", "f"} and {"g", "x", "float", "return"} <= s.uses and not {"T", "f"} & s.uses


def test_mangled_kernel_names():
    assert S._plain_kernel_name("_Z4gemmPKfS0_Pf") == "gemm"
    assert S._plain_kernel_name("_Z10flash_attnv") == "flash_attn"
    assert S._plain_kernel_name("gemm") == "gemm" and S._plain_kernel_name("x_Z4gemm") == "x_Z4gemm"


# --- joining ----------------------------------------------------------------------------------

def test_join_orders_blocks_after_what_they_use():
    kernel = source('__global__ void k(float* p) { p[0] = f(1.0f) + T; }\n\n\n', index=0)
    helper = source("__device__ float f(float x) { return x; }\n", index=1)
    macro = source("#define T 2\n", index=2)
    assert S._join(kernel, [helper, macro]) == (
        "__device__ float f(float x) { return x; }\n\n#define T 2\n\n"
        "__global__ void k(float* p) { p[0] = f(1.0f) + T; }\n")
    # only the block's trailing newlines go: trailing blanks on its last line are its own
    bare = source("#define HAS_X\n", index=5)
    assert S._join(bare, [source("#define Q 1\n", index=6)]) == "#define HAS_X\n\n#define Q 1\n"
    spaced = source("__device__ int z() { return 0; }  \n\n", index=3)
    assert S._join(spaced, [source("#define Q 1\n", index=4)]) == "__device__ int z() { return 0; }  \n\n#define Q 1\n"
    # blocks that use each other (no order works): reply order
    a = source("__device__ int a(int x) { return b(x); }\n", index=0)
    b = source("__device__ int b(int x) { return a(x); }\n", index=1)
    assert S._join(a, [b]) == a.block.body + "\n" + b.block.body


def test_join_ptx_keeps_one_header():
    head = ".version 8.0\n.target sm_90a\n.address_size 64\n"
    kernel = source(head + "\n.visible .entry k()\n{\n call.uni h, ();\n ret;\n}\n\n", "ptx", 0)
    helper = source(".version 8.0\n.target sm_90a\n\n\t.func h()\n{\n ret;\n}\n// X\n", "ptx", 1)
    assert S._join(kernel, [helper]) == (
        head + "\n" + "\t.func h()\n{\n ret;\n}\n// X\n" + "\n" + ".visible .entry k()\n{\n call.uni h, ();\n ret;\n}\n")


def test_a_kernel_in_two_blocks_is_joined_with_the_note():
    reply = ("First the helper:\n" + cuda("#define SCALE 2.0f\n__device__ float f(float x) { return x * SCALE; }")
             + "then the kernel:\n" + cuda('extern "C" __global__ void k(float* C) { C[0] = f(C[0]); }')
             + manifest("k"))
    sol = extract_solution(reply, "cuda")
    assert sol.source == ("#define SCALE 2.0f\n__device__ float f(float x) { return x * SCALE; }\n\n"
                          'extern "C" __global__ void k(float* C) { C[0] = f(C[0]); }\n')
    assert sol.extraction.note == ("the reply holds 2 source blocks and 1 JSON block: kernel from the ```cuda block "
                                   "at line 7 (defines k), joined with the block at line 2")
    assert [b.used for b in sol.extraction.blocks] == ["helper", "source", "manifest"]


def test_helpers_are_found_transitively_and_named_in_order():
    reply = (cuda('extern "C" __global__ void k(float* C) { C[0] = f(C[0]); }')
             + cuda("__device__ float f(float x) { return g(x); }")
             + cuda("__device__ float g(float x) { return x; }") + manifest("k"))
    sol = extract_solution(reply, "cuda")
    assert sol.extraction.note.endswith("(defines k), joined with the blocks at line 4, 7")
    assert sol.source.index("float g(") < sol.source.index("float f(") < sol.source.index("void k(")


def test_a_second_kernel_the_manifest_launches_is_joined():
    reply = (cuda('extern "C" __global__ void a(float* C) { C[0] = 1; }')
             + cuda('extern "C" __global__ void b(float* C) { C[1] = 2; }') + manifest("a", "b"))
    sol = extract_solution(reply)
    assert "void a(" in sol.source and "void b(" in sol.source
    # both define one launched kernel: the last is chosen, the other joined
    assert sol.extraction.note.endswith("line 4 (defines b), joined with the block at line 1")


def test_blocks_left_out_say_why():
    reply = (cuda('extern "C" __global__ void k(float* C) { C[0] = 0; }')  # draft, line 1
             + cuda("__device__ float f(float x) { return x; }\nfor (int i = 0; i < 2; ++i) { }")  # fragment, 4
             + cuda("__device__ float g(float x) { return x; }\n__device__ float f(float x) { return x; }")  # clash? 8
             + cuda('extern "C" __global__ void k(float* C) { C[0] = f(C[0]) + g(C[0]); }\n'
                    "__device__ float f(float x);")  # line 12: the kernel
             + cuda('extern "C" __global__ void other(float* C) { C[0] = 0; }')  # line 16: not launched
             + cuda('extern "C" __global__ void k(float* C) { C[0] = 2; }')  # line 19: a later version
             + "```json\n{\"grid\": [1]}\n```\n"  # line 22: no launches
             + manifest("k"))  # line 25
    sol = extract_solution(reply, "cuda")
    note = sol.extraction.note
    assert note.startswith("the reply holds 6 source blocks and 2 JSON blocks: kernel from the ```cuda block at "
                           "line 19 (defines k); manifest from the ```json block at line 25 (the last with "
                           "\"launches\"); not used: the ```cuda block at line 1 (an earlier version of k)")
    assert sol.source == 'extern "C" __global__ void k(float* C) { C[0] = 2; }\n'


def test_why_a_block_is_not_used():
    chosen = source('__global__ void k(float* p) { p[0] = 1; }\n', index=0)
    chosen.block.line = 10
    info = S.Extraction(run_language="cuda", blocks=[
        S.ReplyBlock(line=30, tag="json", kind="manifest", kernels=["_Z1kPf", "k2"], used="manifest")])

    def why(**kw):
        block = S.ReplyBlock(**{"line": 5, "tag": "cuda", "kind": "source", "language": "cuda", **kw})
        return S._why_unused(block, kw.pop("clash", None), info, chosen)

    assert why(closed=False, kind="manifest") == "it never closes"
    assert why(kind="manifest") == "an earlier manifest"
    assert why(kind="json") == 'no "launches"'
    assert why(language="ptx") == "raw PTX; this run takes CUDA C++"
    assert S._why_unused(S.ReplyBlock(line=5, tag="cuda", kind="source", language="cuda", kernels=["k"]),
                         "it would define f again", info, chosen) == "it would define f again"
    assert why(kernels=["k", "z"]) == "an earlier version of k"
    assert why(kernels=["k"], line=11) == "a later version of k"
    two = source('__global__ void k(float* p) { }\n__global__ void m(float* p) { }\n', index=0)
    two.block.line = 10
    later = S.ReplyBlock(line=12, tag="cuda", kind="source", language="cuda", kernels=["m", "k"])
    assert S._why_unused(later, None, info, two) == "a later version of k, m"
    assert why(kernels=["k"], line=10) == "a later version of k"
    assert why(kernels=["a", "b"]) == "its kernels a, b not launched"
    assert why(kernels=["a"]) == "its kernel a not launched"
    assert why(kernels=["k2"]) == ""  # launched: nothing to say
    assert why(kernels=[]) == ""
    unused_manifest = S.Extraction(run_language=None, blocks=[
        S.ReplyBlock(line=30, tag="json", kind="manifest", kernels=["a"], used=None)])
    block = S.ReplyBlock(line=5, tag="cuda", kind="source", language="ptx", kernels=["a"])
    assert S._why_unused(block, None, unused_manifest, chosen) == "its kernel a not launched"


def test_counts_in_words():
    assert S._count(1, "source block") == "1 source block"
    assert S._count(0, "JSON block") == "0 JSON blocks" and S._count(2, "JSON block") == "2 JSON blocks"


def test_the_note_lists_at_most_six_unused_blocks():
    drafts = "".join(cuda(f'extern "C" __global__ void v{i}(float* C) {{ C[0] = {i}; }}') for i in range(8))
    sol = extract_solution(drafts + cuda('extern "C" __global__ void k(float* C) { C[0] = 9; }') + manifest("k"))
    note = sol.extraction.note
    assert note.count("not used: ") == 6 and note.endswith("; 2 more blocks not used")
    assert "(its kernel v0 not launched)" in note and "v6" not in note
    six = "".join(cuda(f'extern "C" __global__ void v{i}(float* C) {{ C[0] = {i}; }}') for i in range(6))
    sol = extract_solution(six + cuda('extern "C" __global__ void k(float* C) { C[0] = 9; }') + manifest("k"))
    assert sol.extraction.note.count("not used: ") == 6 and "more blocks" not in sol.extraction.note
    sol = extract_solution(drafts[:drafts.index("```cuda", 1)] * 1
                           + cuda('extern "C" __global__ void k(float* C) { C[0] = 9; }') + manifest("k"))
    assert "more blocks not used" not in sol.extraction.note


def test_no_note_for_one_block_of_each():
    sol = extract_solution(cuda('extern "C" __global__ void k(float* C) { C[0] = 9; }') + manifest("k"))
    assert sol.extraction.note == ""
    sol = extract_solution(cuda('extern "C" __global__ void k(float* C) { C[0] = 9; }') + manifest("k") + manifest("k"))
    assert sol.extraction.note == ("the reply holds 1 source block and 2 JSON blocks: kernel from the ```cuda block at "
                                   "line 1 (defines k); manifest from the ```json block at line 7 (the last with \"launches\"); "
                                   "not used: the ```json block at line 4 (an earlier manifest)")


def test_the_largest_block_when_none_defines_the_kernel():
    small = cuda('extern "C" __global__ void a(float* C) { C[0] = 1; }')
    large = cuda('extern "C" __global__ void b(float* C) { C[0] = 1; C[1] = 2; C[2] = 3; }')
    sol = extract_solution(small + large + small + manifest("k"))
    assert "void b(" in sol.source
    assert "(the largest; no block defines k)" in sol.extraction.note
    # equal sizes: the last
    sol = extract_solution(small + small.replace("void a", "void c") + manifest("k"))
    assert "void c(" in sol.source
    one = extract_solution(small + manifest("z"))
    assert one.extraction.note == "" and "void a(" in one.source


def test_block_labels():
    assert S.ReplyBlock(line=3, tag="", kind="source").label() == "```(untagged) block at line 3"
    assert S.ReplyBlock(line=9, tag="cu", kind="source").label() == "```cu block at line 9"


# --- messages ---------------------------------------------------------------------------------

def _validation_error(data) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        LaunchManifest.model_validate(data)
    return e.value


def test_first_error_names_where_and_counts_the_rest():
    one = _validation_error({"launches": [{"kernel": "k", "grid": [], "block": [1]}]})
    assert S._first_error(one) == "launches.0.grid: must have at least 1 entry"
    # four places (shared_bytes's two errors, one per member of str | int, are one place)
    four = _validation_error({"launches": [{"kernel": 1, "grid": [], "block": [], "shared_bytes": []}]})
    assert len(four.errors()) == 5
    message = S._first_error(four)
    assert message.count("; ") == 2 and message.endswith(" (+1 more)")
    four = _validation_error({"launches": [{"kernel": 1, "grid": [], "block": [], "cluster": []}]})
    assert len(four.errors()) == 4 and S._first_error(four).endswith("; launches.0.block: must have at least 1 entry "
                                                                      "(+1 more)")
    three = _validation_error({"launches": [{"kernel": 1, "grid": [], "block": []}]})
    assert len(three.errors()) == 3 and "more)" not in S._first_error(three)
    assert S._first_error(_validation_error({"launches": []})).startswith("launches: ")
    assert S._first_error(_validation_error([])) .startswith("manifest: ")
    by_value = _validation_error({"launches": [{"kernel": "k", "grid": [1], "block": [1], "args": [{"type": "f64"}]}]})
    assert S._first_error(by_value).startswith("launches.0.args.0.type: ")  # no union tag in the path


def test_unknown_key_message():
    assert S.unknown_key_message("shared_byte", ["kernel", "shared_bytes"], "a launch") == (
        "unknown key 'shared_byte' in a launch (did you mean 'shared_bytes'?); a launch takes: kernel, shared_bytes")
    assert S.unknown_key_message("zzz", ["kernel"], "a launch") == "unknown key 'zzz' in a launch; a launch takes: kernel"
    long = "x" * 100
    assert S.unknown_key_message(long, ["kernel"], "a buffer").startswith(f"unknown key '{'x' * 80}' in a buffer")


def test_manifest_messages():
    with pytest.raises(SolutionError) as e:
        parse_manifest("{", where="launch.json")
    assert str(e.value) == "launch.json: invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes"
    with pytest.raises(SolutionError) as e:
        parse_manifest(" " * 100_001)
    assert str(e.value) == "launch manifest: 100001 characters; a manifest may have at most 100000"
    assert parse_manifest(json.dumps(MANIFEST).ljust(100_000)).launches[0].kernel == "k"  # at the limit
    with pytest.raises(SolutionError) as e:
        parse_manifest("[" * 100_000, where="m")
    assert str(e.value) == "m: the JSON is nested too deeply"
    with pytest.raises(SolutionError) as e:
        parse_manifest('{"launches": []}', where="w")
    assert str(e.value) == "w: launches: must have at least 1 entry"


# json raises a plain ValueError (not JSONDecodeError) for an integer longer than int() takes (4300 digits)
HUGE_INT = '{"launches": [{"kernel": "k", "grid": [1' + "0" * 5000 + '], "block": [32]}]}'


def test_an_integer_too_long_for_int_is_a_solution_error_in_a_manifest_and_a_reply():
    with pytest.raises(SolutionError) as e:
        parse_manifest(HUGE_INT, where="w")
    assert str(e.value) == ("w: invalid JSON: Exceeds the limit (4300 digits) for integer string conversion: "
                            "value has 5001 digits")
    # the reply's manifest: a format error (the agent's loop catches SolutionError, nothing else)
    with pytest.raises(SolutionError) as e:
        extract_solution(KERNEL + f"```json\n{HUGE_INT}\n```\n")
    assert str(e.value).startswith("json manifest block (line 4): invalid JSON: Exceeds the limit")
    assert e.value.extraction is not None
    # an earlier draft's: the last manifest is read as ever
    sol = extract_solution(KERNEL + f"```json\n{HUGE_INT}\n```\n" + manifest("k"))
    assert [b.used for b in sol.extraction.blocks] == ["source", None, "manifest"]


# The `let` rules live in a pydantic validator, a decorated method mutmut 3 does not mutate: these
# pin each rule at its limit (hand mutants of each, docs/BENCHMARKS.md pass 6, fail here).
LET_BASE = {"buffers": [{"name": "ws", "dtype": "float32", "shape": [4]}],
            "tensor_maps": [{"name": "tm", "tensor": "ws", "box": [4]}], **MANIFEST}


@pytest.mark.parametrize("let, message", [
    ({f"v{i}": i for i in range(33)}, "`let` names 33 values; at most 32"),
    ({"a" * 65: 1}, f"`let` name {'a' * 65!r} is not a word (letters, digits, _; at most 64)"),
    ({"9x": 1}, "`let` name '9x' is not a word (letters, digits, _; at most 64)"),
    ({"ok": 1, "x y": 1}, "`let` name 'x y' is not a word (letters, digits, _; at most 64)"),  # the whole name
    ({"ws": 1}, "`let` name 'ws' is also a buffer or tensor map"),
    ({"tm": 1}, "`let` name 'tm' is also a buffer or tensor map"),
])
def test_a_let_name_that_is_not_a_word_or_is_taken_or_one_too_many_is_refused(let, message):
    with pytest.raises(SolutionError) as e:
        parse_manifest(json.dumps({**LET_BASE, "let": let}), where="w")
    assert str(e.value) == f"w: manifest: {message}"


def test_lets_at_their_limits_are_read_in_order_and_a_launch_runs_unless_told():
    let = {f"v{i}": f"{i} + 1" for i in range(31)} | {"_" + "a" * 63: 2}  # 32 names, the last 64 characters
    m = parse_manifest(json.dumps({**LET_BASE, "let": let}))
    assert list(m.let) == list(let) and m.let["v3"] == "3 + 1"
    plain = parse_manifest(json.dumps(MANIFEST))
    assert plain.let == {} and plain.launches[0].when == 1


def test_jsonc():
    text = '{"a": 1, // one\n "b": "x//y", /* two\n lines */ "c": [1, 2,],}'
    out = S.strip_jsonc(text)
    assert [len(x) for x in out.split("\n")] == [len(x) for x in text.split("\n")]  # positions stay
    assert out.split("\n")[0] == '{"a": 1,       ' and out.split("\n")[2] == '          "c": [1, 2 ] }'
    assert json.loads(out) == {"a": 1, "b": "x//y", "c": [1, 2]}
    assert json.loads(S.strip_jsonc('{"s": "a,]"}')) == {"s": "a,]"}


# --- the folder -------------------------------------------------------------------------------

def test_a_solution_folder_round_trips(tmp_path):
    sol = Solution(language="ptx", source=".version 8.0\n", manifest=LaunchManifest.model_validate(MANIFEST))
    where = sol.to_dir(tmp_path / "a" / "b")
    assert where == tmp_path / "a" / "b"
    assert sorted(p.name for p in where.iterdir()) == ["kernel.ptx", "launch.json"]
    text = (where / "launch.json").read_text()
    assert text == json.dumps({"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": ["C"]}]}, indent=2) + "\n"
    sol.to_dir(where)  # again, into the same folder
    back = Solution.from_dir(where)
    assert (back.language, back.source, back.name, back.manifest) == ("ptx", ".version 8.0\n", "b", sol.manifest)


def test_folder_errors(tmp_path):
    with pytest.raises(SolutionError) as e:
        Solution.from_dir(tmp_path / "none")
    assert str(e.value) == f"{tmp_path / 'none'}: not a solution folder (expected kernel.cu or kernel.ptx + launch.json)"
    (tmp_path / "kernel.cu").write_text("x")
    (tmp_path / "kernel.ptx").write_text("x")
    with pytest.raises(SolutionError) as e:
        Solution.from_dir(tmp_path)
    assert str(e.value) == f"{tmp_path}: expected exactly one of kernel.cu, kernel.ptx; found 2"
    (tmp_path / "kernel.ptx").unlink()
    with pytest.raises(SolutionError) as e:
        Solution.from_dir(tmp_path)
    assert str(e.value) == f"{tmp_path}: launch.json is missing"
    (tmp_path / "launch.json").write_text('{"launches": [{"kernel": "k", "grid": [1], "block": [1], "grd": 1}]}')
    with pytest.raises(SolutionError) as e:
        Solution.from_dir(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'launch.json'}: launches.0: Value error, unknown key 'grd'") or \
        str(e.value).startswith(f"{tmp_path / 'launch.json'}: launches.0: unknown key 'grd'")
    (tmp_path / "launch.json").write_text(json.dumps(MANIFEST))
    (tmp_path / "kernel.cu").write_text("  \n")
    with pytest.raises(SolutionError) as e:
        Solution.from_dir(tmp_path)
    assert str(e.value) == f"{tmp_path / 'kernel.cu'}: source: kernel source is empty"
    (tmp_path / "kernel.cu").write_text("__global__ void k() {}\n")
    assert Solution.from_dir(tmp_path).language == "cuda"


def test_notes_without_a_reason():
    """No reason to give: the kernel's block when there is one source block, a block nothing needs."""
    kernel = cuda('extern "C" __global__ void k(float* C) { C[0] = 9; }')
    sol = extract_solution(kernel + manifest("z") + manifest("z"))
    assert sol.extraction.note == ("the reply holds 1 source block and 2 JSON blocks: kernel from the ```cuda block at "
                                   "line 1; manifest from the ```json block at line 7 (the last with \"launches\"); "
                                   "not used: the ```json block at line 4 (an earlier manifest)")
    sol = extract_solution(kernel + cuda("__device__ int unused() { return 0; }") + manifest("k"))
    assert sol.extraction.note == ("the reply holds 2 source blocks and 1 JSON block: kernel from the ```cuda block at "
                                   "line 1 (defines k); not used: the ```cuda block at line 4")


def test_helpers_left_out_name_at_most_three_symbols():
    kernel = cuda('extern "C" __global__ void k(float* C) { C[0] = a(1) + b(2) + c(3) + d(4) + e(5); }\n'
                  "__device__ float a(float x) { return x; }\n__device__ float b(float x) { return x; }\n"
                  "__device__ float c(float x) { return x; }\n__device__ float d(float x) { return x; }")
    clash = cuda("__device__ float a(float x) { return x; }\n__device__ float b(float x) { return x; }\n"
                 "__device__ float c(float x) { return x; }\n__device__ float d(float x) { return x; }\n"
                 "__device__ float e(float x) { return x; }")
    sol = extract_solution(kernel + clash + manifest("k"))
    assert sol.extraction.note.endswith("not used: the ```cuda block at line 8 (it would define a, b, c again)")
    fragment = cuda("__device__ float p(float x) { return x; }\n__device__ float q(float x) { return x; }\n"
                    "__device__ float r(float x) { return x; }\n__device__ float s(float x) { return x; }\n"
                    "for (int i = 0; i < 4; ++i) { }")
    user = cuda('extern "C" __global__ void k(float* C) { C[0] = p(1) + q(2) + r(3) + s(4); }')
    sol = extract_solution(user + fragment + manifest("k"))
    assert sol.extraction.note.endswith("not used: the ```cuda block at line 4 (it defines p, q, r but holds "
                                        "statements outside a function, so it cannot be joined)")


KERNEL = cuda('extern "C" __global__ void k(float* C) { C[0] = 9; }')  # lines 1-3


def _error(reply: str) -> str:
    with pytest.raises(SolutionError) as e:
        extract_solution(reply)
    return str(e.value)


def test_which_json_block_is_the_manifest():
    assert _error(KERNEL) == "no launch manifest found: send it as a ```json block"
    assert _error(KERNEL + "```json\n{\"grid\": [1]}\n```\n") == (
        "no launch manifest found: the JSON block at line 4 has no \"launches\"; send the whole manifest "
        "(buffers, tensor_maps, launches) in one ```json block")
    # "launches" nested deeper is not the manifest's
    assert _error(KERNEL + "```json\n{\"x\": {\"launches\": []}}\n```\n").startswith(
        "no launch manifest found: the JSON block at line 4 has no \"launches\"")
    # invalid JSON: the last such block is named, untagged ones as ```json
    bad = "```json\n{\"a\": }\n```\n" + "```\n{\"b\" 1}\n```\n"
    assert _error(KERNEL + bad) == ("no launch manifest found: the ```json block at line 7 is not valid JSON "
                                    "(invalid JSON at line 1 column 6: Expecting ':' delimiter)")
    assert _error(KERNEL + "```jsonc\n{\"a\": }\n```\n") == (
        "no launch manifest found: the ```jsonc block at line 4 is not valid JSON "
        "(invalid JSON at line 1 column 7: Expecting value)")
    # invalid JSON that has "launches" is the manifest, and its error is the manifest's
    assert _error(KERNEL + "```json\n{\"launches\": [}\n```\n").startswith(
        "json manifest block (line 4): invalid JSON at line 1 column 15")
    # a manifest cut off after a whole one: the whole one
    sol = extract_solution(KERNEL + manifest("k") + '```json\n{"launches": [{"kernel": "k", "grid"')
    assert [b.used for b in sol.extraction.blocks] == ["source", "manifest", None]
    assert _error(KERNEL + '```json\n{"launches": [{"kernel": "k", "grid"') == (
        "the ```json block at line 4 (the manifest) never closes: the reply was cut off; send the whole manifest")
    # cut off after the kernel was restated: that kernel's manifest, so an error, even before "launches"
    for cut in ('```json\n{"launches": [{"kernel": "k", "grid"', "```json\n{"):
        assert _error(KERNEL + manifest("k") + KERNEL + cut) == (
            "the ```json block at line 10 never closes: the reply was cut off in the manifest that follows the ```cuda "
            "block at line 7 (the manifest at line 4 is an earlier draft's, not used with it); send the whole manifest")
    # restated with no manifest after it ("manifest unchanged"): the earlier manifest is the solution's
    assert extract_solution(KERNEL + manifest("k") + KERNEL).extraction.blocks[2].used == "source"


# --- fences and blocks ------------------------------------------------------------------------

def test_fenced_blocks_lines_and_bodies():
    F = S._Fenced
    assert S._fenced_blocks("```cuda\n```\n") == [F(1, "cuda", "", True)]
    assert S._fenced_blocks("```cuda\nA\n```\n") == [F(1, "cuda", "A\n", True)]
    reply = "text\n```cuda\nA\n```\n~~~markdown\nintro\n```json\n{}\n```\n~~~\n```ptx\nB\n"
    assert S._fenced_blocks(reply) == [F(2, "cuda", "A\n", True), F(7, "json", "{}\n", True), F(11, "ptx", "B\n\n", False)]  # the text's last line break is a line



def _wrapped(reply: str, levels: int) -> str:
    """`reply` inside `levels` markdown blocks, each fence one backtick longer than the one inside."""
    for n in range(4, 4 + levels):
        reply = "`" * n + "markdown\n" + reply + "`" * n + "\n"
    return reply


def test_markdown_wrapping_is_read_two_levels_deep():
    F = S._Fenced
    assert S.MAX_MARKDOWN_DEPTH == 2
    assert [b.line for b in S._fenced_blocks(_wrapped(KERNEL + manifest("k"), 2))] == [3, 6]
    assert extract_solution(_wrapped(KERNEL + manifest("k"), 2)).source == KERNEL.split("\n", 1)[1][:-4]
    # a third level is a block of its own, not read inside: its kernel is not found
    assert S._fenced_blocks(_wrapped("```cuda\nA\n```\n", 3)) == [F(3, "markdown", "```cuda\nA\n```\n", True)]
    assert _error(_wrapped(KERNEL + manifest("k"), 3)) == "no kernel source block found: tag it ```cuda``` or ```ptx```"
    # ~1,100 levels (1.2 MB): a format error, not a RecursionError out of the parser
    assert _error(_wrapped(KERNEL + manifest("k"), 1100)).startswith("no kernel source block found")

def test_comments_and_strings_are_blanked():
    assert S._strip_c_comments('a // c\nb /* d\n */ "s;}" \'x\' e') == 'a  \nb   "" "" e'
    assert S._strip_c_comments('"unterminated\nx') == '""\nx'


def test_ptx_comments_hide_definitions():
    s = source(".visible .entry k(.param .u64 p)\n{\n ret; // .entry fake2()\n}\n/* old:\n.visible .entry fake()\n{ ret; }\n*/\n",
               "ptx")
    assert s.kernels == {"k"} and s.defines == {"k"} and s.uses == {"visible", "entry", "param", "u64", "p", "ret"}
    assert not source(".func f()\n{ ret; }\nld.global.u32 %r1, [p];\n", "ptx").file_scope


def test_block_kinds_sizes_and_closing():
    reply = ("```cuda\n" + 'extern "C" __global__ void k(float* C) { C[0] = 9; }\n```\n'  # 1: source
             "```\nint untagged_code;\n```\n"  # 4: untagged beside a tagged source: other
             "```python\nprint(1)\n```\n"  # 7: other
             "```\n\n  {\"launches\": [{\"kernel\": \"k\", \"grid\": [1], \"block\": [1]}]}\n```\n"  # 10: untagged JSON
             "```text\ncut off")  # 14: other, never closes
    sol = extract_solution(reply)
    assert [(b.line, b.kind, b.chars, b.closed, b.used) for b in sol.extraction.blocks] == [
        (1, "source", 53, True, "source"), (4, "other", 19, True, None), (7, "other", 9, True, None),
        (10, "manifest", 62, True, "manifest"), (14, "other", 8, False, None)]
    assert [b.kernels for b in sol.extraction.blocks] == [["k"], [], [], ["k"], []]
    # untagged blocks are the source only when no block is tagged as one; other tags never are
    sol = extract_solution("```\n" + 'extern "C" __global__ void k(float* C) { }\n```\n```python\nx = 1\n```\n'
                           + manifest("k"))
    assert [b.kind for b in sol.extraction.blocks] == ["source", "other", "manifest"]
    assert sol.extraction.blocks[0].language == "cuda"


def test_reply_errors_say_what_to_send():
    assert _error("no fences at all") == ("the reply contains no fenced code block; send the kernel in ```cuda``` "
                                          "(or ```ptx```) and the manifest in ```json```")
    assert _error("```python\nx = 1\n```\n" + manifest("k")) == \
        "no kernel source block found: tag it ```cuda``` or ```ptx```"
    assert _error(manifest("k") + '```cuda\nextern "C" __global__ void k(float* C) {') == (
        "the ```cuda block at line 4 (the kernel) never closes: the reply was cut off; send the whole kernel")
    assert _error("```cuda\n   \n```\n" + manifest("k")) == "source: kernel source is empty"
    # a launch that is not an object is the manifest's error, not a crash
    assert _error(KERNEL + '```json\n{"launches": ["a_kernel"]}\n```\n').startswith(
        "json manifest block (line 4): launches.0: ")
    for reply in ("x", "```python\nx\n```\n", manifest("k") + "```cuda\n__global__ void k(", "```cuda\n \n```\n"
                  + manifest("k")):
        with pytest.raises(SolutionError) as e:
            extract_solution(reply)
        assert isinstance(e.value.extraction, S.Extraction)


def test_the_chosen_block_is_used_as_written():
    body = 'extern "C" __global__ void k(float* C) { C[0] = 9; }\n\n\n'
    assert extract_solution("```cuda\n" + body + "```\n" + manifest("k")).source == body


def test_why_the_kernel_block_was_chosen():
    two = cuda('extern "C" __global__ void a(float* C) { }\nextern "C" __global__ void b(float* C) { }')
    sol = extract_solution(cuda('extern "C" __global__ void a(float* C) { C[0] = 1; }') + two + manifest("b", "a"))
    assert "(defines a, b)" in sol.extraction.note
    sol = extract_solution(KERNEL + KERNEL.replace("void k", "void m") + manifest("z", "j"))
    assert "(the largest; no block defines j, z)" in sol.extraction.note


def test_indented_fences_keep_the_code_indentation():
    reply = "  ```cuda\n  \tA\n    B\n C\n  ```\n```cuda\n\tD\n```\n"
    assert [b.body for b in S._fenced_blocks(reply)] == ["  A\n  B\nC\n", "\tD\n"]
    assert [b.body for b in S._fenced_blocks("~~~~\n~~~\n```\n~~~~~\n")] == ["~~~\n```\n"]


def test_tag_words():
    assert [S._tag_word(t) for t in ("cuda", "{.cuda}", "kernel.cu", "launch.json", "a.b.cu", ".ptx", "")] == [
        "cuda", "cuda", "cu", "json", "cu", "ptx", ""]


def test_the_content_decides_the_language_when_it_is_clear():
    assert S._sniff_language("ptx", 'extern "C" __global__ void k() {}') == "cuda"
    assert S._sniff_language("cuda", ".version 8.0\n.target sm_90a\n") == "ptx"
    assert S._sniff_language("cuda", "// __global__ in a comment\n.entry k()\n") == "ptx"
    # unclear (both or neither): the tag, else PTX only when it has PTX's marks
    assert S._sniff_language("cu", ".version 8.0\n__global__ void k();") == "cuda"
    assert S._sniff_language("", ".version 8.0\n__global__ void k();") == "ptx"
    assert S._sniff_language("", "int x;") == "cuda"
    assert S._sniff_language("asm", "int x;") == "ptx"


def test_a_json_block_cut_off_says_so():
    sol = extract_solution(KERNEL + manifest("k") + '```json\n{"x": 1')
    assert sol.extraction.blocks[2].closed is False
    assert sol.extraction.note.endswith("not used: the ```json block at line 7 (it never closes)")
