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
MAX_TURNS = 2  # turn 1 says "1 more after this one"; the feedback for turn 2 says "this is the last one"


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
    statements = {f"{task.name} {arch} require={require}":
                  render_statement(task, _config(task, arch, "cuda", require, "none"))
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
# Every task's statement is also stored by its sha256 (all that is kept of the tasks not shown in full).
def _parts(text: str) -> list[str]:
    return re.split(r"\n(?=\n| *- )", text)  # rejoined by "\n": only newlines are cut


def _key(part: str) -> str:
    return hashlib.sha256(part.encode()).hexdigest()[:12]


def pack(texts: dict[str, str], statements: dict[str, str]) -> dict:
    parts = {_key(p): p for text in texts.values() for p in _parts(text)}
    return {"parts": dict(sorted(parts.items())),
            "prompts": {case: " ".join(_key(p) for p in _parts(text)) for case, text in sorted(texts.items())},
            "statements": {case: hashlib.sha256(text.encode()).hexdigest()
                           for case, text in sorted(statements.items())}}


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
    assert not changed, (f"{len(changed)} task statements differ from {TEXTS.name}: {changed[:5]}; "
                         f"if on purpose: {REWRITE}")


def test_the_recorded_prompts_hold_no_machine_path_or_date():
    text = TEXTS.read_text()
    assert str(Path(__file__).resolve().parents[1]) not in text and "/tmp/" not in text and "/home/" not in text
    assert not re.search(r"20\d\d-\d\d-\d\d", text)


def test_the_fixture_round_trips_byte_for_byte():
    texts = {"a": "x\n\n- y\n  - z\n", "b": "y\n\n\n\nz", "c": ""}
    assert unpack(pack(texts, {"s": "t"})) == (texts, {"s": hashlib.sha256(b"t").hexdigest()})
    assert pack(texts, {})["prompts"]["a"] == " ".join(map(_key, ["x", "", "- y", "  - z\n"]))



# ---------------------------------------------------------------------------------------
# What no registry task reaches, and the errors
# ---------------------------------------------------------------------------------------
def toy(**changes) -> Task:
    """A task of no family: an op type the example manifest has no grid for, a lower-case axis, a
    tensor over one axis twice, a scalar over fixed axes."""
    spec = {"name": "toy", "op_type": "toy", "reference": "def run(x):\n    return x\n",
            "axes": {"batch_size": {"type": "var"}, "X": {"type": "const", "value": 4}},
            "inputs": {"x": {"shape": ["batch_size", "X"], "dtype": "bfloat16", "description": "rows"},
                       "w": {"shape": ["X", "X"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["batch_size", "X", "X"], "dtype": "float32"}},
            "scalars": {"alpha": "1 / (2 * X)"},
            "workloads": [{"name": "B3", "axes": {"batch_size": 3}}, {"name": "B5", "axes": {"batch_size": 5}},
                          {"name": "B9", "axes": {"batch_size": 9}, "split": "held_out"}],
            "flops": "2 * batch_size * X * X", "requested_features": {"sm_90a": ["tma", "mystery"]}}
    return Task.model_validate({**spec, **changes})


def section(text: str, title: str) -> str:
    """The `## title` section of a statement, up to the next one."""
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_a_task_of_no_family_is_described_from_its_definition_alone():
    text = render_task(toy(), "sm_90a")
    assert text.startswith("# Task `toy` on sm_90a (Hopper (H100/H200))\n\nOperation type: toy.\n\n## Tensors\n")
    assert section(text, "Tensors") == (
        "Axes: X=4; varying: batch_size.\n"
        "Every tensor is a separate, contiguous, row-major array (the last axis varies fastest; each starts 256-byte "
        "aligned).\n\n"
        "| tensor | role | shape | dtype | element offset | meaning |\n|---|---|---|---|---|---|\n"
        "| `x` | input | [batch_size, X] | bfloat16 | `i0*X + x` | rows |\n"
        "| `w` | input | [X, X] | float32 | `i0*X + i1` |  |\n"  # one axis twice: no index letter twice
        "| `y` | output | [batch_size, X, X] | float32 | `(i0*X + i1)*X + i2` |  |\n\n"
        "Scalar `alpha` = 1 / (2 * X) = 0.125 (fp32; pass it to a kernel by name).\n"
        "Inputs are read-only: a kernel that writes to an input fails.\n")
    # over a varying axis: the expression alone
    assert "\nScalar `beta` = 1 / batch_size (fp32; pass it to a kernel by name).\nInputs" in render_task(
        toy(scalars={"beta": "1 / batch_size"}), "sm_90a")
    assert section(text, "Workloads") == (
        "- `B3`: batch_size=3 -> x [3, 4], w [4, 4], y [3, 4, 4]; 0.0 GFLOP\n"
        "- `B5`: batch_size=5 -> x [5, 4], w [4, 4], y [5, 4, 4]; 0.0 GFLOP\n\n"  # B9 is held out
        "Your kernel is also checked on other values of batch_size that are not shown here, including values that "
        "are not a multiple of any tile size and values smaller than one tile: read the sizes from the arguments "
        "and handle partial tiles.\n")
    assert section(text, "Requested instructions").startswith(
        "The kernel must use these sm_90a instructions for its main work:\n- `tma`: Tensor Memory Accelerator copies")
    assert "\n- `mystery`: mystery\n\nThey are checked" in text  # a feature with no text: its name
    assert "branch never taken does not count.\n" in text  # no wgmma: no ptxas serialization clause
    # the example: a grid over the first varying axis, every tensor, axis and scalar by name, a map over x
    assert example_manifest(toy(), "sm_90a") == {
        "tensor_maps": [{"name": "tmap_x", "tensor": "x", "box": ["min(batch_size, 64)", "min(X, 64)"]}],
        "launches": [{"kernel": "toy_kernel", "grid": ["cdiv(batch_size, 64)"], "block": [256],
                      "args": ["tmap_x", "w", "y", "batch_size", "X", "alpha"]}]}
    assert example_manifest(toy(), "sm_90a", require=False)["launches"][0]["args"][0] == "x"
    # no varying axis: one block
    fixed = toy(axes={"batch_size": {"type": "const", "value": 2}, "X": {"type": "const", "value": 4}}, workloads=[],
                requested_features={})
    assert example_manifest(fixed, "sm_90a")["launches"][0]["grid"] == ["cdiv(1, 64)"]
    assert "Axes: batch_size=2, X=4.\n" in render_task(fixed, "sm_90a")


def test_a_three_dimensional_map_is_one_element_deep_outside_its_last_two_axes():
    t = toy(inputs={"x": {"shape": ["batch_size", "X", "X"], "dtype": "bfloat16"}})
    assert example_manifest(t, "sm_90a")["tensor_maps"][0]["box"] == [1, "min(X, 64)", "min(X, 64)"]


def test_an_empty_task_says_what_it_lacks():
    t = toy(workloads=[], requested_features={}, description="Does nothing.")
    text = render_task(t, "sm_90a")
    assert "\n\nDoes nothing.\n\n## Tensors" in text and "Operation type" not in text
    assert section(text, "Workloads") == "No workloads are defined for this task yet.\n"
    assert section(text, "Instructions") == "No specific instructions are requested for this arch.\n"
    assert "## Requested" not in text
    assert "## Instructions" not in render_task(t, "sm_90a", require=False)


def test_an_arch_the_tables_do_not_know_is_named_as_given():
    text = render_task(toy(), "sm_120a")
    assert text.startswith("# Task `toy` on sm_120a (sm_120a)\n")
    assert "`num_sms` (? on this GPU)" in text and "compute_120a" in text
    assert ("`<ptxbench/common.cuh>`, `<ptxbench/mbarrier.cuh>`, `<ptxbench/tma.cuh>`, `<ptxbench/cluster.cuh>` "
            "are") in text
    assert "## Instructions\nNo specific instructions are requested for this arch." in text
    system = prompts.system_prompt("sm_120a", "cuda")
    assert "NVIDIA sm_120a GPUs (target `sm_120a`)" in system
    assert "instructions (its own instructions)." in system
    assert "- It is in the SASS of the kernels your manifest launches.\n" in system  # no ptxas caveat
    assert "wgmma:" not in system and "TMA:" not in system and "  - any other requested instruction" in system


def test_the_helper_headers_per_arch_and_setting():
    from tasks.describe import _helper_headers

    base = "`<ptxbench/common.cuh>`, `<ptxbench/mbarrier.cuh>`, `<ptxbench/tma.cuh>`, `<ptxbench/cluster.cuh>`"
    assert _helper_headers("sm_90a") == base + ", `<ptxbench/wgmma.cuh>`"
    assert _helper_headers("sm_100a") == base + ", `<ptxbench/tcgen05.cuh>`"
    assert _helper_headers("sm_100a", require=False) == (
        "(`<ptxbench/common.cuh>` and the others under `<ptxbench/...>`)")


def test_tolerance_wordings_no_family_uses():
    from tasks.schema import RowTolerance, Tolerance

    tol = Tolerance(scale="terms", rtol=2e-2, atol=1e-3, rel_l2={"y": 0.5},
                    rows={"y": RowTolerance(rtol=0.1), "w": RowTolerance(atol=0.25, row="element")})
    judging = section(render_task(toy(tolerance=tol), "sm_90a"), "How it is judged")
    assert judging.startswith(
        "- Correctness: ref is the fp32 result of the reference above on the same inputs (not rounded to the output "
        "dtype). Every element of every output must satisfy |out - ref| <= 0.001 + 0.02 * max(|ref|, rss), where rss "
        "is the root-sum-square of the products summed into that element (computed by the harness). It only forgives "
        "bf16 rounding of those factors where a sum cancels; for y, rss = |ref|. NaN never passes. "
        "Each row (last dimension) of y must also be within a relative L2 error of its own norm, with no floor (a row "
        "near zero is judged against itself): y 0.1. "
        "Instead of that rule, each element of these outputs must be within an absolute error of: w 0.25. "
        "The whole of each output must be within a relative L2 error (||out - ref|| / ||ref||) of y 0.5.\n"
        "- Inputs are fresh random values for every check: N(0, 1) with rare large outliers (N(0, 100) with "
        "probability 1e-3). Outputs are filled")
    assert judging.endswith("compared with no library (speed is reported, not compared) timed the same way on the "
                            "same GPU.\n")



def test_lists_of_two_are_joined_as_lists():
    """Two scalars, two outputs held to |ref| under the terms scale, two element rows, two rows judged
    by their own norm against max(|ref|, rss) (no family has two of each yet)."""
    from tasks.schema import RowTolerance, Tolerance

    own, element = RowTolerance(rtol=0.1), RowTolerance(atol=0.25, row="element")
    two = toy(op_type="gemm", scalars={"alpha": "X", "beta": "2"},
              outputs={"C": {"shape": ["batch_size", "X"], "dtype": "float32"},
                       "y": {"shape": ["batch_size", "X"], "dtype": "float32"},
                       "z": {"shape": ["batch_size", "X"], "dtype": "float32"}},
              tolerance=Tolerance(scale="terms", rows={"C": own, "y": own, "x": element, "w": element}))
    text = render_task(two, "sm_90a")
    assert "the scalars (alpha, beta), `num_sms`" in text
    assert "; for y, z, rss = |ref|." in text  # C is gemm's term output
    assert " Each row (last dimension) of C, y must also be within a relative L2 error of its own norm, with no " \
           "floor (a row near zero is judged against itself; C: the norm of max(|ref|, rss)): C 0.1, y 0.1." in text
    assert "within an absolute error of: x 0.25, w 0.25." in text
    grads = toy(op_type="mha_bwd", outputs={n: two.outputs["C"] for n in ("dQ", "dK", "dV")},
                tolerance=Tolerance(scale="terms", rows={"dQ": own, "dK": own}))
    assert "(a row near zero is judged against itself; dQ, dK: the norm of max(|ref|, rss)): dQ 0.1, dK 0.1." in \
        render_task(grads, "sm_90a")


def test_a_task_with_no_fixed_axis_and_a_baseline_with_no_text():
    t = toy(axes={"batch_size": {"type": "var"}, "X": {"type": "var"}}, scalars={},
            workloads=[{"name": "B3", "axes": {"batch_size": 3, "X": 4}}])
    assert "## Tensors\nAxes: none fixed; varying: batch_size, X.\n" in render_task(t, "sm_90a")
    # a baseline added to the schema before its text: named as it is (model_copy does not validate)
    assert "compared with fla_gdn_v2 timed the same way" in render_task(t.model_copy(update={"baseline": "fla_gdn_v2"}),
                                                                      "sm_90a")


def test_gflop_are_flops_over_1e9():
    t = toy(flops="1050000001 * batch_size", workloads=[{"name": "B1", "axes": {"batch_size": 1}}])
    assert "- `B1`: batch_size=1 -> x [1, 4], w [4, 4], y [1, 4, 4]; 1.1 GFLOP\n" in render_task(t, "sm_90a")
    assert "; 1,050.0 GFLOP" in render_task(t.model_copy(update={"flops": "1050000000000"}), "sm_90a")


def test_the_default_arch_is_hopper():
    assert render_task(toy()) == render_task(toy(), "sm_90a", "cuda", True)

def test_only_two_languages_are_described():
    with pytest.raises(ValueError, match="language must be 'cuda' or 'ptx', got 'sass'"):
        render_task(toy(), "sm_90a", "sass")


def test_the_manifest_json_puts_one_item_a_line():
    assert manifest_json({"buffers": [{"name": "a"}, {"name": "b"}], "launches": [{"grid": [1]}]}) == (
        '{\n  "buffers": [\n    {"name": "a"},\n    {"name": "b"}\n  ],\n  "launches": [\n    {"grid": [1]}\n  ]\n}')


def test_templates_of_a_version_and_their_hash(tmp_path, monkeypatch):
    """The hash a run's config records: sha256 over each template's name and bytes, in name order, so
    runs are comparable exactly when their templates are the same files."""
    (tmp_path / "b_v9.md").write_text("y")
    (tmp_path / "a_v9.md").write_text("x")
    (tmp_path / "a_v90.md").write_text("another version")
    monkeypatch.setattr(prompts, "PROMPTS_DIR", tmp_path)
    assert prompts.template_files("v9") == [tmp_path / "a_v9.md", tmp_path / "b_v9.md"]
    rules = b"".join(f"credit_rules:{a}".encode() + b"\0" + prompts.credit_rules(a).encode() + b"\0"
                     for a in ("sm_100a", "sm_90a"))
    assert prompts.template_hash("v9") == hashlib.sha256(b"a_v9.md\0x\0b_v9.md\0y\0" + rules).hexdigest()
    with pytest.raises(prompts.PromptError, match=f"^no prompt templates for version 'v8' in {tmp_path}$"):
        prompts.template_hash("v8")


@pytest.mark.parametrize("rule,value", [("WGMMA_MIN_OF_ALL_MATH", 0.8), ("SAME_RUN_RATIO", 1.2),
                                        ("TMA_MAX_OTHER_READS", 3.0)])
def test_a_credit_rule_that_changes_changes_the_hash(monkeypatch, rule, value):
    """The credit rules are stated in the system prompt from tools/credit.py's numbers, not a
    template: a run started under one rule must not resume under another (agent.run.inputs_change)."""
    from tools import credit

    before = prompts.template_hash()
    monkeypatch.setattr(credit, rule, value)
    assert prompts.template_hash() != before



def test_a_version_renders_its_own_templates(tmp_path, monkeypatch):
    """Every text of a run comes from its prompt_version's files (a v1 template never fills in), and an
    empty placeholder leaves no run of blank lines in the system prompt."""
    (tmp_path / "system_v9.md").write_text(
        "System for ${gpu_name}.${request}\n\n\n${credit_rules}\n\n${language_rules}\n")
    (tmp_path / "lang_cuda_v9.md").write_text("Lang 9 for ${arch}.\n")
    (tmp_path / "task_v9.md").write_text("Task 9: ${task}|${context}|${budget}|${arch}\n")
    (tmp_path / "context_v9.md").write_text("Docs 9${why}: ${sections}\n")
    monkeypatch.setattr(prompts, "PROMPTS_DIR", tmp_path)
    assert prompts.system_prompt("sm_90a", "cuda", "v9", require=False) == (
        "System for Hopper (H100, H200).\n\nLang 9 for sm_90a.\n")
    assert prompts.task_prompt(" s ", "sm_90a", "c", "v9") == "Task 9: s|\nc\n||sm_90a\n"  # docs a paragraph
    assert prompts.context_block(["a", "b"], version="v9") == "Docs 9: a\n\nb\n"
    with pytest.raises(prompts.PromptError, match="_v1.md is missing"):
        prompts.system_prompt("sm_90a", "cuda")


def test_the_defaults_ask_for_the_instructions():
    assert prompts.system_prompt("sm_90a", "cuda") == prompts.system_prompt("sm_90a", "cuda", require=True)
    assert prompts.task_prompt("s", "sm_90a", max_turns=2) == prompts.task_prompt("s", "sm_90a", max_turns=2,
                                                                                  require=True)
    assert "correct with the requested instructions" in prompts.task_prompt("s", "sm_90a", max_turns=2)

def test_a_missing_template_or_value_is_one_line():
    with pytest.raises(prompts.PromptError, match="^prompt template nothing_v1.md is missing$"):
        prompts.render("nothing")
    with pytest.raises(prompts.PromptError, match="^prompt template next_repair_v0.md is missing$"):
        prompts.render("next_repair", "v0")
    with pytest.raises(prompts.PromptError, match="^prompt template feedback_best_v1.md needs a value for 'status'$"):
        prompts.render("feedback_best", turn=2)
    # values are written as text; the result ends in one newline
    assert prompts.render("feedback_best", turn=2, status="correct") == (
        "(Your best kernel so far is the one from turn 2: correct. You may build on it instead.)\n")


def test_the_require_setting():
    assert (prompts.requires("on"), prompts.requires("off")) == (True, False)
    with pytest.raises(prompts.PromptError, match="^require must be one of on, off, not 'yes'$"):
        prompts.requires("yes")


def test_the_budget_line():
    assert prompts.budget_line(1, None) == prompts.budget_line(1, 0) == ""
    assert prompts.budget_line(2, 4) == ("This is turn 2 of 4 (2 more after this one). Your best kernel across all "
                                         "turns that is correct with the requested instructions is what counts, then "
                                         "its speed.")
    assert prompts.budget_line(4, 4, require=False) == (
        "This is turn 4 of 4 (this is the last one). Your best kernel across all turns that is correct is what "
        "counts, then its speed.")
    # no budget, no docs: their lines stay empty (the statement ends in its own newline)
    # no docs, no budget: one blank line, as between any two of the prompt's paragraphs
    assert prompts.task_prompt("statement\n", "sm_90a") == (
        "statement\n\nWrite the kernel for `sm_90a` now, in the reply format above.\n")
    assert prompts.task_prompt("statement\n", "sm_90a", context=" docs \n", max_turns=2) == (
        "statement\n\ndocs\n\nThis is turn 1 of 2 (1 more after this one). Your best kernel across all turns that "
        "is correct with the requested instructions is what counts, then its speed.\n"
        "Write the kernel for `sm_90a` now, in the reply format above.\n")


def test_the_context_block_holds_what_was_retrieved_and_nothing_else():
    assert prompts.context_block([]) == prompts.context_block(["", "  \n"]) == ""
    assert "chosen for this task:\n\none\n" in prompts.context_block(["one"])  # turn 1: no reason added
    block = prompts.context_block(["  one\n", "", "two  "], why=" and X")
    assert block == ("## Reference material\n\nExcerpts from ptxbench's architecture notes, chosen for this task and X:"
                     "\n\none\n\ntwo\n")


def test_the_latest_history_keeps_the_system_prompt_the_task_and_the_last_exchange():
    chat = [{"n": i} for i in range(6)]
    assert prompts.history_view(chat, "full") == chat
    assert prompts.history_view(chat[:4], "latest") == chat[:4]
    assert prompts.history_view(chat[:5], "latest") == [chat[0], chat[1], chat[3], chat[4]]
    assert prompts.history_view(chat, "latest") == [chat[0], chat[1], chat[4], chat[5]]
    view = prompts.history_view(chat, "full")
    view.append({})  # a copy: the chat itself is left as it was
    assert len(chat) == 6
    assert prompts.fence("ptx") == "ptx" and prompts.fence("cuda") == prompts.fence("anything") == "cuda"

if __name__ == "__main__":
    TEXTS.write_text(json.dumps(pack(*rendered()), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {TEXTS}", file=sys.stderr)


def test_a_fixed_scalar_keeps_its_value_beside_a_varying_one():
    """Each scalar is evaluated on its own: one over fixed axes shows its value even where another
    depends on a varying axis (evaluated together, neither showed one)."""
    text = render_task(toy(scalars={"alpha": "1 / (2 * X)", "per_row": "1 / batch_size"}), "sm_90a")
    assert "Scalar `alpha` = 1 / (2 * X) = 0.125 (fp32; pass it to a kernel by name)." in text
    assert "Scalar `per_row` = 1 / batch_size (fp32; pass it to a kernel by name)." in text
