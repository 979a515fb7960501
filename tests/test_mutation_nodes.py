"""The docs a later turn adds (agent/nodes.py, `cap_sections`): whole sections, in the
retriever's order, while their total fits the per-turn cap (`--context-turn-tokens`, default
2000: a turn's feedback, not a new manual, is the point of turns 2+; the ablation's later-turn
prompts are bounded by it).

Issue 46's planted bug: the cap applied to each section instead of to their total, so later
prompts grew without bound and the ablation changed."""
from __future__ import annotations

import pytest

from agent.nodes import cap_sections


def sections(*tokens: int) -> list[dict]:
    return [{"id": f"doc.md#s{i}", "tokens": t} for i, t in enumerate(tokens)]


def test_the_cap_bounds_the_total_not_each_section():
    chosen = cap_sections(sections(800, 800, 800), 2000)
    assert [x["id"] for x in chosen] == ["doc.md#s0", "doc.md#s1"]  # 1600; a third would make 2400


@pytest.mark.parametrize("tokens,cap,ids", [
    ((1000, 1000), 2000, [0, 1]),  # exactly at the cap: in
    ((1000, 1001), 2000, [0]),  # one token past: out
    ((2500, 300, 1800), 2000, [1]),  # too big alone: skipped, later ones still considered in order
    ((300, 1800, 1700), 2000, [0, 2]),  # 300 + 1800 > 2000; 300 + 1700 = 2000
    ((), 2000, []),
    ((5, 0, 7), 0, [1]),  # a zero cap adds only what costs nothing
])
def test_whole_sections_in_order_while_the_total_fits(tokens, cap, ids):
    chosen = cap_sections(sections(*tokens), cap)
    assert [x["id"] for x in chosen] == [f"doc.md#s{i}" for i in ids]
    assert sum(x["tokens"] for x in chosen) <= cap


def test_a_section_without_a_token_count_costs_nothing_and_is_kept():
    chosen = cap_sections([{"id": "a"}, {"id": "b", "tokens": None}, {"id": "c", "tokens": 10}], 5)
    assert [x["id"] for x in chosen] == ["a", "b"]
    # costs nothing: a counted section that fills the cap exactly still fits after two uncounted ones
    chosen = cap_sections([{"id": "a"}, {"id": "b", "tokens": None}, {"id": "c", "tokens": 5}], 5)
    assert [x["id"] for x in chosen] == ["a", "b", "c"]


def test_the_per_turn_cap_defaults_to_2000_tokens_everywhere_a_run_is_configured():
    """The same default in the run request and in the recorded config (a replay or a resumed run
    that fell back to another default would change the ablation's later turns)."""
    import dataclasses

    from agent.run import SolveRequest
    from agent.sweep import SweepConfig
    from agent.trajectory import RunConfig

    assert {f.name: f.default for f in dataclasses.fields(SolveRequest)}["context_turn_tokens"] == 2000
    assert RunConfig.model_fields["context_turn_tokens"].default == 2000
    assert SweepConfig.model_fields["context_turn_tokens"].default == 2000


# ---------------------------------------------------------------------------------------
# What a run asks the retriever for (`retrieval_call`): every arm's docs follow from it, so a
# dropped or renamed argument changes the ablation while the run still works.
# ---------------------------------------------------------------------------------------
def _config(**kw):
    from agent.trajectory import RunConfig

    base = dict(run_id="r", task="mha_fwd_d96_causal", arch="sm_100a", model="openai/some-model", context="full",
                context_tokens=4321, requested_features=["tma", "tcgen05"], hints=["pipelining"])
    return RunConfig(**{**base, **kw})


def test_the_retrieval_call_carries_the_runs_own_settings():
    """Each value is the run's, never a default: the arch keeps the other arch's docs out, the
    mode and token budget are the arm, the features and hints are what the run asked for, the
    model's tokenizer counts the budget, the feedback steers turns 2+."""
    from knowledge.retriever import task_query
    from tasks.registry import get_task

    task = get_task("mha_fwd_d96_causal")
    call = __import__("agent.nodes", fromlist=["retrieval_call"]).retrieval_call(task, _config(), "ptxas error X")
    assert call == {
        "task": task_query(task.description, "mha_fwd", "attention forward"),
        "arch": "sm_100a", "features": ["tma", "tcgen05"], "feedback": "ptxas error X", "mode": "full",
        "token_budget": 4321, "op_type": "mha_fwd",
        # the held-out head dimension's recipe reaches only its own runs: d96 from the name, tags as registered
        "variants": ["causal", "d96", "held_out_variant"],
        "model": "openai/some-model", "hints": ["pipelining"]}
    assert call["task"].startswith(task.description) and "mha_fwd_d96_causal" not in call["task"]  # never the id
    assert "mha fwd" in call["task"]  # the op type as words too


def test_the_retrieval_call_binds_to_the_retrievers_parameters():
    """Every key is a parameter of knowledge.retriever.retrieve (a misspelt one raises only when
    a run asks for docs), and a first turn sends no feedback."""
    import inspect

    from agent.nodes import retrieval_call
    from knowledge.retriever import retrieve
    from tasks.registry import get_task

    call = retrieval_call(get_task("gemm_n7168_k5120"), _config(task="gemm_n7168_k5120", hints=[]), None)
    inspect.signature(retrieve).bind(**call)
    assert call["feedback"] is None and call["hints"] == [] and call["variants"] == ["seed"]  # its registry tag; no head dimension
    assert call["op_type"] == "gemm"


def test_a_task_without_a_description_is_asked_for_by_its_family_and_op_type():
    from types import SimpleNamespace

    from agent.nodes import retrieval_call

    task = SimpleNamespace(description=None, op_type="mha_bwd", op_family="attention backward", name="t", tags=[])
    assert retrieval_call(task, _config(), None)["task"] == "attention backward mha_bwd mha bwd"


# ---------------------------------------------------------------------------------------
# What a run records of each evaluation (`run_summary`, the `run` event of events.jsonl): the
# report and `agent show` read it; held-out workloads are counts only (their shapes stay unseen).
# ---------------------------------------------------------------------------------------
def test_the_run_event_keeps_visible_workloads_whole_and_counts_held_out_ones():
    import json

    from agent.nodes import run_summary
    from tools.profile import KernelProfile, Profile
    from tools.results import CompileResult, EvalResult, ExecutedCheck, InspectResult, WorkloadResult

    def w(name, split, status):
        return WorkloadResult(workload=name, split=split, axes={"M": 64}, status=status,
                              reason="incorrect" if status == "failed" else None)

    wls = [w("v1", "visible", "passed"), w("v2", "visible", "failed"), w("h1", "held_out", "passed"),
           w("h2", "held_out", "failed"), w("h3", "held_out", "skipped"), w("h4", "held_out", "passed"),
           w("h5", "held_out", "passed")]
    wls[0].speedup_ci = (0.9, 1.1)
    stalls = KernelProfile(name="k", stalls=[("long_scoreboard", 0.5)])
    executed = ExecutedCheck(status="ok", executed={"wgmma": True}, carries={"wgmma": False},
                             profile=Profile(kernels=[stalls]))
    ev = EvalResult(task="gemm_n7168_k5120", arch="sm_90a", compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                    inspect=InspectResult(status="ok", arch="sm_90a"), run_status="failed", run_reason="a visible mismatch",
                    workloads=wls, executed=executed, speedup=1.25, gpu="NVIDIA H200")
    s = run_summary(ev)
    assert s["workloads"] == [wls[0].model_dump(mode="json"), wls[1].model_dump(mode="json")]
    # a skipped held-out workload is neither passed nor failed: 5 = 3 + 1 + the skipped one
    assert s["held_out"] == {"total": 5, "passed": 3, "failed": 1}
    # in JSON form (tuples as lists): what a listener is handed is what events.jsonl reads back
    assert json.loads(json.dumps(s)) == s
    assert (s["run_status"], s["run_reason"], s["gpu"], s["speedup"]) == ("failed", "a visible mismatch", "NVIDIA H200", 1.25)
    assert s["executed"] == executed.model_dump(mode="json")
    assert s["verdicts"] == ev.verdicts()
    assert set(s) == {"run_status", "run_reason", "gpu", "workloads", "held_out", "speedup", "executed", "verdicts"}


