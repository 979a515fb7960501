"""The probe kernels of tests/gpu/test_cupti_counters_gpu.py compile for sm_90a with the real
NVRTC + ptxas, and their SASS is what the GPU test reads the counters against: the wgmma kernels
issue only HGMMA / QGMMA (no HMMA), the mma.sync kernels only HMMA (no GMMA), one per MMA.

On sm_90a ptxas has no fp8 mma.sync: it unpacks the e4m3 operands to f16 (F2FP.F16.E4M3.UNPACK_B)
and issues two HMMA.16816.F32 per m16n8k32 (each a k16 half)."""
from __future__ import annotations

import json

import pytest

from tests.gpu.test_cupti_counters_gpu import ITERS, KERNELS, SOURCE, expected, report
from tools import credit
from tools.compile import compile_source
from tools.sass import disassemble, parse_sass
from tools.toolchain import ToolchainError


def _mma_opcodes(insns) -> dict[str, int]:
    """Tensor-core and fp8-unpack instructions with their modifiers, e.g. HMMA.16816.F32.BF16 -> 8."""
    out: dict[str, int] = {}
    for i in insns:
        if "MMA" in i.opcode or i.opcode == "F2FP":
            key = ".".join((i.opcode, *i.modifiers))
            out[key] = out.get(key, 0) + 1
    return out


@pytest.fixture(scope="module")
def sass() -> dict[str, dict[str, int]]:
    comp = compile_source(SOURCE, "cuda", "sm_90a")
    assert comp.ok, (comp.error, [d.message for d in comp.errors()])
    try:
        text, _tool = disassemble(comp.cubin)
    except ToolchainError as exc:
        pytest.skip(f"no SASS disassembler: {exc}")
    programs = parse_sass(text)
    assert set(programs) == set(KERNELS), programs.keys()
    found = {name: _mma_opcodes(insns) for name, insns in programs.items()}
    for name, ops in found.items():
        print(f"{name}: {ops}")
    return found


def _total(ops: dict[str, int], prefix: str) -> int:
    return sum(n for op, n in ops.items() if op.startswith(prefix))


def test_wgmma_kernels_issue_only_warpgroup_mmas(sass):
    assert sass["wgmma_bf16"] == {"HGMMA.64x8x16.F32.BF16": ITERS}, sass["wgmma_bf16"]
    assert sass["wgmma_e4m3"] == {"QGMMA.64x8x32.F32.E4M3.E4M3": ITERS}, sass["wgmma_e4m3"]


def test_mma_sync_kernels_issue_only_hmma(sass):
    assert sass["mma_sync_bf16"] == {"HMMA.16816.F32.BF16": ITERS}, sass["mma_sync_bf16"]
    fp8 = sass["mma_sync_e4m3"]
    # two f16 HMMAs per m16n8k32, after unpacking e4m3 to f16 (no fp8 mma.sync datapath on sm_90a)
    assert _total(fp8, "HMMA") == 2 * ITERS and _total(fp8, "HMMA.16816.F32") == 2 * ITERS, fp8
    assert _total(fp8, "F2FP") > 0 and all("E4M3" in op for op in fp8 if op.startswith("F2FP")), fp8
    assert not any(op.startswith(("HGMMA", "QGMMA")) for op in fp8), fp8


def test_the_gpu_report_prints_and_writes_every_value(tmp_path, capsys):
    """The GPU test's report (what the lead reads from the H200 run) on made-up counter values."""
    results = {"metrics": list(credit.CUPTI_METRICS), "passes": 6, "chip": "GH100", "iters": ITERS, "blocks": 4,
               "kernels": {name: {"launches": 1, "range_name": name, "expected": expected(name),
                                  "metrics": {m: float(i) for i, m in enumerate(credit.CUPTI_METRICS)},
                                  "work_metrics": {"wgmma_flops": 1.0, "other_flops": 2.0},
                                  "output": {"min": 128.0, "max": 128.0}} for name in KERNELS}}
    report(results, tmp_path / "logs" / "cupti_counters.json")
    assert json.loads((tmp_path / "logs" / "cupti_counters.json").read_text()) == results
    printed = capsys.readouterr().out
    assert all(f"== {name}:" in printed for name in KERNELS) and credit.HMMA_INST_METRIC in printed
    assert "OPEN QUESTION" in printed and f"fp8 mma.sync reads {credit.FP8_OPS_METRIC}" in printed
    assert expected("wgmma_e4m3") == {"mma_warp_instructions": 4 * 4 * ITERS, "flops": 2 * 64 * 8 * 32 * ITERS * 4,
                                      "output": 32.0 * ITERS}
