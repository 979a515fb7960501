"""The credit's arithmetic, each step alone (tools/credit.py; docs/METHODOLOGY.md, "Instruction
credit"): the derived sums `work_metrics` builds from the counters' rows, the tie of every counted
run to the timed median (`tie_to_timed_run`), one workload's verdict from its rows (`_credit`,
`credit_in_process`) and the workloads merged into one check (`combine`).

Found by mutation testing (issue 46, 2026-12-03): these ran only inside whole evaluations, where
a term dropped from a sum, a bound moved by one ulp or a note naming the wrong workload kept CI
green. The values below are chosen so each term of a sum shows in the result on its own (distinct
decimal digits, or powers that cannot add up to one another), and each bound is met exactly
and passed by the smallest step."""
from __future__ import annotations

import math

import pytest

from tools import credit
from tools.credit import (EXACT_SOURCE, OPCODE_METRIC, SAME_RUN_RATIO, SAME_RUN_SLACK_MS, SASS_BULK_COPY, TaskWork,
                          WorkloadCredit, combine, credit_in_process, tie_to_timed_run, work_metrics)

G, T, H, F2, I, D = (credit.GMMA_METRIC, credit.TENSOR_INST_METRIC, credit.HMMA_INST_METRIC,
                     credit.HFMA2_MMA_INST_METRIC, credit.IMMA_INST_METRIC, credit.DMMA_INST_METRIC)
BF16, FP16, TF32 = credit.HGMMA_OPS_METRICS
FP8, DOPS = credit.FP8_OPS_METRIC, credit.DMMA_OPS_METRIC
TMA_BYTES, TMA_INST, TEX, DUR = credit.TMA_BYTES_METRIC, credit.TMA_INST_METRIC, credit.TEX_INST_METRIC, credit.DURATION_METRIC
LDG, ATOM = credit.OTHER_READ_METRICS
# cp.async has no byte counter covering both its forms: its warp instructions are counted, each
# charged 32 lanes x 16 bytes (the counted branch; docs/METHODOLOGY.md, "Instruction credit")
LDGSTS = credit.LDGSTS_INST_METRIC
SMALL = TaskWork(flops=1000.0, read_bytes=100.0)


def r(name: str = "gemm", **metrics) -> dict[str, str]:
    """One launch as the profilers give it (`ncu --page raw`, or tools.credit.counter_rows): every
    work metric 0 unless given."""
    return {"Kernel Name": name, **{m: "0" for m in credit.WORK_METRICS}, credit.SASS_WIDE_SIMT: "0",
            **{m: str(v) for m, v in metrics.items()}}


# ---------------------------------------------------------------------------------------------
# work_metrics: the tensor path
# ---------------------------------------------------------------------------------------------

def test_wgmma_flops_are_the_hgmma_ops_and_fp8_only_where_no_warp_mma_ran():
    """Ten HGMMA warp instructions (each in the GMMA, HMMA and tensor counters), no other tensor
    instruction: the bf16, fp16 and tf32 ops are wgmma's, and so are the fp8 ops (QGMMA and QMMA share
    one counter; with no warp-level MMA they can only be QGMMA's). Nothing else on the tensor pipe."""
    m = work_metrics([r(**{G: 10, H: 10, T: 10, BF16: 1000, FP16: 200, TF32: 30, FP8: 4})])
    assert m["wgmma_flops"] == 1234.0
    assert m["other_tensor_flops"] == 0.0
    assert m["other_flops"] == 0.0 and m["wgmma_of_all_math"] == 1.0


def test_every_other_tensor_instruction_is_charged_its_most_flops():
    """Beside the 10 HGMMAs: 5 warp-level HMMAs and 2 HFMA2.MMAs (both in the HMMA class), 3
    IMMAs, 1 DMMA and 4 tensor instructions of no named class. The warp-level MMAs are bounded
    from above (HMMA class less HFMA2.MMA less GMMA plus IMMA: 8), the unnamed ones by the
    largest IMMA-pipe instruction; fp8 ops are then not wgmma's (a QMMA may have made them), FP64
    tensor ops are exact."""
    m = work_metrics([r(**{G: 10, H: 17, F2: 2, I: 3, D: 1, T: 25, BF16: 1000, FP16: 200, TF32: 30, FP8: 7,
                          DOPS: 11})])
    assert m["wgmma_flops"] == 1230.0
    warp_mma, unnamed = 17 - 2 - 10 + 3, 25 - 17 - 3 - 1
    assert (warp_mma, unnamed) == (8, 4)
    assert m["other_tensor_flops"] == (7 + 11) + warp_mma * 8192 + 2 * 128 + (3 + unnamed) * 2 ** 21
    # the bounds themselves: m16n8k32 fp8 per warp MMA, BGMMA m64n256k256 over 4 warps, 32 x 2 x 2 for HFMA2.MMA
    assert (credit.MMA_SYNC_MAX_FLOPS, credit.IMMA_MAX_FLOPS, credit.HFMA2_MMA_FLOPS) == (
        2 * 16 * 8 * 32, 2 * 64 * 256 * 256 / 4, 32 * 2 * 2)
    assert credit.FLOPS_PER_OP == 1.0  # the ops counters count FLOPs (2*M*N*K on the expert GEMM)


def test_counters_that_disagree_never_make_a_negative_charge():
    """More GMMA than HMMA-class instructions (IGMMA counts in GMMA, not HMMA) and a tensor total
    below its named classes: neither bound goes below zero, and with no warp MMA the fp8 ops stay
    wgmma's."""
    m = work_metrics([r(**{G: 12, H: 10, T: 5, FP8: 64})])
    assert m["wgmma_flops"] == 64.0 and m["other_tensor_flops"] == 0.0


def test_the_sums_are_over_every_launch():
    m = work_metrics([r(**{G: 1, H: 1, T: 1, BF16: 100}), r("other", **{G: 2, H: 2, T: 2, BF16: 200, FP16: 5})])
    assert m["wgmma_flops"] == 305.0 and m[G] == 3.0


# ---------------------------------------------------------------------------------------------
# work_metrics: SIMT math, all the math, and what is absent when a counter is
# ---------------------------------------------------------------------------------------------

# Math outside the tensor pipe, by the bound that needs no list (issue 42 items 1-2; hardware counters,
# read on the timed runs): every thread instruction of any pipe a multiply-add (2), the FMA pipes' fp16
# ones (HFMA2: two lanes) 4 more on top; every uniform-datapath warp instruction a multiply-add (2);
# every reduction warp instruction in memory 32 lanes x its widest form's adds (global RED and ALU
# atomics 8: 128 bits of bf16; shared ALU atomics and cluster reductions 2: f16x2) x 2; TMA/bulk
# reductions 1 FLOP a byte (a bf16 add per 2 bytes, 2 FLOPs).
THREAD, FP16I, UNIF = credit.THREAD_INST_METRIC, credit.FP16_INST_METRIC, credit.UNIFORM_INST_METRIC
RED, ATOMALU, ATOMS, REDAS = ("smsp__inst_executed_op_global_red.sum", "smsp__inst_executed_op_generic_atom_dot_alu.sum",
                              "smsp__inst_executed_op_shared_atom_dot_alu.sum", "smsp__inst_executed_op_redas.sum")
TMARED, DSMRED = credit.TMA_REDUCTION_BYTES_METRICS


