"""Every prompt text the benchmark sends (tasks/describe.py's task statement, agent/prompts.py's
system, turn and budget texts), in process and fast enough for mutation testing (scripts/mutation.sh).

Two kinds of test:
- every prompt, rendered now for every task x arch x --require setting (and, per op type, each
  language, context arm and turn), compared byte for byte with tests/fixtures/prompt_texts.json. A
  changed word changes what every run of that arm is told, so it is changed on purpose, here, and
  shows in review: `PYTHONPATH=. python tests/test_mutation_prompts.py` rewrites the file;
- the branches no registry task reaches (a task with no workloads, no request, an unknown arch or
  op type, a scalar over a varying axis) and the errors, each with what it must say.

The docs arm's text is a stand-in: what the retriever selects is tests/test_context_arms.py's and
tests/test_arms_docs_41.py's, so this fixture changes with the prompts only, never with the docs.
tests/test_example_drift.py replays one recorded run (one task, one arm) through the whole loop;
this file pins every task's statement and every arm's frame without running the loop.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from functools import cache
from pathlib import Path

import pytest

from agent import feedback as fb
from agent import prompts
from agent.nodes import turn1_messages
from agent.run import render_statement
from agent.trajectory import Budget, CandidateRecord, RunConfig
from tasks import list_tasks
from tasks.describe import example_manifest, manifest_json, render_task
from tasks.schema import Task

TEXTS = Path(__file__).resolve().parent / "fixtures" / "prompt_texts.json"
REWRITE = "PYTHONPATH=. python tests/test_mutation_prompts.py"
ARCHES = ("sm_90a", "sm_100a")
REQUIRES = ("on", "off")
LANGS = ("cuda", "ptx")
ARMS = ("none", "docs")  # no reference block, or one (every docs arm is a block of the retriever's text)
MAX_TURNS = 3  # turn 1 says "2 more after this one"; the feedback on turn 2 says "this is the last one"


# ---------------------------------------------------------------------------------------
# Every prompt, as a run renders it
# ---------------------------------------------------------------------------------------
def _config(task: Task, arch: str, lang: str, require: str, arm: str) -> RunConfig:
    return RunConfig(run_id="t", task=task.name, model="scripted", arch=arch, lang=lang, context=arm, require=require,
                     requested_features=task.features_for(arch), budget=Budget(max_turns=MAX_TURNS))


def _stand_in_docs(arch: str, turn: int) -> str:
    """A reference block with two sections, as agent.nodes.retrieve_context renders the retriever's."""
    sections = [f"### {arch} notes\nSection one of turn {turn}.", f"### more\nSection two of turn {turn}."]
    return prompts.context_block(sections, why=" and the last result" if turn > 1 else "")


def _later_turn(cfg: RunConfig) -> str:
    """Turn 2's user message as agent.nodes.draft builds it: new docs first, then the feedback on a
    reply that held no solution (the repair feedback with its budget line)."""
    context = _stand_in_docs(cfg.arch, 2) if cfg.context != "none" else ""
    chosen = CandidateRecord(turn=1, sample=0, path="candidates/1-0", outcome="format_error", error="no code block")
    feedback = fb.render_feedback(1, "repair", cfg.lang, chosen, None, max_turns=cfg.budget.max_turns,
                                  require=prompts.requires(cfg.require))
    return (context.strip() + "\n\n" + feedback.strip()).strip() + "\n"


def _representatives() -> list[Task]:
    """The first task of each op type: each family's statement in full (the rest by hash)."""
    first: dict[str, Task] = {}
    for task in list_tasks():
        first.setdefault(task.op_type, task)
    return list(first.values())


def _frames() -> list[tuple[str, str, str]]:
    """(lang, require, arm): every language and setting with no docs; the docs arm in cuda."""
    return [(lang, require, arm) for lang in LANGS for require in REQUIRES for arm in ARMS
            if arm == "none" or lang == "cuda"]


