"""Which docs reach which arch (knowledge/retriever.py), checked against the docs' own front
matter read here from disk, not against the retriever's parse of it.

Issue 46's planted bug: docs written for both arches (`arch: [sm_90a, sm_100a]`) but filed under
knowledge/docs/sm_90a/ left out of sm_100a, so every sm_100a docs arm lost TMA, mbarrier,
clusters and warp specialization. The rule, for every doc and every arch: a doc reaches an arch
exactly when its front matter names that arch (or it is a common doc), whatever folder holds it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from knowledge import retriever as kr

DOCS = Path(kr.__file__).resolve().parent / "docs"
ARCHES = ("sm_90a", "sm_100a")


def front_matter_arches() -> dict[str, tuple[str, ...]]:
    """doc path (relative to knowledge/docs) -> the arches its front matter names."""
    out = {}
    for path in sorted(DOCS.glob("*/*.md")):
        text = path.read_text()
        meta = yaml.safe_load(text[4:text.index("\n---\n", 4)])
        arch = meta["arch"]
        out[path.relative_to(DOCS).as_posix()] = tuple(arch) if isinstance(arch, list) else (arch,)
    return out


def expected_docs(arch: str) -> list[str]:
    """The arch's docs (any folder) in path order, then the common ones."""
    fm = front_matter_arches()
    return [p for p, a in fm.items() if arch in a] + [p for p, a in fm.items() if a == ("common",)]


def test_docs_written_for_both_arches_live_under_sm_90a():
    """The case the rule exists for is real: these docs sit in sm_90a/ and teach sm_100a too."""
    both = {p for p, a in front_matter_arches().items() if set(a) == set(ARCHES)}
    assert {"sm_90a/tma.md", "sm_90a/mbarrier.md", "sm_90a/clusters_pdl_fences.md",
            "sm_90a/warp_specialization.md"} <= both


@pytest.mark.parametrize("arch", ARCHES)
def test_every_doc_reaches_exactly_the_arches_its_front_matter_names(arch):
    assert [d.path for d in kr.docs_for(arch)] == expected_docs(arch)
    assert sorted(kr.known_arches()) == sorted(ARCHES)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_full_arm_holds_every_section_of_the_arch_and_nothing_else(arch):
    """`full` (every section of the arch's docs, no family filter) as the retriever renders it."""
    r = kr.retrieve("a kernel", arch, [], mode="full", op_type=None)
    assert not r.truncated
    assert {s.doc for s in r.sections} == set(expected_docs(arch))
    # every section of those docs but the ones marked for the other arch (`<!-- arch: X -->`, issue 41)
    sections = sum(1 for d in kr.docs_for(arch) for s in d.sections if s.for_arch(arch))
    assert 0 < sections < sum(len(d.sections) for d in kr.docs_for(arch))  # the shared docs hold both arches' marks
    assert len(r.sections) == sections


def test_the_sm_100a_gemm_arm_teaches_tma_and_mbarrier():
    """The agent's own retrieval for the seed GEMM on sm_100a (docs arm, as `agent solve` calls
    it) draws on the shared TMA/mbarrier docs, and the full arm holds all four shared docs."""
    from tasks import get_task

    task = get_task("gemm_n7168_k5120")
    query = kr.task_query(task.description, task.op_type, task.op_family)
    docs = kr.retrieve(query, "sm_100a", ["tcgen05_mma", "tma"], mode="docs", token_budget=6000,
                       op_type=task.op_type)
    assert {"sm_90a/tma.md", "sm_90a/mbarrier.md"} & {s.doc for s in docs.sections}
    full = kr.retrieve(query, "sm_100a", ["tcgen05_mma", "tma"], mode="full", op_type=task.op_type)
    assert {"sm_90a/tma.md", "sm_90a/mbarrier.md", "sm_90a/clusters_pdl_fences.md",
            "sm_90a/warp_specialization.md"} <= {s.doc for s in full.sections}
    assert "sm_90a/wgmma.md" not in {s.doc for s in full.sections}  # wgmma does not exist on sm_100a


# ---------------------------------------------------------------------------------------
# The filters every arm goes through, one rule at a time (for mutation testing: the loaders are
# cached, so each test here starts from the files on disk).
# ---------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _fresh_caches():
    for f in (kr.load_docs, kr.load_examples, kr.load_hints, kr.companions, kr._index, kr.header_api):
        f.cache_clear()
    yield