def test_every_thread_instruction_is_a_multiply_add_and_fp16_ones_four_more():
    """Each term gets its own decimal digit, so a weight changed or a term left out shows."""
    assert credit.SIMT_FLOP_METRICS == {THREAD: 2.0, FP16I: 4.0}
    assert THREAD == "smsp__thread_inst_executed_pred_on.sum"  # all pipes, not one of them
    m = work_metrics([r(**{THREAD: 1, FP16I: 10})])
    assert m["simt_flops"] == 42
    assert m["other_flops"] == m["other_tensor_flops"] + m["simt_flops"] == 42


@pytest.mark.parametrize("row,wide", [
    ({credit.SASS_WIDE_SIMT: "0"}, False),  # the module's SASS holds no IDP
    ({credit.SASS_WIDE_SIMT: "1"}, True),  # it holds one (dp4a/dp2a: 4 int8 products and their sum)
    ({credit.SASS_WIDE_SIMT: None}, True),  # the SASS was not read: the side that refuses
    ({OPCODE_METRIC: "5 (IDP.4A.S8.S8: 1; IMAD: 4)"}, True),  # Nsight Compute's per-opcode counts: one ran
    ({OPCODE_METRIC: "4 (IMAD: 4)", credit.SASS_WIDE_SIMT: "1"}, False),  # held, never ran: exact counts decide
    ({OPCODE_METRIC: "4 (UTMALDG: 4)", EXACT_SOURCE: "1", credit.SASS_WIDE_SIMT: "1"}, True),  # TMA sites only
    # (pass 5) Nsight Compute counted no instruction at all on this launch: nothing ran, so no IDP did,
    # whatever the module holds
    ({OPCODE_METRIC: "0", credit.SASS_WIDE_SIMT: "1"}, False),
    # an opcode listed with no executions did not run: the counts decide, not the SASS
    ({OPCODE_METRIC: "4 (IDP.4A.S8.S8: 0; IMAD: 4)", credit.SASS_WIDE_SIMT: "1"}, False),
    # a cell that reads as no count is not a count of zero: the module's SASS decides, both ways
    ({OPCODE_METRIC: "n/a", credit.SASS_WIDE_SIMT: "1"}, True),
    ({OPCODE_METRIC: "n/a", credit.SASS_WIDE_SIMT: "0"}, False),
])
def test_where_idp_may_run_every_thread_instruction_is_charged_its_eight_ops(row, wide):
    """IDP does 8 ops per thread instruction and no counter separates it: where it ran, the module holds
    one or nothing is known, every thread instruction is charged WIDE_SIMT_FLOPS (fp16 extras as before)."""
    assert credit.WIDE_SIMT_OPCODES == ("IDP",) and credit.WIDE_SIMT_FLOPS == 8.0
    base = r(**{THREAD: 1, FP16I: 10})
    base.update({k: v for k, v in row.items() if v is not None})
    if row.get(credit.SASS_WIDE_SIMT, "") is None:
        del base[credit.SASS_WIDE_SIMT]
    m = work_metrics([base])
    assert m["simt_flops"] == (8 + 40 if wide else 42)
    assert m.get("wide_simt") == (1.0 if wide else None)


def test_the_uniform_datapath_and_reductions_in_memory_are_charged_their_widest_forms():
    assert credit.UNIFORM_FLOPS_PER_INST == 2.0 and credit.LANES == 32
    assert credit.REDUCTION_ADDS_PER_LANE == {RED: 8.0, ATOMALU: 8.0, ATOMS: 2.0, REDAS: 2.0}
    assert credit.TMA_REDUCTION_FLOPS_PER_BYTE == 1.0
    m = work_metrics([r(**{UNIF: 3, RED: 1, ATOMALU: 10, ATOMS: 100, REDAS: 1000, TMARED: 7, DSMRED: 70_000})])
    assert m["uniform_flops"] == 6
    assert m["reduction_flops"] == 512 * 1 + 512 * 10 + 128 * 100 + 128 * 1000 + 7 + 70_000 == 216_439
    assert m["simt_flops"] == 0 and m["other_flops"] == 6 + 216_439
    # one launch each: the sums are over every launch
    two = work_metrics([r(**{UNIF: 3, RED: 1}), r("other", **{UNIF: 4, TMARED: 5})])
    assert two["uniform_flops"] == 14 and two["reduction_flops"] == 517


def test_the_share_of_all_math_counts_every_pipe():
    """wgmma's FLOPs over wgmma's plus every other pipe's; a kernel that did no math divides by
    at least one FLOP (not by zero), so a lone FLOP of wgmma is all of it."""
    m = work_metrics([r(**{G: 1, H: 1, T: 1, BF16: 900, THREAD: 50})])
    assert m["wgmma_of_all_math"] == 900 / 1000
    assert work_metrics([r(**{G: 1, H: 1, T: 1, BF16: 1})])["wgmma_of_all_math"] == 1.0
    assert work_metrics([r()])["wgmma_of_all_math"] == 0.0


@pytest.mark.parametrize("missing,absent", [
    (DOPS, {"wgmma_flops", "other_tensor_flops", "other_flops", "wgmma_of_all_math"}),
    (G, {"wgmma_flops", "other_tensor_flops", "other_flops", "wgmma_of_all_math"}),
    (T, {"wgmma_flops", "other_tensor_flops", "other_flops", "wgmma_of_all_math"}),
    (THREAD, {"simt_flops", "other_flops", "wgmma_of_all_math"}),
    (FP16I, {"simt_flops", "other_flops", "wgmma_of_all_math"}),
    (UNIF, {"uniform_flops", "other_flops", "wgmma_of_all_math"}),
    (RED, {"reduction_flops", "other_flops", "wgmma_of_all_math"}),
    (DSMRED, {"reduction_flops", "other_flops", "wgmma_of_all_math"}),
    (LDGSTS, {"other_read_bytes"}),
    (TMA_BYTES, {"other_read_bytes", "tma_bytes", "bulk_copy", "bulk_copy_unknown"}),
    (DUR, {"kernel_ms"}),
])
def test_a_sum_is_absent_when_one_launch_lacks_one_of_its_counters(missing, absent):
    """Not measured is not zero: the sum is left out (and no share needing it is granted), while
    the sums that do not need that counter are still there."""
    full = r(**{SASS_BULK_COPY: "0"})
    lacking = r("other", **{SASS_BULK_COPY: "0"})
    del lacking[missing]
    m = work_metrics([full, lacking])
    every = {"wgmma_flops", "other_tensor_flops", "simt_flops", "uniform_flops", "reduction_flops", "other_flops",
             "wgmma_of_all_math",
             "tma_bytes", "other_read_bytes", "kernel_ms"}
    assert not (absent & set(m))
    assert every - absent <= set(m)
    assert missing not in m


def test_no_rows_measure_nothing():
    assert work_metrics([]) == {}


# ---------------------------------------------------------------------------------------------
# work_metrics: reads, bulk copies, exact counts, texture reads, time
# ---------------------------------------------------------------------------------------------

