"""How the docs arm ranks and picks sections (knowledge/retriever.py: `_terms`, `_BM25`, `_rank`,
`_ranked_selection`, `_render`, `_doc_order`), on a small doc set written here, so every tier of
the ranking is met by a section built for it and every score can be worked out by hand.

The rule (docs/METHODOLOGY.md, "Architecture knowledge"): a section's score is an exact tier plus
BM25 normalised below 1, so BM25 orders sections within a tier and never across tiers. The tiers,
from the feedback's error class first (the current mistake matters most): a diagnostic code the
section names (4 + one per code), a quoted compiler message it holds (4 + one per message), the
failing construct in its code (4 + parts/10), a carried-work failure's pipeline (4), the failing
features (2); then the request: a requested feature's minimal pipeline (`core`, 3), a requested
feature (1), written for the task's family (1). The docs arm adds sections in score order while
they and their doc's title fit the budget; a section no term and no tier reaches is never added.

Mutation testing (issue 46) scored the filters before; these tests exist so the ranking is
scored too without the minutes of compiles tests/test_knowledge.py spends per test."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from knowledge import retriever as kr

DOCS = {
    "sm_90a/alpha.md": """---
title: Alpha
arch: sm_90a
features: [wgmma]
keywords: [tile]
ops: [gemm]
---
# Alpha

Warpgroup matrix multiply for the gemm family, tile by tile.

## Pipeline
<!-- core: wgmma -->
Issue wgmma after a fence, commit the group, wait for it.

## Serialized
ptxas reports C7515 when the accumulator registers are touched between wgmma instructions.
""",
    "sm_90a/beta.md": """---
title: Beta
arch: [sm_90a, sm_100a]
features: [tma]
keywords: [copy]
---
# Beta

## Tensor loads
<!-- core: tma -->
A tensor map describes the global tensor; the copy completes on an mbarrier.

## Wrong state space
The message `Arguments mismatch for instruction 'mbarrier'` means the barrier address is not shared.

## Bad form
```ptx
wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f0}, %rd1, %rd2;
```
""",
    "sm_90a/gamma.md": """---
title: Gamma
arch: sm_90a
features: [mbarrier]
keywords: []
---
# Gamma

## Phases
<!-- core: mbarrier -->
An mbarrier phase flips when the expected transaction bytes arrived.

## Unrelated
Nothing anyone asks about: zebra quokka.
""",
    "common/delta.md": """---
title: Delta
arch: common
features: []
keywords: []
---
# Delta

General advice about occupancy and registers.
""",
}
COMPANIONS = "companions:\n  tma: [mbarrier]\n"


@pytest.fixture
def docs(tmp_path, monkeypatch):
    """The doc set above as knowledge/docs, every cache of the retriever cleared before and after."""
    for rel, text in DOCS.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "features.yaml").write_text(COMPANIONS)
    caches = [kr.load_docs, kr.companions, kr._index, kr.count_tokens]
    for c in caches:
        c.cache_clear()
    monkeypatch.setattr(kr, "DOCS_DIR", tmp_path)
    yield {(s.doc, s.heading): s for d in kr.load_docs() for s in d.sections}
    for c in caches:
        c.cache_clear()


# ---------------------------------------------------------------------------------------------
# terms and BM25
# ---------------------------------------------------------------------------------------------

def test_terms_keep_dotted_instructions_whole_and_in_parts():
    assert kr._terms("Use WGMMA.mma_async, then mbarrier:complete_tx.") == [
        "use", "wgmma.mma_async", "wgmma", "mma_async", "then", "mbarrier:complete_tx", "mbarrier", "complete_tx"]
    assert kr._terms("mbarrier::try_wait") == ["mbarrier", "try_wait"]  # a double colon splits the word
    assert kr._terms("sm_90a: cp.async.bulk") == ["sm_90a", "cp.async.bulk", "cp", "async", "bulk"]
    assert kr._terms("") == []


def bm25(corpus: list[list[str]], query: list[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Okapi BM25 as SQLite's FTS5 computes it (its bm25(): IDF = ln((N - n + 0.5) / (n + 0.5)),
    at least 1e-6), every query occurrence of a term counted."""
    n_docs, avg = len(corpus), sum(map(len, corpus)) / len(corpus)
    out = []
    for doc in corpus:
        s = 0.0
        for q in query:
            n = sum(q in d for d in corpus)
            if not n:
                continue
            idf = max(1e-6, math.log((n_docs - n + 0.5) / (n + 0.5)))
            f = doc.count(q)
            s += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(doc) / avg))
        out.append(s)
    return out


