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
