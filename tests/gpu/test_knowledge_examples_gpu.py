"""The knowledge base's code that claims to run, run on the GPU.

The retrievable docs hold fragments and compile-only snippets (tests/test_knowledge.py compiles
every one and checks its SASS); the only code that claims to compute a task's result is the
worked examples in knowledge/examples/, each a kernel + manifest for the task family its
front matter names (`ops`). They are kept out of every context arm, but what they claim is
checked here: correct on the task's visible and held-out workloads through the evaluator,
with the requested instructions in the SASS. sm_90a only (the H200); no sm_100a example
claims to run.

    pytest -m gpu tests/gpu/test_knowledge_examples_gpu.py -q
"""
from __future__ import annotations

import json
import re

import pytest
from gpu_helpers import show

from knowledge.retriever import load_examples
from tasks import list_tasks
from tools.solution import Solution

pytestmark = pytest.mark.gpu


def _example_solutions() -> list[tuple[str, str, Solution]]:
    """(example doc, task name, solution): every example with a launch manifest, for each seed
    task of its family on sm_90a. The kernel source is every ```cuda block of the doc joined
    (the backward example keeps its three kernels in two blocks, each with its own includes)."""
    out = []
    for doc in load_examples():
        if "sm_90a" not in doc.arches:
            continue
        blocks = re.findall(r"^```cuda\s*\n(.*?)^```", doc.body, re.S | re.M)
        manifests = [m for m in re.findall(r"^```json\s*\n(.*?)^```", doc.body, re.S | re.M) if '"launches"' in m]
        if not blocks or len(manifests) != 1:
            continue
        source = "\n".join(blocks)
        for task in list_tasks():
            if task.op_type in doc.ops and "seed" in task.tags and "causal" not in task.tags:
                out.append((doc.path, task.name, Solution(language="cuda", source=source,
                                                          manifest=json.loads(manifests[0]))))
    return out


EXAMPLES = _example_solutions()


def test_every_example_is_collected():
    assert {p for p, _, _ in EXAMPLES} == {d.path for d in load_examples() if "sm_90a" in d.arches}


@pytest.mark.parametrize("doc, task, solution", EXAMPLES, ids=[f"{p}:{t}" for p, t, _ in EXAMPLES])
def test_worked_example_is_correct_with_its_features(evaluator, doc, task, solution):
    r = evaluator.evaluate(solution, task, "sm_90a", workloads="all", time=False)
    assert r.compile.ok, r.compile.error
    assert r.arch_ok, f"{doc}: requested features missing or serialized: {r.inspect.reason}"
    assert r.correct is True, f"{doc} on {task}: {show(r)}"
    assert r.split_correct("held_out") is True, f"{doc} on {task} (held-out): {show(r)}"
