"""How near the "wgmma does >= 85% of all math" rule (tools.credit.WGMMA_MIN_OF_ALL_MATH) the shipped
experts' SASS puts them under the bound that needs no list (tools.credit: every thread instruction of any
pipe a multiply-add, fp16 ones 4 FLOPs more, each uniform-datapath warp instruction one more, each
global reduction or ALU atomic 32 lanes x 8 adds; issue 42 items 1-2), estimated without a GPU. The
H200 measures it: scripts/credit_margins.py, tests/gpu/test_credit_gpu.py prints each workload's `work`.

The estimate leans against the expert: every instruction of a kernel that issues wgmma is taken to run
once per pass of its main loop, by all 32 lanes of every warp, predicates ignored; the prologue, the
epilogue, the split-K reductions and the producer warp's code (which run far less often than the loop
that holds the wgmma) are counted as if they ran as often. Each HGMMA m64nNk16 in a warp's code is a
quarter of its warpgroup's 2*64*N*16 FLOPs (a QGMMA m64nNk32: 2*64*N*32). So it is no proof of the 90%
(with every instruction charged, it reads 0.84-0.93 on the shipped experts, 2026-12-03; 0.89-0.95 under
the per-pipe charge it replaced): it guards against a change that adds instructions to an expert's
kernel, and the H200's counts decide (docs/BENCHMARKS.md, "A bound that needs no list")."""
from __future__ import annotations

from pathlib import Path

import pytest

from tasks import get_task
from tools.compile import compile_source
from tools.sass import disassemble, parse_sass
from tools.toolchain import ToolchainError

ROOT = Path(__file__).resolve().parents[1]
# One task per distinct expert kernel: the GEMM tasks' experts are copies of one (tests/test_gemm_experts.py).
# Only the experts of tasks that request wgmma (GDN decode's asks for TMA alone: no wgmma share).
EXPERTS = sorted({(p.parent / "kernel.cu").read_text(): p.parent.parent.name  # the first of equals
                  for p in sorted((ROOT / "tasks").glob("*/expert/launch.json"), reverse=True)
                  if "wgmma" in get_task(p.parent.parent.name).features_for("sm_90a")}.values())
FP16 = ("HFMA2", "HMUL2", "HADD2", "HMNMX2", "HSETP2", "HSET2")
# instructions of the uniform datapath (one more multiply-add each) and reductions in memory (32 x 8 adds)
UNIFORM_EXCEPT = ("UTMA", "UBLK")  # U-prefixed, but TMA-pipe instructions
REDUCTIONS = ("RED", "ATOMG", "ATOM")  # global reductions, ALU atomics (ATOMS, shared: 32 x 2, not here)
# The estimate of each expert kernel (2026-12-03, ptxas 13.0), less 0.01: a change that adds instructions
# to a kernel fails here before the H200 sees it. Attention backward: 0.905 since v5 (the last CTA of a
# head converts its dQ in the main kernel: SIMT work that was the separate launch's), 0.902 since v6 (the
# direct dQ stores where a head has one key block, counted here as if they ran every step). GEMM: 0.845 since v6 (the
# deferred epilogue inlines a tile's staging code twice per tile width: beside the next tile's first wgmmas, and
# after the last tile; the H200 counts wgmma at 0.98-0.99 of all math on every visible workload, NOTES.md v6),
# 0.835 since v7 (the DSMEM fix-up of a tile's two halves, in the 128-wide instantiation only: 0.8444).
MIN_ESTIMATE_OF = {"fp8_gemm_nt_1d2d_n4096_k7168": 0.85, "gdn_prefill_qk4_v8_d128_k_last": 0.83,
                   "gdn_prefill_qk8_v16_d128_k_last": 0.83, "gemm_n128_k2048": 0.835, "mha_bwd_d128": 0.895,
                   "mha_fwd_d128": 0.915}


def _share(insns) -> float | None:
    """wgmma's share of all math with every instruction charged (tools.credit's bound), or None
    without wgmma."""
    wgmma = 0.0
    for i in insns:
        if i.opcode in ("HGMMA", "QGMMA"):  # bf16/f16/tf32 and fp8 (the FP8 GEMM expert) warpgroup MMAs
            m, n, k = map(int, i.modifiers[0].split("x"))
            wgmma += 2 * m * n * k / 4
    if not wgmma:
        return None
    ops = [i.opcode for i in insns]
    lanes = 32
    thread = lanes * (2 * len(ops) + 4 * sum(op in FP16 for op in ops))
    uniform = 2 * sum(op.startswith("U") and not op.startswith(UNIFORM_EXCEPT) for op in ops)
    reductions = lanes * 8 * 2 * sum(op.startswith(REDUCTIONS) and not op.startswith("ATOMS") for op in ops)
    return wgmma / (wgmma + thread + uniform + reductions)


@pytest.mark.parametrize("task", EXPERTS)
def test_experts_keep_their_estimated_wgmma_share_with_every_instruction_charged(task):
    comp = compile_source((ROOT / "tasks" / task / "expert" / "kernel.cu").read_text(), "cuda", "sm_90a")
    assert comp.ok, comp.error
    try:
        text, _tool = disassemble(comp.cubin)
    except ToolchainError as exc:
        pytest.skip(f"no SASS disassembler: {exc}")
    shares = {name: s for name, insns in parse_sass(text).items() if (s := _share(insns)) is not None}
    print(task, {k: round(v, 4) for k, v in shares.items()})
    assert shares, f"{task}: no kernel issues wgmma"
    for name, share in shares.items():
        assert share >= MIN_ESTIMATE_OF[task], (task, name, share)