# ---------------------------------------------------------------------------------------
# The nodes themselves, in process: a real TrajectoryWriter (events.jsonl on disk), the scripted
# model, a stand-in retriever and a stand-in evaluator that answers with EvalResults built here
# (each test well under a second; tests/test_graph.py runs the same nodes through LangGraph with
# real compiles, seconds a test).
# ---------------------------------------------------------------------------------------
import json as _json
from types import SimpleNamespace as NS

from agent import feedback as fb
from agent import prompts
from agent.budget import Budget, Clock, Spent
from agent.models import ScriptedModel
from agent.nodes import NATURAL_ENDS, Deps, InfraFault, Nodes
from agent.state import NOT_RUN, initial_state
from agent.trajectory import CandidateRecord, TrajectoryWriter, TurnRecord, Verdicts, read_events
from tools.results import CompileResult, EvalResult, InspectResult, SanitizeResult, WorkloadResult

GEMM = "gemm_n7168_k5120"
GOOD_REPLY = ("Plan.\n\n```cuda\nextern \"C\" __global__ void k(float* C) { C[0] = 1.f; }\n```\n\n```json\n"
              + _json.dumps({"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": ["C"]}]}) + "\n```\n")


class Evaluator:
    """Answers evaluate() from a list (or one result for every call); records each call."""

    def __init__(self, *results):
        self.results, self.calls = list(results), []

    def evaluate(self, solution, task, arch, **kw):
        self.calls.append((solution, task.name, arch, kw))
        return self.results.pop(0) if len(self.results) > 1 else self.results[0]


def ev_result(outcome="correct", **kw) -> EvalResult:
    """An EvalResult with the verdicts of `outcome`: compile_error, unverified (compiled, no GPU),
    wrong (ran, a visible mismatch), correct (ran, all passed)."""
    comp = CompileResult(status="failed" if outcome == "compile_error" else "ok", arch="sm_90a", language="cuda",
                         error="line 3: error" if outcome == "compile_error" else None)
    base = dict(task=GEMM, arch="sm_90a", compile=comp, inspect=InspectResult(status="ok", arch="sm_90a"))
    if outcome in ("wrong", "correct"):
        st = "passed" if outcome == "correct" else "failed"
        base.update(run_status="ok", gpu="NVIDIA H200", workloads=[WorkloadResult(
            workload="M8192", split="visible", axes={"M": 8192}, status=st, reason=None if st == "passed" else "incorrect")])
    elif outcome == "unverified":
        base.update(run_status="skipped", run_reason="no GPU: none")
    else:
        base.update(run_reason="did not compile")
    return EvalResult(**{**base, **kw})


def make(tmp_path, replies=(), results=(), retrieve=None, **cfg) -> Nodes:
    config = _config(**{"task": GEMM, "arch": "sm_90a", "context": "none", "hints": [], "requested_features": [],
                        **cfg})
    from tasks.registry import get_task

    model = ScriptedModel(list(replies), params=cfg.pop("model_params", None))
    return Nodes(Deps(config=config, task=get_task(config.task), task_text="THE TASK", model=model,
                      evaluator=Evaluator(*results) if results else None, writer=TrajectoryWriter(tmp_path / "run"),
                      clock=Clock(), retrieve=retrieve))


def events(n: Nodes, type=None):
    return list(read_events(n.deps.writer.run_dir, type))


def rec(turn, sample, outcome, speedup=None, verified=False, **kw) -> CandidateRecord:
    v = Verdicts(compiled=outcome not in ("format_error", "compile_error"), correct=True if outcome in (
        "correct_with_arch", "correct_no_arch", "correct") else None, speedup=speedup)
    return CandidateRecord(turn=turn, sample=sample, path=f"candidates/{turn}-{sample}", outcome=outcome, verdicts=v,
                           verified=verified, **kw)


# -- the node wrapper and small helpers
def test_each_node_is_recorded_with_what_it_read_and_wrote(tmp_path):
    n = make(tmp_path)
    calls = []
    n.decide = lambda state: calls.append(state) or {"action": "stop", "best": {"path": "candidates/1-0"}, "x": 3}
    run = n.node("decide")
    assert run.__name__ == "decide"
    state = {"turn": 2, "current": [{}, {}], "spent": {"turns": 2, "llm_calls": 3, "cost_usd": 0.5, "wall_s": 9}}
    assert run(state) == {"action": "stop", "best": {"path": "candidates/1-0"}, "x": 3}
    start, end = events(n, "node")
    assert (start["node"], start["phase"], start["turn"]) == ("decide", "start", 2)
    assert start["inputs"] == {"turn": 2, "current": "2 items", "best": None,
                               "spent": {"turns": 2, "llm_calls": 3, "cost_usd": 0.5}, "model_error": None}
    assert (end["phase"], end["turn"], end["outputs"]) == ("end", 2, {"action": "4 chars", "best": "candidates/1-0", "x": 3})
    assert end["seconds"] >= 0
    n.draft = lambda state: {}
    n.node("draft")({"turn": 2})
    n.retrieve_context = lambda state: {}
    n.node("retrieve_context")({})
    assert [e["turn"] for e in events(n, "node")][2:] == [3, 3, 1, 1]  # they work on the next turn
    from agent.nodes import _READS

    assert set(_READS) == set(Nodes.names)


def test_brief_values_and_finish_reasons():
    from agent.nodes import _brief, _finish_reason, route

    assert _brief("not a dict", ["a"]) == {"a": None}
    assert _brief({"s": "abc", "l": [1], "d": {"k": 1}, "best": None}, ["s", "l", "d", "best", "gone"]) == {
        "s": "3 chars", "l": "1 items", "d": {"k": 1}, "best": None, "gone": None}
    assert _finish_reason({"choices": [{"finish_reason": "length"}]}) == "length"
    for raw in (None, {}, {"choices": []}, {"choices": [{}]}):
        assert _finish_reason(raw) is None
    assert route({"action": "repair"}) == "repair"


def test_turn_ones_chat_is_the_system_and_task_prompts_of_the_runs_settings():
    from agent.nodes import turn1_messages

    cfg = _config(arch="sm_90a", lang="ptx", require="off", budget=Budget(max_turns=3))
    msgs = turn1_messages(cfg, "THE TASK", "DOCS")
    assert msgs == [{"role": "system", "content": prompts.system_prompt("sm_90a", "ptx", "v1", False)},
                    {"role": "user", "content": prompts.task_prompt("THE TASK", "sm_90a", "DOCS", "v1", 3, False)}]
    assert msgs != turn1_messages(_config(arch="sm_90a", lang="ptx", budget=Budget(max_turns=3)), "THE TASK", "DOCS")


# -- retrieve_context
def sec(doc, heading, tokens, why):
    return NS(doc=doc, heading=heading, tokens=tokens, why=why)


class Retrieved:
    def __init__(self, sections, text="RENDERED DOCS", **kw):
        self.sections, self.text, self.tokens = sections, text, 123
        self.__dict__.update(kw)


def test_no_docs_without_an_arm_or_a_retriever(tmp_path):
    for kw in ({"context": "none"}, {"context": "docs", "retrieve": None}):
        n = make(tmp_path / kw["context"], **kw)
        assert n.retrieve_context({"turn": 0}) == {"context": ""}
        (e,) = events(n, "retrieval")
        assert (e["turn"], e["mode"], e["sections"], e["new_sections"], e["tokens"], e["added"]) == (
            1, kw["context"], [], [], 0, {})
    asked = []
    n = make(tmp_path / "hints", context="none", hints=["pipelining"], retrieve=lambda **k: asked.append(k) or Retrieved([]))
    n.retrieve_context({"turn": 0})
    assert asked and asked[0]["hints"] == ["pipelining"]  # a hint is retrieved even in the none arm


