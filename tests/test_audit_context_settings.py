"""Audit of the context ablation: settings under which a run is recorded (and reported) as one arm
while its model reads another. Each test runs the real agent loop (scripted reply, max one turn)
and reads the chat the model was sent from events.jsonl.

The run's settings check (agent/run.py settings_problem, shared by `agent solve` and sweeps)
refuses both up front, and retrieval sends the header API once."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from agent_loop_helpers import GEMM_TASK, NO_CODE, events, write_script

from agent.run import SolveError, SolveRequest, solve
from agent.trajectory import Budget
from knowledge import retriever as kr


def _first_prompt(tmp: Path, **req) -> str | None:
    """The turn-1 user prompt, or None when the settings were refused up front."""
    model = write_script(tmp / "script.json", [NO_CODE])
    try:
        s = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp / "runs", budget=Budget(max_turns=1),
                               **req), progress=False)
    except SolveError:
        return None
    [request] = events(tmp / "runs" / s.run_id, "llm_request")
    return request["messages"][1]["content"]


@pytest.mark.parametrize("mode", ["docs+headers", "full"])
def test_a_zero_docs_budget_is_refused_or_still_gives_the_arm(tmp_path, mode):
    """`--context full --context-tokens 0` (or `context_tokens: 0` in a sweep) ran with no docs
    and no header API at all, recorded as the full (docs+headers) arm: a report then compares
    two copies of the none arm under three names. Either refuse the setting or give the arm."""
    prompt = _first_prompt(tmp_path, context=mode, context_tokens=0)
    assert prompt is None or "## Reference material" in prompt


@pytest.mark.parametrize("mode", ["docs+headers", "full"])
def test_a_ptx_run_gets_no_header_api_it_cannot_include(tmp_path, mode):
    """A raw-PTX solution is assembled by ptxas: no preprocessor, no `#include <ptxbench/...>`
    (its task statement names no helper header). docs+headers on --lang ptx is docs plus ~2,700
    tokens the model cannot use: "more text", not more knowledge, under the headers arm's name."""
    prompt = _first_prompt(tmp_path, context=mode, lang="ptx")
    assert prompt is None or kr.header_api("sm_90a").strip() not in prompt


@pytest.mark.parametrize("mode", ["docs", "docs+headers", "docs+example"])
def test_a_docs_budget_no_section_fits_is_refused(tmp_path, mode):
    """`context_tokens` 100 (any budget below the smallest section's ~190 tokens): the docs arm sent
    the none arm's prompt, docs+headers the header API alone, docs+example the example alone, each
    recorded and reported under its arm's name. Refused before the run starts, and a sweep of such a
    cell refuses before any run (agent.nodes.empty_arm); full holds every section whatever the budget."""
    assert _first_prompt(tmp_path, context=mode, context_tokens=100) is None
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no folder left behind
    (tmp_path / "full").mkdir()
    assert _first_prompt(tmp_path / "full", context="full", context_tokens=100) is not None
    from agent.sweep import SweepConfig, SweepError, plan

    cfg = SweepConfig(name="s", models=[f"scripted:{tmp_path / 'script.json'}"], tasks=[GEMM_TASK],
                      contexts=["none", mode], context_tokens=100, runs_dir=str(tmp_path / "sweep"))
    arm = re.escape(mode)
    with pytest.raises(SweepError, match=rf"s/.*/{arm}/r0: context '{arm}' retrieves no docs section for task "
                                         rf"{GEMM_TASK} on sm_90a within context_tokens 100"):
        plan(cfg)


def test_a_small_docs_budget_sends_the_header_api_once(tmp_path):
    """With a docs budget one section fits (here 200 tokens; below that the arm is refused, above),
    docs+headers's turn 1 held the header API and recorded only that section as seen; a later turn
    that re-sent the whole retrieval sent three copies of the ~2,700-token API in a 3-turn chat,
    uncapped by context_turn_tokens. The arm grows by the API each turn: more text, not more knowledge."""
    from agent_loop_helpers import broken_probe_reply, probe_reply

    model = write_script(tmp_path / "script.json", [broken_probe_reply(), probe_reply(), NO_CODE])
    s = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp_path / "runs", budget=Budget(max_turns=3),
                           context="docs+headers", context_tokens=200), progress=False)
    last = events(tmp_path / "runs" / s.run_id, "llm_request")[-1]
    chat = "\n".join(m["content"] for m in last["messages"] if m["role"] == "user")
    assert chat.count("### <ptxbench/common.cuh>") == 1