def test_tma_bytes_are_tmas_only_where_no_launch_may_hold_a_bulk_copy():
    """Every row's SASS flag says no plain bulk copy: TMA's bytes are TMA's, and the other reads
    are LDG + atomics + cp.async over every launch, cp.async by instruction: 1000 warp
    instructions x 32 lanes x 16 bytes (its digits sit above the others')."""
    assert credit.LDGSTS_BYTES_PER_INST == 32 * 16
    m = work_metrics([r(**{TMA_BYTES: 1000, LDG: 1, ATOM: 20, LDGSTS: 1000, SASS_BULK_COPY: "0"}),
                      r(**{TMA_BYTES: 4000, LDG: 5000, SASS_BULK_COPY: "0"})])
    assert m["tma_bytes"] == 5000.0 and m["other_read_bytes"] == 5021 + 1000 * 512 == 517_021
    assert "bulk_copy" not in m and "bulk_copy_unknown" not in m


@pytest.mark.parametrize("flags,key", [(("1", "0"), "bulk_copy"), (("0", None), "bulk_copy_unknown"),
                                       ((None, None), "bulk_copy_unknown")])
def test_tma_bytes_that_may_be_bulk_copies_are_other_reads(flags, key):
    """One launch whose module holds UBLKCP, or one whose SASS was not read: the TMA byte counter
    lumps plain bulk copies with tensor-map loads, so none of its bytes are TMA's, all are other
    reads."""
    rows = []
    for flag in flags:
        x = r(**{TMA_BYTES: 1000, LDG: 7})
        if flag is not None:
            x[SASS_BULK_COPY] = flag
        rows.append(x)
    m = work_metrics(rows)
    assert m[key] == 1.0 and "tma_bytes" not in m
    assert m["other_read_bytes"] == 2000 + 14
    assert ("bulk_copy" in m) == (key == "bulk_copy")


def ops_row(cell: str, exact: bool = True, **metrics) -> dict[str, str]:
    x = r(**metrics)
    x[OPCODE_METRIC] = cell
    if exact:
        x[EXACT_SOURCE] = "1"
    return x


@pytest.mark.parametrize("cell,bulk", [
    ("10 (UTMALDG.2D: 10)", False),
    ("12 (UTMALDG.2D: 10; UBLKCP.S.G: 2)", True),
    ("10 (UTMALDG.2D: 10; UBLKCP.S.G: 0)", False),  # a bulk load that never ran
    ("10 (UTMALDG.2D: 10; UBLKCP.G.S: 4)", False),  # a bulk store reads no global memory into shared
    ("14 (UTMALDG: 10; UBLKCP: 4)", True),  # Nsight Compute's bare opcode: a store cannot be told from a load
    ("0", False),  # counted, none ran
])
def test_exact_per_opcode_counts_decide_over_the_modules_sass(cell, bulk):
    """Per-opcode counts (Nsight Compute's, not tied) say whether a bulk load ran; the module's
    SASS flag (it holds one) is overruled by them."""
    m = work_metrics([ops_row(cell, exact=False, **{TMA_BYTES: 1000, SASS_BULK_COPY: "1"})])
    assert ("bulk_copy" in m) == bulk and ("tma_bytes" in m) == (not bulk)
    assert "bulk_copy_unknown" not in m


def test_unreadable_per_opcode_counts_leave_the_sass_to_decide():
    assert "bulk_copy" in work_metrics([ops_row("n/a", exact=False, **{TMA_BYTES: 1, SASS_BULK_COPY: "1"})])
    assert "tma_bytes" in work_metrics([ops_row("n/a", exact=False, **{TMA_BYTES: 1, SASS_BULK_COPY: "0"})])
    assert "bulk_copy_unknown" in work_metrics([ops_row("n/a", exact=False, **{TMA_BYTES: 1})])


@pytest.mark.parametrize("cell,hw,instructions,untied", [
    ("1000 (UTMALDG.2D: 1000)", 1000, 1000, False),
    ("1018 (UTMALDG.2D: 1018)", 1000, 1018, False),  # within 1% + 8 instructions
    ("1019 (UTMALDG.2D: 1019)", 1000, 1019, True),  # one past
    ("982 (UTMALDG.2D: 982)", 1000, 982, False),
    ("981 (UTMALDG.2D: 981)", 1000, 981, True),
    ("1004 (UTMALDG.2D: 1000; UTMACCTL.PF: 4)", 1000, 1000, False),  # the counter without the control ones
    ("1000 (UTMALDG.2D: 960; UTMACMDFLUSH: 40)", 1000, 1000, False),  # ... or with them
    ("1000 (UTMALDG.2D: 1000; IMAD: 77)", 1000, 1000, False),  # only the TMA pipe's opcodes count
    ("1000 (UTMALDG.2D: 500; UBLKCP.S.G: 500)", 1000, 1000, False),
    ("0", 0, 0, False),
    ("0", 9, 0, True),  # within the slack of 8, and one past it
])
def test_exact_counts_are_tied_to_the_hardware_tma_instructions(cell, hw, instructions, untied):
    """The instrumented run's exact TMA-pipe instructions must be the counted runs' (the TMA
    instruction counter): within EXACT_TIE (1%) plus EXACT_TIE_SLACK (8), counting the control
    instructions or not; else they tell nothing and the bytes cannot be told apart."""
    m = work_metrics([ops_row(cell, **{TMA_BYTES: 1000, TMA_INST: hw})])
    assert m["tma_exact_instructions"] == instructions
    assert ("exact_untied" in m) == untied
    if untied:
        assert m["bulk_copy_unknown"] == 1.0 and "tma_bytes" not in m
    assert (credit.EXACT_TIE, credit.EXACT_TIE_SLACK) == (0.01, 8.0)


def test_exact_counts_without_the_hardware_count_are_untied():
    x = ops_row("10 (UTMALDG.2D: 10)", **{TMA_BYTES: 1000})
    assert TMA_INST not in x
    m = work_metrics([x])
    assert m["exact_untied"] == 1.0 and m["tma_exact_instructions"] == 10.0 and m["bulk_copy_unknown"] == 1.0


def test_exact_counts_are_summed_over_launches_and_one_unread_leaves_the_sass_to_decide():
    a = ops_row("600 (UTMALDG.2D: 600)", **{TMA_BYTES: 1, TMA_INST: 600, SASS_BULK_COPY: "0"})
    b = ops_row("400 (UTMALDG.2D: 400)", **{TMA_BYTES: 1, TMA_INST: 400, SASS_BULK_COPY: "0"})
    assert work_metrics([a, b])["tma_exact_instructions"] == 1000.0  # 1000 against 1000: tied
    assert "exact_untied" not in work_metrics([a, b])
    unread = ops_row("n/a", **{TMA_BYTES: 1, TMA_INST: 400, SASS_BULK_COPY: "0"})
    m = work_metrics([a, unread])
    assert "tma_exact_instructions" not in m and "exact_untied" not in m and m["tma_bytes"] == 2.0


def test_texture_reads_are_charged_the_most_one_can_read():
    """No byte counter fits the texture pipe: each warp instruction is charged 32 lanes x 8 texels
    x 16 bytes, on top of the other reads."""
    assert credit.TEX_BYTES_PER_INST == 32 * 8 * 16
    m = work_metrics([r(**{TEX: 3, LDG: 5, SASS_BULK_COPY: "0"})])
    assert m["tex_reads"] == 3.0 and m["other_read_bytes"] == 5 + 3 * 4096
    assert "tex_reads" not in work_metrics([r(**{SASS_BULK_COPY: "0"})])
    lacking = r(**{TEX: 2})
    del lacking[LDG]
    m = work_metrics([lacking])
    assert m["tex_reads"] == 2.0 and "other_read_bytes" not in m