def section(**kw) -> "kr.Section":
    base = dict(doc="sm_90a/x.md", index=1, heading="h", text="t", arch="sm_90a", features=(), keywords=(), tokens=1)
    return kr.Section(**{**base, **kw})


def test_a_section_reaches_a_task_of_its_family_arch_and_variant_only():
    """A section marked for families, arches or variants reaches only those; unmarked, every task;
    op_type or tags None (`agent knowledge search`) sees everything."""
    s = section(ops=("mha_fwd", "mha_bwd"), arches=("sm_100a",), variants=("d96", "d64"))
    assert s.for_op("mha_bwd") and not s.for_op("gemm") and s.for_op(None)
    assert s.for_arch("sm_100a") and not s.for_arch("sm_90a")
    assert s.for_variant(frozenset({"causal", "d64"})) and not s.for_variant(frozenset({"d128"}))
    assert s.for_variant(None) and not s.for_variant(frozenset())
    plain = section()
    assert plain.for_op("gemm") and plain.for_arch("sm_90a") and plain.for_variant(frozenset())
    assert kr.eligible(s, "sm_100a", "mha_fwd", frozenset({"d96"}))
    for arch, op, tags in (("sm_90a", "mha_fwd", {"d96"}), ("sm_100a", "gemm", {"d96"}), ("sm_100a", "mha_fwd", {"d1"})):
        assert not kr.eligible(s, arch, op, frozenset(tags)), (arch, op, tags)


def test_a_doc_is_for_its_families_and_an_example_solves_only_its_variants():
    doc = kr.Doc(path="p", title="t", arch="sm_90a", arches=("sm_90a",), features=(), keywords=(), sections=(),
                 body="", ops=("gemm",), solves_tags=("d128",), solves_not=("causal",))
    assert doc.for_op("gemm") and not doc.for_op("mha_fwd") and doc.for_op(None)
    assert kr.Doc(**{**doc.__dict__, "ops": ()}).for_op("mha_fwd")
    assert doc.solves(frozenset({"d128"})) and doc.solves(None)
    assert not doc.solves(frozenset({"d128", "causal"})) and not doc.solves(frozenset({"d96"}))


def test_the_arch_docs_come_first_then_the_common_ones_of_the_family():
    docs = kr.docs_for("sm_90a", "gemm")
    common = [d for d in docs if d.arch == "common"]
    assert common and docs[-len(common):] == common
    assert all(d.for_op("gemm") for d in docs)
    assert {d.path for d in kr.docs_for("sm_90a", None)} > {d.path for d in docs}  # other families' too
    assert kr.known_arches() == ["sm_100a", "sm_90a"]


def test_a_task_asks_by_its_words_and_its_variant_tags():
    assert kr.task_query("GEMM C = A B^T", "gemm", "matrix multiply") == "GEMM C = A B^T matrix multiply gemm gemm"
    assert kr.task_query("", "mha_bwd") == "mha_bwd mha bwd"
    assert kr.task_variants("mha_fwd_d96_causal", ["causal", "held_out_variant"]) == ["causal", "d96", "held_out_variant"]
    assert kr.task_variants("d64_mha") == ["d64"] and kr.task_variants("mha_d128") == ["d128"]
    assert kr.task_variants("gemm_n7168_k5120") == [] and kr.task_variants("mha_dd96") == []


def test_a_feature_brings_its_companions_transitively_requested_first():
    """knowledge/docs/features.yaml: TMA completes through an mbarrier; tcgen05.mma needs mbarrier,
    tensor memory and its allocation; tensor memory needs its allocation."""
    assert kr.companions()["tma"] == ("mbarrier",)
    assert kr.with_companions(["tma"]) == ["tma", "mbarrier"]
    assert kr.with_companions(["tcgen05_mma", "tma"]) == ["tcgen05_mma", "tma", "mbarrier", "tmem", "tcgen05_alloc"]
    assert kr.with_companions(["wgmma", "wgmma"]) == ["wgmma"] and kr.with_companions([]) == []
    assert kr.with_companions(["wgmma", "tma"]) == ["wgmma", "tma", "mbarrier"]  # every feature's, not the first's


def test_hints_are_checked_by_name_arch_and_repetition():
    known = ", ".join(kr.load_hints())
    assert kr.hint_problem(["fa3_forward"], "sm_90a") is None and kr.hint_problem([], "sm_100a") is None
    assert kr.hint_problem(["nope"], "sm_90a") == f"unknown hint 'nope' (--hint); known: {known} (agent knowledge hints)"
    assert kr.hint_problem(["fa3_forward"], "sm_100a") == "hint 'fa3_forward' is written for sm_90a, not sm_100a"
    assert kr.hint_problem(["tma_store_epilogue", "tma_store_epilogue"], "sm_100a") == "a hint is named twice (--hint)"
    assert kr.hint_problem(["warp_specialization"], "sm_80") == \
        "hint 'warp_specialization' is written for sm_90a, sm_100a, not sm_80"


