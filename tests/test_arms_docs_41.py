"""Issue 41, the docs side of the ablation: every docs arm teaches the whole pipeline of the task's
requested features in code (a TMA tensor load with its mbarrier, wgmma's fence/commit/wait), a
requested feature brings its companions (data: knowledge/docs/features.yaml), a section marked for
one arch never reaches the other, no doc markup reaches a prompt, and no held-out variant's recipe
reaches a run of a train-split task. Prompts are rendered the way agent.nodes renders them, and once
through the real `agent solve` with a scripted model."""
from __future__ import annotations

import re

import pytest
from agent_loop_helpers import NO_CODE, agent_cli, events, write_script

from agent import prompts
from agent.nodes import retrieval_call
from agent.trajectory import RunConfig
from knowledge import retriever as kr
from tasks import list_tasks
from tasks.describe import render_task
from tasks.registry import get_task, task_split

ARCHES = ("sm_90a", "sm_100a")
TASKS = list_tasks()
DOC_ARMS = ("docs", "docs+headers", "full", "docs+example")
STEERING = ("gemm_n7168_k5120", "mha_bwd_d128", "mha_fwd_d128_causal")
_FENCE = re.compile(r"```(?:cuda|ptx)\n(.*?)```", re.S)


def _retrieval(task, arch: str, mode: str) -> kr.Retrieval:
    cfg = RunConfig(run_id="t", task=task.name, model="scripted", arch=arch, context=mode,
                    requested_features=task.features_for(arch))
    return kr.retrieve(**retrieval_call(task, cfg, None))


_CACHE: dict[tuple[str, str, str], tuple[str, kr.Retrieval]] = {}


def turn1(task, arch: str, mode: str) -> tuple[str, kr.Retrieval]:
    """(the whole turn-1 user prompt, the retrieval) as agent.nodes builds them."""
    key = (task.name, arch, mode)
    if key not in _CACHE:
        r = _retrieval(task, arch, mode) if mode != "none" else kr.Retrieval(mode="none")
        _CACHE[key] = (prompts.task_prompt(render_task(task, arch, "cuda"), arch, prompts.context_block([r.text])), r)
    return _CACHE[key]


def code_of(text: str) -> str:
    return "\n".join(_FENCE.findall(text))


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_every_docs_arm_teaches_the_pipeline_of_its_requested_features_in_code(task, arch):
    feats = kr.with_companions(task.features_for(arch))
    for mode in ("docs", "docs+headers", "full"):
        _, r = turn1(task, arch, mode)
        code = code_of(r.text)
        if "tma" in feats:
            for construct in ("cp.async.bulk.tensor", "mbarrier.init", "expect_tx", "mbarrier.try_wait"):
                assert construct in code, (mode, construct)
            assert "fence.proxy.async" in r.text, mode  # the async-proxy fence, with when it is needed
        if "wgmma" in feats:
            for construct in ("wgmma.fence", "wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group"):
                assert construct in code, (mode, construct)
        if "tcgen05_mma" in feats:
            for construct in ("tcgen05.alloc", "tcgen05.mma", "tcgen05.commit"):
                assert construct in r.text, (mode, construct)
        # every core section of a requested feature (and companion) is in the arm, first
        core = [s for d in kr.docs_for(arch, task.op_type) for s in d.sections
                if set(s.core) & set(feats) and kr.eligible(s, arch, task.op_type, frozenset(
                    kr.task_variants(task.name, task.tags)))]
        got = {(x.doc, x.heading) for x in r.sections}
        assert core and all((s.doc, s.heading) in got for s in core), [s.heading for s in core]


@pytest.mark.parametrize("name", STEERING)
def test_the_steering_tasks_docs_arm_holds_the_tma_load_and_its_wait_in_code(name):
    """The issue's steering check, on the three tasks it names (sm_90a, docs arm)."""
    prompt, _ = turn1(get_task(name), "sm_90a", "docs")
    code = code_of(prompt)
    assert "cp.async.bulk.tensor" in code and "mbarrier.try_wait" in code


@pytest.mark.parametrize("arch", ARCHES)
def test_no_markup_and_no_other_arch_material_in_any_prompt(arch):
    for task in TASKS:
        for mode in DOC_ARMS:
            prompt, r = turn1(task, arch, mode)
            assert "<!--" not in prompt and "-->" not in prompt, (task.name, mode)
            if arch == "sm_90a":
                assert "tcgen05" not in prompt.lower() and "(sm_100a/" not in prompt, (task.name, mode)
            for s in r.sections:
                sec = _section(s.doc, s.heading)
                if sec is not None:
                    assert sec.for_arch(arch), (task.name, mode, s.doc, s.heading)


