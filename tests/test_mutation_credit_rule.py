"""The TMA credit's "reads outside TMA" rule (docs/METHODOLOGY.md, "Instruction credit"), on rows
as `ncu --page raw --csv` gives them: every path that reads global memory without TMA is summed,
cp.async (LDGSTS) and atomics that return data as much as LDG (tools/credit.py).

Issue 46's planted bug: the cp.async bytes dropped from the sum, so a kernel streaming most of its
input by cp.async kept its TMA credit. Each limit is checked at the edge (equality passes, one
byte past fails) and for each read path alone, so no path can be left out of the sum unseen."""
from __future__ import annotations

import pytest

from tools import credit as ncu
from tools.credit import TaskWork, verdict, work_metrics

TMA = "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum"
LDG = "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"
LDGSTS = "smsp__inst_executed_op_ldgsts.sum"  # warp instructions, each charged its most bytes
PER = ncu.LDGSTS_BYTES_PER_INST  # 32 lanes x 16 bytes
ATOM = "l1tex__t_bytes_pipe_lsu_mem_global_op_atom.sum"
HGMMA = "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32.sum"
# The seed GEMM's work at M=8192 (N=7168, K=5120, bf16): what its credit is judged against.
WORK = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)


def row(**values: float) -> dict[str, str]:
    """One profiled launch: every work metric 0 unless given."""
    out = {"ID": "0", "Kernel Name": "gemm", ncu.OPCODE_METRIC: "64 (HGMMA: 32; UTMALDG: 32)"}
    out.update({m: "0" for m in ncu.WORK_METRICS})
    out.update({m: str(v) for m, v in values.items()})
    return out


def tma_verdict(features: list[str], *rows: dict[str, str]):
    counts = {f: 1 for f in features}
    return verdict(features, counts, {}, work_metrics(list(rows)), WORK)


def test_both_non_tma_read_paths_are_collected_and_summed():
    """The two read paths the rule names are among the metrics every profiler pass collects."""
    assert set(ncu.OTHER_READ_METRICS) == {LDG, ATOM} and ncu.LDGSTS_INST_METRIC == LDGSTS and PER == 512
    assert {LDG, LDGSTS, ATOM} <= set(ncu.credit_metrics())
    assert {LDG, LDGSTS, ATOM} <= set(ncu.WORK_METRICS)
    m = work_metrics([row(**{TMA: 1.0, LDG: 3.0, LDGSTS: 5.0, ATOM: 13.0}), row(**{TMA: 2.0, LDG: 7.0, LDGSTS: 11.0})])
    assert m["other_read_bytes"] == 3.0 + 5.0 * PER + 13.0 + 7.0 + 11.0 * PER  # every launch, every path
    assert m["tma_bytes"] == 3.0


@pytest.mark.parametrize("path", [LDG, LDGSTS, ATOM])
def test_a_kernel_streaming_its_input_by_one_path_beside_tma_keeps_no_tma_credit(path):
    """TMA loaded the whole input once, and the kernel re-read it 3x more by LDG or by cp.async:
    either way TMA did not carry the reads (the cap beside an MMA is 2x the input bytes)."""
    reread = 3 * WORK.read_bytes / (PER if path == LDGSTS else 1)
    ex = tma_verdict(["wgmma", "tma"], row(**{HGMMA: WORK.flops, TMA: WORK.read_bytes, path: reread}))
    assert ex.carries == {"wgmma": True, "tma": False}
    assert ex.notes["tma"] == ("3.0x the task's input bytes were read from global memory outside tensor-map "
                               "loads (LDG, atomics, cp.async, bulk copies; at most 2x)")