def test_turn_one_gets_the_retrievers_whole_selection_as_rendered(tmp_path, monkeypatch):
    import knowledge.retriever as K

    monkeypatch.setattr(K, "count_tokens", lambda text, tok: f"{tok}:{len(text)}")  # (litellm's counter: 7 s to import)
    asked = []
    r = Retrieved([sec("a.md", "One", 10, "bm25"), sec("b.md", "Two", 20, "compile-error:x")], tokenizer="tok",
                  truncated=True, focus="none", parts={"docs": {"tokens": 30}}, example="served")
    n = make(tmp_path, context="docs", retrieve=lambda **k: asked.append(k) or r)
    up = n.retrieve_context({"turn": 0, "feedback": None})
    assert asked == [__import__("agent.nodes", fromlist=["x"]).retrieval_call(n.deps.task, n.deps.config, None)]
    block = prompts.context_block(["RENDERED DOCS"], why="")
    assert up == {"context": block, "context_sections": ["a.md#One", "b.md#Two"], "base_sections": ["a.md#One", "b.md#Two"]}
    (e,) = events(n, "retrieval")
    assert e["sections"] == [{"id": "a.md#One", "doc": "a.md", "heading": "One", "tokens": 10, "why": "bm25"},
                             {"id": "b.md#Two", "doc": "b.md", "heading": "Two", "tokens": 20, "why": "compile-error:x"}]
    assert (e["turn"], e["mode"], e["new_sections"], e["tokens"], e["tokenizer"], e["truncated"], e["focus"],
            e["added"], e["example"]) == (1, "docs", ["a.md#One", "b.md#Two"], 123, "tok", True, "none",
                                         {"docs": {"tokens": 30}}, "served")
    assert e["prompt_tokens"] == f"tok:{len(block)}"


def test_a_retrieval_result_without_the_optional_fields_is_recorded_with_their_defaults(tmp_path):
    n = make(tmp_path, context="docs", retrieve=lambda **k: Retrieved([]))
    n.retrieve_context({"turn": 0})
    (e,) = events(n, "retrieval")
    assert (e["tokenizer"], e["truncated"], e["focus"], e["added"], "example" in e) == ("chars/4", False, "none", {}, False)
    from agent.nodes import _count

    assert e["prompt_tokens"] == _count(prompts.context_block(["RENDERED DOCS"]), "chars/4")


def test_later_turns_add_only_unseen_sections_ranked_for_the_feedback_within_the_turn_cap(tmp_path):
    """Turns 2+: the feedback's error class, not a new manual. Sections already in the chat, and
    those ranked only by the query (no focus kind in `why`), are not sent again; the rest whole, in
    order, while they fit the per-turn cap; the text is each section's own markdown."""
    from knowledge.retriever import load_docs

    real = [s for d in load_docs() for s in d.sections][:4]
    ids = [f"{s.doc}#{s.heading}" for s in real]
    secs = [sec(real[0].doc, real[0].heading, 50, "compile-error:C7510"),  # seen already
            sec(real[1].doc, real[1].heading, 60, "bm25 serialization:wgmma"),
            sec(real[2].doc, real[2].heading, 70, "bm25"),  # the query's, not the feedback's
            sec(real[3].doc, real[3].heading, 900, "carried-work:tma")]  # past the cap
    asked = []
    n = make(tmp_path, context="docs", context_turn_tokens=100,
             retrieve=lambda **k: asked.append(k) or Retrieved(secs, example="x", parts={"docs": 1}))
    up = n.retrieve_context({"turn": 1, "feedback": "FEEDBACK", "context_sections": [ids[0]]})
    assert asked[0]["feedback"] == "FEEDBACK"
    from agent.nodes import _section_texts

    assert up == {"context": prompts.context_block(_section_texts([ids[1]]), why=" and the last result"),
                  "context_sections": sorted({ids[0], ids[1]})}
    assert _section_texts([ids[1], "nowhere.md#x"]) == [f"(from {real[1].doc})\n{real[1].text.strip()}"]
    (e,) = events(n, "retrieval")
    assert (e["turn"], e["new_sections"], e["added"], "example" in e) == (2, [ids[1]], {}, False)


# -- draft
def test_turn_one_sends_the_task_prompt_and_counts_what_the_call_cost(tmp_path):
    reply = {"text": GOOD_REPLY, "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "cost_usd": 0.25,
                                           "cached_tokens": 300}}
    n = make(tmp_path, replies=[reply], temperature=0.5, seed=7)
    state = {**initial_state(), "context": "DOCS"}
    up = n.draft(state)
    from agent.nodes import turn1_messages

    assert up["messages"] == turn1_messages(n.deps.config, "THE TASK", "DOCS") and up["turn"] == 1
    assert up["model_error"] is None and up["faults"] == 0
    (r,) = up["replies"]
    assert (r["sample"], r["has_solution"], r["format_error"]) == (0, True, None)
    s = Spent(**up["spent"])
    assert (s.llm_calls, s.prompt_tokens, s.completion_tokens, s.cost_usd, s.cached_tokens) == (1, 1000, 200, 0.25, 300)
    assert s.wall_s > 0
    (req,) = events(n, "llm_request")
    assert (req["turn"], req["sample"], req["model"], req["history"], req["messages"]) == (1, 0, "openai/some-model",
                                                                                         "full", up["messages"])
    (resp,) = events(n, "llm_response")
    assert (resp["text"], resp["finish_reason"], resp["usage"]["prompt_tokens"]) == (GOOD_REPLY, "stop", 1000)
    cdir = n.deps.writer.candidate_dir(1, 0)
    assert (cdir / "reply.md").read_text() == GOOD_REPLY and (cdir / "kernel.cu").exists()


def test_later_turns_send_the_new_docs_then_the_feedback(tmp_path):
    n = make(tmp_path, replies=[GOOD_REPLY])
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "T"}, {"role": "assistant", "content": "A"}]
    up = n.draft({**initial_state(), "turn": 1, "messages": chat, "context": "  NEW DOCS \n", "feedback": "\nFIX IT  "})
    assert up["messages"][-1] == {"role": "user", "content": "NEW DOCS\n\nFIX IT\n"} and up["turn"] == 2
    assert len(up["messages"]) == 4 and len(chat) == 3  # the state's list untouched
    up = make(tmp_path / "b", replies=[GOOD_REPLY]).draft({**initial_state(), "turn": 1, "messages": chat})
    assert up["messages"][-1]["content"] == "\n"


def test_a_cost_unknown_for_one_call_makes_the_runs_cost_unknown(tmp_path):
    n = make(tmp_path, replies=[{"text": "no code", "usage": {"prompt_tokens": 5, "completion_tokens": 1, "cost_usd": None}}])
    up = n.draft(initial_state())
    assert Spent(**up["spent"]).cost_usd is None


def test_best_of_n_asks_each_sample(tmp_path):
    n = make(tmp_path, replies=[GOOD_REPLY, "prose only"], samples=2)
    up = n.draft(initial_state())
    assert [(r["sample"], r["has_solution"]) for r in up["replies"]] == [(0, True), (1, False)]
    assert Spent(**up["spent"]).llm_calls == 2 and [e["sample"] for e in events(n, "llm_request")] == [0, 1]


def test_a_reply_cut_off_at_the_token_limit_is_told_so(tmp_path):
    n = make(tmp_path)
    r = n._extract(1, 0, "I will write", finish_reason="length")
    assert not r["has_solution"] and r["format_error"].endswith(
        "; the reply was cut off at the output-token limit, so keep the prose short")
    (e,) = events(n, "format_error")
    assert (e["turn"], e["sample"], e["finish_reason"], e["message"]) == (1, 0, "length", r["format_error"])
    r2 = n._extract(1, 1, "I will write", finish_reason="stop")
    assert "cut off" not in r2["format_error"] and r2["note"] is None


def test_a_prompt_past_the_context_window_is_not_sent(tmp_path):
    n = make(tmp_path, replies=[GOOD_REPLY], model_params={"context_window": 50})
    up = n.draft(initial_state())
    assert up["replies"] == [] and up["model_error"]["kind"] == "context_exceeded"
    assert up["model_error"]["retryable"] is False and up["model_error"]["message"].startswith("turn 1: ")
    assert not events(n, "llm_request")
    (e,) = events(n, "context_exceeded")
    assert e["window"] == 50 and e["prompt_tokens"] > 50 and e["detail"] == up["model_error"]["message"]
    assert Spent(**up["spent"]).llm_calls == 0