def test_the_kernel_time_is_the_launches_ns_in_ms():
    assert work_metrics([r(**{DUR: 1_500_000}), r(**{DUR: 250_000})])["kernel_ms"] == 1.75


# ---------------------------------------------------------------------------------------------
# tie_to_timed_run
# ---------------------------------------------------------------------------------------------

def ok_credit(**kw) -> WorkloadCredit:
    base = dict(workload="M=8192", status="ok", runs=6, counted_from=4, carries={"wgmma": True, "tma": True, "x": False},
                notes={"x": "x did not execute"})
    base.update(kw)
    return WorkloadCredit(**base)


def slow_bound(t: float) -> float:
    return SAME_RUN_RATIO * t + SAME_RUN_SLACK_MS


def fast_bound(t: float) -> float:
    return t / SAME_RUN_RATIO - SAME_RUN_SLACK_MS


@pytest.mark.parametrize("t", [0.05, 1.0, 7.3])
def test_every_counted_run_at_its_bound_is_tied_and_one_step_past_is_not(t):
    """Within SAME_RUN_RATIO (10%, the experts measure 0.983-1.001) plus 10 us of launch gaps,
    both ways: at the bound the credit stands, the next float past it withdraws it."""
    assert (SAME_RUN_RATIO, SAME_RUN_SLACK_MS) == (1.10, 0.01)
    for edge in ([slow_bound(t), fast_bound(t)], [t, slow_bound(t)]):
        c = ok_credit(run_ms=edge)
        tie_to_timed_run(c, t)
        assert c.carries == {"wgmma": True, "tma": True, "x": False} and c.timed_ms == t
    c = ok_credit(run_ms=[t, math.nextafter(slow_bound(t), math.inf), t])
    tie_to_timed_run(c, t)
    why = (f"counted run 5's kernels took {math.nextafter(slow_bound(t), math.inf):.4g} ms, the timed runs {t:.4g} "
           "ms (median): the kernel that was timed is not the one whose instructions were counted")
    assert c.carries == {"wgmma": False, "tma": False, "x": False}
    assert c.notes == {"wgmma": why, "tma": why, "x": "x did not execute"}
    c = ok_credit(run_ms=[math.nextafter(fast_bound(t), -math.inf), 100 * t])
    tie_to_timed_run(c, t)
    assert c.notes["wgmma"] == (f"counted run 4's kernels took {math.nextafter(fast_bound(t), -math.inf):.4g} ms, the "
                                f"timed runs {t:.4g} ms (median): the timed runs took a slower path than the one whose "
                                "instructions were counted")  # the first run that fails is named


def test_the_profiled_run_is_tied_by_its_kernel_time():
    c = ok_credit(counted_from=None, profiled_at=3, kernel_ms=2.0)
    tie_to_timed_run(c, 1.0)
    assert c.notes["tma"].startswith("the profiled run's kernels took 2 ms, the timed runs 1 ms")
    c = ok_credit(counted_from=None, kernel_ms=None)
    tie_to_timed_run(c, 1.0)
    assert c.notes["wgmma"] == ("the profiled run's kernel time was not measured, so it cannot be tied to the "
                                "timed runs") and not c.carries["wgmma"]
    c = ok_credit(counted_from=None, run_ms=[1.0, 3.0])
    tie_to_timed_run(c, 1.0)
    assert c.notes["wgmma"].startswith("the counted run's kernels took 3 ms")


def test_nothing_is_tied_when_untimed_or_not_credited():
    """A workload that was not timed claims no speed, so nothing is tied; a skipped credit keeps
    what it had."""
    c = ok_credit(run_ms=[50.0])
    tie_to_timed_run(c, None)
    assert c.carries["wgmma"] and c.timed_ms is None
    c = ok_credit(status="skipped", run_ms=[50.0])
    tie_to_timed_run(c, 1.0)
    assert c.carries["wgmma"] and c.timed_ms is None


# ---------------------------------------------------------------------------------------------
# credit_in_process / _credit: one workload's verdict from the worker's counted runs
# ---------------------------------------------------------------------------------------------

HONEST = {G: 40, H: 40, T: 40, BF16: 1000, TMA_INST: 8, TMA_BYTES: 100}


def launches(values: dict | None = None, name: str = "gemm", **extra) -> list[dict]:
    metrics = {m: 0.0 for m in credit.credit_metrics()}
    metrics.update(values or HONEST)
    return [{"name": name, "metrics": metrics, **extra}]


META = {"workload": "M=8192", "split": "visible"}


def ran(**kw) -> dict:
    base = {"status": "ran", "runs": 7, "counted_from": 5, "profiled_at": None, "launches": launches(),
            "run_ms": [1.0, 1.02, 0.98], "instrumented_ms": [30.0]}
    base.update(kw)
    return base


def test_an_honest_workloads_credit_records_its_runs_counts_and_sums():
    wc = credit_in_process(META, ran(), ["wgmma", "tma"], SMALL, 1.0, {"HGMMA", "UTMALDG"})
    assert wc.status == "ok" and wc.reason is None
    assert (wc.workload, wc.split, wc.runs, wc.counted_from, wc.profiled_at) == ("M=8192", "visible", 7, 5, None)
    assert wc.counts == {"wgmma": 40, "tma": 8} and wc.executed == {"wgmma": True, "tma": True}
    assert wc.carries == {"wgmma": True, "tma": True} and wc.notes == {}
    assert wc.shares == {"wgmma": 1.0, "tma": 1.0}
    assert wc.kernel_ms == 1.0 and wc.run_ms == [1.0, 1.02, 0.98] and wc.instrumented_ms == [30.0]
    assert wc.timed_ms == 1.0
    assert set(wc.work) <= set(credit.WORK_SUMS)
    assert wc.work["wgmma_flops"] == 1000.0 and wc.work["tma_bytes"] == 100.0 and wc.work["other_read_bytes"] == 0.0


def test_the_counted_runs_median_is_the_kernel_time_and_each_is_tied():
    wc = credit_in_process(META, ran(run_ms=[1.0, 3.0, 1.1]), ["wgmma"], SMALL, 1.0, {"HGMMA"})
    assert wc.kernel_ms == 1.1 and not wc.carries["wgmma"]
    assert wc.notes["wgmma"].startswith("counted run 6's kernels took 3 ms")


def test_a_module_holding_a_bulk_copy_earns_no_tma_credit():
    wc = credit_in_process(META, ran(), ["wgmma", "tma"], SMALL, 1.0, {"HGMMA", "UTMALDG", "UBLKCP"})
    assert wc.carries == {"wgmma": True, "tma": False} and wc.work["bulk_copy"] == 1.0
    unknown = credit_in_process(META, ran(), ["tma"], SMALL, 1.0, None)  # SASS not read
    assert not unknown.carries["tma"] and unknown.work["bulk_copy_unknown"] == 1.0


def test_exact_counts_from_the_worker_decide_the_bulk_copies():
    exact = launches(opcodes={"UTMALDG.2D": 8, "UBLKCP.S.G": 0})
    wc = credit_in_process(META, ran(launches=exact), ["tma"], SMALL, 1.0, {"UTMALDG", "UBLKCP"})
    assert wc.carries["tma"] and wc.work["tma_exact_instructions"] == 8.0
    missing = launches(opcodes={"UTMALDG.2D": 8}, opcodes_missing=["gemm+0x40"])
    wc = credit_in_process(META, ran(launches=missing), ["tma"], SMALL, 1.0, {"UTMALDG", "UBLKCP"})
    assert not wc.carries["tma"] and wc.work["bulk_copy"] == 1.0  # unknown counts: the SASS decides


