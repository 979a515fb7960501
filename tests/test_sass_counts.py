"""Per-opcode executions from per-instruction records (tools.cupti.opcode_counts, issue 42 item 4):
the GPU test's kernel (tests/gpu/test_sass_counts_gpu.py) compiled with the real NVRTC + ptxas and
read back with the real cuobjdump holds both a tensor-map load and a plain bulk copy; records at
their pc offsets decode to UTMALDG and UBLKCP.S.G, and a record the SASS does not hold is named,
never given an opcode. The struct sizes are cupti_sass_metrics.h's (CUPTI_PROFILER_STRUCT_SIZE)."""
from __future__ import annotations

import pytest

from tools import cupti
from tools.cupti import SASS_INST_EXECUTED, SassRecord, opcode_counts
from tools.toolchain import ToolchainError


@pytest.fixture(scope="module")
def sass():
    from tests.gpu.test_sass_counts_gpu import KERNEL, compiled

    try:
        _cubin, programs = compiled()
    except ToolchainError as exc:
        pytest.skip(f"no SASS disassembler: {exc}")
    assert KERNEL in programs, programs.keys()
    return programs


def test_records_decode_to_their_opcodes(sass):
    from tests.gpu.test_sass_counts_gpu import KERNEL

    insns = sass[KERNEL]
    tma = [i for i in insns if i.opcode == "UTMALDG"]
    bulk = [i for i in insns if i.opcode == "UBLKCP"]
    assert len(tma) == 1 and len(bulk) == 1, [i.full_opcode for i in insns]
    assert bulk[0].full_opcode.startswith("UBLKCP.S.G"), bulk[0].full_opcode
    other = next(i for i in insns if i.opcode not in ("UTMALDG", "UBLKCP"))
    records = [SassRecord(KERNEL, tma[0].offset, {SASS_INST_EXECUTED: 7}),
               SassRecord(KERNEL, bulk[0].offset, {SASS_INST_EXECUTED: 40}),
               SassRecord(KERNEL, other.offset, {SASS_INST_EXECUTED: 3}),
               SassRecord(KERNEL, other.offset, {SASS_INST_EXECUTED: 2}),  # a second instance adds up
               SassRecord(KERNEL, bulk[0].offset + 0x100000, {SASS_INST_EXECUTED: 0})]  # never ran: no matter
    counts, unmatched = opcode_counts(records, sass)
    assert counts[tma[0].full_opcode] == 7 and counts[bulk[0].full_opcode] == 40
    assert counts[other.full_opcode] == 5 and not unmatched


def test_a_record_the_sass_does_not_hold_is_named():
    counts, unmatched = opcode_counts([SassRecord("k", 0x40, {SASS_INST_EXECUTED: 9}),
                                       SassRecord("gone", 0x0, {SASS_INST_EXECUTED: 1})],
                                      {"k": []})
    assert counts == {} and unmatched == ["k+0x40", "gone+0x0"]


def test_struct_sizes_are_the_headers():
    # CUPTI_PROFILER_STRUCT_SIZE(type, last field) on x86-64: the end of the named field
    assert cupti.SassSetConfig.size == 36 and cupti.SassEnable.size == 25 and cupti.SassDisable.size == 32
    assert cupti.SassDataProperties.size == 40 and cupti.SassFlush.size == 40  # (the header stops at numOfInstances)
    assert cupti.SassNumMetrics.size == 32 and cupti.SassGetMetrics.size == 40 and cupti.SassProperties.size == 56
    assert cupti.SassData.pcOffset.offset == 32 and cupti.SassData.pInstanceValues.offset == 40
