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
    from tools.sass import kernel_sass

    insns = sass[KERNEL]
    tma = [i for i in insns if i.opcode == "UTMALDG"]
    bulk = [i for i in insns if i.opcode == "UBLKCP"]
    assert len(tma) == 1 and len(bulk) == 1, [i.full_opcode for i in insns]
    assert bulk[0].full_opcode.startswith("UBLKCP.S.G"), bulk[0].full_opcode
    # the sites the executed check counts: the kernel's TMA global loads, both kinds
    sites = {KERNEL: kernel_sass(insns).tma_sites}
    assert sites[KERNEL] == {tma[0].offset: tma[0].full_opcode, bulk[0].offset: bulk[0].full_opcode}
    other = next(i for i in insns if i.opcode not in ("UTMALDG", "UBLKCP"))
    records = [SassRecord(KERNEL, bulk[0].offset, {SASS_INST_EXECUTED: 40}),
               SassRecord(KERNEL, tma[0].offset, {SASS_INST_EXECUTED: 0}),
               SassRecord(KERNEL, other.offset, {SASS_INST_EXECUTED: 3}),  # not a site: not counted
               SassRecord("elsewhere", bulk[0].offset, {SASS_INST_EXECUTED: 5})]  # another function's
    counts, missing = opcode_counts(records, sites)
    assert counts == {tma[0].full_opcode: 0, bulk[0].full_opcode: 40} and not missing
    every = {KERNEL: {i.offset: i.full_opcode for i in insns}}  # all of them: each instance adds up
    counts, _ = opcode_counts(records + [SassRecord(KERNEL, other.offset, {SASS_INST_EXECUTED: 2})], every)
    assert counts[other.full_opcode] >= 5


def test_a_site_without_a_record_is_missing_never_zero():
    counts, missing = opcode_counts([SassRecord("k", 0x40, {SASS_INST_EXECUTED: 9})],
                                    {"k": {0x40: "UTMALDG.2D", 0x80: "UBLKCP.S.G"}, "gone": {0x10: "UBLKCP.S.G"}})
    assert counts == {"UTMALDG.2D": 9, "UBLKCP.S.G": 0} and missing == ["k+0x80", "gone+0x10"]


def test_struct_sizes_are_the_headers():
    # CUPTI_PROFILER_STRUCT_SIZE(type, last field) on x86-64: the end of the named field
    assert cupti.SassSetConfig.size == 36 and cupti.SassEnable.size == 25 and cupti.SassDisable.size == 32
    assert cupti.SassDataProperties.size == 40 and cupti.SassFlush.size == 40  # (the header stops at numOfInstances)
    assert cupti.SassNumMetrics.size == 32 and cupti.SassGetMetrics.size == 40 and cupti.SassProperties.size == 56
    assert cupti.SassData.pcOffset.offset == 32 and cupti.SassData.pInstanceValues.offset == 40
