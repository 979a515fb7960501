"""Sampled references (tasks/sampled.py) agree with the full references on the rows they
draw, for every op type they cover, causal and not, with term scales where the task uses them."""
from __future__ import annotations

import pytest
import torch

from tasks import get_task
from tasks.generators import generate_inputs
from tasks.reference import run_reference, term_scales
from tasks.sampled import has_sampler, sample, view_rows


def small(name: str, S: int):
    task = get_task(name).model_copy(deep=True)
    if "B" in task.axes:
        task.axes["B"].value, task.axes["H"].value = 1, 3
        return task, {"S": S}
    task.axes["N"].value, task.axes["K"].value = 48, 40
    return task, {"M": S}


@pytest.mark.parametrize("name", ["gemm_n7168_k5120", "mha_fwd_d64", "mha_fwd_d128_causal", "mha_bwd_d64",
                                  "mha_bwd_d128_causal"])
def test_sampled_rows_match_the_full_reference(name):
    task, wl = small(name, 77)
    assert has_sampler(task)
    axes = task.axis_values(wl)
    inputs = generate_inputs(task, axes, seed=3)
    full = run_reference(task, inputs)
    scales = term_scales(task, inputs) if task.tolerance.scale == "terms" else {}
    gen = torch.Generator().manual_seed(1)
    samples = sample(task, inputs, gen, rows=9)
    assert set(samples) == set(task.outputs)
    for out, smp in samples.items():
        assert len(smp.rows) == 9 and len(set(smp.rows.tolist())) == 9
        want = view_rows(full[out])[smp.rows]
        torch.testing.assert_close(smp.expected, want, rtol=2e-5, atol=2e-5)
        if out in scales:
            torch.testing.assert_close(smp.scale, view_rows(scales[out])[smp.rows], rtol=2e-5, atol=2e-5)


def test_fast_backward_inputs_are_a_consistent_forward():
    """The timed runs' backward inputs (bf16 forward) are close to the fp32 forward of the same Q, K, V."""
    task, wl = small("mha_bwd_d64", 64)
    axes = task.axis_values(wl)
    exact = generate_inputs(task, axes, seed=5)
    fast = generate_inputs(task, axes, seed=5, fast=True)
    for n in ("Q", "K", "V", "dO"):
        assert torch.equal(exact[n], fast[n])
    assert (fast["LSE"] - exact["LSE"]).abs().max() < 0.1
    o_err = (fast["O"].float() - exact["O"].float()).norm() / exact["O"].float().norm()
    assert o_err < 0.02


@pytest.mark.parametrize("name", ["mha_fwd_d64_causal", "mha_bwd_d128_causal"])
def test_many_rows_are_drawn_in_chunks_and_match_the_full_reference(name):
    """More rows than one chunk (tasks.sampled.CHUNK_ROWS): drawn distinct, computed chunk by
    chunk, still the reference's rows."""
    from tasks.sampled import CHUNK_ROWS

    task, wl = small(name, 77)
    inputs = generate_inputs(task, task.axis_values(wl), seed=4)
    full, scales = run_reference(task, inputs), term_scales(task, inputs)
    samples = sample(task, inputs, torch.Generator().manual_seed(2), rows=2 * CHUNK_ROWS + 7)
    for out, smp in samples.items():
        assert len(smp.rows) == 2 * CHUNK_ROWS + 7 and len(set(smp.rows.tolist())) == len(smp.rows)
        torch.testing.assert_close(smp.expected, view_rows(full[out])[smp.rows], rtol=2e-5, atol=2e-5)
        if out in scales:  # (LSE has no term scale)
            torch.testing.assert_close(smp.scale, view_rows(scales[out])[smp.rows], rtol=2e-5, atol=2e-5)


def test_sample_sizes_per_op_type():
    from tasks import get_task
    from tasks.sampled import DEFAULT_ROWS, rows_for

    assert rows_for(get_task("gemm_n7168_k5120")) == rows_for(get_task("fp8_gemm_nt_1d2d_n4096_k7168")) == 1024
    assert rows_for(get_task("mha_fwd_d128")) == rows_for(get_task("mha_bwd_d128")) == 256
    assert rows_for(get_task("fp8_mha_with_lse_d128")) == 256
    assert rows_for(get_task("gdn_decode_qk4_v8_d128_k_last")) == DEFAULT_ROWS  # no sampler: judged whole