def test_the_caps_hold_at_equality_and_fail_one_byte_past():
    """2x the input bytes beside an MMA (a tiled kernel's side passes read 1.2x; an LDG-streamed
    tiled GEMM re-reads its operands tens of times); 0.5x where the task asks for no matrix
    instruction (memory-bound: each input byte is read once, so most must come by TMA). The two
    paths split the bytes, so only their sum reaches the cap."""
    cap = ncu.TMA_MAX_OTHER_READS * WORK.read_bytes
    at = {HGMMA: WORK.flops, TMA: WORK.read_bytes, LDG: cap / 4, LDGSTS: cap * 3 / 4 / PER}
    assert tma_verdict(["wgmma", "tma"], row(**at)).carries["tma"] is True
    past = {**at, LDG: cap / 4 + 1}
    assert tma_verdict(["wgmma", "tma"], row(**past)).carries["tma"] is False
    past = {**at, LDGSTS: cap * 3 / 4 / PER + 1}  # one cp.async warp instruction more
    assert tma_verdict(["wgmma", "tma"], row(**past)).carries["tma"] is False
    low = ncu.TMA_MAX_OTHER_READS_NO_MMA * WORK.read_bytes
    at = {TMA: WORK.read_bytes, LDG: low / 2, LDGSTS: low / 2 / PER}
    assert tma_verdict(["tma"], row(**at)).carries["tma"] is True
    assert tma_verdict(["tma"], row(**{**at, LDG: low / 2 + 1})).carries["tma"] is False
    # the no-MMA cap applies only where no MMA feature is asked for
    assert tma_verdict(["tma", "mbarrier"], row(**{**at, LDGSTS: low / PER})).carries["tma"] is False


def test_an_unmeasured_read_path_withholds_credit():
    """A launch whose cp.async counter is missing cannot show that TMA carried the reads."""
    r = row(**{HGMMA: WORK.flops, TMA: WORK.read_bytes})
    del r[LDGSTS]
    ex = tma_verdict(["wgmma", "tma"], r)
    assert ex.carries["tma"] is False
    assert ex.notes["tma"] == "the global-memory reads made outside TMA could not be measured"


def test_the_credit_constants_and_why():
    """WORK_SHARE: wgmma must issue >= 90% of the task's matrix FLOPs (tuned kernels measure
    1.00-1.05) and TMA bring >= half its input bytes; wgmma at most 2.5x the FLOPs (a causal kernel
    that computes every tile and masks does 2x) and >= 85% of all the math, every thread instruction
    charged (the cheapest uncounted-math attack reaches 0.833, the shipped experts 0.89-0.99). Reads
    outside TMA: 2x beside an MMA, 0.5x without (docstring above)."""
    assert ncu.WORK_SHARE == {"wgmma": 0.9, "tcgen05_mma": 0.9, "tma": 0.5}  # one rule for both MMAs (issue 41)
    assert (ncu.WGMMA_MAX_OVERWORK, ncu.WGMMA_MIN_OF_ALL_MATH) == (2.5, 0.85)
    assert (ncu.TMA_MAX_OTHER_READS, ncu.TMA_MAX_OTHER_READS_NO_MMA) == (2.0, 0.5)


# ---------------------------------------------------------------------------------------
# `carries` alone: each refusal, with the sentence the model reads, and each share at its edge
# (found by mutation testing, 2026-12-03: granting credit in any of these cases kept CI green)
# ---------------------------------------------------------------------------------------
SMALL = TaskWork(flops=1000.0, read_bytes=100.0)


def test_each_share_holds_at_its_bound_and_fails_just_under():
    """wgmma/tcgen05.mma must issue 90% of the task's matrix FLOPs, TMA load half its input bytes."""
    assert ncu.carries("wgmma", {"wgmma_flops": 900.0, "other_flops": 0.0}, SMALL) == (True, None)
    assert ncu.carries("wgmma", {"wgmma_flops": 899.0, "other_flops": 0.0}, SMALL) == (
        False, "wgmma carried 89.9% of the task's matrix FLOPs (needs 90%)")
    assert ncu.carries("tma", {"tma_bytes": 50.0, "other_read_bytes": 0.0}, SMALL) == (True, None)
    assert ncu.carries("tma", {"tma_bytes": 49.0, "other_read_bytes": 0.0}, SMALL) == (
        False, "tma carried 49.0% of the task's input bytes (needs 50%)")


