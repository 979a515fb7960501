"""How near the "wgmma does >= 90% of all math" rule (tools.credit.WGMMA_MIN_OF_ALL_MATH) the shipped
experts stand once every instruction of the FMA, ALU, FP64 and XU pipes is charged as a multiply-add
(tools.credit.SIMT_FLOP_METRICS: hardware pipe counters), estimated from their SASS without a GPU (the
H200 measures it: tests/gpu/test_credit_gpu.py prints each workload's `work`).

The estimate is a bound that leans against the expert: every instruction of a kernel that issues
wgmma is taken to run once per pass of its main loop, by all 32 lanes of every warp, predicates
ignored; the prologue, the epilogue and the producer warp's code (which run far less often than the
loop that holds the wgmma) are counted as if they ran as often. Every instruction that is not memory,
control, tensor-pipe or uniform-datapath is taken to run on one of the charged pipes (moves, compares,
conversions and MUFU included) at 2 FLOPs a lane, fp16 ones (HFMA2 ...) 4 more. Each HGMMA m64nNk16 in a
warp's code is a quarter of its warpgroup's 2*64*N*16 FLOPs (a QGMMA m64nNk32: 2*64*N*32). Measured on the
shipped experts (2026-12-03, evening): 92.9-95.7% of all math with every pipe charged (97.5-97.7% with the
SASS integer class only, 98.6-99.5% with float math only); the rule needs 90%."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools import credit
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
FP = {"FFMA": 2, "FMUL": 1, "FADD": 1, "HFMA2": 4, "HMUL2": 2, "HADD2": 2, "DFMA": 2, "DMUL": 1, "DADD": 1}
# instructions that run on none of the charged pipes: memory, control, tensor, the uniform datapath
NOT_CHARGED = ("LD", "ST", "ATOM", "RED", "UTMA", "UBLKCP", "SYNCS", "BAR", "WARPSYNC", "BRA", "EXIT", "RET", "CALL",
               "BSSY", "BSYNC", "NOP", "YIELD", "DEPBAR", "HGMMA", "QGMMA", "WARPGROUP", "U", "R2UR", "S2UR", "MEMBAR",
               "FENCE", "ERRBAR", "CCTL", "ELECT", "ACQBULK", "BPT", "JMP", "BRX", "PREEXIT", "VOTEU", "R2B", "B2R",
               "SETMAXREG", "NANOSLEEP")
FP16 = ("HFMA2", "HMUL2", "HADD2", "HMNMX2", "HSETP2", "HSET2")
# what the estimate may leave of the 10% the rule allows (the H200's measurement is the verdict)
MIN_ESTIMATE = 0.92
# The estimate counts each instruction of the SASS once. The GDN prefill expert's triangular solve,
# gates and masks are long straight-line code that runs once a chunk while its 36 wgmma run once a
# chunk too, so the static count puts its share at 0.889 where the H200 counted 0.928-0.933 on every
# workload of both head configurations (2026-12-03, docs/BENCHMARKS.md): its floor is the estimate's,
# held so a change that adds SIMT work to it still fails here.
MIN_ESTIMATE_OF = {"gdn_prefill_qk4_v8_d128_k_last": 0.88, "gdn_prefill_qk8_v16_d128_k_last": 0.88}


def _share(insns) -> tuple[float, float] | None:
    """(wgmma share of all math, integers charged; the same without them), or None without wgmma."""
    wgmma = 0.0
    for i in insns:
        if i.opcode in ("HGMMA", "QGMMA"):  # bf16/f16/tf32 and fp8 (the FP8 GEMM expert) warpgroup MMAs
            m, n, k = map(int, i.modifiers[0].split("x"))
            wgmma += 2 * m * n * k / 4
    if not wgmma:
        return None
    lanes = 32
    charged = [i.opcode for i in insns if not i.opcode.startswith(NOT_CHARGED)]
    pipes = lanes * (2 * len(charged) + 4 * sum(op in FP16 for op in charged))
    fp = lanes * sum(FP.get(i.opcode, 0) for i in insns)
    return wgmma / (wgmma + pipes), wgmma / (wgmma + fp)


@pytest.mark.parametrize("task", EXPERTS)
def test_experts_keep_their_wgmma_share_with_every_pipe_charged(task):
    comp = compile_source((ROOT / "tasks" / task / "expert" / "kernel.cu").read_text(), "cuda", "sm_90a")
    assert comp.ok, comp.error
    try:
        text, _tool = disassemble(comp.cubin)
    except ToolchainError as exc:
        pytest.skip(f"no SASS disassembler: {exc}")
    shares = {name: s for name, insns in parse_sass(text).items() if (s := _share(insns)) is not None}
    print(task, {k: (round(a, 4), round(b, 4)) for k, (a, b) in shares.items()})
    assert shares, f"{task}: no kernel issues wgmma"
    for name, (with_int, without) in shares.items():
        assert with_int >= MIN_ESTIMATE_OF.get(task, MIN_ESTIMATE), (task, name, with_int, without)
        assert with_int < without  # the integer charge is real, not zero
    assert credit.WGMMA_MIN_OF_ALL_MATH < MIN_ESTIMATE