def test_bm25_is_fts5s_okapi_with_a_repeated_query_term_weighing_more():
    corpus = [["wgmma", "fence", "wgmma", "commit"], ["tma", "copy", "mbarrier"], ["zebra"], ["fence", "tma"],
              ["a", "b", "c", "d", "e", "f"]]
    index = kr._BM25(corpus)
    for query in (["wgmma"], ["tma", "fence"], ["wgmma", "wgmma", "tma", "fence", "fence", "fence"],
                  ["nothing", "wgmma"], []):
        assert index.scores(query) == pytest.approx(bm25(corpus, query), rel=1e-9, abs=1e-12), query
    assert index.n == 5 and index.vocab == {t for d in corpus for t in d}
    # a term every section holds scores nothing (FTS5's floor of the IDF), never below zero
    common = kr._BM25([["x", "y"], ["x"], ["x", "z"]])
    assert all(0 <= s < 1e-5 for s in common.scores(["x"]))


# ---------------------------------------------------------------------------------------------
# _rank: the tiers
# ---------------------------------------------------------------------------------------------

def ranked(task="a gemm kernel", features=("wgmma", "tma"), feedback=None, op_type="gemm", variants=None):
    out = kr._rank(task, "sm_90a", list(features), feedback, op_type, variants)
    return {(s.doc, s.heading): (score, why) for s, score, why in out}, out


def tiers(scores):
    """Each section's exact tier: the score without its BM25 part (at most 0.99)."""
    return {k: math.floor(v[0] + 1e-9) for k, v in scores.items()}


def test_the_request_tiers_core_then_feature_then_family(docs):
    """wgmma and tma requested for a gemm task (tma brings its companion mbarrier): each feature's
    core pipeline +3, each section of a requested feature's doc +1, the gemm family's doc +1."""
    scores, out = ranked()
    assert {k: v[1] for k, v in scores.items()} == {
        ("sm_90a/alpha.md", "Alpha"): "feature:wgmma family:gemm",
        ("sm_90a/alpha.md", "Pipeline"): "core:wgmma feature:wgmma family:gemm",
        ("sm_90a/alpha.md", "Serialized"): "feature:wgmma family:gemm",
        ("sm_90a/beta.md", "Tensor loads"): "core:tma feature:tma",
        ("sm_90a/beta.md", "Wrong state space"): "feature:tma",
        ("sm_90a/beta.md", "Bad form"): "feature:tma",
        ("sm_90a/gamma.md", "Phases"): "core:mbarrier feature:mbarrier",
        ("sm_90a/gamma.md", "Unrelated"): "feature:mbarrier",
        ("common/delta.md", "Delta"): "bm25",
    }
    assert tiers(scores) == {
        ("sm_90a/alpha.md", "Alpha"): 2, ("sm_90a/alpha.md", "Pipeline"): 5, ("sm_90a/alpha.md", "Serialized"): 2,
        ("sm_90a/beta.md", "Tensor loads"): 4, ("sm_90a/beta.md", "Wrong state space"): 1,
        ("sm_90a/beta.md", "Bad form"): 1, ("sm_90a/gamma.md", "Phases"): 4, ("sm_90a/gamma.md", "Unrelated"): 1,
        ("common/delta.md", "Delta"): 0,
    }
    # sorted by score; equal scores by doc path, then by place in the doc
    assert [score for _, score, _ in out] == sorted((score for _, score, _ in out), reverse=True)
    assert (out[0][0].doc, out[0][0].heading) == ("sm_90a/alpha.md", "Pipeline")