@pytest.mark.parametrize("bad", [math.nan, math.inf, None])
def test_a_counter_cupti_could_not_read_is_named_and_not_measured(bad):
    """A feature counter CUPTI read no value for: the workload is skipped, naming the counter."""
    wc = credit_in_process(META, ran(launches=launches({**HONEST, G: bad})), ["wgmma", "tma"], SMALL, 1.0, {"HGMMA"})
    assert wc.status == "skipped" and not wc.carries
    assert wc.reason == f"no executed-instruction counts for wgmma (CUPTI read no value for {G})"


def test_a_feature_no_counter_counts_is_skipped_without_unread_counters():
    wc = credit_in_process(META, ran(), ["wgmma", "no_such_feature"], SMALL, 1.0, {"HGMMA"})
    assert wc.status == "skipped" and wc.reason == "no executed-instruction counts for no_such_feature"


@pytest.mark.parametrize("given,why,runs", [
    (None, "not credited: its profiled run was not reached", 0),
    ({"status": "failed", "runs": 3}, "not credited: its profiled run was not reached", 3),
    ({"status": "unavailable", "reason": "no CUPTI", "runs": 2}, "not credited: no CUPTI", 2),
])
def test_a_workload_whose_counted_runs_did_not_run_is_skipped_with_why(given, why, runs):
    wc = credit_in_process({"workload": "M=70", "split": "held_out"}, given, ["wgmma"], SMALL, 1.0)
    assert (wc.status, wc.reason, wc.runs, wc.workload, wc.split) == ("skipped", why, runs, "M=70", "held_out")
    long = credit_in_process(META, {"status": "x", "reason": "y" * 900}, ["wgmma"], SMALL, 1.0)
    assert len(long.reason) == 400


def test_no_run_times_fall_back_to_the_rows_and_untimed_ties_nothing():
    wc = credit_in_process(META, ran(run_ms=[]), ["wgmma"], SMALL, None, {"HGMMA"})
    assert wc.run_ms == [] and wc.kernel_ms is None and wc.timed_ms is None and wc.carries["wgmma"]


def test_the_nsight_compute_path_takes_the_profiled_rows_kernel_time():
    rows = [r(**{**HONEST, DUR: 2_000_000, SASS_BULK_COPY: "0"})]
    rows[0][OPCODE_METRIC] = "48 (HGMMA: 40; UTMALDG: 8)"
    wc = credit._credit({"workload": "w", "runs": 9, "profiled_at": 4}, rows, ["wgmma", "tma"], SMALL, 2.0)
    assert (wc.split, wc.runs, wc.profiled_at, wc.counted_from) == ("visible", 9, 4, None)
    assert wc.kernel_ms == 2.0 and wc.run_ms == [] and wc.carries == {"wgmma": True, "tma": True}
    assert wc.counts == {"wgmma": 40, "tma": 8}


# ---------------------------------------------------------------------------------------------
# combine: every workload's credit as one check
# ---------------------------------------------------------------------------------------------

def wl(workload: str, split: str = "visible", status: str = "ok", **kw) -> WorkloadCredit:
    base = dict(workload=workload, split=split, status=status, runs=6, counted_from=4, timed_ms=1.0)
    base.update(kw)
    return WorkloadCredit(**base)


def test_a_feature_is_credited_only_where_every_credited_workload_credits_it():
    a = wl("M=8192", counts={"wgmma": 10, "tma": 4}, executed={"wgmma": True, "tma": True},
           carries={"wgmma": True, "tma": True}, shares={"wgmma": 1.02, "tma": 0.9}, timed_ms=3.0)
    b = wl("M=70", "held_out", counts={"wgmma": 3, "tma": 1}, executed={"wgmma": True, "tma": True},
           carries={"wgmma": True, "tma": False}, shares={"wgmma": 0.95, "tma": 0.4},
           notes={"tma": "tma carried 40.0% of the task's input bytes (needs 50%)"})
    out = combine(["wgmma", "tma"], [a, b])
    assert out.status == "ok" and out.reason is None and out.workloads == [a, b]
    assert out.counts == {"wgmma": 13, "tma": 5}  # summed over the credited workloads
    assert out.executed == {"wgmma": True, "tma": True} and out.carries == {"wgmma": True, "tma": False}
    assert out.shares == {"wgmma": 0.95, "tma": 0.4}  # the smallest
    assert out.notes == {"tma": "held-out workload #1 (counted runs 4-6): tma carried 40.0% of the task's input "
                                "bytes (needs 50%)"}
    assert out.timed_ms == 3.0  # the first visible workload's


def test_a_share_that_one_workload_could_not_measure_is_unmeasured():
    a = wl("a", shares={"wgmma": 1.0}, carries={"wgmma": True}, executed={"wgmma": True})
    b = wl("b", shares={"wgmma": None}, carries={"wgmma": False}, executed={"wgmma": True})
    c = wl("c", carries={"wgmma": True}, executed={"wgmma": True})  # no share recorded: left out of the min
    assert combine(["wgmma"], [a, b]).shares == {"wgmma": None}
    assert combine(["wgmma"], [a, c]).shares == {"wgmma": 1.0}
    assert combine(["wgmma"], [c]).shares == {}


def test_the_note_names_the_first_workload_that_withheld_and_why():
    """Held-out workloads are named by their number among the held-out ones (their sizes are never
    shown), visible ones by name; without a note, whether the feature ran says why."""
    v1 = wl("M=8192", executed={"wgmma": True, "tma": True}, carries={"wgmma": True, "tma": True})
    h1 = wl("M=1", "held_out", status="skipped", reason="not credited: CUPTI failed")
    h2 = wl("M=70", "held_out", profiled_at=2, counted_from=None, runs=5, executed={"wgmma": False, "tma": True},
            carries={"wgmma": False, "tma": False})
    v2 = wl("M=4096", executed={"wgmma": True, "tma": True}, carries={"wgmma": True, "tma": False},
            notes={"tma": "later"})
    out = combine(["wgmma", "tma"], [v1, h1, h2, v2])
    assert out.notes == {"wgmma": "held-out workload #2 (profiled run 2 of 5): wgmma did not execute",
                         "tma": "held-out workload #2 (profiled run 2 of 5): tma did not carry the work"}
    assert out.reason == "held-out workload #1: not credited: CUPTI failed"
    assert out.executed == {"wgmma": False, "tma": True} and out.carries == {"wgmma": False, "tma": False}
    out = combine(["tma"], [v1, v2])
    assert out.notes == {"tma": "workload M=4096 (counted runs 4-6): later"}


def test_skipped_workloads_are_listed_and_the_check_skipped_when_none_was_credited():
    s1 = wl("M=8192", status="skipped", reason="not credited: a")
    s2 = wl("M=4096", status="skipped", reason="not credited: b")
    out = combine(["wgmma"], [s1, s2])
    assert (out.status, out.reason, out.workloads) == ("skipped", "not credited: a", [s1, s2])
    assert combine(["wgmma"], [wl("x", status="skipped")]).reason == "no workload was credited"
    assert combine(["wgmma"], []).reason == "no workload was credited"
    many = [wl(f"w{k}", status="skipped", reason="r" * 100) for k in range(9)]
    out = combine(["wgmma"], [wl("ok", carries={"wgmma": True}, executed={"wgmma": True}), *many])
    assert out.status == "ok" and len(out.reason) == 600
    assert out.reason.startswith("workload w0: " + "r" * 100 + "; workload w1: ")


