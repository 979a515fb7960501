"""The credit rules (tools.credit) on synthetic counters: every math pipe and every read path
counts, and where a counter lumps two classes together the rule refuses credit. Each class of the
held-out attacks of 2026-12-03 (issue 42) is a case here; tests/gpu/test_credit_gpu.py runs the
kernels themselves."""
from __future__ import annotations

import pytest

from tools import credit as rules
from tools.credit import TaskWork

WORK = TaskWork(flops=2 * 8192 * 7168 * 5120, read_bytes=(8192 + 7168) * 5120 * 2)
META = {"workload": "M8192", "split": "visible"}
NO_BULK = {"HGMMA", "UTMALDG", "UTMASTG"}  # the expert GEMM's module: no plain bulk copy


def counters(**kw) -> dict[str, float]:
    """An honest wgmma + TMA GEMM's counted run (every metric the check reads), with `kw` changed."""
    out = {m: 0.0 for m in rules.credit_metrics()}
    gmma = 4e6
    out.update({rules.GMMA_METRIC: gmma, rules.HMMA_INST_METRIC: gmma, rules.TENSOR_INST_METRIC: gmma,
                rules.HGMMA_OPS_METRICS[0]: WORK.flops * 1.02, rules.TMA_INST_METRIC: 3e5,
                rules.TMA_BYTES_METRIC: WORK.read_bytes * 3, rules.OTHER_READ_METRICS[0]: WORK.read_bytes * 0.01,
                rules.THREAD_INST_METRIC: WORK.flops * 0.002})
    out.update({k.replace("__dot__", "."): float(v) for k, v in kw.items()})
    return out


def credit(metrics: dict, features=("wgmma", "tma"), opcodes=NO_BULK):
    ran = {"status": "ran", "runs": 3, "counted_from": 1, "run_ms": [1.0, 1.0], "instrumented_ms": [40.0],
           "launches": [{"name": "k", "metrics": metrics}]}
    return rules.credit_in_process(META, ran, list(features), WORK, 1.0, opcodes)


def test_an_honest_wgmma_tma_kernel_is_credited():
    wc = credit(counters())
    assert wc.carries == {"wgmma": True, "tma": True}, wc.notes


@pytest.mark.parametrize("what,extra", [
    # the product on the FP64 tensor cores beside full-size bf16 wgmma on zeroed shared memory
    ("DMMA", {rules.DMMA_OPS_METRIC: WORK.flops, rules.DMMA_INST_METRIC: 1e7, rules.TENSOR_INST_METRIC: 4e6 + 1e7}),
    # integer tensor ops (IMMA via mma.sync s8, or IGMMA: the IMMA class), bounded from above
    ("IMMA", {rules.IMMA_INST_METRIC: 1e5, rules.TENSOR_INST_METRIC: 4e6 + 1e5}),
    ("IGMMA", {rules.IMMA_INST_METRIC: 1e5, rules.GMMA_METRIC: 4e6 + 1e5, rules.TENSOR_INST_METRIC: 4e6 + 1e5}),
    # mma.sync bf16 (HMMA) beside the decoy: the HMMA class less the warpgroup MMAs
    ("HMMA", {rules.HMMA_INST_METRIC: 4e6 + 3e7, rules.TENSOR_INST_METRIC: 4e6 + 3e7}),
    # a tensor instruction of a class no counter names: the largest bound
    ("unnamed", {rules.TENSOR_INST_METRIC: 4e6 + 1e5}),
    # math outside the tensor pipe, by the bound that needs no list (issue 42 items 1-2): every thread
    # instruction of any pipe (FFMA, IMAD, DFMA, MUFU, and LDS/LDG lookups alike) a multiply-add
    ("FFMA", {rules.THREAD_INST_METRIC: WORK.flops / 2}),
    ("lookup", {rules.THREAD_INST_METRIC: WORK.flops / 4}),  # a table load per product, charged as its instruction
    ("HFMA2", {rules.FP16_INST_METRIC: WORK.flops / 4}),
    # the uniform datapath: one op per warp instruction, each a multiply-add
    ("uniform", {rules.UNIFORM_INST_METRIC: WORK.flops / 2}),
    # reductions in memory, each warp instruction 32 lanes of its widest form's adds: products from a
    # table added by red.global.add.v8.bf16 (8 a lane), by shared ALU atomics (f16x2: 2), by cluster
    # reductions (REDAS), or by TMA/bulk reductions (by their bytes: 2 a bf16 add)
    ("RED", {"smsp__inst_executed_op_global_red.sum": WORK.flops / 2 / (32 * 8) / 2}),
    ("ATOM", {"smsp__inst_executed_op_generic_atom_dot_alu.sum": WORK.flops / 2 / (32 * 8) / 2}),
    ("ATOMS", {"smsp__inst_executed_op_shared_atom_dot_alu.sum": WORK.flops / 2 / (32 * 2) / 2}),
    ("REDAS", {"smsp__inst_executed_op_redas.sum": WORK.flops / 2 / (32 * 2) / 2}),
    ("TMA reduce", {rules.TMA_REDUCTION_BYTES_METRICS[0]: WORK.flops / 2}),
    ("bulk reduce to a peer CTA", {rules.TMA_REDUCTION_BYTES_METRICS[1]: WORK.flops / 2}),
])
def test_math_on_any_other_pipe_withholds_wgmma_credit(what, extra):
    """wgmma did the task's FLOPs (on zeroed tiles, say) while the product came from another pipe:
    its share of all the math falls below 90%, whichever pipe that was."""
    wc = credit(counters(**extra))
    assert wc.executed["wgmma"] and not wc.carries["wgmma"], (what, wc.shares)
    assert "of the math the kernels did" in wc.notes["wgmma"]