def _section(doc: str, heading: str) -> kr.Section | None:
    return next((s for d in kr.load_docs() for s in d.sections if s.doc == doc and s.heading == heading), None)


def test_markup_is_stripped_from_the_text_but_kept_for_the_snippet_checks():
    sec = _section("sm_90a/wgmma.md", "Mistake: writing accumulators while the wgmma runs (C7515)")
    assert "<!-- expect: info C7515 -->" in sec.source and "<!--" not in sec.text
    assert sec.tokens == kr.estimate_tokens(sec.text)
    assert any(s.expect == ("info", "C7515") for s in kr.snippets() if s.heading == sec.heading)
    assert kr.strip_markup("a\n<!-- arch: sm_100a -->\nb <!-- inline --> c\n") == "a\nb  c"


def test_companions_are_data_and_every_requested_feature_has_its_pipeline():
    comp = kr.companions()
    assert "mbarrier" in comp["tma"] and "mbarrier" in kr.with_companions(["tma"])
    assert kr.with_companions(["wgmma", "tma"])[:2] == ["wgmma", "tma"]  # requested first
    vocab = {"wgmma", "tma", "bulk_copy", "mbarrier", "setmaxnreg", "stmatrix", "ldmatrix", "cp_async",
             "cluster", "pdl", "mma_sync", "tcgen05_mma", "tmem", "tcgen05_alloc"}
    assert set(comp) <= vocab and all(set(v) <= vocab for v in comp.values())
    cores = {f for d in kr.load_docs() for s in d.sections for f in s.core}
    assert cores <= vocab
    for task in TASKS:
        for arch in ARCHES:
            for f in kr.with_companions(task.features_for(arch)):
                assert any(f in s.core and s.for_arch(arch) for d in kr.docs_for(arch) for s in d.sections), (arch, f)


def test_an_arch_marked_section_reaches_only_its_arch():
    marked = [s for d in kr.load_docs() for s in d.sections if s.arches]
    assert marked  # e.g. "wgmma compiled for Blackwell" (sm_100a) and the proxy-fence sections
    for s in marked:
        for arch in set(ARCHES) - set(s.arches):
            r = kr.retrieve(s.heading, arch, [], mode="full", token_budget=6000)
            assert (s.doc, s.heading) not in {(x.doc, x.heading) for x in r.sections}


@pytest.mark.parametrize("task", [t for t in TASKS if task_split(t.name) == "train"], ids=lambda t: t.name)
def test_no_held_out_variant_recipe_reaches_a_train_task(task):
    held_out_only = {v for d in kr.load_docs() for s in d.sections for v in s.variants} - {
        v for t in TASKS if task_split(t.name) == "train" for v in kr.task_variants(t.name, t.tags)}
    assert "d96" in held_out_only  # every d96 task is held out
    for arch in ARCHES:
        for mode in DOC_ARMS:
            _, r = turn1(task, arch, mode)
            for x in r.sections:
                sec = _section(x.doc, x.heading)
                assert sec is None or not set(sec.variants) & held_out_only, (arch, mode, x.heading)
            # the docs' text; the helper API (docs+headers, full) is one list per arch, the same for
            # every task, and keeps its m64n96 wrappers (METHODOLOGY, Known limits)
            docs_text = r.text.replace(kr.header_api(arch), "")
            assert not re.search(r"\bD = 96\b|\bN = 96\b|m64n96", docs_text), (arch, mode)


def test_a_held_out_task_sees_its_own_variant_recipe_only():
    _, r = turn1(get_task("mha_fwd_d96_causal"), "sm_90a", "full")
    heads = {x.heading for x in r.sections}
    assert {"Head dimension 96", "Other shapes: N = 96"} <= heads
    assert not {"Head dimension 64", "Head dimension 256"} & heads


def test_agent_solve_renders_the_pipeline_into_the_turn1_prompt(tmp_path):
    """The real CLI with a scripted model: the chat it sent on turn 1 (llm_request) holds the TMA
    load and its wait in code, no markup and no tcgen05 material."""
    model = write_script(tmp_path / "script.json", [NO_CODE])
    p = agent_cli("solve", "--task", "attn_bwd", "--model", model, "--arch", "sm_90a", "--context", "docs",
                  "--max-turns", "1", "--runs-dir", str(tmp_path / "runs"), "--quiet")
    assert p.returncode in (0, 1), p.stderr
    [run_dir] = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    [req] = events(run_dir, "llm_request")
    user = next(m["content"] for m in req["messages"] if m["role"] == "user")
    assert "cp.async.bulk.tensor" in code_of(user) and "mbarrier.try_wait" in code_of(user)
    assert "<!--" not in user and "tcgen05" not in user.lower()
    [ret] = events(run_dir, "retrieval")
    assert any(s["why"].startswith("core:") for s in ret["sections"])


