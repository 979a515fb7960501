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

### Alpha details
Tiles of 128 rows.

## Pipeline
<!-- core: wgmma -->
Issue wgmma after a fence, commit the group, wait for it.

### Alpha in practice
One warpgroup per tile.

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
    "sm_90a/epsilon.md": """---
title: Epsilon
arch: sm_90a
features: [tma, mbarrier]
keywords: []
---
# Epsilon

## Everything at once
<!-- core: tma, mbarrier -->
C7515 and C7508 both; the message `Arguments mismatch for instruction 'mbarrier'` too.
```ptx
wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f0}, %rd1, %rd2;
```

## Head dimension 96
<!-- variants: d96 -->
Split the 96 columns as 64 + 32.
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
    # PTX's `::` qualifiers stay inside the word, so `mbarrier::try_wait` is one search term too
    assert kr._terms("mbarrier::try_wait") == ["mbarrier::try_wait", "mbarrier", "try_wait"]
    assert kr._terms("shared::cta.b64") == ["shared::cta.b64", "shared", "cta", "b64"]
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

NO_TAGS = frozenset()  # a task of no variant: the d96 section is not for it


def ranked(task="a gemm kernel", features=("wgmma", "tma"), feedback=None, op_type="gemm", variants=NO_TAGS):
    out = kr._rank(task, "sm_90a", list(features), feedback, op_type, variants)
    return {(s.doc, s.heading): (score, why) for s, score, why in out}, out


def tiers(task="a gemm kernel", features=("wgmma", "tma"), feedback=None, op_type="gemm", variants=NO_TAGS):
    """Each section's exact tier: its score less 0.99 x its BM25 over the best section's, the BM25
    query being the task, the requested features twice and the feedback's failing lines twice."""
    scores, _ = ranked(task, features, feedback, op_type, variants)
    sections, index = kr._index("sm_90a", op_type, variants)
    focus = kr.feedback_focus(feedback)
    raw = index.scores(kr._terms(" ".join([task, *features, *features, focus.text, focus.text])))
    top = max(raw) if max(raw) > 0 else 1.0
    assert {(s.doc, s.heading) for s in sections} == set(scores)
    return {(s.doc, s.heading): round(scores[(s.doc, s.heading)][0] - 0.99 * b / top, 9) for s, b in zip(sections, raw)}


def test_the_request_tiers_core_then_feature_then_family(docs):
    """wgmma and tma requested for a gemm task (tma brings its companion mbarrier): each feature's
    core pipeline +3, each section of a requested feature's doc +1, the gemm family's doc +1; the
    variant section (d96) reaches no task without that tag."""
    scores, out = ranked()
    assert {k: v[1] for k, v in scores.items()} == {
        ("sm_90a/alpha.md", "Alpha"): "feature:wgmma family:gemm",
        ("sm_90a/alpha.md", "Pipeline"): "core:wgmma feature:wgmma family:gemm",
        ("sm_90a/alpha.md", "Serialized"): "feature:wgmma family:gemm",
        ("sm_90a/beta.md", "Tensor loads"): "core:tma feature:tma",
        ("sm_90a/beta.md", "Wrong state space"): "feature:tma",
        ("sm_90a/beta.md", "Bad form"): "feature:tma",
        ("sm_90a/epsilon.md", "Everything at once"): "core:mbarrier,tma feature:mbarrier,tma",
        ("sm_90a/gamma.md", "Phases"): "core:mbarrier feature:mbarrier",
        ("sm_90a/gamma.md", "Unrelated"): "feature:mbarrier",
        ("common/delta.md", "Delta"): "bm25",
    }
    assert tiers() == {
        ("sm_90a/alpha.md", "Alpha"): 2, ("sm_90a/alpha.md", "Pipeline"): 5, ("sm_90a/alpha.md", "Serialized"): 2,
        ("sm_90a/beta.md", "Tensor loads"): 4, ("sm_90a/beta.md", "Wrong state space"): 1,
        ("sm_90a/beta.md", "Bad form"): 1, ("sm_90a/epsilon.md", "Everything at once"): 4,
        ("sm_90a/gamma.md", "Phases"): 4, ("sm_90a/gamma.md", "Unrelated"): 1, ("common/delta.md", "Delta"): 0,
    }
    assert [score for _, score, _ in out] == sorted((score for _, score, _ in out), reverse=True)
    assert (out[0][0].doc, out[0][0].heading) == ("sm_90a/alpha.md", "Pipeline")
    assert "Head dimension 96" in {h for _, h in ranked(variants=frozenset({"d96"}))[0]}
    assert "Head dimension 96" not in {h for _, h in ranked(variants=frozenset({"d128"}))[0]}