def test_fp8_ops_are_wgmmas_only_where_no_warp_level_mma_ran():
    """The fp8 ops counter counts QGMMA and QMMA alike: on a run with no warp-level MMA (HMMA-class
    instructions all warpgroup ones) they are wgmma's; with one, they are not."""
    fp8 = counters(**{rules.HGMMA_OPS_METRICS[0]: 0.0, rules.FP8_OPS_METRIC: WORK.flops})
    assert credit(fp8).carries["wgmma"] is True
    mixed = dict(fp8, **{rules.HMMA_INST_METRIC: 4e6 + 10, rules.TENSOR_INST_METRIC: 4e6 + 10})
    wc = credit(mixed)
    assert wc.carries["wgmma"] is False


def test_the_hfma2_mma_moves_of_an_honest_kernel_cost_little():
    """ptxas uses HFMA2.MMA as a register move: charged 128 FLOPs each, a kernel's worth of them
    leaves an honest kernel credited."""
    wc = credit(counters(**{rules.HFMA2_MMA_INST_METRIC: 1e6, rules.HMMA_INST_METRIC: 4e6 + 1e6,
                            rules.TENSOR_INST_METRIC: 4e6 + 1e6}))
    assert wc.carries["wgmma"] is True, wc.notes


def test_reads_through_atomics_count_as_other_reads():
    """Every operand byte read (re-read per tile) with atomics that return data, TMA streaming into
    memory nothing reads: the atomics' bytes are other reads, over the 2x cap."""
    wc = credit(counters(**{rules.OTHER_READ_METRICS[1]: WORK.read_bytes * 40}))
    assert not wc.carries["tma"] and "atomics" in wc.notes["tma"]
    assert credit(counters(**{rules.OTHER_READ_METRICS[1]: 64.0})).carries["tma"]  # a tile counter's atomics


def test_plain_bulk_copies_are_not_tma():
    """The TMA byte counter counts cp.async.bulk (UBLKCP) with tensor-map loads: where the module
    holds one, TMA's bytes are other reads and TMA carries nothing; where the SASS was not read,
    nothing can be told apart: no credit either."""
    wc = credit(counters(), opcodes={"HGMMA", "UTMALDG", "UBLKCP"})
    assert not wc.carries["tma"] and "plain bulk copies" in wc.notes["tma"]
    assert wc.carries["wgmma"]  # the math rule is not the reads' business
    unknown = credit(counters(), opcodes=None)
    assert not unknown.carries["tma"] and "could not be told" in unknown.notes["tma"]


