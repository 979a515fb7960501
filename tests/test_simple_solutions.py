"""Every task ships a simple SIMT solution (tasks/<task>/simple): it parses, its manifest plans
for every workload (held-out sizes included), and it compiles for sm_90a with the real NVRTC
and ptxas, without spills. Correctness on a GPU: tests/gpu/test_evaluator_gpu.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks import TASKS, get_task
from tools.compile import compile_solution
from tools.features import sensing
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.solution import Solution
from tools.toolchain import find_toolchain

ROOT = Path(__file__).resolve().parents[1] / "tasks"


def test_every_task_has_a_simple_solution():
    assert sorted(p.parent.name for p in ROOT.glob("*/simple")) == sorted(TASKS)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_manifest_plans_for_every_workload(name):
    sol = Solution.from_dir(ROOT / name / "simple")
    task = get_task(name)
    assert sol.language == "cuda" and sol.name == "simple"
    for w in task.workloads:
        plan = plan_launches(sol.manifest, task, task.axis_values(w), NOMINAL_LIMITS["sm_90a"])
        assert len(plan.launches) == len(sol.manifest.launches)
    for launch in sol.manifest.launches:
        assert re.search(rf'extern "C" __global__[^;{{]*?\b{launch.kernel}\(', sol.source), launch.kernel


@pytest.mark.parametrize("name", sorted(TASKS))
def test_compiles_for_sm90a_without_spills(name):
    tc = find_toolchain()
    if tc.nvrtc.path is None or tc.ptxas.path is None:
        pytest.skip(f"needs NVRTC and ptxas: {tc.nvrtc.reason or tc.ptxas.reason}")
    sol = Solution.from_dir(ROOT / name / "simple")
    r = compile_solution(sol, "sm_90a")
    assert r.ok, r.error
    assert not [d for d in r.diagnostics if d.severity in ("error", "warning")], r.diagnostics
    kernels = {launch.kernel for launch in sol.manifest.launches}
    assert kernels <= set(r.kernels), (kernels, list(r.kernels))
    for k in kernels:
        assert r.kernels[k].spill_stores == 0 and r.kernels[k].spill_loads == 0, (k, r.kernels[k])
    assert not sensing(r.ptx), sensing(r.ptx)  # no clock, launch id or state across launches


def _body(path: Path) -> str:
    """The attention kernels differ only in their HEAD_DIM / CAUSAL defines."""
    return re.sub(r"#define (HEAD_DIM|CAUSAL) \d+", r"#define \1 ?", path.read_text())


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_attention_copies_differ_only_in_their_defines(direction):
    """One kernel body for every head dimension. Above d128 a row is spread over 8 lanes instead
    of 4 (kernel.cu: LANES), so a block of 128 threads owns 16 rows, not 32: that manifest's grid
    is the only other difference."""
    folders = sorted(ROOT.glob(f"mha_{direction}_*/simple"))
    assert len(folders) == len([n for n in TASKS if n.startswith(f"mha_{direction}_")])
    bodies = {_body(f / "kernel.cu") for f in folders}
    assert len(bodies) == 1
    for f in folders:
        task = get_task(f.parent.name)
        src = (f / "kernel.cu").read_text()
        assert f"#define HEAD_DIM {task.axes['D'].value}\n" in src
        assert re.search(rf"#define CAUSAL {int('causal' in task.tags)}\b", src)
        rows = 16 if task.axes["D"].value > 128 else 32
        manifest = (f / "launch.json").read_text()
        assert f'"cdiv(S, {rows})"' in manifest
        assert manifest.replace(f'"cdiv(S, {rows})"', '"cdiv(S, ROWS)"') == \
            (folders[0] / "launch.json").read_text().replace('"cdiv(S, 32)"', '"cdiv(S, ROWS)"')
