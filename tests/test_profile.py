"""The profile block (tools/profile.py) and the roofline / SOL score (tools/roofline.py),
from synthetic Nsight Compute metric values: no GPU needed."""
from __future__ import annotations

import math

import pytest

from tasks import get_task
from tools import profile as pf
from tools.profile import PROFILE_METRICS, Profile, build_profile, render, stall_metric, tokens
from tools.results import (CompileResult, EvalResult, ExecutedCheck, InspectResult, Timing, WorkloadResult)
from tools.roofline import apply_roofline, sol_score, speed_of_light

H200 = "NVIDIA H200"


def gemm_kernel(time_ns: float = 1.0e6) -> dict[str, float]:
    """A wgmma GEMM launch: 601e9 tensor FLOPs in 1 ms, shared memory bounding occupancy."""
    return {
        pf.TIME: time_ns, "sm__ops_path_tensor_src_bf16_dst_fp32.sum": 601.3e9, pf.TENSOR_PIPE: 71.5,
        pf.DRAM_READ: 300e6, pf.DRAM_WRITE: 117e6, pf.L2_HIT: 81.2, pf.OCCUPANCY: 5.9,
        pf.THEORETICAL_OCCUPANCY: 6.25, "launch__occupancy_limit_registers": 1, "launch__occupancy_limit_shared_mem": 1,
        "launch__occupancy_limit_warps": 5, "launch__occupancy_limit_blocks": 32, pf.REGISTERS: 168,
        pf.BLOCK_SIZE: 384, pf.GRID_SIZE: 132, pf.WAVES: 1.0,
        stall_metric("gmma"): 4.0, stall_metric("long_scoreboard"): 2.0, stall_metric("barrier"): 1.0,
        stall_metric("wait"): 0.5, stall_metric("selected"): 1.0,
    }


def test_metric_names_are_unique_and_cover_each_figure():
    assert len(set(PROFILE_METRICS)) == len(PROFILE_METRICS)
    for name in (pf.TIME, pf.TENSOR_PIPE, pf.DRAM_READ, pf.DRAM_WRITE, pf.L2_HIT, pf.OCCUPANCY,
                 *pf.OCCUPANCY_LIMITS.values(), stall_metric("long_scoreboard")):
        assert name in PROFILE_METRICS
    assert stall_metric("selected") not in PROFILE_METRICS  # issuing is not a stall


def test_one_kernel_all_figures():
    p = build_profile({"gemm": gemm_kernel()}, H200, flops=2 * 8192 * 7168 * 5120, min_bytes=0.3e9)
    assert p.status == "ok" and p.peak_tflops == 989.0 and p.peak_tbps == 4.8
    k = p.kernels[0]
    assert k.time_ms == pytest.approx(1.0) and k.time_share == pytest.approx(1.0)
    assert k.tflops == pytest.approx(601.3) and k.tflops_pct == pytest.approx(601.3 / 989 * 100)
    assert k.dram_gbps == pytest.approx(417.0) and k.dram_pct == pytest.approx(417 / 4800 * 100)
    assert k.occupancy_limiter == "registers and shared memory"  # both allow one block per SM
    assert [r for r, _ in k.stalls] == ["gmma", "long scoreboard", "barrier"]
    assert sum(s for _, s in k.stalls) == pytest.approx(7.0 / 7.5)  # "selected" is not counted
    assert p.tflops == pytest.approx(601.3, rel=1e-3)
    text = render(p)
    for piece in ("tensor pipe 72%;", "601 TFLOP/s (61% of peak)", "DRAM 417 GB/s (9% of peak)", "L2 hit 81%",
                  "occupancy 6% (max 6%), bound by registers and shared memory", "168 regs", "gmma 53%"):
        assert piece in text, (piece, text)


def test_shares_order_and_more_kernels_line():
    kernels = {f"k{i}": {pf.TIME: 1e5 * (i + 1)} for i in range(5)}  # 0.1 .. 0.5 ms
    p = build_profile(kernels, H200, flops=1e12, min_bytes=1e9)
    assert [k.name for k in p.kernels] == ["k4", "k3", "k2", "k1", "k0"]
    assert sum(k.time_share for k in p.kernels) == pytest.approx(1.0)
    assert p.kernels[0].time_share == pytest.approx(0.5 / 1.5)
    text = render(p)
    assert "`k4` (33% of time)" in text and "2 more kernels: 20% of time" in text
    assert "`k1`" not in text


