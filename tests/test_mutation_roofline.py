"""tools/ceilings.py and tools/roofline.py against hand-computed figures (mutation pass 8): which datasheet row
a GPU's name reads, which peak a task is held to (fp8 or bf16), the implausibility margin on both roofs and
what its verdict says, T_SOL and its bound from the peaks, SOL-ExecBench's score at its edges, and what
apply_roofline fills per workload and for the whole result. tests/test_profile.py has the anchors (a score of
0.5 at the library, 1 at the roofline); here every branch, each figure worked out by hand from the table in
tools/ceilings.py (H100 SXM 989 / 1979 TFLOP/s, 3.35 TB/s; H200 989 / 1979, 4.8; B200 2250 / 4500, 8.0)."""
from __future__ import annotations

import math

import pytest

from tasks import get_task
from tasks.schema import Task
from tools.ceilings import CEILINGS, ceiling_for, computes_in_fp8, implausible
from tools.results import CompileResult, EvalResult, InspectResult, Timing, WorkloadResult
from tools.roofline import apply_roofline, sol_score, speed_of_light

H200 = "NVIDIA H200"
GEMM = "gemm_n7168_k5120"  # bf16: 2*M*7168*5120 FLOPs
FP8_GEMM = "fp8_gemm_nt_1d2d_n4096_k7168"  # e4m3 inputs: 2*m*4096*7168 FLOPs


# ------------------------------------------------------------------ ceilings

def test_each_gpu_reads_its_own_datasheet_row():
    """By the name the driver reports, in any case, its board (PCIe, NVL) included; a GPU not in the table has
    no ceiling (no guess)."""
    assert ceiling_for("NVIDIA H100 80GB HBM3") is CEILINGS["H100"]
    assert ceiling_for("NVIDIA H100 PCIe") is CEILINGS["H100 PCIe"]
    assert ceiling_for("NVIDIA H100 NVL") is CEILINGS["H100 NVL"]
    assert ceiling_for("NVIDIA H200") is CEILINGS["H200"] and ceiling_for("nvidia h200") is CEILINGS["H200"]
    assert ceiling_for("NVIDIA H200 NVL") is CEILINGS["H200 NVL"]
    assert ceiling_for("NVIDIA B200 NVL") is CEILINGS["B200"]  # a board without its own row: the chip's (higher)
    assert ceiling_for("NVIDIA B200") is CEILINGS["B200"]
    assert ceiling_for("NVIDIA A100-SXM4-80GB") is None and ceiling_for(None) is None and ceiling_for("") is None
    rows = {k: (c.tflops_16, c.tflops_8, c.hbm_tbps) for k, c in CEILINGS.items()}
    assert rows == {"H100": (989.0, 1979.0, 3.35), "H100 PCIe": (756.0, 1513.0, 2.0), "H100 NVL": (835.0, 1670.0, 3.9),
                    "H200": (989.0, 1979.0, 4.8), "H200 NVL": (835.0, 1670.0, 4.8), "B200": (2250.0, 4500.0, 8.0)}
    assert (CEILINGS["B200"].tensor_tflops(True), CEILINGS["B200"].tensor_tflops(False)) == (4500.0, 2250.0)


def test_a_task_with_an_fp8_input_is_held_to_the_fp8_peak():
    assert computes_in_fp8(get_task(FP8_GEMM)) and computes_in_fp8(get_task("fp8_mha_with_lse_d128"))
    assert not computes_in_fp8(get_task(GEMM)) and not computes_in_fp8(get_task("gdn_decode_qk4_v8_d128_k_last"))


def _ms_at(flops: float, tflops: float) -> float:
    """The median time (ms) at which `flops` run at `tflops` TFLOP/s."""
    return flops / (tflops * 1e12) * 1e3


def test_a_throughput_within_the_margin_is_plausible_and_beyond_it_is_not():
    """bf16 on the H200: 989 x 1.05 = 1038.45 TFLOP/s is the last plausible throughput; the fp8 task has twice it."""
    task, fp8 = get_task(GEMM), get_task(FP8_GEMM)
    axes, axes8 = task.axis_values({"M": 8192}), fp8.axis_values({"m": 8192})
    assert implausible(H200, task, axes, _ms_at(task.flop_count(axes), 1030.0)) is None  # above the peak, inside 5%
    ms = _ms_at(task.flop_count(axes), 1050.0)
    assert implausible(H200, task, axes, ms) == (
        f"1050 TFLOP/s at {ms:.4g} ms is above the NVIDIA H200 dense bf16 tensor peak of 989 TFLOP/s: the timed "
        "runs cannot have done the task's arithmetic")
    assert implausible(H200, fp8, axes8, _ms_at(fp8.flop_count(axes8), 2050.0)) is None  # 1979 x 1.05 = 2077.95
    ms = _ms_at(fp8.flop_count(axes8), 2100.0)
    assert implausible("NVIDIA B200", fp8, axes8, ms) is None  # B200's fp8 peak is 4500
    assert implausible(H200, fp8, axes8, ms) == (
        f"2100 TFLOP/s at {ms:.4g} ms is above the NVIDIA H200 dense fp8 tensor peak of 1979 TFLOP/s: the timed "
        "runs cannot have done the task's arithmetic")


