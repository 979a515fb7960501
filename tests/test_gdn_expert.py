"""The expert GDN decode kernel (tasks/gdn_decode_*/expert) without a GPU: it compiles with the real
NVRTC + ptxas for sm_90a with its TMA load in the SASS, the tile read with LDS, and no spills; its manifest plans every
workload (held-out included) with the tile height passed to the kernel equal to the tensor map's
box and the grid covering every row of the state exactly once; and the algebra it computes (both
dot products from the state before the update, o = scale (g S q + delta k.q)) matches the task's
reference within the task's own tolerance on every workload. The GPU side: tests/gpu/test_gdn_gpu.py
(test_expert_decode_at_fla_speed_with_tma_credit)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tasks import get_task
from tasks.generators import generate_inputs
from tasks.reference import run_reference
from tools.correctness import compare
from tools.solution import Solution

ROOT = Path(__file__).resolve().parents[1]
DECODE = ["gdn_decode_qk4_v8_d128_k_last", "gdn_decode_qk8_v16_d128_k_last"]


@pytest.mark.parametrize("name", DECODE)
def test_expert_compiles_with_tma_in_the_sass_and_plans_every_workload(name):
    from tools.evaluator import Evaluator, static_check
    from tools.launch import NOMINAL_LIMITS, plan_launches

    task = get_task(name)
    sol = Solution.from_dir(ROOT / "tasks" / name / "expert")
    comp, insp = Evaluator.compile_and_inspect(sol, "sm_90a")
    assert comp.ok, comp.error
    k = comp.kernels["gdn_decode_tma"]
    assert k.spill_stores == 0 and k.spill_loads == 0 and k.stack_frame == 0, k
    if insp.status == "ok":  # cuobjdump present (the CPU setup installs it)
        assert insp.feature_present("tma"), insp.features
        # The tile is read from shared memory with LDS: a generic LD (the compiler no longer knowing
        # the pointer is shared, e.g. after aligning it through an integer) is slower and needs more
        # registers. The state's only global reads are the TMA's; its only global stores 16-byte STGs.
        ops = insp.kernels["gdn_decode_tma"].opcodes
        assert ops.get("LDS", 0) >= 4 and "LD" not in ops, ops
        assert ops.get("UTMALDG", 0) == 1 and ops.get("STG", 0) >= 4, ops
    limits = NOMINAL_LIMITS["sm_90a"]
    for w in task.workloads:
        axes = task.axis_values(w)
        assert static_check(sol, comp, task, axes, limits) is None, w.name
        plan = plan_launches(sol.manifest, task, axes, limits)
        (launch,) = plan.launches
        rows = next(a.value for a in launch.args if a.kind == "i32" and a.name not in axes)
        heads = axes["batch_size"] * axes["num_v_heads"]
        assert {tm.tensor for tm in plan.tensor_maps} == {"state", "new_state"}
        for tm in plan.tensor_maps:  # the load's box and the (STORE_TMA build's) store's: one tile
            assert tm.view == (heads * 128, 128) and tm.box == (rows, 128), (w.name, tm)
        assert rows % 16 == 0 and 128 % rows == 0, rows  # the kernel's groups of 4 rows per warp
        assert launch.grid == (heads * 128 // rows, 1, 1) and launch.block == (128, 1, 1), launch
        assert launch.shared_bytes >= rows * 128 * 4 + 127, launch  # the tile plus its alignment slack


def _kernel_algebra(x: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """What gdn_decode_tma computes, in fp32: S k and S q from the state before the update, then
    S' = g S + delta k^T and o = scale (g S q + delta (k.q))."""
    hq, hv = x["q"].shape[2], x["v"].shape[2]
    q = x["q"][:, 0].float().repeat_interleave(hv // hq, 1)
    k = x["k"][:, 0].float().repeat_interleave(hv // hq, 1)
    v = x["v"][:, 0].float()
    g = torch.exp(-torch.exp(x["A_log"]) * F.softplus(x["a"][:, 0].float() + x["dt_bias"]))[..., None]
    beta = torch.sigmoid(x["b"][:, 0].float())[..., None]
    S = x["state"]
    sk, sq = torch.einsum("bhvk,bhk->bhv", S, k), torch.einsum("bhvk,bhk->bhv", S, q)
    delta = beta * (v - g * sk)
    new_state = g[..., None] * S + delta[..., None] * k[:, :, None, :]
    out = scale * (g * sq + delta * (k * q).sum(-1, keepdim=True))
    return {"output": out[:, None].to(torch.bfloat16), "new_state": new_state}


@pytest.mark.parametrize("name", DECODE)
def test_the_kernels_fused_output_form_meets_the_tolerance(name):
    task = get_task(name)
    for w in task.workloads:
        axes = task.axis_values(w)
        x = generate_inputs(task, axes, seed=5)
        ref = run_reference(task, x)
        got = _kernel_algebra(x, 1 / math.sqrt(axes["head_size"]))
        for out in ("output", "new_state"):
            m = compare(out, got[out], ref[out], task.tolerance)
            assert m.passed, (w.name, m)
