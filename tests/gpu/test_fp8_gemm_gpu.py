"""The block-scaled FP8 GEMM task on a real GPU (H200, torch 2.11): full-size inputs and reference
fit and are quick; every library backend (cuBLASLt through torch._scaled_mm, the Triton kernel)
computes the task's D within its tolerance on every workload, and cuBLASLt is there on Hopper;
the simple solution is correct on every workload through the Evaluator and times against the
library; variants that misapply the scales fail.

The printed worst ratios and relative L2 errors are the calibration of the task's tolerance
(tasks/families/fp8_gemm.py's docstring quotes the CPU emulation; these are the real kernels)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpu_helpers import show
from tasks import get_task
from tasks.families.baselines import BaselineUnavailable, list_backends, make_baseline
from tasks.generators import generate_inputs
from tasks.reference import run_reference, term_scales
from tools.solution import Solution

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
NAME = "fp8_gemm_nt_1d2d_n4096_k7168"
SIMPLE = ROOT / "tasks" / NAME / "simple"
REQUIRED_ON_HOPPER = "scaled_mm:cublaslt"  # cuBLASLt >= 12.9 has the 1x128 / 128x128 recipe on sm_90


def _errors(task, got, ref, rss) -> tuple[float, float]:
    """(worst |got - ref| / (atol + rtol * max(|ref|, rss)), relative L2) of D."""
    import torch

    tol = task.tolerance
    g = got.float()
    worst = ((g - ref).abs() / (tol.atol + tol.rtol * torch.maximum(ref.abs(), rss))).max().item()
    return worst, ((g - ref).norm() / ref.norm()).item()


def test_full_size_inputs_and_reference():
    import torch

    task = get_task(NAME)
    axes = task.axis_values({"m": 8192})  # the largest workload
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    x = generate_inputs(task, axes, seed=123, device="cuda")
    torch.cuda.synchronize()
    t_gen = time.perf_counter() - t0
    ref = run_reference(task, x)["D"]
    rss = term_scales(task, x)["D"]
    torch.cuda.synchronize()
    t_ref = time.perf_counter() - t0 - t_gen
    assert str(x["A"].dtype) == "torch.float8_e4m3fn" and x["A"].is_cuda and tuple(ref.shape) == (8192, 4096)
    assert bool(torch.isfinite(ref).all()) and bool((rss > 0).all())
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{NAME} m=8192: generate {t_gen:.3f} s, reference + term scales {t_ref:.2f} s, peak {peak:.1f} GiB, "
          f"D std {ref.std().item():.1f}")
    assert t_gen < 5 and t_ref < 30 and peak < 40


@pytest.mark.parametrize("m", [4096, 3000, 70])
def test_baselines_match_the_reference(m):
    import torch

    task = get_task(NAME)
    x = generate_inputs(task, task.axis_values({"m": m}), seed=7, device="cuda")
    ref, rss = run_reference(task, x)["D"], term_scales(task, x)["D"]
    ran = []
    for backend in list_backends(task):
        try:
            baseline = make_baseline(task, x, backend)
        except BaselineUnavailable as exc:
            print(f"m={m} {backend}: unavailable: {exc}")
            continue
        assert baseline.name == backend
        out = baseline.run()
        torch.cuda.synchronize()
        assert set(out) == {"D"} and out["D"].dtype == torch.bfloat16 and tuple(out["D"].shape) == (m, 4096)
        worst, rel_l2 = _errors(task, out["D"], ref, rss)
        print(f"m={m} {backend}: worst {worst:.3f} of the bound, relative L2 {rel_l2:.2e} ({baseline.detail})")
        assert worst <= 1.0 and rel_l2 <= task.tolerance.rel_l2["D"], (backend, worst, rel_l2)
        ran.append(backend)
    assert ran, "no library backend ran"
    if torch.cuda.get_device_capability()[0] == 9 and m % 16 == 0:
        assert REQUIRED_ON_HOPPER in ran, ran


def test_baseline_reads_fresh_inputs_in_place():
    """The worker copies each pair's fresh inputs into the tensors the baseline was made with."""
    import torch

    task = get_task(NAME)
    axes = task.axis_values({"m": 1024})
    x = generate_inputs(task, axes, seed=1, device="cuda")
    ran = []
    for backend in list_backends(task):
        try:
            baseline = make_baseline(task, x, backend)
        except BaselineUnavailable as exc:
            print(f"{backend}: unavailable: {exc}")
            continue
        fresh = generate_inputs(task, axes, seed=2, device="cuda")
        for n, t in x.items():
            t.copy_(fresh[n])
        out = baseline.run()["D"]
        torch.cuda.synchronize()
        worst, _ = _errors(task, out, run_reference(task, fresh)["D"], term_scales(task, fresh)["D"])
        assert worst <= 1.0, (backend, worst)
        ran.append(backend)
    assert ran, "no library backend ran"  # zero baselines would prove nothing
    if torch.cuda.get_device_capability()[0] == 9:
        assert REQUIRED_ON_HOPPER in ran, ran


def test_simple_solution_passes_every_workload_and_is_timed(evaluator):
    sol = Solution.from_dir(SIMPLE)
    r = evaluator.evaluate(sol, NAME, "sm_90a", workloads="all", time=False)
    assert r.correct is True and r.split_correct("held_out") is True, show(r)
    r = evaluator.evaluate(sol, NAME, "sm_90a", workloads="visible", time=True)
    assert r.correct is True, show(r)
    w = r.workloads[0]
    print(f"simple: {w.timing.median_ms:.2f} ms, baseline {w.baseline_name} {w.baseline.median_ms:.3f} ms, "
          f"speedup {w.speedup:.4f}; D relative L2 {[o.rel_l2 for o in w.outputs]}")
    assert w.baseline_name in list_backends(get_task(NAME)) and w.speedup is not None and w.speedup < 1


# Each replaces one expression of the simple kernel: the kernel then applies some scale of the wrong block.
WRONG_SCALES = {
    "neighbour_n_block": ("SF_B[(size_t)(n / SCALE_K) * num_kblock + kb]",
                          "SF_B[(size_t)((n / SCALE_K + 1) % (N / SCALE_K)) * num_kblock + kb]"),
    "sf_b_transposed": ("SF_B[(size_t)(n / SCALE_K) * num_kblock + kb]",
                        "SF_B[(size_t)kb * (N / SCALE_K) + n / SCALE_K]"),
    "sf_a_first_k_block": ("SF_A[(size_t)m * num_kblock + kb]", "SF_A[(size_t)m * num_kblock]"),
}


@pytest.mark.parametrize("fault", sorted(WRONG_SCALES))
def test_misapplied_scales_fail(evaluator, fault):
    sol = Solution.from_dir(SIMPLE)
    old, new = WRONG_SCALES[fault]
    assert sol.source.count(old) == 1
    wrong = sol.model_copy(update={"source": sol.source.replace(old, new), "name": f"wrong_{fault}"})
    r = evaluator.evaluate(wrong, NAME, "sm_90a", workloads="visible", time=False)
    assert r.compiled and r.correct is False, show(r)
    assert r.workloads[0].reason == "incorrect", show(r)