def test_the_totals_and_profile_are_the_first_visible_credited_workloads():
    h = wl("M=70", "held_out", carries={"wgmma": True}, executed={"wgmma": True}, timed_ms=0.1)
    skipped = wl("M=1", status="skipped", reason="r")
    v = wl("M=8192", carries={"wgmma": True}, executed={"wgmma": True}, timed_ms=2.0)
    rows = {"M=70": [r("held", **{G: 1, H: 1, T: 1, BF16: 5})],
            "M=8192": [r("gemm", **{G: 2, H: 2, T: 2, BF16: 7, DUR: 1e6}), r("gemm", **{G: 2, H: 2, T: 2, BF16: 7})]}
    for rs in rows.values():
        for x in rs:
            x[OPCODE_METRIC] = "2 (HGMMA: 2)"
    out = combine(["wgmma"], [h, skipped, v], extra_metrics=("dram__bytes_read.sum",), profiled=rows)
    assert out.timed_ms == 2.0 and out.metrics["wgmma_flops"] == 14.0
    assert out.per_kernel == {"gemm": {"wgmma": 4}}
    assert set(out.kernel_metrics) == {"gemm"} and out.kernel_metrics["gemm"]["launches"] == 2.0
    assert out.kernel_metrics["gemm"][BF16] == 14.0
    # no visible workload credited: the first credited one; no extra metrics asked: no kernel metrics
    out = combine(["wgmma"], [skipped, h], profiled=rows)
    assert out.timed_ms == 0.1 and out.metrics["wgmma_flops"] == 5.0 and out.kernel_metrics == {}
    assert combine(["wgmma"], [v]).metrics == {} and combine(["wgmma"], [v]).per_kernel == {}


# ---------------------------------------------------------------------------------------------
# Where exact counts are needed, and how the rows carry them
# ---------------------------------------------------------------------------------------------

def inspection(status="ok", uncounted=(), **kernels):
    from tools.results import InspectResult, KernelSass

    return InspectResult(status=status, arch="sm_90a", uncounted_kernels=list(uncounted),
                         kernels={n: KernelSass(registers=32, tma_sites=sites) for n, sites in kernels.items()})


def test_exact_counts_are_asked_for_only_where_a_launched_kernel_holds_a_bulk_load():
    """A plain bulk load (UBLKCP.S.G) among a launched kernel's TMA instructions: every launched
    kernel's TMA-pipe sites are counted (all of them, so their sum can be tied to the hardware's
    TMA instructions); only tensor-map loads, an unlaunched kernel's bulk load, or SASS not read
    (the SASS flag refuses then): none."""
    both = {0x40: "UTMALDG.2D", 0x80: "UBLKCP.S.G", 0xC0: "UTMACCTL.PF"}
    tma_only = {0x40: "UTMALDG.2D"}
    assert credit.exact_count_sites(inspection(main=both, side=tma_only, empty={})) == {"main": both,
                                                                                       "side": tma_only}
    assert credit.exact_count_sites(inspection(main=tma_only, side={0x10: "UBLKCP.G.S"})) is None  # a store
    assert credit.exact_count_sites(inspection(main=tma_only, side={0x10: "UBLKCP"})) == {
        "main": tma_only, "side": {0x10: "UBLKCP"}}  # a bare opcode: taken as a load
    assert credit.exact_count_sites(inspection(uncounted=["spare"], main=tma_only, spare=both)) is None
    assert credit.exact_count_sites(inspection(uncounted=["main"], main=tma_only, spare=both)) == {"spare": both}
    assert credit.exact_count_sites(inspection(status="skipped", main=both)) is None
    assert credit.exact_count_sites(inspection()) is None
    assert credit.exact_count_sites(None) is None
    assert credit.exact_count_sites(object()) is None  # anything without a status is not a read SASS


def test_is_bulk_load():
    assert credit.is_bulk_load("UBLKCP.S.G") and credit.is_bulk_load("UBLKCP.S.G.MULTICAST")
    assert credit.is_bulk_load("UBLKCP")  # Nsight Compute's bare name: a store cannot be told apart
    assert not credit.is_bulk_load("UBLKCP.G.S") and not credit.is_bulk_load("UTMALDG.2D")


def test_parse_instances_reads_nsight_computes_per_opcode_cells():
    """'total (OPCODE: n; ...)': counts may carry thousands separators; an opcode named twice is
    summed; an item that is no count is skipped, not the end of the list; no parentheses: none."""
    assert credit.parse_instances("1,234 (HGMMA: 64; IMAD: 1,170)") == {"HGMMA": 64.0, "IMAD": 1170.0}
    assert credit.parse_instances("9 (A: 1; junk; B: x; C: 2; A: 3)") == {"A": 4.0, "C": 2.0}
    assert credit.parse_instances("5 (SYNCS.ARRIVE:TRANS64: 5)") == {"SYNCS.ARRIVE:TRANS64": 5.0}  # the last colon
    assert credit.parse_instances("12") == {} and credit.parse_instances("") == {} and credit.parse_instances(None) == {}


def test_rows_from_the_worker_carry_every_finite_counter_and_the_modules_sass():
    out = credit.counter_rows([{"name": "gemm", "metrics": {G: 3, TMA_BYTES: 1.5, LDG: math.nan, T: None}},
                               {"name": "epilogue", "metrics": {G: 0}}], {"HGMMA", "UTMALDG"})
    wide = credit.SASS_WIDE_SIMT
    assert out == [{"Kernel Name": "gemm", G: "3.0", TMA_BYTES: "1.5", SASS_BULK_COPY: "0", wide: "0"},
                   {"Kernel Name": "epilogue", G: "0.0", SASS_BULK_COPY: "0", wide: "0"}]
    assert credit.counter_rows([{"name": "k", "metrics": {}}], {"UBLKCP"})[0][SASS_BULK_COPY] == "1"
    assert credit.counter_rows([{"name": "k", "metrics": {}}], {"IDP", "HGMMA"})[0][wide] == "1"
    assert not {SASS_BULK_COPY, wide} & set(credit.counter_rows([{"name": "k", "metrics": {}}], None)[0])
    exact = credit.counter_rows([{"name": "k", "metrics": {}, "opcodes": {"UTMALDG.2D": 7, "UBLKCP.S.G": 2.0}}])[0]
    assert exact[OPCODE_METRIC] == "9 (UBLKCP.S.G: 2; UTMALDG.2D: 7)" and exact[EXACT_SOURCE] == "1"
    assert credit.parse_instances(exact[OPCODE_METRIC]) == {"UBLKCP.S.G": 2.0, "UTMALDG.2D": 7.0}
    missing = credit.counter_rows([{"name": "k", "metrics": {}, "opcodes": {"UTMALDG.2D": 7},
                                    "opcodes_missing": ["k+0x40"]}])[0]
    assert (missing[OPCODE_METRIC], missing[EXACT_SOURCE]) == ("n/a", "1")
    empty = credit.counter_rows([{"name": "k", "metrics": {}, "opcodes": {}}])[0]
    assert empty[OPCODE_METRIC] == "0 ()" and credit._exact_tma_total(empty) == (0, 0)


