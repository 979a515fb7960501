"""Audit of the context ablation (after issue 25): each arm holds what its name says, for every
task family and both arches, on turn 1 and on the turns after it.

Every retrieval here is the agent's own call (agent.nodes.retrieval_call), and the multi-turn
checks run the real agent loop with scripted replies (real NVRTC + ptxas, real SQLite)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.nodes import retrieval_call
from agent.trajectory import RunConfig
from knowledge import retriever as kr
from tasks import list_tasks

ARCHES = ("sm_90a", "sm_100a")
TASKS = list_tasks()
OP_TYPES = {t.op_type for t in TASKS}


def _retrieve(task, arch: str, mode: str, feedback: str | None = None, **cfg) -> kr.Retrieval:
    config = RunConfig(run_id="audit", task=task.name, model="scripted", arch=arch, context=mode,
                       requested_features=task.features_for(arch), **cfg)
    return kr.retrieve(**retrieval_call(task, config, feedback))


def _off_task(heading: str, op_type: str) -> bool:
    """A section that by its own heading is about another task family than `op_type`: FP8
    material (e4m3 operands, FP8 attention's P scaling) for a bf16 task, the attention backward
    for a forward task, the forward's online-softmax correction for the backward, GDN's chunked
    prefill for decode and its MTP notes for decode and prefill."""
    h = heading.lower()
    fp8_only = ("fp8" in h or "f8f6f4" in h) and "e4m3 (k32)" not in h  # wgmma's "N = 96 and e4m3": both
    if fp8_only and not op_type.startswith("fp8"):
        return True
    if h.startswith("backward") and op_type != "mha_bwd":
        return True
    if h.startswith("prefill") and op_type not in ("gdn_prefill", "gdn_mtp"):  # MTP builds on the chunked form
        return True
    if h.startswith("mtp") and op_type != "gdn_mtp":
        return True
    return h.startswith("correction") and op_type == "mha_bwd"


# One task per op type (the variants of a family share their docs but for the query).
_BY_OP = {}
for _t in TASKS:
    _BY_OP.setdefault(_t.op_type, _t)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("task", list(_BY_OP.values()), ids=list(_BY_OP))
def test_no_arm_holds_another_familys_section(task, arch):
    """Issue 25 kept FP8 and GDN *docs* from other families' tasks, but a doc written for every
    attention task (or, with no `ops`, for every task) carries sections for one family only:
    the FP8 P scaling and the sm_100a FP8 notes reached bf16 attention, tcgen05's e4m3 operands
    every sm_100a task, the backward's launches every forward task (about 1,300 of the 6,000
    tokens of the bf16 forward's docs arm on sm_100a). The docs arm is "the sections for the
    task at hand", and full "every section of the task family's docs": neither holds them."""
    for mode in ("docs", "full"):
        r = _retrieve(task, arch, mode)
        off = [f"{s.doc}#{s.heading}" for s in r.sections if _off_task(s.heading, task.op_type)]
        assert not off, f"{task.name} {arch} {mode}: sections of another family: {off}"


def test_fp8_and_backward_sections_still_reach_their_own_tasks():
    """The narrowing keeps each section where it belongs (in the full arm, which holds all of them)."""
    want = {
        ("fp8_mha_fwd", "sm_90a"): ["common/attention.md#FP8 attention: P scaling (both arches)"],
        ("fp8_mha_fwd", "sm_100a"): ["sm_100a/attention.md#FP8 attention on sm_100a",
                                     "sm_100a/tcgen05.md#FP8 operands (kind::f8f6f4)"],
        ("fp8_gemm", "sm_100a"): ["sm_100a/tcgen05.md#FP8 operands (kind::f8f6f4)"],
        ("mha_bwd", "sm_90a"): ["common/attention.md#Backward: what to compute, in which launches"],
        ("mha_bwd", "sm_100a"): ["sm_100a/attention.md#Backward on sm_100a"],
        ("mha_fwd", "sm_100a"): ["sm_100a/attention.md#Correction: rescaling O in TMEM"],
        ("gdn_mtp", "sm_90a"): ["common/pattern_gdn.md#Prefill: the chunked form (tensor-core work)",
                                "common/pattern_gdn.md#MTP (speculative verification): a few tokens from a pooled state"],
        ("gdn_decode", "sm_100a"): ["common/pattern_gdn.md#Decode (one token): memory-bound"],
    }
    for (op, arch), ids in want.items():
        got = {f"{s.doc}#{s.heading}" for s in _retrieve(_BY_OP[op], arch, "full").sections}
        assert set(ids) <= got, (op, arch, set(ids) - got)
    # and the FP8 tasks' docs arm now ranks the e4m3 operand section as its family's
    docs = _retrieve(_BY_OP["fp8_gemm"], "sm_100a", "docs")
    why = {f"{s.doc}#{s.heading}": s.why for s in docs.sections}
    assert "family:fp8_gemm" in why["sm_100a/tcgen05.md#FP8 operands (kind::f8f6f4)"]


def test_section_ops_markers_name_real_task_families_and_never_reach_the_model():
    """A misspelt family in a marker would hide its section from every task; the marker line is
    bookkeeping, not text for the model."""
    marked = [s for d in kr.load_docs() for s in d.sections if s.ops]
    assert marked, "no section narrows its doc's families"
    for s in marked:
        assert set(s.ops) <= OP_TYPES, (s.doc, s.heading, set(s.ops) - OP_TYPES)
        assert "<!-- ops" not in s.text
    for task in _BY_OP.values():
        for arch in ARCHES:
            assert "<!-- ops" not in _retrieve(task, arch, "full").text


@pytest.mark.parametrize("task", list(_BY_OP.values()), ids=list(_BY_OP))
def test_blackwell_arms_name_wgmma_only_as_the_other_arch(task):
    """wgmma does not exist on sm_100a. Docs served to both arches (warp specialisation, ldmatrix,
    the GDN pattern) told a Blackwell model its consumers "run wgmma" and to issue "one m64n8k8
    tf32 wgmma": another arch's instructions in the sm_100a arms. Every paragraph of an sm_100a
    arm's docs that names wgmma now frames it as sm_90a's (or says what tcgen05 does instead).
    (The helper-header API is generated from the headers' comments and is checked apart.)"""
    import re

    r = _retrieve(task, "sm_100a", "full")
    by_id = {f"{s.doc}#{s.heading}": s for d in kr.load_docs() for s in d.sections}
    for ref in r.sections:
        for para in re.split(r"\n\s*\n", by_id[f"{ref.doc}#{ref.heading}"].text):
            if "wgmma" in para:
                assert re.search(r"tcgen05|sm_90a|Hopper|sm_100a|Blackwell", para), \
                    f"{task.name}: {ref.doc}#{ref.heading} names wgmma as if it ran on sm_100a:\n{para}"


def test_knowledge_version_names_what_an_arm_can_send(tmp_path):
    """A run's arm is auditable after the fact only with the text it drew from: the version
    changes with any doc, worked example, pattern hint, companion table or helper header, and only with them."""
    import shutil

    root = tmp_path / "knowledge"
    for sub in ("docs", "examples", "hints", "include"):  # hints: --hint adds them to any arm
        shutil.copytree(kr.ROOT / sub, root / sub)
    base = kr.knowledge_version(root)
    assert base == kr.knowledge_version() and len(base) == 64
    (root / "retriever_notes.txt").write_text("not sent to any model")
    assert kr.knowledge_version(root) == base
    for rel in ("docs/sm_90a/wgmma.md", "examples/sm_90a/gemm_tma_wgmma.md", "include/ptxbench/tma.cuh",
                "hints/warp_specialization.md", "docs/features.yaml"):
        path = root / rel
        old = path.read_text()
        path.write_text(old + "\n")
        assert kr.knowledge_version(root) != base, rel
        path.write_text(old)
    assert kr.knowledge_version(root) == base


# How docs say an axis in words: "at batch 1", "3000 tokens", "sequence length 77".
_AXIS_WORDS = {"batch_size": ["batch", "batch size", "batches"], "num_seqs": ["sequences", "seqs"],
               "total_seq_len": ["tokens", "total tokens", "total length"], "pool_size": ["pool", "pool size", "slots"],
               "S": ["sequence length", "seq len", "seqlen"], "L": ["sequence length", "seq len", "seqlen"],
               "M": ["rows"], "m": ["rows"]}


@pytest.mark.parametrize("arch", ARCHES)
def test_no_arm_names_a_held_out_size_in_words(arch):
    """test_context_arms scans for `axis=value` and workload names; a doc can also say a held-out
    size in words. The GDN decode notes said "at batch 1 there are only 8-16 heads": batch 1 is
    a held-out decode workload, named in the docs arms and not in none. Every task's full and
    docs+example arms (all the text any of its arms can hold) are scanned."""
    import re

    for task in TASKS:
        visible = {(a, v) for w in task.workloads_for("visible") for a, v in w.axes.items()}
        texts = [_retrieve(task, arch, mode).text for mode in ("full", "docs+example")]
        for w in task.workloads_for("held_out"):
            for axis, value in w.axes.items():
                if (axis, value) in visible or axis not in _AXIS_WORDS:
                    continue
                words = "|".join(re.escape(s) for s in _AXIS_WORDS[axis])
                for pat in (rf"\b(?:{words})\s*(?:=|of|:)?\s*{value}(?![\w.])", rf"(?<![\w.]){value}\s+(?:{words})\b"):
                    for text in texts:
                        m = re.search(pat, text, re.I)
                        assert not m, f"{task.name} {arch}: held-out {axis}={value} in words: " \
                                      f"...{text[max(0, m.start() - 60):m.end() + 40]}..."


def test_the_example_arm_holds_no_held_out_size_either():
    """test_context_arms scans the four nested arms; the worked examples of docs+example (whole
    kernels with their manifests, the likeliest place for a size) get the same scan."""
    from test_context_arms import _held_out_patterns, _turn1

    for task in TASKS:
        for arch in ARCHES:
            prompt = _turn1(task, arch, "docs+example")[1]
            for what, pat in _held_out_patterns(task):
                m = pat.search(prompt)
                assert not m, f"{task.name} {arch}: held-out {what!r}: ...{prompt[max(0, m.start() - 80):m.end() + 80]}..."


_FEEDBACK = ("ptxas error   : Instruction 'wgmma.mma_async' not supported on .target 'sm_100a'\n"
             "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized\n"
             "- `tma`: MISSING - no instruction proving it is in the SASS of the launched kernels")


@pytest.mark.parametrize("budget", [1500, 6000])
@pytest.mark.parametrize("arch", ARCHES)
def test_every_task_keeps_each_layer_within_its_budget(arch, budget):
    """The docs layer holds at most context_tokens (the text as sent, titles included) and the
    header API at most its own budget, for every task, with and without feedback; docs+headers
    is the docs arm's text plus the header API and nothing else."""
    for task in TASKS:
        for feedback in (None, _FEEDBACK):
            docs = _retrieve(task, arch, "docs", feedback, context_tokens=budget)
            both = _retrieve(task, arch, "docs+headers", feedback, context_tokens=budget)
            assert docs.tokens == docs.parts["docs"]["tokens"] <= budget, (task.name, docs.tokens)
            assert both.parts["headers"]["tokens"] <= kr.HEADER_BUDGET
            assert both.text == docs.text + "\n" + kr.header_api(arch), task.name


def _declarations(source: str) -> list[tuple[str, str]]:
    """(name, whole declaration with whitespace runs collapsed) of every PTXBENCH_DEVICE function
    (its template line, return type and complete parameter list) and every enum of a header."""
    import re

    flat = " ".join(source.split())
    out = []
    for m in re.finditer(r"(?:template <[^>]*> )?PTXBENCH_DEVICE [^(;{]*?\b(\w+)\(", flat):
        depth, j = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(flat[j], 0)
            j += 1
        out.append((m[1], flat[m.start():j].replace("PTXBENCH_DEVICE ", "")))
    for m in re.finditer(r"enum (\w+)[^{]*\{[^}]*\}", flat):
        out.append((m[1], m[0]))
    return out


@pytest.mark.parametrize("arch", ARCHES)
def test_the_header_api_lists_every_helper_whole(arch):
    """docs+headers claims the helper headers' API. The API generator skipped one-line templates
    (`template <int N = 0> PTXBENCH_DEVICE void wgmma_wait()`: the wait of the fence -> mma ->
    commit -> wait sequence, setmaxnreg_inc/dec, tma_store_wait, wgmma_fence_operands) and cut
    declarations that wrap at their first line (tcgen05_smem_desc without its `layout`
    parameter, the Tcgen05Swizzle enum without its 64B and 32B values)."""
    api = " ".join(kr.header_api(arch).split())
    for path in sorted((kr.INCLUDE_DIR / "ptxbench").glob("*.cuh")):
        only = kr.header_arches(path)
        if only is not None and arch not in only:
            continue
        for name, decl in _declarations(path.read_text()):
            assert decl in api, f"{path.name}: {name} is not in the {arch} header API as declared: {decl}"