def test_answers_recorded_before_a_crash_are_reused_not_asked_again(tmp_path):
    n = make(tmp_path, replies=["a second answer"], samples=2)
    w = n.deps.writer
    w.event("llm_response", turn=1, sample=0, text=GOOD_REPLY, usage={"prompt_tokens": 7}, finish_reason="stop")
    w.event("fault", turn=1, sample=0, kind="rate_limit")
    w.event("fault", turn=1, sample=0, kind="rate_limit")
    w.event("fault", turn=2, sample=0, kind="rate_limit")  # another turn's
    w.event("llm_response", turn=2, sample=0, text="other turn")
    up = n.draft(initial_state())
    assert [r["has_solution"] for r in up["replies"]] == [True, False]
    assert up["faults"] == 2 and Spent(**up["spent"]).prompt_tokens >= 7
    (e,) = events(n, "llm_response_reused")
    assert (e["turn"], e["sample"]) == (1, 0) and e["seq_of_response"] == 1
    assert [x["sample"] for x in events(n, "llm_request")] == [1]
    # all answered before: the window is not even checked
    n2 = make(tmp_path / "b", model_params={"context_window": 5})
    n2.deps.writer.event("llm_response", turn=1, sample=0, text=GOOD_REPLY, usage={})
    assert n2.draft(initial_state())["model_error"] is None


def test_a_provider_failure_leaves_the_turn_for_a_resume(tmp_path):
    n = make(tmp_path, replies=[GOOD_REPLY, {"fault": "auth"}], samples=2)
    up = n.draft(initial_state())
    assert up["replies"] == [] and Spent(**up["spent"]).llm_calls == 0  # no turn: a resume finishes it
    assert up["model_error"]["kind"] == "auth" and up["faults"] == 1
    (e,) = events(n, "llm_error")
    assert (e["turn"], e["sample"], e["kind"], e["retryable"]) == (1, 1, "auth", False)


def test_at_a_natural_end_what_came_is_judged(tmp_path):
    n = make(tmp_path, replies=[GOOD_REPLY], samples=2)
    up = n.draft(initial_state())
    assert up["model_error"]["kind"] == "script_exhausted" and up["model_error"]["message"]
    assert [r["sample"] for r in up["replies"]] == [0] and Spent(**up["spent"]).llm_calls == 1
    assert set(NATURAL_ENDS) == {"replay_exhausted", "script_exhausted", "human_exhausted", "context_exceeded"}


# -- evaluate
def put_solution(n: Nodes, turn: int, sample: int) -> None:
    from tools.solution import extract_solution

    cdir = n.deps.writer.candidate_dir(turn, sample)
    cdir.mkdir(parents=True, exist_ok=True)
    extract_solution(GOOD_REPLY, "cuda").to_dir(cdir)


def reply(sample, has=True, error=None, note=None):
    return {"sample": sample, "text": f"reply {sample}", "has_solution": has, "format_error": error, "note": note}


def test_every_reply_becomes_a_candidate_record_and_an_event(tmp_path):
    n = make(tmp_path, results=[ev_result("wrong")], executed_check=True, profile_feedback=True)
    put_solution(n, 2, 1)
    state = {"turn": 2, "replies": [reply(0, False, "no code block"), reply(1, note="second block used")],
             "parent": "candidates/1-0", "attempts": [{"a": 1}], "evaluation": NOT_RUN}
    up = n.evaluate(state)
    fmt, ran_ = (CandidateRecord(**c) for c in up["current"])
    assert (fmt.outcome, fmt.error, fmt.parent, fmt.path) == ("format_error", "no code block", "candidates/1-0", "candidates/2-0")
    assert (ran_.outcome, ran_.note, ran_.parent, ran_.verified) == ("incorrect", "second block used", "candidates/1-0", True)
    assert up["attempts"] == [{"a": 1}] + up["current"] and up["evaluation"] == "ok"
    (sol, task, arch, kw), = n.deps.evaluator.calls
    assert (task, arch, kw) == (GEMM, "sm_90a", {"workloads": "all", "executed_check": True, "time": True,
                                                 "profile": True})
    e = events(n, "candidate")
    assert [(x["turn"], x["sample"], x["path"], x["outcome"], x["parent"]) for x in e] == [
        (2, 0, "candidates/2-0", "format_error", "candidates/1-0"), (2, 1, "candidates/2-1", "incorrect", "candidates/1-0")]
    assert e[1]["verdicts"] == ran_.verdicts.model_dump(mode="json") and e[1]["verified"] is True and e[0]["error"] == "no code block"
    # evaluated: on disk, and the compile, inspect and run stages recorded
    assert EvalResult.model_validate_json((n.deps.writer.candidate_dir(2, 1) / "eval.json").read_text()).gpu == "NVIDIA H200"
    assert [x["sample"] for x in events(n, "compile")] == [1] and events(n, "inspect")[0]["turn"] == 2
    assert "ptx" not in events(n, "compile")[0]["result"]
    from agent.nodes import run_summary

    run_ev = events(n, "run")[0]
    assert {k: run_ev[k] for k in run_summary(ev_result("wrong"))} == _json.loads(_json.dumps(run_summary(ev_result("wrong"))))


def test_the_profile_is_asked_only_with_the_executed_check(tmp_path):
    for executed, profile, want in ((False, True, False), (True, False, False)):
        n = make(tmp_path / f"{executed}{profile}", results=[ev_result("wrong")], executed_check=executed,
                 profile_feedback=profile)
        put_solution(n, 1, 0)
        n.evaluate({"turn": 1, "replies": [reply(0)]})
        assert n.deps.evaluator.calls[0][3]["profile"] is want and n.deps.evaluator.calls[0][3]["executed_check"] is executed


def test_turn_one_has_no_parent_and_what_the_evaluation_says(tmp_path):
    n = make(tmp_path, results=[ev_result("unverified"), ev_result("compile_error"), ev_result("correct")])
    for s in range(3):
        put_solution(n, 1, s)
    up = n.evaluate({"turn": 1, "replies": [reply(0)], "parent": "candidates/0-0"})
    assert CandidateRecord(**up["current"][0]).parent is None
    assert up["evaluation"] == "skipped: no GPU: none"  # compiled, not run: why
    up = n.evaluate({"turn": 1, "replies": [reply(1)], "evaluation": "earlier"})
    assert up["evaluation"] == "earlier"  # did not compile: says nothing about the evaluation
    up = n.evaluate({"turn": 1, "replies": [reply(2)]})
    assert up["evaluation"] == "ok"
    assert n.evaluate({"turn": 1})["evaluation"] == NOT_RUN


def test_a_run_on_the_gpu_is_not_undone_by_a_later_sample_that_could_not_run(tmp_path):
    n = make(tmp_path, results=[ev_result("correct"), ev_result("unverified", run_reason=None)])
    put_solution(n, 1, 0)
    put_solution(n, 1, 1)
    assert n.evaluate({"turn": 1, "replies": [reply(0), reply(1)]})["evaluation"] == "ok"
    n = make(tmp_path / "b", results=[ev_result("unverified", run_reason=None)])
    put_solution(n, 1, 0)
    assert n.evaluate({"turn": 1, "replies": [reply(0)]})["evaluation"] == "skipped: unknown reason"


def test_an_evaluation_on_disk_is_reused_not_run_again(tmp_path):
    n = make(tmp_path, results=[ev_result("compile_error")])
    put_solution(n, 1, 0)
    (n.deps.writer.candidate_dir(1, 0) / "eval.json").write_text(ev_result("correct").model_dump_json())
    up = n.evaluate({"turn": 1, "replies": [reply(0)]})
    assert n.deps.evaluator.calls == [] and CandidateRecord(**up["current"][0]).verified
    (e,) = events(n, "eval_reused")
    assert (e["turn"], e["sample"]) == (1, 0) and not events(n, "run")


