"""The FP8 block-scaled GEMM expert (tasks/fp8_gemm_nt_1d2d_n4096_k7168/expert) on the CPU, with the
real toolchain: it compiles for sm_90a with no spills and no serialized wgmma, its SASS carries the
FP8 warpgroup MMA (QGMMA e4m3 x e4m3 -> f32, the instruction the FP8 tensor-path credit counts) fed
by TMA loads and drained by TMA stores, and its manifest plans a launch on every workload of the
task (held-out included) with the split-K scratch sized for the splits the kernel is told.
The GPU side (correctness, credit, speed): tests/gpu/test_fp8_expert_gpu.py."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tasks import get_task
from tools.compile import compile_solution
from tools.launch import NOMINAL_LIMITS, plan_launches
from tools.sass import disassemble, parse_sass
from tools.solution import Solution
from tools.toolchain import ToolchainError

ROOT = Path(__file__).resolve().parents[1]
NAME = "fp8_gemm_nt_1d2d_n4096_k7168"
EXPERT = ROOT / "tasks" / NAME / "expert"
KERNEL = "fp8_gemm_1d2d_sm90"


@pytest.fixture(scope="module")
def compiled():
    r = compile_solution(Solution.from_dir(EXPERT), "sm_90a")
    assert r.ok, r.error
    return r


def test_compiles_without_spills_or_serialized_wgmma(compiled):
    k = compiled.kernels[KERNEL]
    assert k.spill_stores == 0 and k.spill_loads == 0 and k.stack_frame == 0, k
    assert k.registers <= 168, k  # 384 threads, one CTA per SM; setmaxnreg moves them between warpgroups
    said = [d for d in compiled.diagnostics if d.code in ("C7515", "C7508") or d.severity == "warning"]
    assert not said, said


def test_sass_holds_fp8_gmma_fed_and_drained_by_tma(compiled):
    try:
        text, _tool = disassemble(compiled.cubin)
    except ToolchainError as exc:
        pytest.skip(f"no SASS disassembler: {exc}")
    insns = parse_sass(text)[KERNEL]
    ops = [i.full_opcode for i in insns]
    qgmma = [op for op in ops if op.startswith("QGMMA.")]
    # two 128-column passes per K block, four k32 steps each, m64n128 e4m3 x e4m3 into fp32
    assert qgmma and set(qgmma) == {"QGMMA.64x128x32.F32.E4M3.E4M3"} and len(qgmma) == 8, sorted(set(ops))
    assert not any(i.opcode in ("HGMMA", "HMMA", "QMMA") for i in insns)  # no 16-bit or warp-level MMA path
    assert sum(i.opcode == "UTMALDG" for i in insns) >= 2 and sum(i.opcode == "UTMASTG" for i in insns) >= 1
    assert not any(i.opcode == "UBLKCP" for i in insns)  # no plain bulk copy (it would void the TMA credit)
    assert any(i.opcode == "REDG" for i in insns)  # split K (small M) adds partials in place
    # the scales are promoted on the CUDA cores: one FFMA per accumulator and pass (2 x 64 per K block)
    assert sum(i.opcode == "FFMA" for i in insns) >= 128


@pytest.mark.parametrize("m", [w.axes["m"] for w in get_task(NAME).workloads])
def test_manifest_plans_every_workload(m):
    task = get_task(NAME)
    limits = NOMINAL_LIMITS["sm_90a"]
    axes = task.axis_values({"m": m})
    plan = plan_launches(Solution.from_dir(EXPERT).manifest, task, axes, limits)
    [launch] = plan.launches
    tiles = math.ceil(m / 128) * (axes["n"] // 256)
    splits = max(1, min(8, limits.num_sms // tiles))
    assert launch.args[-1].value == splits
    assert launch.grid == (min(limits.num_sms, tiles * splits), 1, 1) and launch.block == (384, 1, 1)
    assert launch.shared_bytes <= limits.max_smem_per_block
    ws = next(b for b in plan.buffers if b.name == "ws")
    if splits > 1:  # split-K partials added in place (SPLIT_RED): one fp32 row of N per row of the padded tiles
        assert ws.shape[0] >= math.ceil(m / 128) * 128 and ws.shape[1] == axes["n"]
    counters = next(b for b in plan.buffers if b.name == "counters")
    assert counters.zero and counters.shape[0] >= tiles
    assert (m, splits) != (70, 1)  # M = 70 is 16 tiles on 132 SMs: split K must engage there
