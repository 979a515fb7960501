"""The task side on a real GPU: full-size inputs and references fit and are quick, and every
library baseline computes the task's outputs within the task's own tolerance (cuDNN and
FlashAttention round P to bf16, so this also checks the tolerance criterion at full size).
The simple solutions are run by tests/gpu/test_evaluator_gpu.py::test_simple_solution_passes."""
from __future__ import annotations

import time

import pytest

from tasks import get_task
from tasks.families.baselines import BaselineUnavailable, list_backends, make_baseline
from tasks.generators import generate_inputs
from tasks.reference import run_reference, term_scales

from gpu_helpers import PTXBENCH_SET, show

pytestmark = pytest.mark.gpu

SEED_TASKS = ["gemm_n7168_k5120", "mha_fwd_d128", "mha_fwd_d128_causal", "mha_bwd_d128", "mha_bwd_d128_causal"]
REQUIRED = {"cublas", "sdpa:cudnn"}  # must work on the H200; the other SDPA backends may refuse a shape


def expected_outputs(task) -> set[str]:
    """Every output of the task; PyTorch's public SDPA forward returns no LSE (tasks/families/baselines.py,
    _sdpa_forward: the library's time is then if anything understated), so that one may be missing."""
    return set(task.outputs) - ({"LSE"} if task.baseline == "sdpa_fwd" else set())


def _largest(task):
    return max(task.workloads, key=lambda w: task.flop_count(task.axis_values(w)))


@pytest.mark.parametrize("name", SEED_TASKS + ["mha_bwd_d96", "mha_fwd_d256", "mha_bwd_d256"])
def test_full_size_inputs_and_reference(name):
    import torch

    task = get_task(name)
    axes = task.axis_values(_largest(task))
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    x = generate_inputs(task, axes, seed=123, device="cuda")
    torch.cuda.synchronize()
    t_gen = time.perf_counter() - t0
    ref = run_reference(task, x)
    torch.cuda.synchronize()
    t_ref = time.perf_counter() - t0 - t_gen
    for n, spec in task.inputs.items():
        assert x[n].is_cuda and x[n].shape == task.shape(n, axes) and str(x[n].dtype) == f"torch.{spec.dtype}"
    for n, value in ref.items():
        assert value.shape == task.shape(n, axes) and bool(torch.isfinite(value).all()), n
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name} {axes}: generate {t_gen:.2f} s, reference {t_ref:.2f} s, peak {peak:.1f} GiB")
    assert t_gen < 30 and t_ref < 60 and peak < 100


@pytest.mark.parametrize("name", SEED_TASKS + ["mha_fwd_d256", "mha_bwd_d256"])
def test_baselines_match_the_reference(name):
    import torch

    task = get_task(name)
    axes = task.axis_values(task.workloads_for("visible")[0])
    x = generate_inputs(task, axes, seed=7, device="cuda")
    ref = run_reference(task, x)
    scales = term_scales(task, x) if task.tolerance.scale == "terms" else {}
    tol = task.tolerance
    ran = []
    for backend in list_backends(task):
        try:
            baseline = make_baseline(task, x, backend)
        except BaselineUnavailable as exc:
            assert backend not in REQUIRED, str(exc)
            print(f"{name} {backend}: unavailable: {exc}")
            continue
        out = baseline.run()
        torch.cuda.synchronize()
        assert set(out) == expected_outputs(task), (backend, list(out))
        ref_b, scales_b = ref, scales
        if task.baseline == "sdpa_bwd" and not baseline.inputs_as_given:
            # The library's backward uses its own forward's O for Delta = rowsum(dO * O), not the
            # task's input O; where they differ by an ulp, peaked rows (dS ~ 0) notice. Judge it
            # against the reference given that same O, as a candidate is judged given the input O.
            x_lib = {**x, "O": _library_forward_o(task, x, backend)}
            ref_b = run_reference(task, x_lib)
            scales_b = term_scales(task, x_lib)
        for n, got in out.items():
            e, g = ref_b[n], got.float()
            err = (g - e).abs()
            scale = torch.maximum(e.abs(), scales_b[n]) if n in scales_b else e.abs()
            ratio = (err / (tol.atol + tol.rtol * scale)).max().item()
            plain = (err / (tol.atol + tol.rtol * e.abs())).max().item()
            print(f"{name} {backend} {n}: worst ratio {ratio:.3f} (against |ref| alone: {plain:.3f})")
            assert ratio <= 1.0, (backend, n, ratio)
        ran.append(backend)
    assert REQUIRED & set(ran), ran