def test_a_wait_for_a_gpu_another_run_held_is_not_the_runs_time(tmp_path, monkeypatch):
    """A sweep's runs share its GPUs: an evaluation that waited 30 s in the queue (EvalResult.phase_s
    queue_wait) behind other runs spent 40 s. Counted, `max_time_s` 20 stopped the run after turn 1
    and the report counted it as a model that failed at every later limit: the sweep's concurrency,
    not the model, decided it. Its own 10 s are counted, a memcheck's queue wait is left out as well."""
    import agent.budget as budget

    now = [0.0]
    monkeypatch.setattr(budget, "time", NS(monotonic=lambda: now[0]))

    class Queued(Evaluator):
        def evaluate(self, solution, task, arch, **kw):
            now[0] += 40.0 if not kw.get("sanitize") else 7.0
            return super().evaluate(solution, task, arch, **kw)

    n = make(tmp_path, memcheck=True)
    n.deps.clock = Clock()
    n.deps.evaluator = Queued(ev_result("correct", phase_s={"queue_wait": 30.0}), crashed(phase_s={"queue_wait": 30.0}),
                              ev_result("correct", phase_s={"queue_wait": 5.0}))
    put_solution(n, 1, 0)
    n.evaluate({"turn": 1, "replies": [reply(0)]})
    assert n.deps.clock.elapsed() == 10.0
    assert budget.exhausted(Budget(max_time_s=20), Spent(turns=1, wall_s=n.deps.clock.elapsed())) is None
    put_solution(n, 2, 0)
    n.evaluate({"turn": 2, "replies": [reply(0)]})  # a crash: its memcheck waited 5 s of its 7 in the queue
    assert n.deps.clock.elapsed() == 10.0 + 10.0 + 2.0


def test_a_harness_failure_stops_the_run_without_a_verdict(tmp_path):
    n = make(tmp_path, results=[ev_result("compile_error", compile=CompileResult(
        status="failed", arch="sm_90a", language="cuda", error="x", infra_error="ptxas missing"))])
    put_solution(n, 1, 0)
    with pytest.raises(InfraFault, match="ptxas missing"):
        n.evaluate({"turn": 1, "replies": [reply(0)]})
    (e,) = events(n, "infra_error")
    assert (e["turn"], e["sample"], e["detail"]) == (1, 0, "ptxas missing")
    assert not (n.deps.writer.candidate_dir(1, 0) / "eval.json").exists()


def crashed(**kw):
    return ev_result("wrong", workloads=[WorkloadResult(workload="M8192", split="visible", axes={"M": 8192},
                                                        status="failed", reason="cuda_error", detail="illegal address")], **kw)


def test_a_crash_gets_memcheck_once_and_its_result_kept(tmp_path):
    san = SanitizeResult(status="failed", reason="2 errors", errors=["Invalid __global__ write of size 4"])
    n = make(tmp_path, results=[crashed(), ev_result("wrong", sanitize=san)])
    put_solution(n, 1, 0)
    n.evaluate({"turn": 1, "replies": [reply(0)]})
    first, second = n.deps.evaluator.calls
    assert second[3] == {"workloads": "visible", "executed_check": False, "sanitize": True, "time": False}
    kept = EvalResult.model_validate_json((n.deps.writer.candidate_dir(1, 0) / "eval.json").read_text())
    assert kept.sanitize == san
    (e,) = events(n, "memcheck")
    assert (e["turn"], e["sample"], e["trigger"], e["status"], e["reason"], e["errors"]) == (
        1, 0, "M8192: cuda_error", "failed", "2 errors", ["Invalid __global__ write of size 4"])


def test_a_memcheck_run_that_stopped_early_says_so(tmp_path):
    n = make(tmp_path, results=[crashed(), ev_result("wrong")])  # sanitize: skipped, "not requested"
    put_solution(n, 1, 0)
    n.evaluate({"turn": 1, "replies": [reply(0)]})
    assert events(n, "memcheck")[0]["reason"] == "the candidate did not reach the memcheck run"
    other = SanitizeResult(status="skipped", reason="no compute-sanitizer")
    n = make(tmp_path / "b", results=[crashed(), ev_result("wrong", sanitize=other)])
    put_solution(n, 1, 0)
    n.evaluate({"turn": 1, "replies": [reply(0)]})
    assert events(n, "memcheck")[0]["reason"] == "no compute-sanitizer"


def test_no_memcheck_when_the_run_turned_it_off(tmp_path):
    n = make(tmp_path, results=[crashed()], memcheck=False)
    put_solution(n, 1, 0)
    n.evaluate({"turn": 1, "replies": [reply(0)]})
    assert len(n.deps.evaluator.calls) == 1 and not events(n, "memcheck")


# -- decide
def decide_state(current, replies=None, **kw):
    st = {**initial_state(), "turn": 1, "current": [c.model_dump() for c in current],
          "replies": replies or [reply(c.sample) for c in current], "messages": [{"role": "user", "content": "T"}],
          "evaluation": "ok"}
    st.update(kw)
    return st


def test_the_turns_best_sample_continues_the_chat_and_the_best_so_far_is_kept(tmp_path):
    n = make(tmp_path, samples=3, budget=Budget(max_turns=5))
    cur = [rec(1, 0, "incorrect"), rec(1, 1, "correct_with_arch", 1.5, True), rec(1, 2, "correct_with_arch", 1.5, True)]
    up = n.decide(decide_state(cur))
    assert up["messages"][-1] == {"role": "assistant", "content": "reply 1"}  # ties: the lowest sample
    assert CandidateRecord(**up["best"]).path == "candidates/1-1" and up["parent"] == "candidates/1-1"
    assert (up["action"], up["stop_reason"], up["decisions"]) == ("optimise", None, ["optimise"])
    assert Spent(**up["spent"]).turns == 1
    (t,) = up["per_turn"]
    assert TurnRecord(**t).chosen == 1 and TurnRecord(**t).action == "optimise"
    (d,) = events(n, "decision")
    assert (d["turn"], d["action"], d["outcome"], d["chosen"], d["reason"], d["best"], d["best_speedup"],
            d["best_verified"], d["parent"], d["population"]) == (
        1, "optimise", "correct_with_arch", 1, "correct with the requested instructions", "candidates/1-1", 1.5,
        True, "candidates/1-1", None)
    (b,) = events(n, "budget")
    assert b["limits"]["max_turns"] == 5 and b["spent"]["turns"] == 1
    summary = _json.loads((n.deps.writer.run_dir / "summary.json").read_text())
    assert summary["status"] == "running"
    # a faster verified one later replaces the best; a slower one does not
    old = rec(0, 0, "correct_with_arch", 2.0, True)
    up = n.decide(decide_state([rec(1, 0, "correct_with_arch", 1.9, True)], best=old.model_dump()))
    assert CandidateRecord(**up["best"]).path == "candidates/0-0"
    up = n.decide(decide_state([rec(1, 0, "correct_with_arch", 2.1, True)], best=old.model_dump()))
    assert CandidateRecord(**up["best"]).path == "candidates/1-0"


@pytest.mark.parametrize("outcome,verified,require,why", [
    ("correct_with_arch", True, "on", "correct with the requested instructions"),
    ("unverified", True, "on", "correct, the requested instructions in the SASS; their execution unverified"),
    ("unverified", False, "on", "compiled with the requested instructions; correctness unverified (ok)"),
    ("arch_missing", True, "off", "correct"),
    ("unverified", False, "off", "compiled; correctness unverified (ok)"),
    ("run_failed", True, "on", "run failed"),
    ("compile_error", False, "on", "compile error"),
])
def test_the_action_and_why_follow_the_chosen_candidate(tmp_path, outcome, verified, require, why):
    n = make(tmp_path, require=require)
    c = rec(1, 0, outcome, verified=verified)
    if outcome == "arch_missing":
        c.verdicts.correct = True
    up = n.decide(decide_state([c]))
    assert up["action"] == ("repair" if why in ("run failed", "compile error") else "optimise")
    assert events(n, "decision")[0]["reason"] == why


@pytest.mark.parametrize("kind,reason", [("script_exhausted", "script_end"), ("context_exceeded", "context_exceeded"),
                                         ("replay_exhausted", "replay_end"), ("human_exhausted", "human_end"),
                                         ("auth", "model_error")])
def test_a_model_that_gave_no_reply_stops_the_run(tmp_path, kind, reason):
    n = make(tmp_path)
    up = n.decide(decide_state([], model_error={"kind": kind, "message": "m"}, parent="candidates/1-0"))
    assert (up["action"], up["stop_reason"], up["stop_detail"]) == ("stop", reason, f"{kind}: m")
    assert up["per_turn"] == [] and Spent(**up["spent"]).turns == 0 and up["parent"] == "candidates/1-0"
    d = events(n, "decision")[0]
    assert (d["outcome"], d["chosen"], d["best"], d["best_speedup"], d["best_verified"]) == (None, None, None, None, None)


