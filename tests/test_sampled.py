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