def test_only_the_task_familys_docs_are_ranked(docs):
    """An attention task: the gemm-only doc (alpha) is not ranked at all."""
    scores, _ = ranked(op_type="attention")
    assert not any(doc == "sm_90a/alpha.md" for doc, _ in scores) and ("sm_90a/beta.md", "Bad form") in scores
    assert ("sm_90a/alpha.md", "Pipeline") in ranked(op_type=None)[0]


def test_equal_scores_keep_the_docs_order(docs):
    """Ties (here: nothing matches, every score 0) are ordered by doc path, then place in the doc,
    so a retrieval is the same on every machine."""
    _, out = ranked("xylophone", (), op_type=None)
    assert [(s.doc, s.index) for s, _, _ in out] == sorted((s.doc, s.index) for s, _, _ in out)
    assert len(out) == 10


def test_bm25_orders_within_a_tier_normalised_to_the_best_section(docs):
    """Nothing requested, no feedback: every section in tier 0, ordered by BM25 alone (not by doc),
    the best one exactly 0.99; a section none of whose words are asked scores 0."""
    scores, out = ranked("phase flips when bytes arrived", (), op_type=None)
    assert (out[0][0].doc, out[0][0].heading) == ("sm_90a/gamma.md", "Phases")  # a later doc first
    assert scores[("sm_90a/gamma.md", "Phases")][0] == pytest.approx(0.99)
    assert [score for _, score, _ in out] == sorted((score for _, score, _ in out), reverse=True)
    assert set(tiers("phase flips when bytes arrived", (), op_type=None).values()) == {0}
    assert scores[("sm_90a/gamma.md", "Unrelated")] == (0.0, "bm25")


def test_a_best_bm25_below_one_is_still_the_top_of_the_scale(docs):
    """BM25 is normalised by the best section's score whatever its size: a word many sections hold
    scores below 1 and its best section still gets 0.99."""
    sections, index = kr._index("sm_90a", None, None)
    low = [t for t in sorted(index.vocab) if 0 < max(index.scores([t])) < 1]
    assert low, "the doc set has a word common enough to score below 1"
    scores, _ = ranked(low[0], (), op_type=None)
    assert max(v[0] for v in scores.values()) == pytest.approx(0.99)


def test_a_query_no_section_matches_scores_nothing(docs):
    scores, _ = ranked("xylophone", (), op_type=None)
    assert set(scores.values()) == {(0.0, "bm25")}


FEEDBACK = ("ptxas error   : Arguments mismatch for instruction 'mbarrier'\n"
            "ptxas error   : (C7515) unexpected wgmma.mma_async.sync.aligned.m64n64k16 here\n"
            "ptxas error   : (C7508) bad wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 operands\n")