def test_the_exact_tma_total_is_the_data_moving_instructions_and_all_of_them():
    row = {OPCODE_METRIC: "20 (UTMALDG.2D: 8; UBLKCP.S.G: 2; UTMACCTL.PF: 3; UTMACMDFLUSH: 1; UTMASTG.2D: 4; IMAD: 2)"}
    assert credit._exact_tma_total(row) == (14.0, 18.0)
    assert credit._exact_tma_total({OPCODE_METRIC: "n/a"}) is None
    assert credit._exact_tma_total({}) is None
    assert credit._exact_tma_total({OPCODE_METRIC: "0"}) == (0, 0)


def test_per_kernel_counts_are_by_kernel_name():
    rows = [r("a", **{G: 2, TMA_INST: 1}), r("b", **{G: 5, TMA_INST: 0}), r("a", **{G: 1, TMA_INST: 1})]
    nameless = {k: v for k, v in r(**{G: 4, TMA_INST: 0}).items() if k != "Kernel Name"}
    assert credit.per_kernel([*rows, nameless], ["wgmma", "tma"]) == {
        "a": {"wgmma": 3, "tma": 2}, "b": {"wgmma": 5, "tma": 0}, "?": {"wgmma": 4, "tma": 0}}


def test_kernel_metrics_sum_counters_and_take_the_rest_from_the_longest_launch():
    """A profile per kernel: `.sum` counters over its launches; ratios and limits (`.pct`, `.max`)
    from its longest launch (a tie: the later one), as the profile reads one typical launch."""
    pct, peak = "sm__throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread"
    rows = [{"Kernel Name": "k", DUR: "100", BF16: "5", pct: "40", peak: "128"},
            {"Kernel Name": "k", DUR: "300", BF16: "7", pct: "90"},
            {"Kernel Name": "k", DUR: "200", BF16: "1", pct: "60", peak: "96"},
            {"Kernel Name": "k", DUR: "300", BF16: "0", pct: "80"},
            {"Kernel Name": "j", BF16: "2", pct: "n/a", peak: "64"},
            {BF16: "4"}]
    out = credit.kernel_metrics(rows, [BF16, pct, peak, DUR])
    # (the longest launches carry no register count: the first launch's stays, a shorter one's never replaces it)
    assert out["k"] == {BF16: 13.0, pct: 80.0, peak: 128.0, DUR: 900.0, "launches": 4.0}
    assert out["j"] == {BF16: 2.0, peak: 64.0, "launches": 1.0}  # no time: its first launch; an unreadable value skipped
    assert out["?"] == {BF16: 4.0, "launches": 1.0}
    # a first launch of no measured time still sets what a later one lacks
    out = credit.kernel_metrics([{"Kernel Name": "z", pct: "10", peak: "32"}, {"Kernel Name": "z", DUR: "0.5", pct: "20"}],
                                [pct, peak])
    assert out["z"] == {pct: 20.0, peak: 32.0, "launches": 2.0}
    # the longest so far, not the last: 300 ns, then 200, then 250: the 300 ns launch's value stays
    out = credit.kernel_metrics([{"Kernel Name": "y", DUR: d, pct: p} for d, p in (("300", "1"), ("200", "2"), ("250", "3"))],
                                [pct])
    assert out["y"][pct] == 1.0


def test_an_mma_share_past_its_cap_or_short_of_all_the_math_carries_nothing():
    """At most 2.5x the task's FLOPs in whole 128-row tiles (equality passes); at least 85% of all
    the math (equality passes); the other math unmeasured: no credit."""
    work = TaskWork(flops=1000.0, read_bytes=1.0, padded_flops=2000.0)
    assert credit.mma_carries("wgmma", 5.0, 5000.0, 0.0, work) is None  # 2.5 x 2 (padded) = 5
    assert credit.mma_carries("wgmma", 5.0001, 5000.1, 0.0, work) == (
        "wgmma issued 5.0x the task's matrix FLOPs (at most 5x, 2.5x its work in whole 128-row tiles, counts as "
        "doing the task's work)")
    unpadded = TaskWork(flops=1000.0, read_bytes=1.0, padded_flops=500.0)  # padding never lowers the cap
    assert credit.mma_carries("wgmma", 2.5, 2500.0, 0.0, unpadded) is None
    assert credit.mma_carries("wgmma", 2.6, 2600.0, 0.0, unpadded).startswith("wgmma issued 2.6x")
    assert credit.mma_carries("tcgen05_mma", 1.0, 850.0, 150.0, SMALL) is None  # 850 / 1000: exactly 85%
    why = credit.mma_carries("tcgen05_mma", 1.0, 849.0, 151.0, SMALL,
                             metrics={"other_tensor_flops": 12345.0, "simt_flops": 678.0, "uniform_flops": 9.0,
                                      "reduction_flops": 10.0})
    assert why == ("tcgen05_mma did 84.9% of the math the kernels did (needs 85%); the rest: other tensor "
                   "instructions (mma.sync, DMMA, IMMA: 1.23e+04 FLOPs at most), thread instructions of any pipe "
                   "(each a multiply-add: 678), the uniform datapath (9) and reductions in memory (atomics, red, "
                   "TMA reduce: 10)")
    assert credit.mma_carries("wgmma", 1.0, 1.0, 9.0, SMALL).endswith(
        "(mma.sync, DMMA, IMMA: 0 FLOPs at most), thread instructions of any pipe (each a multiply-add: 0), the "
        "uniform datapath (0) and reductions in memory (atomics, red, TMA reduce: 0)")
    assert credit.mma_carries("wgmma", 1.0, 0.0, 0.0, SMALL).startswith("wgmma did 0.0%")  # no math: no division by 0
    assert credit.mma_carries("wgmma", 1.0, 1.5, 0.0, SMALL) is None  # the floor of one FLOP only guards the division
    assert credit.mma_carries("wgmma", 1.0, 1000.0, None, SMALL) == (
        "the math done outside wgmma (other tensor-pipe, thread, uniform and reduction instructions) could not be "
        "measured")
    assert credit.mma_carries("wgmma", 1.0, 1000.0, 0.0, SMALL, of_all=0.5).startswith("wgmma did 50.0%")


def test_a_workload_nsight_compute_did_not_profile_is_skipped_with_why():
    wc = credit._unprofiled({"workload": "M=70", "split": "held_out", "runs": 4, "reason": "timeout",
                             "detail": "the profiled process hung"})
    assert (wc.workload, wc.split, wc.status, wc.runs, wc.reason) == (
        "M=70", "held_out", "skipped", 4, "not credited: timeout: the profiled process hung")
    wc = credit._unprofiled({"workload": "M=8192"})
    assert (wc.split, wc.runs, wc.reason) == ("visible", 0, "not credited: its profiled run was not reached")
    assert len(credit._unprofiled({"workload": "w", "reason": "x" * 900}).reason) == 400


def test_a_skipped_workload_keeps_its_timed_median_and_runs_default_to_none():
    wc = credit._credit({"workload": "w"}, [r(**{G: 1})], ["wgmma", "unknown_feature"], SMALL, 2.5)
    assert wc.status == "skipped" and wc.timed_ms == 2.5 and wc.runs == 0 and wc.split == "visible"


