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