def test_wgmma_must_also_be_most_of_the_math_the_kernels_did():
    ok, why = ncu.carries("wgmma", {"wgmma_flops": 1000.0, "other_flops": 0.0, "wgmma_of_all_math": 0.5}, SMALL)
    assert not ok and why.startswith("wgmma did 50.0% of the math the kernels did (needs 85%)")
    assert ncu.carries("wgmma", {"wgmma_flops": 1000.0, "other_flops": 0.0, "wgmma_of_all_math": 1.0}, SMALL) == (True, None)


def test_what_the_counters_cannot_tell_withholds_credit():
    """Plain bulk copies count on the TMA byte counter; a tcgen05.mma share has no counter yet; a
    share that could not be measured is no share: none of them carries, whatever the bytes say."""
    full = {"tma_bytes": 100.0, "other_read_bytes": 0.0}
    assert ncu.carries("tma", {**full, "bulk_copy": 1.0}, SMALL) == (False, (
        "plain bulk copies (cp.async.bulk without .tensor, SASS UBLKCP) ran or the module holds them, and the TMA "
        "byte counter counts them with tensor-map loads: only tensor-map loads count as TMA"))
    assert ncu.carries("tma", {**full, "bulk_copy_unknown": 1.0}, SMALL) == (
        False, "whether TMA's bytes were tensor-map loads or plain bulk copies could not be told (SASS not read, "
        "or no exact count of its bulk copies)")
    assert ncu.carries("tcgen05_mma", {}, SMALL) == (False, (
        "tcgen05_mma's share of the task's matrix FLOPs is unverified on this GPU (no counter of tcgen05.mma "
        "FLOPs is read yet), so it carries no credit"))
    for feature, work in (("tcgen05_mma", None), ("wgmma", SMALL), ("tma", None)):
        assert ncu.carries(feature, {}, work) == (False, f"the share of the work {feature} carried could not be measured")


def test_each_share_is_of_the_tasks_own_work_and_tma_counts_a_byte_once():
    """wgmma FLOPs / the task's FLOPs; TMA bytes / its input bytes, capped at 1 (re-reading the
    input through TMA does not carry more of it); None where the task has no such work."""
    none = {"wgmma": None, "tcgen05_mma": None, "tma": None}
    m = {"wgmma_flops": 500.0, "tcgen05_flops": 2.0, "tma_bytes": 300.0}
    assert ncu.work_shares(m, None) == none
    assert ncu.work_shares(m, SMALL) == {"wgmma": 0.5, "tcgen05_mma": 0.002, "tma": 1.0}
    assert ncu.work_shares(m, TaskWork(flops=0.0, read_bytes=0.0)) == none
    assert ncu.work_shares(m, TaskWork(flops=1.0, read_bytes=1.0)) == {"wgmma": 500.0, "tcgen05_mma": 2.0, "tma": 1.0}
    assert ncu.work_shares({}, SMALL) == none


def test_the_verdict_records_what_ran_what_carried_and_why():
    """executed: ran at least once (a feature with no count did not); carries: the share rules for
    wgmma and TMA, having run for the others; the counts, kernels, shares, notes and metrics kept."""
    metrics = {"wgmma_flops": 899.0, "other_flops": 0.0, "tma_bytes": 60.0, "other_read_bytes": 0.0}
    kernels = {"gemm": {"wgmma": 3}}
    ex = verdict(["wgmma", "tma", "mbarrier", "setmaxnreg"], {"wgmma": 3, "tma": 2, "mbarrier": 5}, kernels, metrics,
                 SMALL)
    assert ex.executed == {"wgmma": True, "tma": True, "mbarrier": True, "setmaxnreg": False}
    assert ex.carries == {"wgmma": False, "tma": True, "mbarrier": True, "setmaxnreg": False}
    assert ex.notes == {"wgmma": "wgmma carried 89.9% of the task's matrix FLOPs (needs 90%)"}
    assert ex.shares == {"wgmma": 0.899, "tma": 0.6}
    assert (ex.counts, ex.per_kernel, ex.metrics, ex.status) == ({"wgmma": 3, "tma": 2, "mbarrier": 5}, kernels, metrics, "ok")