def test_counting_closes_its_process_only_where_one_runs():
    closed = []
    proc = type("P", (), {"close": lambda self: closed.append(1), "extra_metrics": ("x",)})()
    credit.Counting(mode="ncu", process=proc).close()
    credit.Counting(mode="cupti").close()
    assert closed == [1]
    assert credit.Counting(mode="cupti", process=proc).profile_wanted
    assert not credit.Counting(mode="cupti").profile_wanted and credit.Counting(mode="cupti").in_process
    assert not credit.Counting(mode="ncu").in_process and credit.Counting(mode="off").reason == (
        "the task requests no features for this arch")


def test_instructions_count_by_base_opcode_and_a_zero_cell_is_a_count():
    """Per-opcode cells name full opcodes (HGMMA.64x128x16.F32.BF16); a feature counts its base
    opcodes. A cell of 0 with no instances is a count (none ran); an unreadable one is none, so a
    feature without a counter of its own is then uncounted. A feature tools.features does not know
    is uncounted, and the features after it are still counted."""
    rows = [{OPCODE_METRIC: "9 (HGMMA.64x128x16.F32.BF16: 3; HGMMA.64x64x16.F32.BF16: 2; SYNCS.ARRIVE.TRANS64: 4)"}]
    assert credit.counts_from_rows(rows, ["unknown_feature", "wgmma", "mbarrier"]) == (
        {"wgmma": 5, "mbarrier": 4}, ["unknown_feature"])
    assert credit.counts_from_rows([{OPCODE_METRIC: "0"}], ["mbarrier"]) == ({"mbarrier": 0}, [])
    assert credit.counts_from_rows([{OPCODE_METRIC: "n/a"}], ["mbarrier"]) == ({}, ["mbarrier"])
    # a dedicated counter and the per-opcode count: the larger
    assert credit.counts_from_rows([{OPCODE_METRIC: "3 (HGMMA.64x64: 3)", G: "7"}], ["wgmma"]) == ({"wgmma": 7}, [])
    assert credit._number("1,234 (HGMMA: 64)") == 1234.0 and credit._number("n/a") is None
    assert credit._number(None) is None


def test_a_single_bulk_load_or_texture_read_counts():
    assert "bulk_copy" in work_metrics([ops_row("1 (UBLKCP.S.G: 1)", exact=False, **{TMA_BYTES: 1})])
    m = work_metrics([r(**{TEX: 1, SASS_BULK_COPY: "0"})])
    assert m["tex_reads"] == 1.0 and m["other_read_bytes"] == 4096.0


def test_untied_exact_counts_refuse_tma_before_anything_else():
    """work_metrics marks untied counts unknown too; the model reads why: the counts were not the
    counted runs'."""
    m = work_metrics([ops_row("1019 (UTMALDG.2D: 1019)", **{TMA_BYTES: 100, TMA_INST: 1000})])
    assert credit.carries("tma", m, SMALL) == (False, (
        "the instrumented run's exact TMA instructions (1019) are not the counted runs' (the TMA instruction "
        "counter): whether TMA's bytes were tensor-map loads or plain bulk copies could not be told"))


def test_the_mma_rule_reads_the_other_math_and_only_wgmma_its_share_of_all():
    why = credit.carries("wgmma", {"wgmma_flops": 1000.0, "other_flops": 9000.0, "other_tensor_flops": 5000.0,
                                   "simt_flops": 4000.0}, SMALL)[1]
    assert why.endswith("(mma.sync, DMMA, IMMA: 5e+03 FLOPs at most), thread instructions of any pipe (each a "
                        "multiply-add: 4e+03), the uniform datapath (0) and reductions in memory (atomics, red, TMA "
                        "reduce: 0)")
    # wgmma_of_all_math is wgmma's: tcgen05.mma computes its own share of all the math
    assert credit.carries("tcgen05_mma", {"tcgen05_flops": 1000.0, "other_flops": 0.0, "wgmma_of_all_math": 0.5},
                          SMALL) == (True, None)


def test_a_feature_a_workload_recorded_nothing_for_is_not_credited():
    """A credited workload whose verdict lacks the feature (never counted there): not executed, not
    carried, no count added; the note names it."""
    a = wl("a", counts={"tma": 2}, executed={"tma": True}, carries={"tma": True})
    b = wl("b", counts={"wgmma": 5, "tma": 1}, executed={"wgmma": True, "tma": True}, carries={"wgmma": True, "tma": True})
    out = combine(["wgmma", "tma"], [a, b])
    assert out.counts == {"wgmma": 5, "tma": 3}
    assert out.executed == {"wgmma": False, "tma": True} and out.carries == {"wgmma": False, "tma": True}
    assert out.notes == {"wgmma": "workload a (counted runs 4-6): wgmma did not execute"}
    c = wl("c", counts={"wgmma": 1}, executed={"wgmma": True})  # ran, carries not recorded
    assert combine(["wgmma"], [c]).notes == {"wgmma": "workload c (counted runs 4-6): wgmma did not carry the work"}


def test_the_in_process_credit_passes_on_what_the_worker_recorded():
    wc = credit_in_process(META, {k: v for k, v in ran(profiled_at=3).items() if k != "runs"}, ["wgmma"], SMALL,
                           1.0, {"HGMMA"})
    assert wc.runs == 0 and wc.profiled_at == 3
    missing = credit.counter_rows([{"name": "k", "metrics": {}, "opcodes_missing": ["k+0x40"]}])[0]
    assert missing[OPCODE_METRIC] == "n/a"  # no count at all: the SASS decides


def test_a_long_list_of_unread_counters_is_cut_at_400_characters():
    metrics = {f"counter_{k:03d}_with_a_long_name.sum": math.nan for k in range(40)}
    wc = credit_in_process(META, ran(launches=[{"name": "k", "metrics": {**metrics}}]), ["wgmma"], SMALL, 1.0)
    assert wc.status == "skipped" and len(wc.reason) == 400


def test_untied_counts_without_their_total_still_say_why():
    why = credit.carries("tma", {"tma_bytes": 100.0, "other_read_bytes": 0.0, "exact_untied": 1.0}, SMALL)[1]
    assert why.startswith("the instrumented run's exact TMA instructions (0) are not the counted runs'")


def test_every_uncounted_feature_and_unread_counter_is_named():
    wc = credit_in_process(META, ran(launches=launches({**HONEST, G: math.nan, TMA_INST: math.inf})), ["wgmma", "tma"],
                           SMALL, 1.0, {"HGMMA"})
    assert wc.reason == (f"no executed-instruction counts for wgmma, tma (CUPTI read no value for "
                         f"{TMA_INST}, {G})")


def test_the_band_reads_each_end_at_its_own_quantile():
    """timed_band's ends are the p-th of 100 inclusive quantiles of the other timed runs, for any p
    (TIE_BAND's ends are the extremes; a narrower band is a one-argument change): a lower end past
    the median reads its own quantile, not the next one. Of the runs 10..14 the p-th quantile is
    10 + 4p exactly, so a neighbouring quantile (0.04 ms off) shows."""
    pm = [[float(x), 1.0] for x in (10, 11, 12, 13, 14)]
    for lo, hi in ((0.25, 0.75), (0.6, 0.9), (0.75, 1.0), (0.99, 1.0)):
        got = credit.timed_band(pm, 0, [], band=(lo, hi))
        assert got == [pytest.approx(10 + 4 * lo, abs=1e-9), pytest.approx(10 + 4 * hi, abs=1e-9)], (lo, hi, got)