def test_without_hints_the_message_says_none(tmp_path, monkeypatch):
    monkeypatch.setattr(kr, "HINTS_DIR", tmp_path)
    assert kr.hint_problem(["x"], "sm_90a") == "unknown hint 'x' (--hint); known: none (agent knowledge hints)"


def test_the_known_arches_are_those_docs_name_but_common_and_any(monkeypatch):
    def doc(*arches):
        return kr.Doc(path="p", title="t", arch=arches[0], arches=arches, features=(), keywords=(), sections=(), body="")
    docs = (doc("common"), doc("any"), doc("sm_90a", "sm_100a"), doc("sm_120a"))
    monkeypatch.setattr(kr, "load_docs", lambda: docs)
    assert kr.known_arches() == ["sm_100a", "sm_120a", "sm_90a"]
    # a doc for "any" arch reaches every arch, after the arch's own, as a common one does
    assert kr.docs_for("sm_100a") == [docs[2], docs[0], docs[1]] and kr.docs_for("sm_120a") == [docs[3], docs[0], docs[1]]


def test_the_feedback_names_what_later_turns_add_docs_for():
    """A compile error: its construct, code, message and features; else ptxas's serialization notes;
    else a requested instruction that did not carry the work; else BM25 over the whole feedback."""
    err = ("ptxas error (C7600): ptx line 12: Arguments mismatch for instruction 'wgmma.mma_async.sync'\n"
           "ptxas info (C7515): ptx line 3: wgmma serialized\n- `tma`: MISSING - no instruction\n"
           "ptxas error: ptx line 14: Unknown symbol 'smem'")
    f = kr.feedback_focus(err)
    assert f.kind == "compile_error" and f.codes == ("C7600",) and f.constructs == ("wgmma.mma_async.sync",)
    assert f.messages == ("Arguments mismatch for instruction 'wgmma.mma_async.sync'", "Unknown symbol 'smem'")
    assert f.features == ("wgmma",)
    assert f.text == "\n".join(err.splitlines()[i] for i in (0, 3))  # the error lines only
    s = kr.feedback_focus("nvrtc warning: unused\nptxas info (C7515): wgmma serialized\n- `tma`: MISSING - x\n"
                          "ptxas info (C7508): setmaxnreg ignored")
    assert (s.kind, s.codes) == ("serialization", ("C7508", "C7515"))
    assert s.text == "ptxas info (C7515): wgmma serialized\nptxas info (C7508): setmaxnreg ignored"
    c = kr.feedback_focus("ptxas info: fine\n- `tma`: MISSING - x\n- `wgmma`: executed, but did not carry the work: y")
    assert (c.kind, c.features) == ("carried_work", ("tma", "wgmma"))
    assert c.text == "- `tma`: MISSING - x\n- `wgmma`: executed, but did not carry the work: y"
    o = kr.feedback_focus("W0 FAILED (incorrect)")
    assert (o.kind, o.text) == ("other", "W0 FAILED (incorrect)")
    assert kr.feedback_focus(None) == kr.feedback_focus("  \n") == kr.FeedbackFocus("none", "")
    assert kr.follows_feedback("bm25 compile-error:C7600") and kr.follows_feedback("carried-work:tma")
    assert not kr.follows_feedback("feature:tma bm25") and not kr.follows_feedback("compile-error")


def test_quoted_compiler_messages_are_read_without_their_prefixes():
    fb = ("ptxas error : ptx line 7: Unknown symbol 'smem_buffer_a'.\nnvrtc error: line 3: identifier is undefined\n"
          "ptxas fatal : Ptx assembly aborted due to errors\nerror: short\nptxas error   : Unknown symbol 'smem_buffer_a'\n"
          "error: twelve chars\nerror: eleven char\nptxas error: operand out of range for MAX.")
    # 12 characters at least (a shorter one matches too much); the final period dropped, nothing else
    assert kr.feedback_messages(fb) == ["Unknown symbol 'smem_buffer_a'", "identifier is undefined",
                                        "operand out of range for MAX", "twelve chars"]
    assert kr.feedback_messages(None) == []