def test_equal_scores_keep_the_docs_order(docs):
    """Ties (here: nothing matches, every score 0) are ordered by doc path, then place in the doc,
    so a retrieval is the same on every machine."""
    _, out = ranked("xylophone", (), op_type=None)
    assert [(s.doc, s.index) for s, _, _ in out] == sorted((s.doc, s.index) for s, _, _ in out)
    assert len(out) == 9


def test_bm25_orders_within_a_tier_normalised_to_the_best_section(docs):
    """The BM25 part is 0.99 x the section's BM25 over the best section's: the query is the task,
    the requested features twice and the feedback's text twice."""
    task, features = "a gemm kernel with an mbarrier phase", ["wgmma"]
    scores, out = ranked(task, features)
    sections, index = kr._index("sm_90a", "gemm", None)
    raw = index.scores(kr._terms(" ".join([task, *features, *features, "", ""])))
    top = max(raw)
    for sec, b in zip(sections, raw):
        score, why = scores[(sec.doc, sec.heading)]
        if why == "bm25":
            assert score == pytest.approx(0.99 * b / top, abs=1e-12)
        assert 0 <= score - math.floor(score + 1e-9) <= 0.99 + 1e-9
    best = max(zip(sections, raw), key=lambda x: x[1])[0]
    assert best.doc == "sm_90a/gamma.md" and best.heading == "Phases"  # "mbarrier phase": its words
    # nothing requested, no feedback: the BM25 part alone, the best section exactly 0.99
    scores, _ = ranked("phase flips when bytes arrived", (), op_type=None)
    assert max(v[0] for v in scores.values()) == pytest.approx(0.99)
    assert scores[("sm_90a/gamma.md", "Phases")][0] == pytest.approx(0.99)
    assert scores[("sm_90a/gamma.md", "Unrelated")] == (0.0, "bm25")


def test_a_query_no_section_matches_scores_nothing(docs):
    scores, _ = ranked("xylophone", (), op_type=None)
    assert set(scores.values()) == {(0.0, "bm25")}


def test_a_compile_errors_code_message_and_construct_come_first(docs):
    """ptxas's error names the construct on its line (wgmma.mma_async...) and a message; the
    sections holding them are ranked above every section of the request."""
    feedback = ("ptxas error   : Arguments mismatch for instruction 'mbarrier'\n"
                "ptxas error   : (C7515) unexpected wgmma.mma_async.sync.aligned.m64n64k16 here\n")
    focus = kr.feedback_focus(feedback)
    assert focus.kind == "compile_error" and focus.codes == ("C7515",)
    assert "wgmma.mma_async.sync.aligned.m64n64k16" in focus.constructs and "wgmma" in focus.features
    scores, out = ranked(feedback=feedback)
    # a code: 4 + 1; and wgmma is a failing feature (+2) as well as requested
    assert scores[("sm_90a/alpha.md", "Serialized")][1] == \
        "compile-error:code:C7515 compile-error:feature:wgmma feature:wgmma family:gemm"
    assert tiers(scores)[("sm_90a/alpha.md", "Serialized")] == 5 + 2 + 1 + 1
    # the message: 4 + 1
    why = scores[("sm_90a/beta.md", "Wrong state space")][1]
    assert why == "compile-error:message:1 feature:tma" and tiers(scores)[("sm_90a/beta.md", "Wrong state space")] == 6
    # the construct: four of its parts in the code (wgmma.mma_async.sync.aligned): 4 + 0.4
    score, why = scores[("sm_90a/beta.md", "Bad form")]
    assert why == "compile-error:construct:wgmma.mma_async.sync.aligned feature:tma"
    assert 4 + 0.4 + 1 <= score < 4 + 0.4 + 1 + 0.99 + 1e-9
    assert [(s.doc, s.heading) for s, _, _ in out][:1] == [("sm_90a/alpha.md", "Serialized")]


