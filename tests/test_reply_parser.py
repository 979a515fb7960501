"""The reply parser (tools/solution.py, extract_solution) against a corpus of reply shapes
(tests/corpus/replies/: one reply per file, its expected outcome in cases.toml), plus the
manifest's strict keys (issue 23) and JSONC. Sources the corpus marks `compiles` go through
the real NVRTC and ptxas: a joined helper block must give a module that builds."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tools.solution import (Extraction, Solution, SolutionError, extract_solution, parse_manifest, strip_jsonc)

CORPUS = Path(__file__).resolve().parent / "corpus" / "replies"
CASES = tomllib.loads((CORPUS / "cases.toml").read_text())


def _lines(ex: Extraction, used: str) -> list[int]:
    return [b.line for b in ex.blocks if b.used == used]


def test_every_reply_has_an_expected_outcome():
    files = {p.stem for p in CORPUS.glob("*.md")}
    assert files == set(CASES), (files ^ set(CASES))
    assert len(CASES) >= 25


@pytest.mark.parametrize("name", sorted(CASES))
def test_reply_shape(name):
    case = CASES[name]
    reply = (CORPUS / f"{name}.md").read_text()
    lang = case["lang"] or None
    if "error" in case:
        with pytest.raises(SolutionError) as err:
            extract_solution(reply, lang)
        message = str(err.value)
        assert case["error"] in message, message
        assert "\n" not in message and err.value.extraction is not None
        return
    sol = extract_solution(reply, lang)
    ex = sol.extraction
    assert ex is not None and ex.language == sol.language == case["language"]
    assert _lines(ex, "source") == [case["kernel"]], ex.blocks
    assert _lines(ex, "helper") == case.get("helpers", []), ex.blocks
    assert _lines(ex, "manifest") == [case["manifest"]], ex.blocks
    for text in case.get("contains", []):
        assert text in sol.source, (text, sol.source)
    for text in case.get("excludes", []):
        assert text not in sol.source, (text, sol.source)
    order = case.get("order", [])
    positions = [sol.source.find(t) for t in order]
    assert -1 not in positions and positions == sorted(positions), (order, sol.source)
    note = case.get("note")
    if note == "":
        assert ex.note == ""
    elif note is not None:
        assert "\n" not in ex.note
        for text in note:
            assert text in ex.note, (text, ex.note)


COMPILES = sorted(n for n, c in CASES.items() if c.get("compiles"))


@pytest.mark.parametrize("name", COMPILES)
def test_extracted_source_compiles(name, tmp_path):
    """What the parser hands on (helpers joined, PTX header first) is a module the real
    toolchain builds, holding every kernel the manifest launches."""
    from tools.compile import compile_solution

    case = CASES[name]
    sol = extract_solution((CORPUS / f"{name}.md").read_text(), case["lang"] or None)
    result = compile_solution(sol, "sm_90a")
    assert result.ok, (result.error, sol.source)
    assert {lc.kernel for lc in sol.manifest.launches} <= set(result.kernels)
    back = Solution.from_dir(sol.to_dir(tmp_path / name))  # and it survives its folder
    assert back.source == sol.source and back.manifest == sol.manifest


def test_either_language_when_the_run_does_not_say():
    ptx = extract_solution((CORPUS / "plain_ptx.md").read_text())
    cuda = extract_solution((CORPUS / "plain_cuda.md").read_text())
    assert (ptx.language, cuda.language) == ("ptx", "cuda")


def test_windows_and_old_mac_line_ends():
    reply = (CORPUS / "helpers_split.md").read_text()
    crlf = extract_solution(reply.replace("\n", "\r\n"), "cuda")
    assert crlf.source.replace("\r", "") == extract_solution(reply, "cuda").source
    assert [b.used for b in crlf.extraction.blocks] == ["helper", "source", "manifest"]
    old_mac = extract_solution(reply.replace("\n", "\r"), "cuda")  # a lone \r ends a line too (CommonMark)
    assert old_mac.source == extract_solution(reply, "cuda").source


def test_the_kernel_extracted_is_the_kernel_its_folder_reads_back(tmp_path):
    # A lone \r inside a `//` comment: NVRTC reads the rest of the line as comment, universal newlines
    # (the folder the loop evaluates) as code; `agent replay` compiles the reply's. One kernel for both.
    reply = ('```cuda\nextern "C" __global__ void k(float* C) {\n    C[0] = 1.0f;  // tail\r    C[1] = 2.0f;\n}\n```\n'
             '```json\n{"launches": [{"kernel": "k", "grid": [1], "block": [1], "args": ["C"]}]}\n```\n')
    sol = extract_solution(reply, "cuda")
    back = Solution.from_dir(sol.to_dir(tmp_path / "s"))
    assert back.source == sol.source and "\r" not in sol.source


def test_every_candidate_records_its_language():
    reply = (CORPUS / "both_languages_ptx_run.md").read_text()
    ex = extract_solution(reply, "ptx").extraction
    assert [(b.tag, b.kind, b.language, b.used) for b in ex.blocks] == [
        ("cuda", "source", "cuda", None), ("ptx", "source", "ptx", "source"), ("json", "manifest", None, "manifest")]
    assert ex.run_language == "ptx" and ex.blocks[2].kernels == ["fill"]
    with pytest.raises(SolutionError) as err:  # the error carries what was found too
        extract_solution((CORPUS / "cuda_in_ptx_run.md").read_text(), "ptx")
    assert [b.language for b in err.value.extraction.source_blocks] == ["cuda"]


def test_the_extraction_is_not_written_to_the_folder(tmp_path):
    sol = extract_solution((CORPUS / "manifest_json_with_comments.md").read_text(), "cuda")
    folder = sol.to_dir(tmp_path / "s")
    assert json.loads((folder / "launch.json").read_text())["launches"][0]["kernel"] == "gemm"  # plain JSON
    assert Solution.from_dir(folder).extraction is None


# ---------------------------------------------------------------- the manifest's keys (issue 23)

MANIFEST = {"buffers": [{"name": "ws", "dtype": "float32", "shape": ["M", 4]}],
            "tensor_maps": [{"name": "tmA", "tensor": "A", "box": [128, 64], "swizzle": "128B"}],
            "launches": [{"kernel": "k", "grid": [1], "block": [128],
                          "args": ["tmA", {"type": "f32", "value": "sm_scale"}]}]}


@pytest.mark.parametrize("where, key, message", [
    (lambda m: m, "launch", "manifest: unknown key 'launch' in the manifest (did you mean 'launches'?)"),
    (lambda m: m["buffers"][0], "zeros", "buffers.0: unknown key 'zeros' in a buffer (did you mean 'zero'?)"),
    (lambda m: m["tensor_maps"][0], "swizle",
     "tensor_maps.0: unknown key 'swizle' in a tensor map (did you mean 'swizzle'?)"),
    (lambda m: m["tensor_maps"][0], "l2promotion", "(did you mean 'l2_promotion'?)"),
    (lambda m: m["launches"][0], "shared_byte",
     "launches.0: unknown key 'shared_byte' in a launch (did you mean 'shared_bytes'?)"),
    (lambda m: m["launches"][0], "clusters", "(did you mean 'cluster'?)"),
    (lambda m: m["launches"][0]["args"][1], "valu",
     "launches.0.args.1: unknown key 'valu' in a by-value argument (did you mean 'value'?)"),
    (lambda m: m, "comment",
     "unknown key 'comment' in the manifest; the manifest takes: let, buffers, tensor_maps, launches"),
])
def test_unknown_keys_are_rejected_at_every_level(where, key, message):
    m = json.loads(json.dumps(MANIFEST))
    where(m)[key] = 1
    with pytest.raises(SolutionError) as err:
        parse_manifest(json.dumps(m), where="launch.json")
    text = str(err.value)
    assert text.startswith("launch.json: ") and message in text and "\n" not in text, text
    assert "Value error" not in text and "by_value" not in text


def test_jsonc_in_launch_json_on_disk(tmp_path):
    (tmp_path / "kernel.cu").write_text('extern "C" __global__ void k() {}\n')
    (tmp_path / "launch.json").write_text('{\n  // one block\n  "launches": [{"kernel": "k", "grid": [1], '
                                          '"block": [32], /* no args */},],\n}\n')
    assert Solution.from_dir(tmp_path).manifest.launches[0].block == [32]


def test_jsonc_keeps_strings_whole():
    text = '{"a": "x // not a comment", "b": "/* nor this */", "c": [1, 2,], "d": "\\" // quote"} // end'
    assert json.loads(strip_jsonc(text)) == {"a": "x // not a comment", "b": "/* nor this */", "c": [1, 2],
                                             "d": '" // quote'}
    with pytest.raises(SolutionError, match=r"invalid JSON at line 3 column 1"):  # line numbers survive comments
        parse_manifest('{/* a\nb */\n"launches": }', where="m")


def test_a_real_kernel_split_over_two_blocks_is_joined_and_builds():
    """knowledge/examples/sm_90a/attention_backward.md is written as a person writes a reply:
    kernels 1 and 3 in one block, the wgmma kernel 2 in another, one manifest launching all
    three. "The last block wins" lost two kernels; joined, the module has all three."""
    from tools.compile import compile_solution

    root = Path(__file__).resolve().parents[1]
    sol = extract_solution((root / "knowledge" / "examples" / "sm_90a" / "attention_backward.md").read_text(), "cuda")
    assert [b.used for b in sol.extraction.source_blocks] == ["source", "helper"]
    result = compile_solution(sol, "sm_90a")
    assert result.ok, result.error
    assert {lc.kernel for lc in sol.manifest.launches} == set(result.kernels) == {
        "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq_convert"}
