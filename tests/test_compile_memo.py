"""The evaluator compiles a source once per arch (tools.evaluator._compile): the shared simple
kernels of a family and resubmitted kernels are not compiled again, and each caller gets its own
copy of the result. Real NVRTC + ptxas."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools import evaluator
from tools.solution import Solution

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The arches compile_solution is called for, with the evaluator's memo emptied."""
    import tools.compile as compile_mod

    seen: list[str] = []
    real = compile_mod.compile_solution
    monkeypatch.setattr(compile_mod, "compile_solution", lambda sol, arch: seen.append(arch) or real(sol, arch))
    monkeypatch.setattr(evaluator, "_COMPILED", type(evaluator._COMPILED)())
    return seen


SIMPLE_GEMM = ROOT / "tasks" / "gemm_n7168_k5120" / "simple"


def test_a_source_compiles_once_per_arch_and_callers_get_copies(calls):
    sol = Solution.from_dir(SIMPLE_GEMM)
    first = evaluator._compile(sol, "sm_90a")
    assert first.ok and calls == ["sm_90a"]
    first.error = "changed by its caller"
    second = evaluator._compile(sol, "sm_90a")
    assert calls == ["sm_90a"] and second.ok and second.error is None and second.cubin == first.cubin
    evaluator._compile(sol, "sm_100a")
    assert calls == ["sm_90a", "sm_100a"]


def test_a_failed_compile_is_not_kept(calls):
    sol = Solution.from_dir(SIMPLE_GEMM)
    broken = sol.model_copy(update={"source": sol.source + "\nthis is not CUDA;\n"})
    assert not evaluator._compile(broken, "sm_90a").ok
    assert not evaluator._compile(broken, "sm_90a").ok
    assert calls == ["sm_90a", "sm_90a"]