def test_the_budget_stops_the_run(tmp_path):
    n = make(tmp_path, budget=Budget(max_turns=2))
    up = n.decide(decide_state([rec(2, 0, "incorrect")], turn=2, spent=Spent(turns=1).model_dump()))
    assert (up["action"], up["stop_reason"], up["stop_detail"]) == ("stop", "max_turns", "2 of 2 turns used")
    assert events(n, "decision")[0]["reason"] == "2 of 2 turns used"


def test_evolve_draws_the_parent_from_the_best_candidates_so_far(tmp_path):
    n = make(tmp_path, strategy="evolve", population=2, seed=11)
    attempts = [rec(1, 0, "incorrect"), rec(2, 0, "correct_with_arch", 1.2, True), rec(3, 0, "compile_error"),
                rec(4, 0, "correct_with_arch", 0.8, True)]
    cur = [attempts[-1]]
    up = n.decide(decide_state(cur, turn=4, attempts=[a.model_dump() for a in attempts]))
    pop = fb.population(attempts, 2, True)
    parent = fb.draw_parent(pop, 11, 4)
    assert up["parent"] == parent.path
    d = events(n, "decision")[0]
    assert d["population"] == [c.path for c in pop] and d["reason"].startswith(f"parent {parent.path}: ")
    # stopping: no draw
    n = make(tmp_path / "b", strategy="evolve", population=2, budget=Budget(max_turns=1))
    up = n.decide(decide_state(cur, turn=4, attempts=[a.model_dump() for a in attempts]))
    assert up["parent"] == cur[0].path and events(n, "decision")[0]["population"] is None


# -- the feedback the next turn sees
def test_linear_feedback_renders_the_chosen_candidates_evaluation(tmp_path):
    n = make(tmp_path, samples=2, budget=Budget(max_turns=6), profile_feedback=True)
    chosen, other = rec(1, 1, "incorrect", verified=True), rec(1, 0, "compile_error")
    ev = ev_result("wrong")
    cdir = n.deps.writer.candidate_dir(1, 1)
    cdir.mkdir(parents=True)
    (cdir / "eval.json").write_text(ev.model_dump_json())
    best = rec(0, 0, "correct_with_arch", 1.0, True)
    tr = TurnRecord(turn=1, candidates=[other, chosen], chosen=1, action="repair")
    state = {"per_turn": [tr.model_dump()], "best": best.model_dump(), "base_sections": ["a#b"], "turn": 1}
    up = n.repair(state)
    want = fb.render_feedback(1, "repair", "cuda", chosen, ev, [other], 2, best=best, profile=True, max_turns=6,
                              require=True)
    assert up == {"feedback": want}
    (e,) = events(n, "feedback")
    assert (e["turn"], e["kind"], e["outcome"], e["text"], e["parent"]) == (1, "repair", "incorrect", want, chosen.path)
    assert n.optimise(state)["feedback"] == fb.render_feedback(1, "optimise", "cuda", chosen, ev, [other], 2, best=best,
                                                               profile=True, max_turns=6, require=True)
    # the latest-only history: docs sent with earlier feedback may come again
    n.deps.config.history = "latest"
    assert n.repair(state)["context_sections"] == ["a#b"]
    n.deps.config.history = "full"
    (cdir / "eval.json").unlink()
    assert n.repair({**state, "best": None})["feedback"] == fb.render_feedback(
        1, "repair", "cuda", chosen, None, [other], 2, best=None, profile=True, max_turns=6, require=True)


def test_evolve_feedback_branches_from_turn_one_with_the_parents_reply(tmp_path):
    n = make(tmp_path, strategy="evolve", budget=Budget(max_turns=6), require="off")
    parent = rec(2, 0, "incorrect", verified=True)
    pdir = n.deps.writer.run_dir / parent.path
    pdir.mkdir(parents=True)
    (pdir / "reply.md").write_text("THE PARENT'S REPLY")
    ev = ev_result("wrong")
    (pdir / "eval.json").write_text(ev.model_dump_json())
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "T"}, {"role": "assistant", "content": "X"}]
    state = {"turn": 4, "parent": parent.path, "attempts": [rec(1, 0, "compile_error").model_dump(), parent.model_dump()],
             "messages": msgs, "base_sections": ["d#1"]}
    up = n.optimise(state)
    want = fb.render_feedback(2, "optimise", "cuda", parent, ev, profile=False, max_turns=6, next_turn=5, require=False)
    assert up == {"feedback": want, "messages": msgs[:2] + [{"role": "assistant", "content": "THE PARENT'S REPLY"}],
                  "context_sections": ["d#1"]}
    (e,) = events(n, "feedback")
    assert (e["turn"], e["kind"], e["outcome"], e["parent"]) == (4, "optimise", "incorrect", parent.path)
    (pdir / "reply.md").unlink()
    (pdir / "eval.json").unlink()
    up = n.repair({**state, "base_sections": None})
    assert up["messages"][-1]["content"] == "" and up["context_sections"] == []
    assert up["feedback"] == fb.render_feedback(2, "repair", "cuda", parent, None, profile=False, max_turns=6,
                                                next_turn=5, require=False)


# ---------------------------------------------------------------------------------------
# Found by the first mutation run of the whole module (2026-12-03 evening)
# ---------------------------------------------------------------------------------------
def test_a_node_is_handed_the_state_and_its_seconds_are_recorded(tmp_path, monkeypatch):
    import agent.nodes as N

    first = [10.0]
    monkeypatch.setattr(N, "time", NS(monotonic=lambda: first.pop() if first else 10.12345))  # the nodes' clock only
    n = make(tmp_path)
    got = []
    n.repair = lambda state: got.append(state) or {}
    state = {"turn": 1}
    n.node("repair")(state)
    assert got == [state]
    end = events(n, "node")[-1]
    assert (end["node"], end["seconds"]) == ("repair", 0.123)


def test_the_none_arm_without_hints_never_asks_the_retriever(tmp_path):
    n = make(tmp_path, context="none", retrieve=lambda **k: pytest.fail("asked"))
    assert n.retrieve_context({"turn": 0}) == {"context": ""}


def test_the_feedbacks_focus_is_recorded(tmp_path):
    n = make(tmp_path, context="docs", retrieve=lambda **k: Retrieved([], focus="serialization"))
    n.retrieve_context({"turn": 1, "feedback": "f"})
    assert events(n, "retrieval")[0]["focus"] == "serialization"


def test_a_state_without_docs_or_faults_sends_none(tmp_path):
    from agent.nodes import turn1_messages

    n = make(tmp_path, replies=[GOOD_REPLY])
    up = n.draft({"turn": 0, "messages": [], "spent": Spent().model_dump()})
    assert up["messages"] == turn1_messages(n.deps.config, "THE TASK", "") and up["faults"] == 0
    n = make(tmp_path / "b", replies=[GOOD_REPLY])
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "T"}, {"role": "assistant", "content": "A"}]
    up = n.draft({"turn": 1, "messages": chat, "spent": Spent().model_dump(), "feedback": "FIX IT", "faults": 3})
    assert up["messages"][-1]["content"] == "FIX IT\n" and up["faults"] == 3


class Completing:
    """A model stand-in: records complete()'s arguments, answers with a Completion; reports faults
    through on_fault as a retrying model does."""

    def __init__(self, raw=None, faults=(), window=None):
        self.raw, self.faults, self.window, self.calls = raw, list(faults), window, []

    def complete(self, messages, on_fault=None, grows=True, **kw):
        from agent.models import Completion, Usage

        self.calls.append({"messages": messages, "grows": grows, **kw})
        for f in self.faults:
            on_fault(f)
        return Completion(text=GOOD_REPLY, model="served-model", usage=Usage(10, 5, 0.0), latency_s=1.23456,
                          attempts=1 + len(self.faults), faults=list(self.faults), raw=self.raw)