@pytest.mark.parametrize("name,served", [("gemm_n7168_k5120", "gemm_tma_wgmma.md"),
                                         ("mha_fwd_d128", "attention_forward.md"), ("mha_bwd_d128", "attention_backward.md"),
                                         ("mha_fwd_d128_causal", None), ("mha_bwd_d128_causal", None),
                                         ("mha_fwd_d64", None), ("mha_bwd_d256", None), ("fp8_mha_with_lse_d128", None)])
def test_docs_example_serves_an_example_only_where_it_solves_the_task_as_written(name, served):
    task = get_task(name)
    _, docs = turn1(task, "sm_90a", "docs")
    _, r = turn1(task, "sm_90a", "docs+example")
    if served:
        assert r.parts["example"]["sections"] == 1 and r.example == f"served examples/sm_90a/{served}"
        # the wording inside the arm says what it is, and not that no arm holds it
        assert "kept out of every context arm" not in r.text and "Only the docs+example arm serves it" in r.text
    else:
        assert r.text == docs.text and r.parts["example"] == {"tokens": 0, "sections": 0}
        assert r.example.startswith(("no worked example", "examples/sm_90a/")) and "left out" in r.example \
            or r.example.startswith("no worked example")


def test_a_run_records_which_example_it_was_served(tmp_path):
    model = write_script(tmp_path / "script.json", [NO_CODE])
    p = agent_cli("solve", "--task", "attn_fwd_causal", "--model", model, "--arch", "sm_90a", "--context",
                  "docs+example", "--max-turns", "1", "--runs-dir", str(tmp_path / "runs"), "--quiet")
    assert p.returncode in (0, 1), p.stderr
    [run_dir] = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    [ret] = events(run_dir, "retrieval")
    assert ret["added"]["example"] == {"tokens": 0, "sections": 0}
    assert "attention_forward.md left out: it solves d128 (not causal)" in ret["example"]


# ---------------------------------------------------------------- turns 2+: docs follow the error

def _compiler_feedback(source: str, lang: str = "cuda", arch: str = "sm_90a") -> str:
    """What a real compile says, as the feedback quotes it (tools' diagnostics, rendered)."""
    from tools.compile import compile_source

    r = compile_source(source, lang, arch)
    return "\n".join(d.render() for d in r.diagnostics if d.severity == "error" or d.code)


def _added_after(feedback: str) -> tuple[kr.Retrieval, list[kr.SectionRef]]:
    """The sections a turn after the first adds for this feedback (agent.nodes' filter)."""
    gemm = get_task("gemm_n7168_k5120")
    _, first = turn1(gemm, "sm_90a", "docs")
    cfg = RunConfig(run_id="t", task=gemm.name, model="scripted", arch="sm_90a", context="docs",
                    requested_features=gemm.features_for("sm_90a"))
    r = kr.retrieve(**retrieval_call(gemm, cfg, feedback))
    seen = {(s.doc, s.heading) for s in first.sections}
    return r, [s for s in r.sections if (s.doc, s.heading) not in seen and kr.follows_feedback(s.why)]


def test_a_syntax_error_adds_no_serialization_sections():
    from agent_loop_helpers import BROKEN_LINE_TEXT, PROBE_CU

    feedback = _compiler_feedback(PROBE_CU.replace(BROKEN_LINE_TEXT, BROKEN_LINE_TEXT.replace("float d0", "flaot d0")))
    assert 'identifier "flaot" is undefined' in feedback
    r, added = _added_after(feedback)
    assert r.focus == "compile_error"
    assert not any(re.search(r"C75\d\d", s.why) for s in r.sections)  # no section ranked for a code
    assert not any("Serialization" in s.heading or "C75" in s.heading for s in added)


def test_a_compile_error_on_a_construct_adds_the_sections_that_show_it():
    from agent_loop_helpers import PROBE_CU

    feedback = _compiler_feedback(PROBE_CU.replace("mbarrier.try_wait.parity.shared::cta.b64",
                                                   "mbarrier.try_wait.parity.shared::cta.b32"))
    assert "mbarrier.try_wait.parity" in feedback
    r, _ = _added_after(feedback)
    assert r.focus == "compile_error"
    top = r.sections[0]
    assert "compile-error:construct:mbarrier.try_wait" in top.why and "mbarrier.try_wait" in code_of(
        _section(top.doc, top.heading).text)