def rendered() -> tuple[dict[str, str], dict[str, str]]:
    """(texts, statements): the whole turn-1 chat of one task of each op type and the turn-2
    message, in each arch and frame, by case name; and every task's statement (cuda, both arches
    and --require settings), by case name."""
    texts: dict[str, str] = {}
    statements = {f"{task.name} {arch} require={require}": render_statement(task, _config(task, arch, "cuda", require, "none"))
                  for task in list_tasks() for arch in ARCHES for require in REQUIRES}
    for arch in ARCHES:
        for lang, require, arm in _frames():
            frame = f"{arch} {lang} require={require}"
            for task in _representatives():
                cfg = _config(task, arch, lang, require, arm)
                context = _stand_in_docs(arch, 1) if arm != "none" else ""
                system, user = turn1_messages(cfg, render_statement(task, cfg), context)
                texts[f"system {frame}"] = system["content"]  # takes no task
                texts[f"turn 1 user {task.name} {frame} {arm}"] = user["content"]
            texts[f"turn 2 user {frame} {arm}"] = _later_turn(cfg)
    return texts, statements


# The fixture stores each paragraph or list item once (the prompts share most of theirs) and each
# prompt as the list of their short hashes: byte for byte, and a changed word is one changed line.
# The statements of the tasks not shown in full are stored by their sha256.
def _parts(text: str) -> list[str]:
    return re.split(r"\n(?=\n| *- )", text)  # rejoined by "\n": only newlines are cut


def _key(part: str) -> str:
    return hashlib.sha256(part.encode()).hexdigest()[:12]


def pack(texts: dict[str, str], statements: dict[str, str]) -> dict:
    parts = {_key(p): p for text in texts.values() for p in _parts(text)}
    return {"parts": dict(sorted(parts.items())),
            "prompts": {case: " ".join(_key(p) for p in _parts(text)) for case, text in sorted(texts.items())},
            "statements": {case: hashlib.sha256(text.encode()).hexdigest() for case, text in sorted(statements.items())}}


def unpack(packed: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(texts, statement hashes)"""
    texts = {case: "\n".join(packed["parts"][k] for k in keys.split(" ")) for case, keys in packed["prompts"].items()}
    return texts, packed["statements"]


@cache
def recorded() -> tuple[dict[str, str], dict[str, str]]:
    return unpack(json.loads(TEXTS.read_text()))


def _first_difference(now: str, then: str) -> str:
    a, b = _parts(now), _parts(then)
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"part {i} now {a[i:i + 1]!r}, recorded {b[i:i + 1]!r}"


def test_every_prompt_is_the_recorded_one():
    (now, statements), (then, hashes) = rendered(), recorded()
    assert sorted(now) == sorted(then), f"other prompt cases than recorded; if on purpose: {REWRITE}"
    changed = [case for case in now if now[case] != then[case]]
    assert not changed, (f"{len(changed)} prompts differ from {TEXTS.name}, first {changed[0]!r}: "
                         f"{_first_difference(now[changed[0]], then[changed[0]])}; if on purpose: {REWRITE}")
    now_hashes = {case: hashlib.sha256(text.encode()).hexdigest() for case, text in statements.items()}
    changed = sorted(case for case in now_hashes.keys() | hashes.keys() if now_hashes.get(case) != hashes.get(case))
    assert not changed, f"{len(changed)} task statements differ from {TEXTS.name}: {changed[:5]}; if on purpose: {REWRITE}"


def test_the_recorded_prompts_hold_no_machine_path_or_date():
    text = TEXTS.read_text()
    assert str(Path(__file__).resolve().parents[1]) not in text and "/tmp/" not in text and "/home/" not in text
    assert not re.search(r"20\d\d-\d\d-\d\d", text)


def test_the_fixture_round_trips_byte_for_byte():
    texts = {"a": "x\n\n- y\n  - z\n", "b": "y\n\n\n\nz", "c": ""}
    assert unpack(pack(texts, {"s": "t"})) == (texts, {"s": hashlib.sha256(b"t").hexdigest()})
    assert pack(texts, {})["prompts"]["a"] == " ".join(map(_key, ["x", "", "- y", "  - z\n"]))


if __name__ == "__main__":
    TEXTS.write_text(json.dumps(pack(*rendered()), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {TEXTS}", file=sys.stderr)