def test_a_compile_errors_code_message_and_construct_come_first(docs):
    """ptxas's errors name codes, a message and the constructs on their lines; the sections holding
    them are ranked above every section of the request, each kind adding to the others."""
    focus = kr.feedback_focus(FEEDBACK)
    assert focus.kind == "compile_error" and focus.codes == ("C7508", "C7515")
    assert focus.constructs == ("wgmma.mma_async.sync.aligned.m64n64k16",
                                "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16")
    assert focus.features == ("mbarrier", "wgmma")
    scores, out = ranked(feedback=FEEDBACK)
    t = tiers(feedback=FEEDBACK)
    # one code (4 + 1), wgmma a failing feature (+2), requested (+1), the family's (+1)
    assert scores[("sm_90a/alpha.md", "Serialized")][1] == \
        "compile-error:code:C7515 compile-error:feature:wgmma feature:wgmma family:gemm"
    assert t[("sm_90a/alpha.md", "Serialized")] == 5 + 2 + 1 + 1
    # a failing feature's core section: +2 for the failure on top of the request's 3 + 1 + 1
    assert t[("sm_90a/alpha.md", "Pipeline")] == 2 + 3 + 1 + 1
    assert t[("sm_90a/beta.md", "Wrong state space")] == 5 + 1  # the message: 4 + 1
    # the construct fully in the code (all 8 parts: 4 + 0.8), named whole, not the 4-part hit
    assert scores[("sm_90a/beta.md", "Bad form")][1] == \
        "compile-error:construct:wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 feature:tma"
    assert t[("sm_90a/beta.md", "Bad form")] == pytest.approx(4.8 + 1)
    # two codes (4 + 2), the message (4 + 1), the construct (4.8), both failing features (+2), the
    # core of both requested-or-companion features (+3) and both as features (+1)
    assert scores[("sm_90a/epsilon.md", "Everything at once")][1] == (
        "compile-error:code:C7508,C7515 compile-error:message:1 "
        "compile-error:construct:wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "compile-error:feature:mbarrier core:mbarrier,tma feature:mbarrier,tma")
    assert t[("sm_90a/epsilon.md", "Everything at once")] == pytest.approx(6 + 5 + 4.8 + 2 + 3 + 1)
    assert (out[0][0].doc, out[0][0].heading) == ("sm_90a/epsilon.md", "Everything at once")


def test_a_partial_construct_is_named_by_the_parts_the_code_shows(docs):
    feedback = "ptxas error   : unexpected wgmma.mma_async.sync.aligned.m64n64k16 here\n"
    scores, _ = ranked(feedback=feedback)
    assert scores[("sm_90a/beta.md", "Bad form")][1] == "compile-error:construct:wgmma.mma_async.sync.aligned feature:tma"
    assert tiers(feedback=feedback)[("sm_90a/beta.md", "Bad form")] == pytest.approx(4.4 + 1)


def test_a_compile_errors_features_bring_no_companions(docs):
    """Only a carried-work failure asks for the failing feature's companions: a TMA compile error
    is about TMA's own instructions."""
    feedback = "ptxas error   : bad cp.async.bulk.tensor.2d operands\n"
    assert kr.feedback_focus(feedback).features == ("bulk_copy", "tma")
    scores, _ = ranked(feedback=feedback, features=())
    assert scores[("sm_90a/gamma.md", "Phases")][1] == "bm25"
    assert scores[("sm_90a/beta.md", "Tensor loads")][1] == "compile-error:feature:tma"


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
    assert tiers(feedback=feedback, features=())[("sm_90a/alpha.md", "Serialized")] == 6
    assert kr.follows_feedback(scores[("sm_90a/alpha.md", "Serialized")][1])
    assert not kr.follows_feedback(scores[("sm_90a/alpha.md", "Pipeline")][1])


def test_a_carried_work_failure_asks_for_the_failing_features_pipeline_and_companions(docs):
    """TMA did not carry the work: its core pipeline (+4) and its companion mbarrier's, and every
    section of either feature (+2), above the request's own tiers."""
    feedback = "- `tma`: executed, but did not carry the work (45% of the input bytes)"
    scores, _ = ranked(feedback=feedback, features=("wgmma",))
    t = tiers(feedback=feedback, features=("wgmma",))
    assert scores[("sm_90a/beta.md", "Tensor loads")][1] == "carried-work:core:tma carried-work:feature:tma"
    assert t[("sm_90a/beta.md", "Tensor loads")] == 6
    assert scores[("sm_90a/gamma.md", "Phases")][1] == "carried-work:core:mbarrier carried-work:feature:mbarrier"
    assert scores[("sm_90a/gamma.md", "Unrelated")][1] == "carried-work:feature:mbarrier"
    assert t[("sm_90a/gamma.md", "Unrelated")] == 2
    assert scores[("sm_90a/epsilon.md", "Everything at once")][1] == (
        "carried-work:core:mbarrier,tma carried-work:feature:mbarrier,tma")
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

def cost(docs, *keys, tokens=None) -> int:
    """Tokens a selection of sections takes: each section + 1, each doc's title line once + 1."""
    tokens = tokens or kr.count_tokens
    titles = {d.path: d.title for d in kr.load_docs()}
    seen, total = set(), 0
    for key in keys:
        s = docs[key]
        total += tokens(s.text) + 1
        if s.doc not in seen:
            total += tokens(f"# {titles[s.doc]}  ({s.doc})") + 1
            seen.add(s.doc)
    return total


def greedy(docs, keys, budget, tokens=None) -> list:
    """The rule: in rank order, each section that still fits (with its doc's title the first time)."""
    out = []
    for k in keys:
        if cost(docs, *out, k, tokens=tokens) <= budget:
            out.append(k)
    return out


def select(budget, feedback=None, variants=NO_TAGS, tz=kr.FALLBACK_TOKENIZER, features=("wgmma", "tma")):
    chosen, refs, truncated = kr._ranked_selection("a gemm kernel", "sm_90a", list(features), feedback, budget, "gemm",
                                                   variants, tz)
    return [(s.doc, s.heading) for s in chosen], refs, truncated


def test_sections_are_added_in_rank_order_while_they_fit(docs):
    _, order = ranked()
    keys = [(s.doc, s.heading) for s, score, _ in order if score > 0]
    for n in range(len(keys) + 1):
        for budget in (cost(docs, *keys[:n]), cost(docs, *keys[:n]) + 1, cost(docs, *keys[:n + 1]) - 1):
            got, refs, truncated = select(budget)
            assert got == greedy(docs, keys, budget), (n, budget)
            assert truncated == (len(got) < len(keys))
    # refs: what was chosen, with its tokens, score (4 places) and why
    got, refs, truncated = select(10 ** 6)
    assert not truncated and got == keys
    assert [(r.doc, r.heading, r.tokens, r.score, r.why) for r in refs] == [
        (s.doc, s.heading, kr.count_tokens(s.text), round(score, 4), why) for s, score, why in order if score > 0]


def test_the_selection_follows_the_feedback_the_variants_and_the_tokenizer(docs, monkeypatch):
    got, _, _ = select(10 ** 6, feedback=FEEDBACK)
    assert got[0] == ("sm_90a/epsilon.md", "Everything at once")
    assert ("sm_90a/epsilon.md", "Head dimension 96") in select(10 ** 6, variants=frozenset({"d96"}))[0]
    assert ("sm_90a/epsilon.md", "Head dimension 96") not in select(10 ** 6, variants=frozenset({"d128"}))[0]
    # a model's own tokenizer counts every section and title: here one that counts characters
    real = kr.count_tokens
    monkeypatch.setattr(kr, "count_tokens", lambda text, tokenizer=kr.FALLBACK_TOKENIZER:
                        len(text) if tokenizer == "chars" else real(text, tokenizer))
    _, order = ranked()
    keys = [(s.doc, s.heading) for s, score, _ in order if score > 0]
    for n in range(len(keys) + 1):  # sections and doc titles alike in the model's tokens
        for budget in (cost(docs, *keys[:n], tokens=len), cost(docs, *keys[:n + 1], tokens=len) - 1):
            got, refs, _ = select(budget, tz="chars")
            assert got == greedy(docs, keys, budget, tokens=len), (n, budget)
    assert refs[0].tokens == len(docs[keys[0]].text)


def test_sections_that_nothing_reaches_are_never_added(docs):
    chosen, refs, truncated = kr._ranked_selection("phase flips", "sm_90a", [], None, 10 ** 6, None)
    assert all(r.score > 0 for r in refs) and ("sm_90a/gamma.md", "Unrelated") not in {(s.doc, s.heading)
                                                                                          for s in chosen}
    assert not truncated
    assert kr._ranked_selection("xylophone", "sm_90a", [], None, 10 ** 6, None) == ([], [], False)


def test_render_groups_sections_under_their_docs_title_in_first_seen_order(docs):
    """Each doc's title once, before its first section; the intro without its `# Title` line (a
    `### Title ...` heading inside it stays), every other section whole."""
    picked = [docs[("sm_90a/beta.md", "Bad form")], docs[("sm_90a/alpha.md", "Alpha")],
              docs[("sm_90a/beta.md", "Tensor loads")], docs[("sm_90a/alpha.md", "Pipeline")]]
    text = kr._render(picked)
    assert text == "\n\n".join([
        "# Beta  (sm_90a/beta.md)", picked[0].text, picked[2].text,
        "# Alpha  (sm_90a/alpha.md)",
        "Warpgroup matrix multiply for the gemm family, tile by tile.\n\n### Alpha details\nTiles of 128 rows.",
        picked[3].text]) + "\n"
    assert "### Alpha in practice" in picked[3].text
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
    # the family's docs: a doc outside them (alpha is gemm's only) sorts after them
    assert [(s.doc, s.index) for s in kr._doc_order(secs, "sm_90a", "attention")][-2:] == [
        ("sm_90a/alpha.md", 0), ("sm_90a/alpha.md", 2)]


def test_bm25_answers_from_any_thread():
    """Runs retrieve concurrently (a sweep's threads): one index serves every thread."""
    import threading

    index = kr._BM25([["wgmma", "fence"], ["tma"]])
    out = []
    t = threading.Thread(target=lambda: out.append(index.scores(["tma"])))
    t.start()
    t.join()
    assert len(out) == 1 and out[0][0] == 0.0 and out[0][1] > 0


# ---------------------------------------------------------------------------------------------
# The arms put together (_retrieve, _headers, retrieve): what each ablation arm's prompt holds
# ---------------------------------------------------------------------------------------------

API = "## Helper API\nhow to include\n### ptxbench/tma.cuh\nload_2d(...)\n### ptxbench/wgmma.cuh\nmma_64(...)\n"
EXAMPLE = """---
title: Worked GEMM
arch: sm_90a
features: [wgmma]
keywords: []
ops: [gemm]
solves:
  tags: [d128, seed]
  not: [causal, fp8]
---
# Worked GEMM

<!-- features: wgmma -->
The whole kernel.
"""
HINT = """---
title: "Pattern hint: split K (two halves)"
arch: sm_90a
---

# Pattern hint: split K

Split K across two CTAs.

### Pattern hint: split K in practice
Two halves.
"""
HINT_TEXT = "Split K across two CTAs.\n\n### Pattern hint: split K in practice\nTwo halves."


def example(title: str, solves: str) -> str:
    return f"---\ntitle: {title}\narch: sm_90a\nfeatures: []\nkeywords: []\nops: [gemm]\n{solves}---\n# {title}\n\nBody.\n"


@pytest.fixture
def arms(docs, tmp_path_factory, monkeypatch):
    """The doc set, a helper API, worked examples (gemm: by their variants) and two hints, in a
    folder of their own (a hint is no doc)."""
    tmp_path = tmp_path_factory.mktemp("knowledge")
    (tmp_path / "examples/sm_90a").mkdir(parents=True)
    (tmp_path / "examples/sm_90a/gemm.md").write_text(EXAMPLE)
    (tmp_path / "examples/sm_90a/gemm_any.md").write_text(example("Any GEMM", "solves:\n  not: [causal]\n"))
    (tmp_path / "examples/sm_90a/gemm_d96.md").write_text(example("D96 GEMM", "solves:\n  tags: [d96]\n"))
    (tmp_path / "examples/sm_100a").mkdir()
    (tmp_path / "examples/sm_100a/gemm.md").write_text(EXAMPLE.replace("arch: sm_90a", "arch: sm_100a"))
    (tmp_path / "hints").mkdir()
    (tmp_path / "hints/split_k.md").write_text(HINT)
    (tmp_path / "hints/two_ctas.md").write_text(HINT.replace("split K (two halves)", "two CTAs"))
    monkeypatch.setattr(kr, "EXAMPLES_DIR", tmp_path / "examples")
    monkeypatch.setattr(kr, "HINTS_DIR", tmp_path / "hints")
    monkeypatch.setattr(kr, "header_api", lambda arch=None: API if arch == "sm_90a" else "### other.cuh\n")
    for c in (kr.load_examples, kr.load_hints):
        c.cache_clear()
    yield docs
    for c in (kr.load_examples, kr.load_hints):
        c.cache_clear()


def tok(text: str) -> int:
    return kr.count_tokens(text)


def arm(mode, budget=10 ** 6, features=("wgmma", "tma"), variants=(), **kw):
    return kr.retrieve("a gemm kernel", "sm_90a", list(features), mode=mode, token_budget=budget, op_type="gemm",
                       variants=list(variants), **kw)


def test_the_docs_arm_is_the_ranked_selection_rendered(arms):
    chosen, refs, truncated = kr._ranked_selection("a gemm kernel", "sm_90a", ["wgmma", "tma"], None, 60, "gemm",
                                                   frozenset())
    r = arm("docs", 60)
    assert r.text == kr._render(chosen) and r.tokens == tok(r.text) and r.sections == refs
    assert (r.mode, r.truncated, r.tokenizer, r.focus, r.example) == ("docs", truncated, "chars/4", "none", None)
    assert truncated and r.parts == {"docs": {"tokens": tok(r.text), "sections": len(chosen)}}
    empty = kr.retrieve("xylophone", "sm_90a", [], mode="docs", op_type="attention", variants=[])  # nothing scores
    assert (empty.text, empty.tokens, empty.parts, empty.sections) == ("", 0, {"docs": {"tokens": 0, "sections": 0}}, [])


def test_docs_plus_headers_adds_the_helper_api_after_the_docs(arms):
    docs = arm("docs", 80)
    r = arm("docs+headers", 80, header_budget=10 ** 6)
    assert r.text == docs.text + "\n" + API and r.tokens == tok(r.text) and r.sections == docs.sections
    assert r.parts == {**docs.parts, "headers": {"tokens": tok(API), "sections": 2}}
    assert r.truncated == docs.truncated
    bare = kr.retrieve("xylophone", "sm_90a", [], mode="docs+headers", op_type="attention", variants=[])
    assert bare.text == API and not bare.truncated


def test_a_helper_api_past_its_budget_keeps_whole_headers_and_says_so(arms):
    whole = tok(API)
    assert kr._headers("sm_90a", whole) == (API, False)
    first = "## Helper API\nhow to include\n### ptxbench/tma.cuh\nload_2d(...)"
    for budget in (tok(first), whole - 1):
        assert kr._headers("sm_90a", budget) == (first + "\n(Some helper headers were left out for the budget.)\n",
                                                 True)
    assert kr._headers("sm_90a", tok(first) - 1) == (
        "## Helper API\nhow to include\n(Some helper headers were left out for the budget.)\n", True)
    r = arm("docs+headers", 10 ** 6, header_budget=tok(first))
    assert r.truncated and r.text.endswith("(Some helper headers were left out for the budget.)\n")
    assert r.parts["headers"]["sections"] == 1


def test_the_full_arm_adds_every_other_eligible_section_in_doc_order_then_the_api(arms):
    docs = arm("docs", 60)
    r = arm("full", 60)
    picked = [(s.doc, s.heading) for s in docs.sections]
    eligible = [(s.doc, s.heading) for d in kr.docs_for("sm_90a", "gemm") for s in d.sections
                if kr.eligible(s, "sm_90a", "gemm", frozenset())]
    extra = [k for k in eligible if k not in picked]
    assert [(x.doc, x.heading) for x in r.sections] == picked + extra
    assert all((x.score, x.why) == (0.0, "full") for x in r.sections[len(picked):])
    assert [x.tokens for x in r.sections[len(picked):]] == [tok(arms[k].text) for k in extra]
    body = kr._render(kr._doc_order([arms[k] for k in picked + extra], "sm_90a", "gemm")) + "\n" + API
    head = f"(All {len(eligible)} sections of the sm_90a docs for this task and the helper headers: about {tok(body)} tokens.)"
    assert r.text == head + "\n\n" + body and r.tokens == tok(r.text)
    assert not r.truncated  # what the docs arm left out for its budget, full adds back
    assert r.parts == {"docs": docs.parts["docs"], "headers": {"tokens": tok(API), "sections": 2},
                       "full": {"tokens": tok(body.removesuffix("\n" + API)) - docs.parts["docs"]["tokens"],
                                "sections": len(extra)}}


def test_the_full_arm_stops_at_its_own_budget_and_says_so(arms, monkeypatch):
    docs = arm("docs", 60)
    used = sum(tok(arms[(s.doc, s.heading)].text) for s in docs.sections)
    monkeypatch.setattr(kr, "FULL_MODE_BUDGET", 90)  # room for a few more sections, not all
    r = arm("full", 60)
    extra = r.sections[len(docs.sections):]
    assert extra and sum(x.tokens for x in extra) + used <= 90
    assert r.truncated and r.text.endswith("\n(Some sections were left out: the full docs exceed 90 tokens.)\n")
    assert f"(All {len(r.sections)} sections" in r.text
    # the arm's own budget, when larger, is the limit
    big = arm("full", 10 ** 6)
    assert not big.truncated and "left out" not in big.text


def test_the_example_arm_serves_the_worked_examples_only_to_the_variants_they_solve(arms):
    """A worked example is pasted whole only into a task whose variant tags it solves as written
    (all of its tags, none of its `not`); the others are named, with what they solve."""
    docs = arm("docs", 60, variants=["d128", "seed"])
    r = arm("docs+example", 60, variants=["d128", "seed"])
    blocks = ["# Worked GEMM  (examples/sm_90a/gemm.md)\n\n# Worked GEMM\n\nThe whole kernel.",
              "# Any GEMM  (examples/sm_90a/gemm_any.md)\n\n# Any GEMM\n\nBody."]
    block = "\n\n".join(blocks)
    assert r.text == docs.text + "\n" + block and r.tokens == tok(r.text) and r.mode == "docs+example"
    assert r.example == ("served examples/sm_90a/gemm.md; served examples/sm_90a/gemm_any.md; examples/sm_90a/gemm_d96.md "
                         "left out: it solves d96 as written")
    assert r.parts == {**docs.parts, "example": {"tokens": tok(block), "sections": 2}}
    assert r.sections[-2:] == [
        kr.SectionRef("examples/sm_90a/gemm.md", "Worked GEMM", tok("# Worked GEMM\n\nThe whole kernel."), 0.0, "example"),
        kr.SectionRef("examples/sm_90a/gemm_any.md", "Any GEMM", tok("# Any GEMM\n\nBody."), 0.0, "example")]
    assert r.truncated == docs.truncated and r.truncated
    causal = arm("docs+example", 60, variants=["d128", "seed", "causal"])
    assert causal.example == ("examples/sm_90a/gemm.md left out: it solves d128, seed (not causal, fp8) as written; "
                              "examples/sm_90a/gemm_any.md left out: it solves every variant (not causal) as written; "
                              "examples/sm_90a/gemm_d96.md left out: it solves d96 as written")
    assert causal.parts["example"] == {"tokens": 0, "sections": 0}
    assert causal.text == arm("docs", 60, variants=["d128", "seed", "causal"]).text
    assert causal.sections == arm("docs", 60, variants=["d128", "seed", "causal"]).sections
    other = kr.retrieve("a kernel", "sm_90a", [], mode="docs+example", op_type="attention", variants=[])
    assert other.example == "no worked example for attention on sm_90a"
    # no doc section fits: the examples alone
    alone = arm("docs+example", 1, variants=["d96"])
    assert alone.text == ("# Any GEMM  (examples/sm_90a/gemm_any.md)\n\n# Any GEMM\n\nBody.\n\n"
                          "# D96 GEMM  (examples/sm_90a/gemm_d96.md)\n\n# D96 GEMM\n\nBody.")
    assert alone.parts["docs"] == {"tokens": 0, "sections": 0} and not alone.text.startswith("\n")


def test_every_count_is_in_the_models_tokenizer(arms, monkeypatch):
    """A model whose tokenizer counts characters: the budgets, every section's tokens, each part's
    and the whole text's tokens, in every arm, hints included."""
    real = kr.count_tokens
    monkeypatch.setattr(kr, "tokenizer_for", lambda model: "chars" if model == "char-model" else kr.FALLBACK_TOKENIZER)
    monkeypatch.setattr(kr, "count_tokens", lambda text, tokenizer=kr.FALLBACK_TOKENIZER:
                        len(text) if tokenizer == "chars" else real(text, tokenizer))
    for mode in ("docs", "docs+headers", "docs+example", "full", "none"):
        r = arm(mode, 400, model="char-model", header_budget=len(API), hints=["split_k"])
        assert (r.tokenizer, r.tokens, r.mode) == ("chars", len(r.text), mode), mode
        assert r.parts["hints"]["tokens"] == len(r.text[r.text.index("# Pattern hint"):])
        assert r.sections[-1].tokens == len(f"# Pattern hint: split K\n\n{HINT_TEXT}")
        if mode != "none":
            assert sum(x.tokens + 1 for x in r.sections if x.why not in ("full", "example") and not x.why.startswith("hint"))\
                <= 400 and r.parts["docs"]["tokens"] == len(kr._render([arms[(x.doc, x.heading)] for x in r.sections
                                                                        if x.why not in ("full", "example")
                                                                        and not x.why.startswith("hint")]))
        if mode in ("docs+headers", "full"):
            assert r.parts["headers"] == {"tokens": len(API), "sections": 2}
            cut = arm(mode, 400, model="char-model", header_budget=len(API) - 1)
            assert cut.parts["headers"]["sections"] == 1 and cut.truncated


def test_the_arms_follow_the_feedback_the_arch_and_the_family(arms):
    r = arm("docs+headers", 10 ** 6, feedback=FEEDBACK)
    assert (r.sections[0].doc, r.sections[0].heading) == ("sm_90a/epsilon.md", "Everything at once")
    assert r.focus == "compile_error"
    assert kr.retrieve("a kernel", "sm_100a", [], mode="docs+headers", op_type="gemm").text.endswith("### other.cuh\n")
    full = kr.retrieve("a kernel", "sm_90a", [], mode="full", op_type="attention", variants=[])
    assert not any(x.doc == "sm_90a/alpha.md" for x in full.sections)  # gemm's own doc
    assert kr.retrieve("a gemm kernel", "sm_90a", ["wgmma"], op_type="gemm").mode == "docs"  # the default arm
    assert arm("docs", 1).parts == {"docs": {"tokens": 0, "sections": 0}}  # a budget of 1 is still the docs arm


def test_hint_blocks_in_the_order_named(arms):
    assert kr.hint_block([]) == ""
    two = kr.hint_block(["two_ctas", "split_k"])
    # two_ctas's body keeps its first heading (it is not its title); split_k's loses it, not the later one
    assert two == ("# Pattern hint: two CTAs  (hints/two_ctas.md)\n\n# Pattern hint: split K\n\n" + HINT_TEXT + "\n\n"
                   "# Pattern hint: split K (two halves)  (hints/split_k.md)\n\n" + HINT_TEXT + "\n")
    assert kr.load_hints()["split_k"].text.count("# Pattern hint: split K") == 2  # the title, and a heading that stays


def test_retrieve_refuses_an_unknown_arm_and_the_none_arm_holds_nothing_but_hints(arms):
    with pytest.raises(ValueError) as info:
        arm("everything")
    assert str(info.value) == ("unknown knowledge mode 'everything' (use one of none, docs, docs+headers, full, "
                               "docs+example)")
    for r in (arm("none"), arm("docs", 0)):
        assert (r.text, r.tokens, r.parts, r.sections) == ("", 0, {}, [])
    hinted = arm("none", hints=["split_k"])
    block = f"# Pattern hint: split K (two halves)  (hints/split_k.md)\n\n{HINT_TEXT}\n"
    assert hinted.text == block and hinted.tokens == tok(block)
    assert hinted.parts == {"hints": {"tokens": tok(block), "sections": 1}}
    assert hinted.sections == [kr.SectionRef("hints/split_k.md", "Pattern hint: split K (two halves)",
                                             tok(f"# Pattern hint: split K\n\n{HINT_TEXT}"), 0.0,
                                             "hint:split_k")]
    docs = arm("docs", 60)
    both = arm("docs", 60, hints=["split_k"])
    assert both.text == docs.text.rstrip("\n") + "\n\n" + block and both.tokens == tok(both.text)
    assert both.sections[:-1] == docs.sections and both.parts["docs"] == docs.parts["docs"]
    assert arm("docs", 60, feedback="- `tma`: MISSING - no instruction").focus == "carried_work"


def test_the_full_arm_adds_in_doc_order_what_fits_its_budget_skipping_what_does_not(arms, monkeypatch):
    """Every eligible section the docs arm did not pick, in doc order, while the total stays within
    the limit (equality fits); one too big is skipped and a later, smaller one still comes."""
    docs = arm("docs", 60)
    picked = {(x.doc, x.heading) for x in docs.sections}
    used = sum(tok(arms[k].text) for k in picked)
    rest = [(s.doc, s.heading) for d in kr.docs_for("sm_90a", "gemm") for s in d.sections
            if (s.doc, s.heading) not in picked and kr.eligible(s, "sm_90a", "gemm", frozenset())]
    assert any(tok(arms[a].text) > tok(arms[b].text) for i, a in enumerate(rest) for b in rest[i + 1:])
    for limit in range(60, used + sum(tok(arms[k].text) for k in rest) + 1):  # (the arm's own 60 at least)
        monkeypatch.setattr(kr, "FULL_MODE_BUDGET", limit)
        want, total = [], used
        for k in rest:
            if total + tok(arms[k].text) <= limit:
                want.append(k)
                total += tok(arms[k].text)
        r = arm("full", 60)
        assert [(x.doc, x.heading) for x in r.sections if x.why == "full"] == want, limit
        assert r.truncated == (len(want) < len(rest)) and API in r.text


def test_the_full_arm_keeps_a_sections_own_family_marker(arms, tmp_path):
    (tmp_path / "sm_90a/gamma.md").write_text(DOCS["sm_90a/gamma.md"].replace(
        "## Unrelated\n", "## Unrelated\n<!-- ops: attention -->\n"))
    for c in (kr.load_docs, kr._index):
        c.cache_clear()
    full = arm("full", 60)
    assert ("sm_90a/gamma.md", "Unrelated") not in {(x.doc, x.heading) for x in full.sections}
    assert "zebra" not in full.text


def test_the_docs_part_of_every_arm_is_the_selection_in_the_models_tokens(arms, monkeypatch):
    real = kr.count_tokens
    monkeypatch.setattr(kr, "tokenizer_for", lambda model: "chars" if model == "char-model" else kr.FALLBACK_TOKENIZER)
    monkeypatch.setattr(kr, "count_tokens", lambda text, tokenizer=kr.FALLBACK_TOKENIZER:
                        len(text) if tokenizer == "chars" else real(text, tokenizer))
    want = select(400, tz="chars")[0]
    for mode in ("docs", "docs+headers", "docs+example", "full"):
        r = arm(mode, 400, model="char-model")
        assert [(x.doc, x.heading) for x in r.sections if x.why not in ("full", "example")] == want, mode