def test_a_serialization_note_adds_its_c75xx_sections():
    c7514 = next(s for s in kr.snippets() if s.expect == ("info", "C7514"))
    feedback = _compiler_feedback(c7514.source, c7514.language)
    r, added = _added_after(feedback)
    assert r.focus == "serialization"
    assert added and all(kr.follows_feedback(s.why) for s in added)
    assert "C7514" in added[0].heading and added[0].why.startswith("serialization:code:C7514")


def test_work_not_carried_adds_that_features_pipeline():
    """The arch section's own line (agent/feedback.py writes it) for a TMA that did not carry the work."""
    import inspect

    from agent import feedback as fb

    assert "executed, but did not carry the task's work" in inspect.getsource(fb.arch_section)
    feedback = ("### Architecture instructions: executed without carrying the work\n"
                "- `tma`: executed, but did not carry the task's work: tma carried 3.0% of the task's input bytes "
                "(needs 50%)")
    focus = kr.feedback_focus(feedback)
    assert focus.kind == "carried_work" and focus.features == ("tma",)
    r = kr.retrieve("gemm", "sm_90a", ["wgmma", "tma"], feedback, op_type="gemm", token_budget=6000)
    pipeline = [s for s in r.sections if "carried-work:core:" in s.why]
    assert {s.heading for s in pipeline} >= {"Loading a tile", "Model", "Phases in a ring of stages"}
    assert r.sections[:len(pipeline)] == pipeline  # first


def test_a_turn_2_retrieval_event_says_why_each_section_was_added(tmp_path):
    """Through the loop: turn 1 a broken probe (NVRTC error), turn 2 the probe; the turn-2 retrieval
    event names the error class and every section it added follows it."""
    from agent_loop_helpers import broken_probe_reply, probe_reply

    model = write_script(tmp_path / "script.json", [broken_probe_reply(), probe_reply()])
    p = agent_cli("solve", "--task", "gemm", "--model", model, "--arch", "sm_90a", "--context", "docs",
                  "--max-turns", "2", "--runs-dir", str(tmp_path / "runs"), "--quiet")
    assert p.returncode in (0, 1), p.stderr
    [run_dir] = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    ret = events(run_dir, "retrieval")
    assert [e["turn"] for e in ret] == [1, 2] and ret[0]["focus"] == "none" and ret[1]["focus"] == "compile_error"
    why = {s["id"]: s["why"] for s in ret[1]["sections"]}
    assert all(kr.follows_feedback(why[i]) for i in ret[1]["new_sections"])
    assert not any("C75" in i for i in ret[1]["new_sections"])


# ---------------------------------------------------------------- docs teach PTX, headers the helpers

def _helper_names() -> set[str]:
    names = set()
    for path in kr.INCLUDE_DIR.glob("ptxbench/*.cuh"):
        names |= set(re.findall(r"PTXBENCH_DEVICE[^(]*?\b(\w+)\s*\(", path.read_text()))
    return names - {"memory"}


def _calls(name: str, text: str) -> bool:
    """`name` as an identifier of its own (not the tail of a PTX name: fence.mbarrier_init, nor a
    PTX special register the helper is named after: %cluster_ctarank)."""
    return re.search(rf"(?<![.%\w]){name}\b", text) is not None


def test_no_doc_names_a_helper():
    """Issue 41 item 4: the docs teach the PTX, the helper headers the API, so the docs ->
    docs+headers step adds exactly the helper API. Checked on what a model reads (the doc with
    its `<!-- ... -->` markup stripped: a feature marker such as tcgen05_alloc is not a call)."""
    helpers = _helper_names()
    assert len(helpers) > 60
    texts = [(d.path, re.sub(r"<!--.*?-->", "", d.body, flags=re.S)) for d in kr.load_docs()]
    texts += [(f"hints/{h.name}.md", h.text) for h in kr.load_hints().values()]  # --hint docs too
    for path, body in texts:
        named = sorted(n for n in helpers if _calls(n, body))
        assert not named, f"{path} names header helpers {named}: teach the PTX, the headers teach the API"
        assert "<ptxbench/" not in body and "namespace ptxbench" not in body, f"{path} includes a helper header"


def test_the_tma_load_every_docs_arm_holds_is_plain_ptx():
    """The core TMA section (in every docs arm of a task requesting TMA) calls no helper."""
    sec = _section("sm_90a/tma.md", "Loading a tile")
    assert "tma" in sec.core
    assert not {n for n in _helper_names() if _calls(n, sec.text)}
    assert "<ptxbench/" not in sec.text