def test_nsight_computes_per_opcode_counts_split_what_the_counters_lump():
    """Where a row carries per-opcode executed counts (Nsight Compute), the split is exact and on the
    profiled run itself: an executed UBLKCP refuses TMA's bytes; a module with none keeps them."""
    row = {k: repr(v) for k, v in counters().items()}
    with_bulk = dict(row, **{rules.OPCODE_METRIC: "30 (UTMALDG: 20; UBLKCP.S.G: 10)"})
    only_tma = dict(row, **{rules.OPCODE_METRIC: "20 (UTMALDG: 20)"})
    assert "bulk_copy" in rules.work_metrics([with_bulk]) and "tma_bytes" not in rules.work_metrics([with_bulk])
    assert rules.work_metrics([only_tma])["tma_bytes"] == WORK.read_bytes * 3


def test_exact_counts_of_the_counted_run_split_tensor_map_loads_from_bulk_copies():
    """Issue 42, item 4: in process, the worker counts the TMA-pipe instructions one by one (CUPTI's
    SASS metrics, an instrumented run of its own) where the module holds a plain bulk load. A bulk load
    that ran refuses TMA's bytes; a module whose bulk load never ran (a dead branch) keeps them, as one
    whose bulk copies are stores (UBLKCP.G.S: not among TMA's load bytes); a site CUPTI gave no record
    for leaves the module's SASS to decide (it holds a bulk copy: refused); exact counts that are not
    the hardware passes' (their sum off the TMA instruction counter) tell nothing: refused."""
    bulk_module = {"HGMMA", "UTMALDG", "UBLKCP"}

    def exact(opcodes=None, missing=None):
        launch = {"name": "k", "metrics": counters()}
        if opcodes is not None:
            launch["opcodes"] = opcodes
        if missing:
            launch["opcodes_missing"] = missing
        ran = {"status": "ran", "runs": 3, "counted_from": 1, "run_ms": [1.0, 1.0], "instrumented_ms": [40.0],
               "launches": [launch]}
        return rules.credit_in_process(META, ran, ["wgmma", "tma"], WORK, 1.0, bulk_module)

    tma = counters()[rules.TMA_INST_METRIC]  # the hardware passes' TMA-pipe instructions: the exact ones tie to it
    ran_bulk = exact({"UTMALDG.2D": tma - 10, "UBLKCP.S.G": 10})
    assert not ran_bulk.carries["tma"] and "plain bulk copies" in ran_bulk.notes["tma"]
    dead_bulk = exact({"UTMALDG.2D": tma, "UBLKCP.S.G": 0})
    assert dead_bulk.carries == {"wgmma": True, "tma": True}, dead_bulk.notes
    assert dead_bulk.work["tma_bytes"] == WORK.read_bytes * 3 and dead_bulk.work["tma_exact_instructions"] == tma
    stores = exact({"UTMALDG.2D": tma - 64, "UBLKCP.G.S": 64})
    assert stores.carries["tma"], stores.notes
    missing = exact({"UTMALDG.2D": tma}, missing=["k+0x80"])
    assert not missing.carries["tma"] and "plain bulk copies" in missing.notes["tma"]  # the SASS decides
    assert exact({"UTMALDG.2D": 123456789, "UBLKCP.S.G": 0}).work["tma_exact_instructions"] == 123456789  # exact digits
    assert not exact().carries["tma"]  # no exact counts: the module's SASS holds a bulk copy
    # the bulk-fed pipeline whose only tensor-map load never runs: its bytes are bulk copies, never TMA's
    fed = exact({"UTMALDG.2D": 0, "UBLKCP.S.G": tma})
    assert not fed.carries["tma"] and fed.work["other_read_bytes"] >= WORK.read_bytes * 3
    # an instrumented run that issues other TMA instructions than the counted runs (it sensed the
    # instrumentation and took its tensor-map path there): the exact counts are not the counted runs'
    sensed = exact({"UTMALDG.2D": tma / 2, "UBLKCP.S.G": 0})
    assert not sensed.carries["tma"] and "are not the counted runs'" in sensed.notes["tma"], sensed.notes
    assert exact({"UTMALDG.2D": tma * 1.005, "UBLKCP.S.G": 0}).carries["tma"]  # within the tie
    # tensor-map prefetch and command flush may or may not be on the hardware's TMA count: either sum ties
    control = {"UTMACCTL.PF": 20000, "UTMACMDFLUSH": 10000}
    assert exact({"UTMALDG.2D": tma, "UBLKCP.S.G": 0, **control}).carries["tma"]
    assert exact({"UTMALDG.2D": tma - 30000, "UBLKCP.S.G": 0, **control}).carries["tma"]
    assert not exact({"UTMALDG.2D": tma - 15000, "UBLKCP.S.G": 0, **control}).carries["tma"]
    assert rules.is_bulk_load("UBLKCP") and rules.is_bulk_load("UBLKCP.S.G.MULTICAST")
    assert not rules.is_bulk_load("UBLKCP.G.S") and not rules.is_bulk_load("UTMALDG.2D")