class Sized(Completing):
    def context_size(self, messages):
        from agent.models import ContextSize

        return ContextSize(prompt_tokens=99, window=self.window, reserve=7, source="params")


def test_each_call_is_recorded_with_the_runs_options_and_the_providers_answer(tmp_path):
    from agent.models import Fault, call_options

    n = make(tmp_path, temperature=0.7, seed=3, samples=2)
    model = Sized(raw={"choices": [{"finish_reason": "length"}]}, faults=[Fault("rate_limit", 429, "slow down", 1)])
    n.deps.model = model
    up = n.draft(initial_state())
    assert up["faults"] == 2  # one a call
    assert [c["grows"] for c in model.calls] == [True, True]  # the full chat, linear: the cache grows
    for s, c in enumerate(model.calls):
        assert {k: v for k, v in c.items() if k not in ("messages", "grows")} == call_options(0.7, 3, 1, s)
    req = events(n, "llm_request")[1]
    assert (req["turn"], req["sample"], req["context"]) == (1, 1, {"prompt_tokens": 99, "window": None, "reserve": 7,
                                                                   "source": "params"})
    f = events(n, "fault")[1]
    assert (f["turn"], f["sample"], f["retryable"], f["kind"], f["status"]) == (1, 1, True, "rate_limit", 429)
    resp = events(n, "llm_response")[1]
    assert (resp["turn"], resp["sample"], resp["model"], resp["latency_s"], resp["attempts"], resp["finish_reason"]) == (
        1, 1, "served-model", 1.235, 2, "length")  # finish_reason from the provider's choices
    assert [r["has_solution"] for r in up["replies"]] == [True, True]


def test_a_model_without_a_window_check_is_sent_unchecked(tmp_path):
    n = make(tmp_path)
    n.deps.model = Completing(raw={"finish_reason": "stop"})
    n.draft(initial_state())
    assert events(n, "llm_request")[0]["context"] is None and events(n, "llm_response")[0]["finish_reason"] == "stop"


@pytest.mark.parametrize("history,strategy,grows", [("latest", "linear", False), ("full", "evolve", False),
                                                     ("full", "best-of-n", True)])
def test_the_prompt_cache_grows_only_with_the_full_chat_of_one_branch(tmp_path, history, strategy, grows):
    from agent import prompts as P

    n = make(tmp_path, history=history, strategy=strategy)
    n.deps.model = model = Completing()
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "T"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "F1"}, {"role": "assistant", "content": "A2"}]
    n.draft({**initial_state(), "turn": 2, "messages": chat, "feedback": "F2"})
    assert model.calls[0]["grows"] is grows
    assert model.calls[0]["messages"] == P.history_view(chat + [{"role": "user", "content": "F2\n"}], history)


def test_a_prompt_past_the_window_is_recorded_with_its_figures(tmp_path):
    n = make(tmp_path)
    n.deps.model = Sized(window=50)
    up = n.draft({**initial_state(), "faults": 4})
    e = events(n, "context_exceeded")[0]
    assert (e["turn"], e["prompt_tokens"], e["window"], e["reserve"], e["source"]) == (1, 99, 50, 7, "params")
    assert (up["turn"], up["faults"], len(up["messages"])) == (1, 4, 2)


def test_a_reply_is_kept_as_written_and_its_folder_made_again_on_a_resume(tmp_path):
    import shutil

    n = make(tmp_path, lang="ptx")
    shutil.rmtree(n.deps.writer.run_dir / "candidates")
    r = n._extract(1, 0, GOOD_REPLY)  # a CUDA kernel where PTX was asked: a format error
    assert not r["has_solution"] and r["text"] == GOOD_REPLY
    from tools.solution import SolutionError, extract_solution

    with pytest.raises(SolutionError) as e:
        extract_solution(GOOD_REPLY, "ptx")
    assert r["format_error"] == str(e.value)
    n = make(tmp_path / "b")
    two = GOOD_REPLY + "\nSecond try:\n" + GOOD_REPLY.replace("1.f", "2.f")
    r = n._extract(2, 1, two)
    r2 = n._extract(2, 1, two)  # the same folder again (a resumed turn): no error
    assert r == r2 and r["text"] == two and r["has_solution"]
    assert r["note"] == extract_solution(two, "cuda").extraction.note and "2 source blocks" in r["note"]
    e = events(n, "extraction")[0]
    assert (e["turn"], e["sample"], e["language"], e["note"]) == (2, 1, "cuda", r["note"])
    assert len(events(n, "extraction")) == 2


def test_memcheck_runs_the_same_solution_on_the_runs_arch(tmp_path):
    n = make(tmp_path, results=[crashed(), ev_result("wrong")])
    put_solution(n, 1, 0)
    n.evaluate({"turn": 1, "replies": [reply(0)]})
    first, second = n.deps.evaluator.calls
    assert second[0] == first[0] and second[0] is not None and second[1:3] == (GEMM, "sm_90a")


def test_linear_feedback_in_the_runs_language_profile_and_require_settings(tmp_path):
    from tools.profile import skipped as profile_skipped

    n = make(tmp_path, samples=1, budget=Budget(max_turns=6), profile_feedback=True, lang="ptx", require="on",
             history="latest")
    chosen = rec(1, 0, "format_error")
    chosen.error = "no code"
    tr = TurnRecord(turn=1, candidates=[chosen], chosen=0, action="repair")
    state = {"per_turn": [tr.model_dump()], "turn": 1}
    up = n.repair(state)
    want = fb.render_feedback(1, "repair", "ptx", chosen, None, [], 1, best=None, profile=True, max_turns=6, require=True)
    assert up == {"feedback": want, "context_sections": []} and "```ptx" in want
    ok = rec(1, 0, "unverified", verified=True)
    ev = ev_result("correct")
    ev.executed.profile = profile_skipped("no ncu")
    cdir = n.deps.writer.candidate_dir(1, 0)
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / "eval.json").write_text(ev.model_dump_json())
    tr = TurnRecord(turn=1, candidates=[ok], chosen=0, action="optimise")
    up = n.optimise({"per_turn": [tr.model_dump()], "turn": 1})
    want = fb.render_feedback(1, "optimise", "ptx", ok, ev, [], 1, best=None, profile=True, max_turns=6, require=True)
    assert up["feedback"] == want
    assert want != fb.render_feedback(1, "optimise", "ptx", ok, ev, [], 1, profile=False, max_turns=6, require=True)
    assert want != fb.render_feedback(1, "optimise", "ptx", ok, ev, [], 1, profile=True, max_turns=6, require=False)
    assert want != fb.render_feedback(1, "optimise", "ptx", ok, ev, [], 1, profile=True, max_turns=None, require=True)


def test_evolve_feedback_in_the_runs_language_profile_and_require_settings(tmp_path):
    n = make(tmp_path, strategy="evolve", budget=Budget(max_turns=6), require="on", profile_feedback=True, lang="ptx")
    parent = rec(2, 0, "unverified", verified=True)
    pdir = n.deps.writer.run_dir / parent.path
    pdir.mkdir(parents=True)
    ev = ev_result("correct")
    (pdir / "eval.json").write_text(ev.model_dump_json())
    state = {"turn": 4, "parent": parent.path, "attempts": [parent.model_dump()], "messages": [{}, {}]}
    up = n.optimise(state)
    want = fb.render_feedback(2, "optimise", "ptx", parent, ev, profile=True, max_turns=6, next_turn=5, require=True)
    assert up["feedback"] == want and events(n, "feedback")[0]["text"] == want
    assert want != fb.render_feedback(2, "optimise", "ptx", parent, ev, profile=False, max_turns=6, next_turn=5, require=True)
    assert want != fb.render_feedback(2, "optimise", "ptx", parent, ev, profile=True, max_turns=6, next_turn=5, require=False)
    fmt = rec(2, 0, "format_error")
    fmt.error = "no code"
    state = {"turn": 4, "parent": fmt.path, "attempts": [fmt.model_dump()], "messages": [{}, {}]}
    (pdir / "eval.json").unlink()
    assert "```ptx" in n.repair(state)["feedback"]


