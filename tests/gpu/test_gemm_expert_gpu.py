"""The GEMM expert (tasks/gemm_n7168_k5120/expert, shipped for every GEMM task) on the GPU, run
in-process through the project's own manifest planning and launch code:

- every path sums in a fixed order, so two runs on the same inputs must agree bit for bit (a race
  in the ring, the staging buffers or the work handoff would show here): the data-parallel path at
  the seed shape and at gemm_n5376_k21504 (K = 21504, the largest reduction; withheld until GEMM was judged on term scales), and stream-K with 2,
  2-3 and ~34 contributors a tile (with FIXUP_ORDERED the fix-up sums partials in contributor order,
  not arrival order; shipped off, where 2 contributors, as at M = 70, are order-free anyway);
- every tile width and schedule the manifest (or expert_dev's variants) can pick is correct on
  ragged shapes: N not a multiple of 64 or 256 (an odd number of 64-column chunks in the last
  column tile: the epilogue's staging buffers alternate across tiles), M below one tile, stream-K
  and data-parallel, with CTAs that do more than one tile.

    python -m pytest -m gpu -q tests/gpu/test_gemm_expert_gpu.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))


@pytest.fixture(scope="module")
def device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.zeros(1, device="cuda")  # the primary context, before any module load
    from tools.launch import DeviceLimits

    props = torch.cuda.get_device_properties(0)
    return DeviceLimits(num_sms=props.multi_processor_count, max_smem_per_block=232448)


_BUILT: dict = {}  # variant name -> (solution, loaded module)


def _run(task, m: int, variant_name: str, limits, tmp_path, seed: int = 1, runs: int = 1):
    """(outputs of `runs` launches on one seed's inputs, the verdict of the last)."""
    import torch
    from expert_dev import variant

    from tasks.generators import generate_inputs
    from tasks.reference import run_reference
    from tools.compile import compile_solution
    from tools.launch import Bound, Module, plan_launches
    from tools.workspace import Workspace, term_scales

    if variant_name not in _BUILT:  # one compile per variant for the whole module
        sol = variant("gemm_n7168_k5120", variant_name, tmp_path)
        comp = compile_solution(sol, "sm_90a")
        assert comp.ok, comp.error
        _BUILT[variant_name] = sol, Module(comp.cubin, comp.symbols)
    sol, module = _BUILT[variant_name]
    axes = task.axis_values({"M": m})
    plan = plan_launches(sol.manifest, task, axes, limits)
    ws = Workspace(task, plan)
    bound = Bound(plan, module, ws.pointers())
    fresh = generate_inputs(task, axes, seed, device="cuda", fast=True)
    outs = []
    for _ in range(runs):
        ws.load_inputs(fresh)
        ws.reset()
        bound.launch()
        torch.cuda.synchronize()
        outs.append(ws.outputs["C"].clone())
    # the task's own rule: GEMM is judged on the scale of its terms (tasks/families/gemm.py)
    reason, detail, _ = ws.verdict(run_reference(task, fresh), task.tolerance, term_scales(task, fresh), inputs=fresh)
    return outs, reason, detail


# nowave: the data-parallel path alone (every tile one CTA's); FIXUP_ORDERED (`ordered`) at M = 8192:
# stream-K over the last wave (2-3 contributors a tile); shipped at M = 70: equal splits (2 contributors,
# order-free; since v7 through distributed shared memory in clusters of 2, `nopair` the ws and counters); sk_wave_ordered at gemm_n34816_k5120 M = 70: 4 tiles over 132 CTAs (~34 contributors:
# the fix-up that restarts from the first partial). Every one with the shipped deferred epilogue (EPI_DEFER:
# a tile's stores run beside the next tile's first wgmmas).
@pytest.mark.parametrize("task_name,m,variant_name", [
    ("gemm_n7168_k5120", 8192, "nowave"), ("gemm_n5376_k21504", 8828, "nowave"), ("gemm_n7168_k5120", 8192, "ordered"),
    ("gemm_n7168_k5120", 70, "shipped"), ("gemm_n7168_k5120", 70, "nopair"), ("gemm_n34816_k5120", 70, "sk_wave_ordered")])
def test_every_path_is_deterministic(task_name, m, variant_name, device, tmp_path):
    """The same bits on every run: a race in the ring, the staging buffers or the work handoff would
    show here, and so would a stream-K sum whose order followed whichever contributor came last."""
    import torch

    from tasks import get_task

    outs, reason, detail = _run(get_task(task_name), m, variant_name, device, tmp_path, runs=3)
    bits = [o.view(torch.int16) for o in outs]
    for other in bits[1:]:
        assert int((bits[0] != other).sum()) == 0, "two runs on the same inputs differ"
    if task_name != "gemm_n5376_k21504":  # withheld: its tolerance question (NOTES.md)
        assert reason is None, f"{reason}: {detail}"


# (N, K, M): N % 256 of 136 (3 chunks: odd), 64 (1 chunk), 200 (4, the last one clipped); M below
# one tile, between tiles, and large enough that CTAs take several tiles
RAGGED = [(136, 512, 8192), (136, 512, 70), (576, 1024, 8192), (576, 1024, 1000), (200, 4096, 300), (7168, 5120, 70)]


# shipped: v5 (6-deep ring at 128 wide, equal stream-K splits); v4: a 4-deep ring and balanced ranges;
# sk_wave: stream-K over the last partial wave at large M (576 x 1024 x 8192: 60 of 192 tiles)
# nodefer: v5's epilogue (each tile stored before the next tile's wgmmas; shipped since v6: stored while they run)
@pytest.mark.parametrize("variant_name", ["shipped", "v4", "sk_wave", "bn256", "bn128", "bn128_p4", "nodefer"])
def test_every_tile_width_is_correct_on_ragged_shapes(variant_name, device, tmp_path):
    from tasks.families.gemm import gemm_task

    failed = []
    for n, k, m in RAGGED:
        _outs, reason, detail = _run(gemm_task(n, k), m, variant_name, device, tmp_path / f"{n}_{k}_{m}", seed=m)
        if reason is not None:
            failed.append(f"N={n} K={k} M={m}: {reason}: {detail}")
    assert not failed, "\n".join(failed)
