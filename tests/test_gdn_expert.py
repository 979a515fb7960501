"""The expert GDN decode kernel (tasks/gdn_decode_*/expert, gdn_decode_ring) without a GPU: it compiles with the
real NVRTC + ptxas for sm_90a with the state read by tensor-map loads and the side inputs by tensor-map loads or
cp.async (LDG only in the one-tile body, RING_TILE_BODY), the stages read with LDS, and no spills; its manifest
plans every workload (where the grid is a CTA per tile and the one-tile body runs, all resident at once), held-out
included) with the tile height it passes the kernel one the module has, the tensor maps' box that high, the tile
count covering every row of the state exactly once, the block the warps of that height, and shared memory for at
least one stage and at most RING_STAGES; and the algebra it computes (both dot products from the state before the
update, o = scale (g S q + delta k.q)) matches the task's reference within the task's own tolerance on every
workload. The GPU side: tests/gpu/test_gdn_gpu.py (test_expert_decode_at_fla_speed_with_tma_credit)."""
from __future__ import annotations

import math
import re
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


def _ring_defaults(source: str) -> dict[str, int]:
    """kernel.cu's compile-time ring knobs as shipped (the first #define of each: the #ifndef defaults)."""
    knobs = ("RING_ROWS", "RING_STAGES", "RING_WARPS", "RING_SIDE", "RING_ROWS_SMALL", "RING_WARPS_SMALL",
             "RING_TILE_BODY", "RING_MIN_BLOCKS")
    return {k: int(re.search(rf"#define {k} (\d+)", source).group(1)) for k in knobs}


def _stage_bytes(rows: int) -> int:
    return rows * 512 + 1152  # kernel.cu's RingShape::STAGE_BYTES: the rows, then k, q, v and the gates


@pytest.mark.parametrize("name", DECODE)
def test_expert_compiles_with_tma_in_the_sass_and_plans_every_workload(name):
    from tools.evaluator import Evaluator, static_check
    from tools.launch import NOMINAL_LIMITS, plan_launches

    task = get_task(name)
    sol = Solution.from_dir(ROOT / "tasks" / name / "expert")
    knobs = _ring_defaults(sol.source)
    warps_of = {knobs["RING_ROWS"]: knobs["RING_WARPS"]}  # the module's tile heights and their warps
    if knobs["RING_ROWS_SMALL"]:
        warps_of[knobs["RING_ROWS_SMALL"]] = knobs["RING_WARPS_SMALL"]
    side_by_tma = knobs["RING_SIDE"] == 0
    comp, insp = Evaluator.compile_and_inspect(sol, "sm_90a")
    assert comp.ok, comp.error
    k = comp.kernels["gdn_decode_ring"]
    # No spills. With RING_MIN_BLOCKS (64 registers) the entry saves a few registers around its calls of the
    # not-inlined bodies (a stack frame of ~56 B, once per CTA), nothing inside their loops.
    assert k.spill_stores == 0 and k.spill_loads == 0, k
    assert k.stack_frame <= (64 if knobs["RING_MIN_BLOCKS"] else 0), k
    if knobs["RING_MIN_BLOCKS"]:
        assert k.registers <= 65536 // (128 * knobs["RING_MIN_BLOCKS"]), k
    if insp.status == "ok":  # cuobjdump present (the CPU setup installs it)
        assert insp.feature_present("tma"), insp.features
        # The state comes by tensor-map loads, k, q, v and the gates by tensor-map loads too or by cp.async
        # (LDGSTS, ~7% of the state's bytes); never LDG, a generic LD or a plain bulk copy. The stage is read
        # with LDS and the new rows leave as 16-byte STGs.
        ops = insp.kernels["gdn_decode_ring"].opcodes
        # (the one-tile body, RING_TILE_BODY, reads k, q, v and the gates with LDG: ~7% of the state's bytes)
        assert not ({"LD", "UBLKCP"} | (set() if knobs["RING_TILE_BODY"] else {"LDG"})) & set(ops), ops
        if side_by_tma:
            assert ops.get("UTMALDG", 0) >= 9, ops
        else:
            assert ops.get("UTMALDG", 0) >= 1 and ops.get("LDGSTS", 0) >= 1, ops
        assert ops.get("LDS", 0) >= 4 and ops.get("STG", 0) >= 4, ops
    limits = NOMINAL_LIMITS["sm_90a"]
    for w in task.workloads:
        axes = task.axis_values(w)
        assert static_check(sol, comp, task, axes, limits) is None, w.name
        plan = plan_launches(sol.manifest, task, axes, limits)
        (launch,) = plan.launches
        scalars = [a.value for a in launch.args if a.kind == "i32" and a.name not in axes]
        tiles, rows = scalars  # the tile count and the tile height the kernel is told
        assert rows in warps_of, (w.name, rows)
        heads = axes["batch_size"] * axes["num_v_heads"]
        maps = {tm.tensor: tm for tm in plan.tensor_maps}
        side = {"q", "k", "v", "a", "b", "A_log", "dt_bias"} if side_by_tma else set()
        assert set(maps) == {"state", "new_state"} | side, set(maps)
        for t in ("state", "new_state"):  # one tile: `rows` rows of the [heads * 128, 128] view
            assert maps[t].view == (heads * 128, 128) and maps[t].box == (rows, 128), (w.name, maps[t])
        if side_by_tma:
            assert maps["v"].box == (1, rows) and maps["q"].box == maps["k"].box == (1, 128), w.name
        assert tiles * rows == heads * 128, (w.name, tiles)  # the tile count covers every row once
        if knobs["RING_TILE_BODY"] and launch.grid[0] == tiles:  # the entry takes the one-tile body: its CTAs
            per_sm = 65536 // (128 * -(-k.registers // 8) * 8)  # all resident at once (one wave), by the registers
            assert tiles <= per_sm * limits.num_sms, (w.name, launch, k.registers)
        # a strided walk (blockIdx.x, + gridDim.x, ...) visits every tile once for any grid up to the tile count
        assert 1 <= launch.grid[0] <= tiles and launch.block == (32 * warps_of[rows], 1, 1), (w.name, launch)
        # the kernel uses as many stages as the dynamic shared memory holds: at least one, at most RING_STAGES
        stages = (launch.shared_bytes - 128) // _stage_bytes(rows)
        assert 1 <= stages and launch.shared_bytes <= knobs["RING_STAGES"] * _stage_bytes(rows) + 128, (w.name, launch)


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