def test_exact_count_sites_only_where_a_bulk_load_may_run():
    from tools.results import InspectResult, KernelSass

    def insp(**kernels):
        return InspectResult(status="ok", arch="sm_90a", uncounted_kernels=["spare"], kernels={
            n: KernelSass(tma_sites=loads) for n, loads in kernels.items()})

    assert rules.exact_count_sites(insp(k={0x100: "UTMALDG.2D"})) is None  # tensor-map loads only
    assert rules.exact_count_sites(insp(k={0x100: "UTMALDG.2D"}, spare={0x20: "UBLKCP.S.G"})) is None  # never launched
    both = insp(k={0x100: "UTMALDG.2D"}, side={0x40: "UBLKCP.S.G"}, plain={}, spare={0x8: "UBLKCP.S.G"})
    assert rules.exact_count_sites(both) == {"k": {0x100: "UTMALDG.2D"}, "side": {0x40: "UBLKCP.S.G"}}
    assert rules.exact_count_sites(None) is None
    assert rules.exact_count_sites(InspectResult(status="skipped", arch="sm_90a")) is None


def test_a_missing_counter_is_not_measured_and_refuses():
    for m in (rules.DMMA_OPS_METRIC, rules.IMMA_INST_METRIC, *rules.SIMT_FLOP_METRICS, rules.UNIFORM_INST_METRIC,
              *rules.REDUCTION_ADDS_PER_LANE, *rules.TMA_REDUCTION_BYTES_METRICS):
        metrics = counters()
        del metrics[m]
        assert credit(metrics).carries["wgmma"] is False, m
    for m in (*rules.OTHER_READ_METRICS, rules.LDGSTS_INST_METRIC):
        metrics = counters()
        del metrics[m]
        assert credit(metrics).carries["tma"] is False, m


def test_the_check_reads_hardware_counters_only():
    """Every metric the in-process check reads is a hardware counter (no SASS-patched metric): each
    pass is a stretch of timed runs, none runs instrumented code (issue 42 item 7's cost)."""
    from tools.cupti import is_sass_patched

    assert not [m for m in rules.credit_metrics() if is_sass_patched(m)]


def test_counting_is_one_object():
    off = rules.Counting(mode="off")
    assert not off.in_process and not off.profile_wanted and "requests no features" in off.reason
    assert rules.Counting(mode="cupti").in_process


