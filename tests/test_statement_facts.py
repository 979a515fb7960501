"""The none arm holds harness facts only, and --require off names no instruction (issue 41).

Every task x arch x require setting x language is rendered the way a run opens its chat
(agent.nodes.turn1_messages over agent.run.render_statement, the none arm: no docs) and
searched for the facts the architecture docs teach (knowledge/docs/doc_only_facts.txt): a
tuned example manifest or a design tip in a description would hand every arm the docs' design.
Under --require off no prompt names the requested instructions or states a credit rule, and the
feedback reports correctness and speed only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent import feedback as fb
from agent.nodes import turn1_messages
from agent.run import render_statement
from agent.trajectory import Budget, CandidateRecord, RunConfig, Verdicts
from tasks import list_tasks
from tools.results import CompileResult, EvalResult, FeatureVerdict, InspectResult

REPO = Path(__file__).resolve().parents[1]
FACTS_FILE = REPO / "knowledge" / "docs" / "doc_only_facts.txt"
ARCHES = ("sm_90a", "sm_100a")
TASKS = list_tasks()
# What --require off must never show: the instructions the tasks request, by any of their names.
INSTRUCTION_NAMES = re.compile(r"wgmma|cp\.async\.bulk|mbarrier|\bTMA\b|tcgen05|setmaxnreg|tensor memory", re.I)
# A request or a credit rule, in the words the prompts use for them.
REQUEST_WORDS = re.compile(r"requested instruction|Requested instructions|credited|must use these|asks for them", re.I)


def doc_only_facts() -> list[tuple[str, re.Pattern]]:
    facts = []
    for n, line in enumerate(FACTS_FILE.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        category, sep, pattern = line.partition(": ")
        assert sep and category.strip() and pattern.strip(), f"{FACTS_FILE.name}:{n}: want 'category: regex'"
        facts.append((category.strip(), re.compile(pattern.strip(), re.I)))
    return facts


def found(text: str) -> list[str]:
    return [f"{cat}: {m.group(0)!r} in {line.strip()[:140]!r}" for line in text.splitlines()
            for cat, rx in doc_only_facts() if (m := rx.search(line))]


def none_prompt(task, arch: str, require: str, lang: str = "cuda") -> str:
    cfg = RunConfig(run_id="t", task=task.name, model="scripted", arch=arch, lang=lang, context="none",
                    require=require, requested_features=task.features_for(arch), budget=Budget(max_turns=8))
    return "\n".join(m["content"] for m in turn1_messages(cfg, render_statement(task, cfg)))


def test_the_list_catches_what_the_statement_used_to_say():
    """Each category of the list matches the design text the statement held before issue 41, so
    a list that matches nothing cannot pass the tests below."""
    before = {
        "swizzle mode": '{"name": "tmap_A", "tensor": "A", "box": [128, 64], "swizzle": "128B"}',
        "box size": "a load still delivers (and counts in its transaction bytes) the whole box",
        "warpgroup count": '"block": [384],',
        "stage count": '"shared_bytes": "4 * (128 * 64 + 128 * 64) * 2 + 1024"',
        "V transpose": "so V (stored with D contiguous) must be transposed before P @ V",
        "P scaling": "P must be scaled into e4m3's normal range (e.g. x256)",
        "chunk size": "the chunked form on tensor cores (chunks of 64 tokens: see the GDN pattern doc)",
        "kernel split": '{"kernel": "attn_bwd_convert_dq", "args": ["dQ_accum", "dQ"]}',
        "base-2 scale": '{"type": "f32", "value": "sm_scale * 1.4426950408889634"}',
        "doc pointer": "see the GDN pattern doc",
        "alignment tip": "so align it yourself where a swizzle needs more",
        "GDN state tip": "without a state write-back they are S_0 times 2 x seq_len columns",
    }
    facts = doc_only_facts()
    assert {c for c, _ in facts} == set(before)
    for category, text in before.items():
        assert any(rx.search(text) for c, rx in facts if c == category), category
    # the manifest schema's list of values is a harness fact, not a choice
    assert not found('`swizzle` is "none" (default), "32B", "64B" or "128B".')


@pytest.mark.parametrize("require", ["on", "off"])
@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_none_arm_holds_no_doc_only_fact(task, arch, require):
    for lang in ("cuda", "ptx"):
        hits = found(none_prompt(task, arch, require, lang))
        assert not hits, f"{task.name} {arch} require {require} {lang}:\n" + "\n".join(hits)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_require_off_names_no_instruction(task, arch):
    for lang in ("cuda", "ptx"):
        text = none_prompt(task, arch, "off", lang)
        assert not INSTRUCTION_NAMES.search(text), INSTRUCTION_NAMES.search(text).group(0)
        assert not REQUEST_WORDS.search(text), REQUEST_WORDS.search(text).group(0)
    on = none_prompt(task, arch, "on")
    assert "Requested instructions" in on and "credited only if" in on  # the switch is the only difference


def test_example_manifest_is_the_same_on_both_arches():
    from tasks.describe import example_manifest

    for task in TASKS:
        if task.features_for("sm_90a") == task.features_for("sm_100a") or \
                ("tma" in task.features_for("sm_90a")) == ("tma" in task.features_for("sm_100a")):
            assert example_manifest(task, "sm_90a") == example_manifest(task, "sm_100a"), task.name
        assert "tensor_maps" not in example_manifest(task, "sm_90a", require=False)


def _arch_missing_eval() -> EvalResult:
    """A SIMT kernel of the GEMM task: compiled, the requested features missing from the SASS."""
    comp = CompileResult(status="ok", arch="sm_90a", language="cuda")
    insp = InspectResult(status="ok", arch="sm_90a", features={"wgmma": FeatureVerdict(present=False),
                                                              "tma": FeatureVerdict(present=False)})
    return EvalResult(task="gemm_n7168_k5120", arch="sm_90a", compile=comp, inspect=insp,
                      requested_features=["wgmma", "tma"])


def test_feedback_under_off_reports_no_missing_instruction():
    ev = _arch_missing_eval()
    rec = fb.candidate_record(1, 0, "candidates/1-0", ev)
    assert rec.outcome == "arch_missing"
    on = fb.render_feedback(1, "repair", "cuda", rec, ev, max_turns=4)
    assert "MISSING" in on and "wgmma" in on
    # under off the loop's goal is met by this kernel (compiled, not shown wrong): optimise, and say so
    assert fb.best_eligible(rec, require=False) and not fb.best_eligible(rec)
    off = fb.render_feedback(1, "optimise", "cuda", rec, ev, max_turns=4, require=False)
    assert not INSTRUCTION_NAMES.search(off) and not REQUEST_WORDS.search(off), off
    assert "compiles (its correctness is not known yet)" in off
    best = CandidateRecord(turn=1, sample=0, path="candidates/1-0", outcome="arch_missing", verified=True,
                           verdicts=Verdicts(compiled=True, correct=True, speedup=0.5))
    worse = rec.model_copy(update={"turn": 2, "path": "candidates/2-0", "outcome": "incorrect"})
    text = fb.render_feedback(2, "repair", "cuda", worse, None, others=[best], best=best, require=False)
    assert "turn 1: correct, speedup 0.5x" in text and "arch" not in text