def test_missing_metrics_give_none_not_guesses():
    p = build_profile({"k": {pf.TIME: 2e6}}, "NVIDIA GeForce RTX 4090", flops=0, min_bytes=0)
    k = p.kernels[0]
    assert k.time_ms == pytest.approx(2.0)
    assert None is k.tflops is k.dram_gbps is k.tensor_pipe_pct is k.occupancy_pct is k.occupancy_limiter
    assert k.stalls == [] and p.peak_tflops is None and p.tflops is None
    assert "no figures measured" in render(p)
    # no time at all: shares stay unknown rather than divided by zero
    p = build_profile({"a": {pf.L2_HIT: 50.0}, "b": {}}, H200, flops=1e9, min_bytes=1e6)
    assert all(k.time_share is None for k in p.kernels) and p.time_ms is None
    assert "L2 hit 50%" in render(p)


def test_grid_smaller_than_a_wave_is_the_limiter():
    m = gemm_kernel()
    m[pf.WAVES], m[pf.GRID_SIZE] = 0.25, 33
    k = build_profile({"k": m}, H200, 1e9, 1e6).kernels[0]
    assert k.occupancy_limiter == "grid size"


def test_fp8_peak():
    p = build_profile({"k": {pf.TIME: 1e6, "sm__ops_path_tensor_src_fp8.sum": 1e12}}, H200, 1e12, 0, fp8=True)
    assert p.peak_tflops == 1979.0 and p.kernels[0].tflops_pct == pytest.approx(1000 / 1979 * 100)


def test_absent_profile_is_one_line():
    assert render(pf.skipped("ncu (Nsight Compute) is not on PATH")) == \
        "No profile: ncu (Nsight Compute) is not on PATH."
    assert render(None).count("\n") == 0
    assert build_profile({}, H200, 1, 1).status == "skipped"


def test_token_budget():
    """Three kernels with every figure stay within the block's budget (250 tokens)."""
    kernels = {name: gemm_kernel(t) for name, t in (("attn_bwd_dkdv_kernel", 3e6), ("attn_bwd_dq_kernel", 2e6),
                                                    ("attn_bwd_preprocess", 1e5), ("tail", 1e4))}
    text = render(build_profile(kernels, H200, flops=4.1e12, min_bytes=0.5e9))
    assert tokens(text) < 250, (tokens(text), text)


def test_profile_round_trips_in_executed_check():
    p = build_profile({"gemm": gemm_kernel()}, H200, 1e12, 1e9)
    ex = ExecutedCheck(status="ok", profile=p)
    again = ExecutedCheck.model_validate_json(ex.model_dump_json())
    assert again.profile == p and isinstance(again.profile, Profile)


# ---------------------------------------------------------------------------------------
# Roofline and SOL score
# ---------------------------------------------------------------------------------------
def test_speed_of_light_picks_the_binding_roof():
    ms, bound = speed_of_light(H200, flops=989e12, min_bytes=1e9)  # 1 s of math, 0.2 ms of traffic
    assert bound == "compute" and ms == pytest.approx(1000.0)
    ms, bound = speed_of_light(H200, flops=1e9, min_bytes=4.8e12)
    assert bound == "memory" and ms == pytest.approx(1000.0)
    assert speed_of_light("NVIDIA A100", 1e12, 1e9) is None
    ms, _ = speed_of_light("NVIDIA B200", 2250e12, 0, fp8=True)
    assert ms == pytest.approx(500.0)


def test_sol_score_anchors_and_edges():
    assert sol_score(10.0, 10.0, 5.0) == pytest.approx(0.5)  # at the library
    assert sol_score(5.0, 10.0, 5.0) == pytest.approx(1.0)  # at the roofline
    assert sol_score(15.0, 10.0, 5.0) == pytest.approx(1 / 3)
    assert sol_score(4.9, 10.0, 5.0) == 1.0  # below the roofline (within the implausibility margin): capped
    assert sol_score(5.0, 5.0, 5.0) == 1.0 and sol_score(6.0, 4.9, 5.0) == 0.0  # library at/past the roofline