def test_answers_reused_after_a_crash_count_as_recorded(tmp_path):
    n = make(tmp_path, samples=2)
    w = n.deps.writer
    w.event("llm_response", turn=1, sample=0, text="cut", usage={"completion_tokens": 4, "cached_tokens": 2},
            finish_reason="length")
    w.event("llm_response", turn=1, sample=1, usage={"prompt_tokens": 5, "completion_tokens": 3, "cost_usd": 0.5})
    w.event("fault", turn=1, sample=1, kind="rate_limit")
    up = n.draft({**initial_state(), "faults": 2})
    s = Spent(**up["spent"])
    assert (s.llm_calls, s.prompt_tokens, s.completion_tokens, s.cached_tokens, s.cost_usd) == (2, 5, 7, 2, None)
    assert up["faults"] == 3
    r0, r1 = up["replies"]
    assert r0["format_error"].endswith("cut off at the output-token limit, so keep the prose short")  # its finish reason
    assert r1["text"] == "" and not r1["has_solution"]


class Failing:
    def complete(self, messages, on_fault=None, **kw):
        from agent.models import Fault, ModelError

        raise ModelError("auth", "", faults=[Fault("auth", 401, "bad key", 1)])


def test_a_provider_failure_adds_its_faults_and_names_itself(tmp_path):
    n = make(tmp_path)
    n.deps.model = Failing()
    up = n.draft({**initial_state(), "faults": 3})
    assert up["faults"] == 4 and up["model_error"] == {"kind": "auth", "message": "auth", "retryable": False}


def test_a_reply_cut_off_is_judged_with_its_finish_reason(tmp_path):
    from tools.solution import SolutionError, extract_solution

    n = make(tmp_path)
    n.deps.model = m = Completing(raw={"finish_reason": "length"})
    m.text = "prose only"

    def complete(messages, on_fault=None, **kw):
        from agent.models import Completion, Usage

        return Completion(text="prose only", model="m", usage=Usage(1, 1, 0.0), latency_s=0.1, attempts=1,
                          raw={"finish_reason": "length"})

    m.complete = complete
    up = n.draft(initial_state())
    with pytest.raises(SolutionError) as e:
        extract_solution("prose only", "cuda")
    assert up["replies"][0]["format_error"] == (
        str(e.value) + "; the reply was cut off at the output-token limit, so keep the prose short")


def test_the_evaluation_events_name_their_turn_and_sample(tmp_path):
    n = make(tmp_path, results=[ev_result("wrong")])
    put_solution(n, 3, 2)
    n.evaluate({"turn": 3, "replies": [reply(2)]})
    for kind in ("compile", "inspect", "run"):
        (e,) = events(n, kind)
        assert (e["turn"], e["sample"]) == (3, 2), kind
    assert events(n, "inspect")[0]["result"] == _json.loads(_json.dumps(ev_result("wrong").inspect.model_dump(mode="json")))


def test_decide_keeps_the_earlier_turns_and_decisions(tmp_path):
    n = make(tmp_path, budget=Budget(max_turns=9))
    earlier = TurnRecord(turn=1, candidates=[rec(1, 0, "incorrect")], chosen=0, action="repair").model_dump()
    best = rec(2, 0, "correct_with_arch", 1.5, True)
    up = n.decide(decide_state([best], turn=2, per_turn=[earlier], decisions=["repair"]))
    assert up["decisions"] == ["repair", "optimise"] and up["per_turn"][0] == earlier
    t = TurnRecord(**up["per_turn"][1])
    assert t.turn == 2 and [c.path for c in t.candidates] == [best.path] and t.best.path == best.path
    assert events(n, "budget")[0]["turn"] == 2


def test_under_require_on_the_requested_instructions_decide_the_choice_the_best_and_the_action(tmp_path):
    fast_plain = rec(1, 0, "arch_missing", 3.0, True)
    fast_plain.verdicts.correct = True
    slow_arch = rec(1, 1, "correct_with_arch", 1.0, True)
    n = make(tmp_path, samples=2)
    up = n.decide(decide_state([fast_plain, slow_arch]))
    assert TurnRecord(**up["per_turn"][0]).chosen == 1 and CandidateRecord(**up["best"]).sample == 1
    n = make(tmp_path / "b")
    up = n.decide(decide_state([fast_plain]))
    assert up["action"] == "repair" and up["best"] is None  # correct without the instructions: not the goal
    n = make(tmp_path / "c", require="off")
    assert n.decide(decide_state([fast_plain]))["action"] == "optimise"


def test_evolve_draws_by_the_turn_from_a_population_ranked_under_require(tmp_path):
    plain = rec(1, 0, "arch_missing", 9.0, True)
    plain.verdicts.correct = True
    arch = [rec(t, 0, "correct_with_arch", 1.0 + t / 10, True) for t in (2, 3, 4)]
    attempts = [plain] + arch
    pop = fb.population(attempts, 3, True)
    assert plain not in pop
    turn = next(t for t in range(5, 60) if fb.draw_parent(pop, 11, t).path != fb.draw_parent(pop, 11, None).path)
    n = make(tmp_path, strategy="evolve", population=3, seed=11, budget=Budget(max_turns=99))
    up = n.decide(decide_state([arch[-1]], turn=turn, attempts=[a.model_dump() for a in attempts]))
    assert up["parent"] == fb.draw_parent(pop, 11, turn).path
    assert events(n, "decision")[0]["population"] == [c.path for c in pop]
    # nothing to draw from yet: the turn's own best
    n = make(tmp_path / "b", strategy="evolve", population=3, budget=Budget(max_turns=99))
    up = n.decide(decide_state([arch[0]], turn=2, attempts=[]))
    assert up["parent"] == arch[0].path and events(n, "decision")[0]["population"] is None


def test_linear_feedback_under_require_off_says_nothing_of_the_instructions(tmp_path):
    n = make(tmp_path, require="off", budget=Budget(max_turns=4))
    ok = rec(1, 0, "arch_missing", verified=True)
    ev = ev_result("correct")
    cdir = n.deps.writer.candidate_dir(1, 0)
    cdir.mkdir(parents=True)
    (cdir / "eval.json").write_text(ev.model_dump_json())
    tr = TurnRecord(turn=1, candidates=[ok], chosen=0, action="optimise")
    text = n.optimise({"per_turn": [tr.model_dump()], "turn": 1})["feedback"]
    assert text == fb.render_feedback(1, "optimise", "cuda", ok, ev, [], 1, max_turns=4, require=False)
    assert text != fb.render_feedback(1, "optimise", "cuda", ok, ev, [], 1, max_turns=4, require=True)


def test_turn_ones_chat_without_docs_and_under_require_on():
    from agent.nodes import turn1_messages

    cfg = _config(arch="sm_90a", budget=Budget(max_turns=3))
    assert turn1_messages(cfg, "T") == turn1_messages(cfg, "T", "")
    msgs = turn1_messages(cfg, "T")
    assert msgs[0]["content"] == prompts.system_prompt("sm_90a", "cuda", "v1", True)
    assert msgs[1]["content"] == prompts.task_prompt("T", "sm_90a", "", "v1", 3, True)
    assert msgs[0]["content"] != prompts.system_prompt("sm_90a", "cuda", "v1", False)


def test_under_require_off_the_fastest_correct_kernel_leads_with_or_without_the_instructions(tmp_path):
    fast_plain = rec(1, 0, "arch_missing", 3.0, True)
    fast_plain.verdicts.correct = True
    slow_arch = rec(1, 1, "correct_with_arch", 1.0, True)
    n = make(tmp_path, samples=2, require="off")
    up = n.decide(decide_state([slow_arch, fast_plain]))
    assert CandidateRecord(**up["best"]).sample == 0 and up["action"] == "optimise"
    chosen_sample = TurnRecord(**up["per_turn"][0]).chosen
    assert chosen_sample == max([slow_arch, fast_plain], key=lambda c: fb.rank(c, False)).sample
    assert chosen_sample != max([slow_arch, fast_plain], key=lambda c: fb.rank(c, True)).sample
    n = make(tmp_path / "b", strategy="evolve", population=1, require="off", budget=Budget(max_turns=9))
    up = n.decide(decide_state([slow_arch], turn=2, attempts=[fast_plain.model_dump(), slow_arch.model_dump()]))
    assert up["parent"] == fast_plain.path  # the population of one: the fastest correct kernel