def _library_forward_o(task, x, backend):
    import torch
    import torch.nn.functional as F

    from tasks.families.baselines import _sdpa_context

    sm_scale = task.scalar_values(task.axis_values({"S": x["Q"].shape[2]}))["sm_scale"]
    with _sdpa_context(backend), torch.no_grad():
        return F.scaled_dot_product_attention(x["Q"], x["K"], x["V"], is_causal="causal" in task.tags, scale=sm_scale)


@pytest.mark.parametrize("name", PTXBENCH_SET)
def test_ptxbench_set_simple_solution_passes_and_is_timed(evaluator, name):
    from pathlib import Path

    from tools.solution import Solution

    sol = Solution.from_dir(Path(__file__).resolve().parents[2] / "tasks" / name / "simple")
    # Every workload judged (this is the only GPU test of these simple solutions), the visible one timed.
    r = evaluator.evaluate(sol, name, "sm_90a", workloads="held_out", time=False)
    assert r.split_correct("held_out") is True, show(r)
    timed = evaluator.evaluate(sol, name, "sm_90a", workloads="visible", time=True)
    assert timed.correct is True, show(timed)
    for w in timed.workloads:
        print(f"{name} {w.workload}: simple {w.timing.median_ms:.4g} ms, {w.baseline_name} "
              f"{w.baseline.median_ms if w.baseline else float('nan'):.4g} ms, speedup {w.speedup}")
        assert w.baseline_name and w.baseline is not None and w.baseline.median_ms > 0, show(timed)


@pytest.mark.parametrize("name,S", [("mha_bwd_d128", 77), ("mha_bwd_d128_causal", 1000), ("mha_bwd_d96_causal", 300),
                                    ("mha_bwd_d256", 256), ("mha_bwd_d64", 8192)])
def test_fast_backward_inputs_on_the_gpu_are_a_consistent_forward(name, S):
    """The timed and counted runs' backward inputs on the GPU (one flash-attention forward writes
    O and LSE) are the forward of the same Q, K, V to bf16 accuracy: against the fp32 reference
    on a few heads, and how long one generation takes is printed (docs/BENCHMARKS.md)."""
    import torch

    task = get_task(name)
    axes = task.axis_values({"S": S})
    generate_inputs(task, axes, seed=3, device="cuda", fast=True)  # warm-up (kernels, allocator)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fast = generate_inputs(task, axes, seed=3, device="cuda", fast=True)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    q, k, v = (fast[n][:1, :2].float() for n in ("Q", "K", "V"))  # two heads, in fp32: the forward by hand
    scores = (q @ k.transpose(-1, -2)) * float(task.scalar_values(axes)["sm_scale"])
    if "causal" in task.tags:
        scores.masked_fill_(torch.ones(S, S, dtype=torch.bool, device="cuda").tril().logical_not(), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.softmax(scores, dim=-1) @ v
    lse_err = (fast["LSE"][:1, :2].float() - lse).abs().max().item()
    o_err = ((fast["O"][:1, :2].float() - o).norm() / o.norm()).item()
    print(f"{name} S{S}: fast generation {took * 1e3:.1f} ms, LSE max error {lse_err:.3g}, O relative error {o_err:.3g}")
    assert lse_err < 0.1 and o_err < 0.02
