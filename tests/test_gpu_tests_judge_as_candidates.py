"""A GPU test that judges outputs itself must judge them as a candidate is judged: with the task's term scales
where the task has them. On 2026-12-04 tests/gpu/test_gdn_gpu.py judged fla's outputs with `compare` and no
scale, a stricter rule than any candidate faces, and a row bound was loosened for it (docs/METHODOLOGY.md,
"Output rows: judged against the term scales, 1.2e-2"). Every call of tools.correctness.compare under tests/gpu
passes its fifth argument, the term scale (None is fine where the task has none: a value the test computed)."""
from __future__ import annotations

import ast
from pathlib import Path

GPU_TESTS = Path(__file__).resolve().parent / "gpu"


def _compare_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == "compare" or getattr(n.func, "attr", None) == "compare")]


def test_every_gpu_test_compare_passes_the_term_scale():
    unscaled = []
    for path in sorted(GPU_TESTS.glob("*.py")):
        for call in _compare_calls(ast.parse(path.read_text())):
            if len(call.args) < 5 and not any(k.arg == "scale" for k in call.keywords):
                unscaled.append(f"{path.name}:{call.lineno}")
    assert not unscaled, f"compare() without the term scale (tools.workspace.term_scales): {unscaled}"


def test_the_check_sees_a_call_without_the_scale():
    calls = _compare_calls(ast.parse("m = compare(n, got, ref[n], task.tolerance)\n"
                                     "m = correctness.compare(n, got, ref[n], tol, scale=s)\n"))
    assert [len(c.args) for c in calls] == [4, 4] and calls[1].keywords[0].arg == "scale"
