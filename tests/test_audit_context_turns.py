"""Audit of the context ablation past turn 1: what each arm puts into the chat on every turn of a
real agent loop (scripted replies; real NVRTC, ptxas, SQLite), read back from the llm_request
events, and that retrieval is the same in any process (hash seed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_loop_helpers import GEMM_TASK, NO_CODE, broken_probe_reply, events, probe_reply, write_script

from agent.run import SolveRequest, solve
from agent.trajectory import Budget
from knowledge import retriever as kr

REPO = Path(__file__).resolve().parents[1]
TURNS = 3
_RUNS: dict[tuple[str, str], Path] = {}


def _run(tmp: Path, mode: str, history: str = "full") -> Path:
    """A 3-turn gemm run on sm_90a: a compile error, a compiling probe, a reply without code."""
    key = (mode, history)
    if key not in _RUNS:
        here = tmp / f"{mode.replace('+', '_')}_{history}"
        here.mkdir()
        model = write_script(here / "script.json", [broken_probe_reply(), probe_reply(), NO_CODE])
        s = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=here / "runs", context=mode, history=history,
                               budget=Budget(max_turns=TURNS), context_turn_tokens=1500), progress=False)
        assert s.turns == TURNS, s
        _RUNS[key] = here / "runs" / s.run_id
    return _RUNS[key]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("arms")


def _user_texts(run_dir: Path) -> list[str]:
    """The user messages of the last request: the whole chat the model saw, turn by turn."""
    last = events(run_dir, "llm_request")[-1]
    return [m["content"] for m in last["messages"] if m["role"] == "user"]


_SECTION_TEXTS = {f"{s.doc}#{s.heading}": s.text for d in kr.load_docs() for s in d.sections}


def _sections_in(text: str) -> set[str]:
    """Doc sections whose whole text (a few hundred characters at least) is in `text`."""
    return {i for i, t in _SECTION_TEXTS.items() if len(t) > 200 and t.strip() in text}


def test_the_none_arm_gets_no_docs_on_any_turn(tmp):
    run = _run(tmp, "none")
    chat = "\n".join(_user_texts(run))
    assert "## Reference material" not in chat and not _sections_in(chat)
    assert "### <ptxbench/" not in chat  # the header API either
    assert all(r["tokens"] == 0 and not r["new_sections"] for r in events(run, "retrieval"))


@pytest.mark.parametrize("history", ["full", "latest"])
def test_later_turns_keep_the_arms_nested(tmp, history):
    """Turns 2+ add feedback-ranked sections (at most context_turn_tokens a turn): whatever the
    docs arm has seen by the last turn is inside what full had from turn 1; docs+headers adds the
    same sections as docs on every turn, and the header API reaches the chat once, in its arms only."""
    seen = {}
    for mode in kr.NESTED_MODES:
        run = _run(tmp, mode, history)
        chat = "\n".join(_user_texts(run))
        seen[mode] = _sections_in(chat)
        assert chat.count("### <ptxbench/common.cuh>") == (mode in ("docs+headers", "full")), mode
        for r in events(run, "retrieval")[1:]:
            assert sum(s["tokens"] for s in r["sections"] if s["id"] in r["new_sections"]) <= 1500
    assert not seen["none"] and seen["docs"] and seen["docs"] == seen["docs+headers"]
    assert seen["docs+headers"] <= seen["full"], seen["docs+headers"] - seen["full"]
    docs_new = [r["new_sections"] for r in events(_run(tmp, "docs", history), "retrieval")]
    hdr_new = [r["new_sections"] for r in events(_run(tmp, "docs+headers", history), "retrieval")]
    assert docs_new == hdr_new, docs_new
    # later turns add only sections ranked for the feedback's error class (issue 41): a syntax
    # error (turn 2) names no construct, code or feature, so it adds nothing
    for r in events(_run(tmp, "docs", history), "retrieval")[1:]:
        why = {s["id"]: s["why"] for s in r["sections"]}
        assert all(kr.follows_feedback(why[i]) for i in r["new_sections"]), r


def test_the_example_arm_never_resends_its_worked_kernel(tmp):
    run = _run(tmp, "docs+example")
    chat = _user_texts(run)
    example = next(d for d in kr.load_examples() if "gemm" in d.path)
    assert sum(example.body.strip()[:400] in c for c in chat) == 1  # turn 1 only
    assert events(run, "retrieval")[0]["added"]["example"]["sections"] == 1


_HASH = """
import hashlib
from agent.nodes import retrieval_call
from agent.trajectory import RunConfig
from knowledge import retriever as kr
from tasks import list_tasks
h = hashlib.sha256()
fb = "ptxas error   : Instruction 'wgmma.mma_async' not supported on .target 'sm_100a'\\n- `tma`: MISSING"
for t in list_tasks()[::4]:
    for arch in ("sm_90a", "sm_100a"):
        for mode in kr.MODES:
            cfg = RunConfig(run_id="h", task=t.name, model="scripted", arch=arch, context=mode,
                            requested_features=t.features_for(arch))
            for feedback in (None, fb):
                r = kr.retrieve(**retrieval_call(t, cfg, feedback))
                h.update(r.text.encode() + repr([vars(s) for s in r.sections]).encode())
print(h.hexdigest())
"""


def test_retrieval_is_the_same_in_every_process():
    """Same task, arch, arm and feedback -> the same context, whatever the process's hash seed
    (a set iterated into the ranking would make two replicas of a cell read different docs)."""
    digests = set()
    for seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _HASH], cwd=REPO, env=env, capture_output=True, text=True,
                             check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


def test_the_retrieval_event_says_what_each_turn_added(tmp):
    """`added` is documented (docs/BENCHMARKS.md, agent/nodes.py) as the tokens and sections each
    layer of the arm added. On turn 2+ of the full arm nothing is added (every section is in the
    chat since turn 1: prompt_tokens 0, no new_sections), yet `added` repeats the whole arm, about
    10,000 tokens a turn: summed over a run's events it counts the arm once per turn."""
    run = _run(tmp, "full")
    later = events(run, "retrieval")[1:]
    assert later and all(r["prompt_tokens"] == 0 and not r["new_sections"] for r in later)
    assert all(sum(p["tokens"] for p in r["added"].values()) == 0 for r in later), [r["added"] for r in later]