def test_moving_the_compulsory_bytes_faster_than_hbm_is_implausible():
    """GEMM at M=1 is B's 7168 x 5120 bf16 read once (73 MB) at 73 MFLOP: far below the tensor peak at any
    time that HBM allows, so only the memory roof decides. H200: 4.8 x 1.05 = 5.04 TB/s; H100: 3.5175."""
    task = get_task(GEMM)
    axes = task.axis_values({"M": 1})
    nbytes = task.min_bytes(axes)
    assert nbytes == 2 * (7168 * 5120 + 5120 + 7168)
    ms = lambda tbps: nbytes / (tbps * 1e12) * 1e3  # noqa: E731
    assert implausible(H200, task, axes, ms(5.0)) is None
    assert implausible("NVIDIA H100 80GB HBM3", task, axes, ms(5.0)) == (
        f"5.00 TB/s at {ms(5.0):.4g} ms is above the NVIDIA H100 80GB HBM3 memory bandwidth of 3.35 TB/s for the "
        "73 MB every run must read and write (L2 is flushed before each run)")
    assert implausible(H200, task, axes, ms(5.1)).startswith("5.10 TB/s at ")
    # an H100 PCIe moves 2.0 TB/s: 3 TB/s there is a kernel that skipped a third of its traffic (the SXM's 3.35
    # would have let it pass), and its T_SOL is the PCIe board's
    assert implausible("NVIDIA H100 PCIe", task, axes, ms(3.0)).startswith("3.00 TB/s at ")
    assert implausible("NVIDIA H100 PCIe", task, axes, ms(2.05)) is None
    assert speed_of_light("NVIDIA H100 PCIe", 0, 2e12) == (1000.0, "memory")


def test_no_time_or_no_known_gpu_is_never_implausible():
    task = get_task(GEMM)
    axes = task.axis_values({"M": 8192})
    assert implausible(H200, task, axes, 0.0) is None and implausible(H200, task, axes, -1.0) is None
    assert implausible("NVIDIA A100", task, axes, 1e-6) is None and implausible(None, task, axes, 1e-6) is None


# ------------------------------------------------------------------ T_SOL and the score

def test_speed_of_light_is_the_larger_roof_exactly():
    """989e12 FLOPs at 989 TFLOP/s is 1 s exactly; so are 4.8e12 bytes at 4.8 TB/s and 3.35e12 at 3.35."""
    assert speed_of_light(H200, 989e12, 0) == (1000.0, "compute")
    assert speed_of_light(H200, 989e12, 4.8e12) == (1000.0, "compute")  # a tie is compute-bound
    assert speed_of_light(H200, 0, 4.8e12) == (1000.0, "memory")
    assert speed_of_light("NVIDIA H100 80GB HBM3", 989e12, 3.35e12 * 2) == (2000.0, "memory")
    assert speed_of_light(H200, 1979e12, 0, fp8=True) == (1000.0, "compute")
    assert speed_of_light(H200, 1979e12, 0, fp8=False) == (1979e12 / 989e12 * 1e3, "compute")
    # one FLOP and no bytes, one byte and no FLOPs: each alone decides (no floor of 1 on the other)
    assert speed_of_light(H200, 1.0, 0) == (1 / 989e12 * 1e3, "compute")
    assert speed_of_light(H200, 0, 1.0) == (1 / 4.8e12 * 1e3, "memory")
    assert speed_of_light(H200, 0, 0) is None and speed_of_light(H200, -1.0, 0) is None
    assert speed_of_light(H200, 0, -1.0) is None and speed_of_light(None, 989e12, 0) is None


def test_the_score_at_its_edges():
    """S = 1 / (1 + (T - T_SOL) / (T_lib - T_SOL)), = (1 - r) / (1 + 1/s - 2r) with s = T_lib / T, r = T_SOL / T_lib."""
    assert sol_score(1.0, 2.0, 0.5) == pytest.approx(0.75)  # 1 / (1 + 0.5 / 1.5)
    s, r = 2.0, 0.25
    assert sol_score(1.0, 2.0, 0.5) == pytest.approx((1 - r) / (1 + 1 / s - 2 * r))
    assert sol_score(0.5, 2.0, 0.5) == 1.0 and sol_score(0.4, 2.0, 0.5) == 1.0
    # the library at the roofline: no gap left, so at or below the roofline 1, else 0 (not a division by zero)
    assert sol_score(6.0, 5.0, 5.0) == 0.0 and sol_score(5.0, 5.0, 5.0) == 1.0 and sol_score(4.0, 5.0, 5.0) == 1.0


