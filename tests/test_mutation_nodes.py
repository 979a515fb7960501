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