def test_the_construct_hit_counts_the_longest_shared_prefix_of_two_parts_or_more():
    code = "wgmma.mma_async.sync.aligned.m64n128k16 ..."
    assert kr._construct_hit("wgmma.mma_async.sync.aligned.m64n64k16", code) == 4
    assert kr._construct_hit("wgmma.mma_async", code) == 2
    assert kr._construct_hit("wgmma.fence", code) == 0  # "wgmma" alone is no hit
    assert kr._construct_hit("mbarrier.try_wait", code) == 0
    assert kr._code_of("text\n```ptx\nWGMMA.x\n```\nmore\n```cuda\nint a;\n```\n```python\nno\n```") == \
        "wgmma.x\n\nint a;\n"


def test_a_serialization_note_asks_for_the_sections_on_its_code(docs):
    feedback = "ptxas info (C7515): Potential Performance Loss: wgmma.mma_async instructions are serialized"
    scores, _ = ranked(feedback=feedback, features=())
    assert scores[("sm_90a/alpha.md", "Serialized")][1] == "serialization:code:C7515 family:gemm"
    assert tiers(scores)[("sm_90a/alpha.md", "Serialized")] == 6
    assert kr.follows_feedback(scores[("sm_90a/alpha.md", "Serialized")][1])
    assert not kr.follows_feedback(scores[("sm_90a/alpha.md", "Pipeline")][1])


def test_a_carried_work_failure_asks_for_the_failing_features_pipeline_and_companions(docs):
    """TMA did not carry the work: its core pipeline (+4) and its companion mbarrier's, and every
    section of either feature (+2), above the request's own tiers."""
    feedback = "- `tma`: executed, but did not carry the work (45% of the input bytes)"
    scores, _ = ranked(feedback=feedback, features=("wgmma",))
    assert scores[("sm_90a/beta.md", "Tensor loads")][1] == "carried-work:core:tma carried-work:feature:tma"
    assert tiers(scores)[("sm_90a/beta.md", "Tensor loads")] == 6
    assert scores[("sm_90a/gamma.md", "Phases")][1] == "carried-work:core:mbarrier carried-work:feature:mbarrier"
    assert scores[("sm_90a/gamma.md", "Unrelated")][1] == "carried-work:feature:mbarrier"
    assert tiers(scores)[("sm_90a/gamma.md", "Unrelated")] == 2
    assert scores[("sm_90a/alpha.md", "Pipeline")][1] == "core:wgmma feature:wgmma family:gemm"


def test_the_family_tier_counts_a_sections_own_ops_marker(docs, tmp_path):
    (tmp_path / "sm_90a/gamma.md").write_text(DOCS["sm_90a/gamma.md"].replace(
        "## Unrelated\n", "## Unrelated\n<!-- ops: gemm, attention -->\n"))
    for c in (kr.load_docs, kr._index):
        c.cache_clear()
    scores, _ = ranked(features=())
    assert scores[("sm_90a/gamma.md", "Unrelated")][1] == "family:gemm"
    assert scores[("sm_90a/gamma.md", "Phases")][1] == "bm25"
    assert ranked(features=(), op_type=None)[0][("sm_90a/alpha.md", "Alpha")][1] == "bm25"


# ---------------------------------------------------------------------------------------------
# _ranked_selection and _render: what fits the budget
# ---------------------------------------------------------------------------------------------

def cost(docs, *keys) -> int:
    """Tokens a selection of sections takes: each section + 1, each doc's title line once + 1."""
    titles = {d.path: d.title for d in kr.load_docs()}
    seen, total = set(), 0
    for key in keys:
        s = docs[key]
        total += kr.count_tokens(s.text) + 1
        if s.doc not in seen:
            total += kr.count_tokens(f"# {titles[s.doc]}  ({s.doc})") + 1
            seen.add(s.doc)
    return total