def test_texture_reads_are_charged_their_most_bytes():
    """No byte counter separates the texture pipe's reads, so each warp instruction is charged the
    most it can read (TEX_BYTES_PER_INST). A kernel streaming its operands through textures beside a
    TMA stream keeps no TMA credit; the few the GEMM expert issues at M=70 (1,120 on the H200) cost
    it nothing. A rule that refused on any texture read took the honest expert's credit."""
    assert rules.TEX_BYTES_PER_INST == 32 * 8 * 16  # 32 lanes x 8 texels (trilinear) x 16 bytes
    few = credit(counters(**{rules.TEX_INST_METRIC: 1120}))
    assert few.carries == {"wgmma": True, "tma": True}, few.notes
    streamed = WORK.read_bytes * rules.TMA_MAX_OTHER_READS / rules.TEX_BYTES_PER_INST  # the cap, in instructions
    many = credit(counters(**{rules.TEX_INST_METRIC: streamed}))
    assert many.carries == {"wgmma": True, "tma": False} and "outside tensor-map loads" in many.notes["tma"]


def test_an_honest_rows_share_is_its_wgmma_over_everything_charged():
    """One honest row, its share by hand: wgmma 1.02 F; 0.01 F thread instructions (2 FLOPs each),
    0.2% of them fp16 (4 more), 1e6 uniform warp instructions (2 each), a split-K of 1e5 RED.v4 warp
    instructions (charged as v8: 32 x 8 adds x 2), 1e4 tile-counter atomics (ATOM.ALU, as much) and a
    TMA reduce of 1 MB (1 FLOP a byte)."""
    F = WORK.flops
    row = counters(**{rules.THREAD_INST_METRIC: 0.01 * F, rules.FP16_INST_METRIC: 0.0002 * F,
                      rules.UNIFORM_INST_METRIC: 1e6, "smsp__inst_executed_op_global_red.sum": 1e5,
                      "smsp__inst_executed_op_generic_atom_dot_alu.sum": 1e4,
                      rules.TMA_REDUCTION_BYTES_METRICS[0]: 2 ** 20})
    wc = credit(row)
    other = 2 * 0.01 * F + 4 * 0.0002 * F + 2 * 1e6 + (1e5 + 1e4) * 32 * 8 * 2 + 2 ** 20
    assert wc.work["simt_flops"] == 2 * 0.01 * F + 4 * 0.0002 * F
    assert wc.work["uniform_flops"] == 2e6 and wc.work["reduction_flops"] == (1e5 + 1e4) * 512 + 2 ** 20
    assert wc.work["other_flops"] == pytest.approx(other, rel=1e-12)
    assert wc.work["wgmma_of_all_math"] == pytest.approx(1.02 * F / (1.02 * F + other), rel=1e-12)
    assert 0.97 < wc.work["wgmma_of_all_math"] < 0.99 and wc.carries["wgmma"] is True, wc.notes


@pytest.mark.parametrize("where", ["thread", "uniform", "reductions"])
def test_a_row_whose_math_is_all_off_the_float_pipes_is_refused(where):
    """A planted row: wgmma issued the task's FLOPs (on zeroed tiles) while the product ran where a
    per-pipe charge of the FMA/ALU/FP64/XU pipes saw nothing: table loads and shared atomics (every one
    a thread instruction of the LSU), integer multiply-adds on uniform registers, or a red.global per
    product. Each is refused, and the note says where the math went."""
    F, mna = WORK.flops, WORK.flops / 2  # the task's multiply-adds
    extra = {"thread": {rules.THREAD_INST_METRIC: 2 * mna},  # an LDS and an ATOMS a product
             "uniform": {rules.UNIFORM_INST_METRIC: mna},  # UIMAD: one multiply-add a warp instruction
             "reductions": {"smsp__inst_executed_op_global_red.sum": mna / 32}}[where]  # one scalar add a lane
    wc = credit(counters(**extra))
    assert wc.carries["wgmma"] is False and "of the math the kernels did" in wc.notes["wgmma"], wc.work
    assert wc.work["wgmma_of_all_math"] < 0.9 * 0.9 * F / F
    named = {"thread": "thread instructions", "uniform": "uniform datapath", "reductions": "reductions in memory"}[where]
    assert named in wc.notes["wgmma"]