def _result(speedups: list[float | None], gpu: str = H200) -> EvalResult:
    task = get_task("gemm")
    ws = []
    for i, s in enumerate(speedups):
        wl = task.workloads_for("visible")[0]
        ws.append(WorkloadResult(workload=f"{wl.name}-{i}", split="visible", axes=task.axis_values(wl),
                                 status="passed", speedup=s,
                                 baseline=Timing(median_ms=1.0, iqr_ms=0.01, cv=0.01, runs=10)))
    return EvalResult(task=task.name, arch="sm_90a", compile=CompileResult(status="ok", arch="sm_90a", language="cuda"),
                      inspect=InspectResult(status="ok", arch="sm_90a"), run_status="ok", workloads=ws, gpu=gpu)


def test_apply_roofline_fills_workloads_and_geomean():
    task = get_task("gemm")
    res = _result([1.0, 0.5])
    apply_roofline(res, task)
    w = res.workloads[0]
    t_sol = task.flop_count(w.axes) / 989e12 * 1e3
    assert w.roofline_bound == "compute" and w.sol_ms == pytest.approx(t_sol)
    assert w.sol_score == pytest.approx(0.5)  # as fast as the library
    t = 1.0 / 0.5
    s2 = 1 / (1 + (t - t_sol) / (1.0 - t_sol))
    assert res.workloads[1].sol_score == pytest.approx(s2)
    assert res.sol_score == pytest.approx(math.sqrt(0.5 * s2))
    assert res.verdicts()["sol_score"] == res.sol_score


def test_apply_roofline_leaves_unknowns_none():
    task = get_task("gemm")
    res = _result([1.2, None])  # one workload untimed: no geomean
    apply_roofline(res, task)
    assert res.workloads[0].sol_score is not None and res.workloads[1].sol_score is None
    assert res.workloads[1].sol_ms is not None and res.sol_score is None
    res = _result([1.0], gpu="NVIDIA A100")  # no ceiling for it
    apply_roofline(res, task)
    assert res.workloads[0].sol_ms is None and res.sol_score is None


def test_eval_output_and_feedback_show_roofline_and_profile():
    from agent import feedback as fb
    from agent.commands import evaluate
    from agent.commands.common import console

    task = get_task("gemm")
    res = _result([1.0])
    res.workloads[0].timing = Timing(median_ms=1.0, iqr_ms=0.01, cv=0.01, runs=10)
    apply_roofline(res, task)
    res.executed = ExecutedCheck(status="ok", profile=build_profile({"gemm": gemm_kernel()}, H200, 1e12, 1e9))
    with console.capture() as cap:
        evaluate.render(res)
    out = cap.get()
    assert "SOL score" in out and "0.500" in out and "(compute)" in out and "tensor pipe 72%;" in out
    rec = fb.candidate_record(2, 0, "candidates/2-0", res)
    with_profile = fb.render_feedback(2, "optimise", "cuda", rec, res, profile=True)
    assert "SOL score 0.50" in with_profile and "compute-bound" in with_profile
    assert "### Profile" in with_profile and "stalls: gmma 53%" in with_profile
    assert "### Profile" not in fb.render_feedback(2, "optimise", "cuda", rec, res, profile=False)


def test_real_ncu_rows_of_the_expert_gemm():
    """The ncu pass on the H200 (2026-11-30: expert GEMM, M=8192, Nsight Compute 2025.3.1), its
    raw CSV cut to the columns used, through the same parsing as the executed check."""
    from pathlib import Path

    from tools import credit, ncu

    text = (Path(__file__).parent / "fixtures" / "ncu" / "gemm_expert_profile_h200.csv").read_text()
    rows = ncu.parse_raw_csv(text)
    task = get_task("gemm")
    axes = task.axis_values(task.workloads_for("visible")[0])
    p = build_profile(credit.kernel_metrics(rows, list(PROFILE_METRICS)), H200, task.flop_count(axes),
                      task.min_bytes(axes))
    [k] = p.kernels
    assert k.tensor_pipe_pct > 90 and 700 < k.tflops < 989 and k.registers == 168 and k.block_size == 384
    assert k.occupancy_limiter and "registers" in k.occupancy_limiter and k.stalls[0][0] == "barrier"
    assert p.tflops == pytest.approx(k.tflops, rel=1e-3)  # wgmma did exactly the task's 2*M*N*K
    assert tokens(render(p)) < 120
