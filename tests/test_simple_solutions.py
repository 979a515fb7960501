"""Every task ships a simple SIMT solution (tasks/<task>/simple): it parses, its manifest plans
for every workload (held-out sizes included), and it compiles for sm_90a with the real NVRTC
and ptxas, without spills. A family's tasks share one kernel source (tasks/simple_kernels/), each
manifest naming its own instance. Correctness on a GPU: tests/gpu/test_evaluator_gpu.py."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tasks import TASKS, get_task
from tools.compile import compile_solution
from tools.features import sensing
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.results import CompileResult
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


_COMPILED: dict[str, CompileResult] = {}


def _compiled(sol: Solution) -> CompileResult:
    """One compile per shared source (the forward attention source holds 16 kernels): the tasks
    that link it differ only in the kernels their manifests launch."""
    if sol.source not in _COMPILED:
        _COMPILED[sol.source] = compile_solution(sol, "sm_90a")
    return _COMPILED[sol.source]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_compiles_for_sm90a_without_spills(name):
    tc = find_toolchain()
    if tc.nvrtc.path is None or tc.ptxas.path is None:
        pytest.skip(f"needs NVRTC and ptxas: {tc.nvrtc.reason or tc.ptxas.reason}")
    sol = Solution.from_dir(ROOT / name / "simple")
    r = _compiled(sol)
    assert r.ok, r.error
    assert not [d for d in r.diagnostics if d.severity in ("error", "warning")], r.diagnostics
    kernels = {launch.kernel for launch in sol.manifest.launches}
    assert kernels <= set(r.kernels), (kernels, list(r.kernels))
    for k in kernels:
        assert r.kernels[k].spill_stores == 0 and r.kernels[k].spill_loads == 0, (k, r.kernels[k])
    assert not sensing(r.ptx), sensing(r.ptx)  # no clock, launch id or state across launches


SHARED = ROOT / "simple_kernels"
# task name prefix -> the shared source its simple kernel links to, and its kernels' names
FAMILIES = {
    "mha_fwd_": ("attention_fwd.cu", ["attn_fwd_simple{d}{c}"]),
    "fp8_mha_with_lse_": ("attention_fwd.cu", ["fp8_attn_fwd_simple{d}{c}"]),
    "mha_bwd_": ("attention_bwd.cu", ["attn_bwd_delta{d}", "attn_bwd_dkdv{d}{c}", "attn_bwd_dq{d}{c}"]),
    "gdn_decode_": ("gdn.cu", ["gdn_decode_simple"]),
    "gdn_prefill_": ("gdn.cu", ["gdn_prefill_simple"]),
    "gdn_mtp_": ("gdn.cu", ["gdn_mtp_simple"]),
}


@pytest.mark.parametrize("prefix", sorted(FAMILIES))
def test_a_family_shares_one_kernel_source(prefix):
    """Linked, not copied: one source per family, with the head dimension and the mask as template
    arguments, so each attention task's manifest names the instance for its D and mask. Above d128
    a row is spread over 8 lanes instead of 4 (attention_*.cu: LANES), so a block of 128 threads
    owns 16 rows, not 32: that grid is the only other difference between a family's manifests."""
    source, kernels = FAMILIES[prefix]
    names = [n for n in TASKS if n.startswith(prefix)]
    shapes = set()
    for name in names:
        folder = ROOT / name / "simple"
        assert os.path.islink(folder / "kernel.cu") or os.path.islink(folder), name
        assert (folder / "kernel.cu").resolve() == (SHARED / source).resolve(), name
        task = get_task(name)
        d = f"_d{task.axes['D'].value}" if "D" in task.axes else ""
        causal = "_causal" if "causal" in task.tags else ""
        manifest = (folder / "launch.json").read_text()
        for k in kernels:
            assert f'"kernel": "{k.format(d=d, c=causal)}"' in manifest, (name, k)
            manifest = manifest.replace(f'"kernel": "{k.format(d=d, c=causal)}"', f'"kernel": "{k}"')
        if d:
            rows = 16 if task.axes["D"].value > 128 else 32
            assert re.search(rf'"cdiv\([SL], {rows}\)"', manifest), name
            manifest = re.sub(rf'"cdiv\(([SL]), {rows}\)"', r'"cdiv(\1, ROWS)"', manifest)
        shapes.add(manifest)
    assert names and len(shapes) == 1, shapes
    assert not [p for p in SHARED.glob("*.cu") if os.path.islink(p)]  # the shared sources are the real files