def test_the_metric_list_is_pinned_and_takes_four_passes_on_gh100():
    """What the check reads, exactly, and what it costs: 4 passes on GH100 (CUPTI's host API, no
    GPU), so 4 counted runs per workload. A counter added or dropped shows here first."""
    from tools import cupti

    assert set(rules.credit_metrics()) == {
        rules.GMMA_METRIC, rules.TMA_INST_METRIC, *rules.HGMMA_OPS_METRICS, rules.FP8_OPS_METRIC, rules.DMMA_OPS_METRIC,
        *rules.TENSOR_INST_METRICS, "smsp__thread_inst_executed_pred_on.sum",
        "sm__thread_inst_executed_pipe_fma_type_fp16_pred_on.sum", "sm__inst_executed_pipe_uniform.sum",
        "smsp__inst_executed_op_global_red.sum", "smsp__inst_executed_op_generic_atom_dot_alu.sum",
        "smsp__inst_executed_op_shared_atom_dot_alu.sum", "smsp__inst_executed_op_redas.sum",
        "l1tex__m_l1tex2xbar_write_bytes_mem_global_op_tma_red.sum",
        "l1tex__m_l1tex2xbar_write_bytes_mem_dshared_op_tma_red.sum", rules.TMA_BYTES_METRIC, *rules.OTHER_READ_METRICS,
        rules.LDGSTS_INST_METRIC, rules.TEX_INST_METRIC}
    assert len(rules.credit_metrics()) == 26
    try:
        assert cupti.passes("GH100", list(rules.credit_metrics())) == 4
    except cupti.CuptiError as exc:  # no libcupti on this machine
        pytest.skip(str(exc))


def test_dp4a_products_beside_the_largest_decoy_are_refused_where_the_module_holds_idp():
    """IDP (dp4a) does 4 int8 multiply-adds per thread instruction and no counter separates it. A
    dp4a GEMM (one IDP per 4 multiply-adds, nothing else) beside decoy wgmma at the overwork cap
    (2.5x the task's FLOPs): charged as one multiply-add each it would pass (2.5 / 2.75 of all math);
    where the module's SASS holds IDP every thread instruction is charged its 8 ops, and it fails."""
    row = counters(**{rules.HGMMA_OPS_METRICS[0]: WORK.flops * 2.5, rules.THREAD_INST_METRIC: WORK.flops / 8})
    assert credit(row, opcodes=NO_BULK).carries["wgmma"] is True  # the charge without IDP in the SASS
    wc = credit(row, opcodes=NO_BULK | {"IDP"})
    assert wc.carries["wgmma"] is False and wc.work["wide_simt"] == 1.0, wc.work
    assert wc.work["wgmma_of_all_math"] == pytest.approx(2.5 / 3.5)


def test_the_idp_opcode_is_what_ptxas_emits_for_dp4a_and_dp2a():
    """WIDE_SIMT_OPCODES names SASS base opcodes: real NVRTC + ptxas for sm_90a turn __dp4a and
    __dp2a_lo into IDP, which the evaluator's module opcodes (base names) then hold."""
    from tools.compile import compile_source
    from tools.sass import disassemble, parse_sass
    from tools.toolchain import ToolchainError

    src = ('extern "C" __global__ void k(const int* a, const int* b, int* c) {\n'
           '  const int t = threadIdx.x;\n  c[t] = __dp4a(a[t], b[t], c[t]) + __dp2a_lo(a[t + 32], b[t + 32], 0);\n}\n')
    comp = compile_source(src, "cuda", "sm_90a")
    assert comp.ok, comp.error
    try:
        text, _tool = disassemble(comp.cubin)
    except ToolchainError as exc:
        pytest.skip(f"no SASS disassembler: {exc}")
    opcodes = {i.opcode for insns in parse_sass(text).values() for i in insns}
    assert set(rules.WIDE_SIMT_OPCODES) <= opcodes, sorted(opcodes)