# ------------------------------------------------------------------ apply_roofline

def _workload(task: Task, axes: dict[str, int], speedup: float | None, baseline_ms: float = 1.0,
              status: str = "passed") -> WorkloadResult:
    return WorkloadResult(workload=f"w{len(axes)}", split="visible", axes=axes, status=status, speedup=speedup,
                          baseline=Timing(median_ms=baseline_ms, iqr_ms=0.0, cv=0.0, runs=10))


def _result(*workloads: WorkloadResult, gpu: str = H200) -> EvalResult:
    return EvalResult(task="t", arch="sm_90a", compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                      inspect=InspectResult(status="ok", arch="sm_90a"), run_status="ok", workloads=list(workloads),
                      gpu=gpu)


def test_an_fp8_task_is_scored_against_the_fp8_peak():
    task = get_task(FP8_GEMM)
    res = _result(_workload(task, {"m": 8192}, 1.0, baseline_ms=1.0))
    apply_roofline(res, task)
    w = res.workloads[0]
    t_sol = 2 * 8192 * 4096 * 7168 / 1979e12 * 1e3  # 0.243 ms: compute-bound at the fp8 peak
    assert w.sol_ms == pytest.approx(t_sol, rel=1e-12) and w.roofline_bound == "compute"
    assert w.sol_score == pytest.approx(0.5) and res.sol_score == pytest.approx(0.5)


def test_a_memory_bound_workload_is_timed_against_its_bytes():
    task = get_task(GEMM)
    res = _result(_workload(task, {"M": 1}, 2.0, baseline_ms=0.1))
    apply_roofline(res, task)
    w = res.workloads[0]
    t_sol = task.min_bytes(task.axis_values({"M": 1})) / 4.8e12 * 1e3  # 0.0153 ms
    assert w.roofline_bound == "memory" and w.sol_ms == pytest.approx(t_sol, rel=1e-12)
    assert w.sol_score == pytest.approx(1 / (1 + (0.05 - t_sol) / (0.1 - t_sol)))


def test_rows_without_axes_or_work_do_not_stop_the_rows_after_them():
    """The harness-error row ("*", no axes) and a workload with neither FLOPs nor bytes get no T_SOL; the
    workloads after them still do. A failed row keeps the result's score unset."""
    toy = Task.model_validate({
        "name": "toy", "op_type": "toy", "axes": {"M": {"type": "var"}}, "flops": "2*M",
        "inputs": {"x": {"shape": ["M"], "dtype": "float32"}}, "outputs": {"y": {"shape": ["M"], "dtype": "float32"}},
        "reference": "def run(x):\n    return x\n"})
    harness = WorkloadResult(workload="*", split="visible", axes={}, status="failed")
    res = _result(harness, _workload(toy, {"M": 0}, 1.0), _workload(toy, {"M": 1 << 20}, 1.0))
    apply_roofline(res, toy)
    assert (harness.sol_ms, res.workloads[1].sol_ms, res.workloads[1].sol_score) == (None, None, None)
    last = res.workloads[2]
    assert last.roofline_bound == "memory" and last.sol_ms == pytest.approx(8 * (1 << 20) / 4.8e12 * 1e3, rel=1e-12)
    assert last.sol_score == pytest.approx(0.5) and res.sol_score is None


def test_a_library_time_of_zero_gives_no_score():
    task = get_task(GEMM)
    res = _result(_workload(task, {"M": 8192}, 1.0, baseline_ms=0.0))
    apply_roofline(res, task)
    assert res.workloads[0].sol_ms is not None and res.workloads[0].sol_score is None and res.sol_score is None


def test_one_workload_scored_zero_makes_the_geomean_zero():
    """A workload slower than a library at the roofline scores 0: the geometric mean is 0, not log(0)'s error."""
    task = get_task(GEMM)
    axes = task.axis_values({"M": 8192})
    t_sol = task.flop_count(axes) / 989e12 * 1e3  # 0.608 ms
    at_roof = _workload(task, {"M": 8192}, 0.5, baseline_ms=t_sol)  # the library at T_SOL, the kernel at twice it
    res = _result(_workload(task, {"M": 8192}, 1.0), at_roof)
    apply_roofline(res, task)
    assert at_roof.sol_score == 0.0 and res.workloads[0].sol_score == pytest.approx(0.5)
    assert res.sol_score == 0.0
    res = _result(_workload(task, {"M": 8192}, 1.0), _workload(task, {"M": 8192}, 2.0))
    apply_roofline(res, task)
    assert res.sol_score == pytest.approx(math.sqrt(res.workloads[0].sol_score * res.workloads[1].sol_score))