def test_sections_are_added_in_rank_order_while_they_fit(docs):
    _, order = ranked()
    keys = [(s.doc, s.heading) for s, score, _ in order if score > 0]
    for n in range(1, len(keys) + 1):
        budget = cost(docs, *keys[:n])
        chosen, refs, truncated = kr._ranked_selection("a gemm kernel", "sm_90a", ["wgmma", "tma"], None, budget,
                                                       "gemm")
        assert [(s.doc, s.heading) for s in chosen][:n] == keys[:n]
        got = [(s.doc, s.heading) for s in chosen]
        assert cost(docs, *got) <= budget
        assert truncated == (len(got) < len(keys))
    # refs: what was chosen, with its tokens, score (4 places) and why
    chosen, refs, truncated = kr._ranked_selection("a gemm kernel", "sm_90a", ["wgmma", "tma"], None, 10 ** 6,
                                                   "gemm")
    assert not truncated and [(r.doc, r.heading) for r in refs] == keys
    assert [(r.tokens, r.score, r.why) for r in refs] == [
        (kr.count_tokens(s.text), round(score, 4), why) for s, score, why in order if score > 0]


def test_a_section_past_the_budget_is_skipped_and_a_smaller_one_after_it_still_fits(docs):
    _, order = ranked()
    keys = [(s.doc, s.heading) for s, score, _ in order if score > 0]
    first, second = keys[0], keys[1]
    budget = cost(docs, first) + 1  # one token short of nothing but the first: the next ones do not fit
    chosen, _, truncated = kr._ranked_selection("a gemm kernel", "sm_90a", ["wgmma", "tma"], None, budget, "gemm")
    assert [(s.doc, s.heading) for s in chosen] == [first] and truncated
    budget = cost(docs, first) - 1  # the first does not fit; a later, smaller one does
    chosen, _, truncated = kr._ranked_selection("a gemm kernel", "sm_90a", ["wgmma", "tma"], None, budget, "gemm")
    got = [(s.doc, s.heading) for s in chosen]
    assert first not in got and got and truncated and cost(docs, *got) <= budget
    assert kr._ranked_selection("a gemm kernel", "sm_90a", ["wgmma"], None, 0, "gemm")[:1] == ([],)


def test_sections_that_nothing_reaches_are_never_added(docs):
    chosen, refs, truncated = kr._ranked_selection("phase flips", "sm_90a", [], None, 10 ** 6, None)
    assert all(r.score > 0 for r in refs) and ("sm_90a/gamma.md", "Unrelated") not in {(s.doc, s.heading)
                                                                                          for s in chosen}
    assert not truncated
    assert kr._ranked_selection("xylophone", "sm_90a", [], None, 10 ** 6, None) == ([], [], False)


def test_render_groups_sections_under_their_docs_title_in_first_seen_order(docs):
    picked = [docs[("sm_90a/beta.md", "Bad form")], docs[("sm_90a/alpha.md", "Alpha")],
              docs[("sm_90a/beta.md", "Tensor loads")], docs[("sm_90a/alpha.md", "Pipeline")]]
    text = kr._render(picked)
    assert text == "\n\n".join([
        "# Beta  (sm_90a/beta.md)", picked[0].text, picked[2].text,
        "# Alpha  (sm_90a/alpha.md)", "Warpgroup matrix multiply for the gemm family, tile by tile.",
        picked[3].text]) + "\n"
    # an intro that is nothing but its title adds nothing beyond the doc's title line
    bare = kr.Section("common/delta.md", 0, "Delta", "# Delta", "common", (), (), 2)
    assert kr._render([bare]) == "# Delta  (common/delta.md)\n"


def test_full_order_is_the_arch_docs_then_each_docs_own_order(docs):
    secs = [docs[("common/delta.md", "Delta")], docs[("sm_90a/gamma.md", "Unrelated")],
            docs[("sm_90a/alpha.md", "Serialized")], docs[("sm_90a/gamma.md", "Phases")],
            docs[("sm_90a/alpha.md", "Alpha")]]
    assert [(s.doc, s.index) for s in kr._doc_order(secs, "sm_90a", None)] == [
        ("sm_90a/alpha.md", 0), ("sm_90a/alpha.md", 2), ("sm_90a/gamma.md", 0), ("sm_90a/gamma.md", 1),
        ("common/delta.md", 0)]
    stray = kr.Section("elsewhere/x.md", 0, "X", "x", "sm_90a", (), (), 1)
    assert kr._doc_order([stray, docs[("common/delta.md", "Delta")]], "sm_90a", None)[-1] is stray
