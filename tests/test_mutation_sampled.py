"""What tests/test_sampled.py (the sampled rows equal the full reference's) leaves open in
tasks/sampled.py, found by mutation (docs/BENCHMARKS.md, "Mutation scores"):

- the rows come from the caller's generator (seeded from the evaluation's secret), and from
  nothing else: the same seed draws the same rows whatever the global RNG did, another seed others;
- a sample carries a term scale exactly where its task is judged against term scales: a GEMM
  (judged against |ref|) gets none, so its sampled verdict is never looser than its whole one."""
from __future__ import annotations

import pytest
import torch

from tasks.generators import generate_inputs
from tasks.sampled import sample

from test_sampled import small


@pytest.mark.parametrize("name", ["gemm_n7168_k5120", "mha_fwd_d64", "mha_bwd_d64"])
def test_the_rows_follow_the_callers_generator_and_nothing_else(name):
    task, wl = small(name, 200)
    inputs = generate_inputs(task, task.axis_values(wl), seed=3)

    def rows(seed: int, global_seed: int = 0) -> list[list[int]]:
        torch.manual_seed(global_seed)  # the global RNG in another state; the rows must not care
        out = sample(task, inputs, torch.Generator().manual_seed(seed), rows=16)
        return [smp.rows.tolist() for smp in out.values()]

    first = rows(1)
    assert rows(1, global_seed=5) == first
    assert rows(2) != first
    assert all(len(set(r)) == 16 for r in first)


@pytest.mark.parametrize("name", ["gemm_n7168_k5120", "mha_fwd_d64", "mha_bwd_d64"])
def test_a_sample_has_a_term_scale_exactly_where_its_task_is_judged_against_one(name):
    """(FP8 GEMM's scale rows are compared with term_scales in tests/test_fp8_gemm.py.)"""
    task, wl = small(name, 40)
    inputs = generate_inputs(task, task.axis_values(wl), seed=3)
    terms = task.tolerance.scale == "terms"
    assert terms  # GEMM and attention alike are judged against term scales
    for out, smp in sample(task, inputs, torch.Generator().manual_seed(1), rows=8).items():
        if terms and out != "LSE":  # (LSE sums no products: it has no term scale)
            assert smp.scale is not None and smp.scale.shape == smp.expected.shape, out
        else:
            assert smp.scale is None, out


def test_an_op_type_without_a_sampler_is_refused_by_name():
    """Gated DeltaNet has no sampler (judged whole on every run): asking for one names why."""
    from tasks import get_task

    task = get_task("gdn_decode_qk4_v8_d128_k_last")
    with pytest.raises(ValueError, match=r"^no sampled reference for op type 'gdn_decode' "
                                         r"\(task gdn_decode_qk4_v8_d128_k_last\)$"):
        sample(task, generate_inputs(task, task.axis_values(task.workloads[0]), seed=1),
               torch.Generator().manual_seed(1), rows=4)


@pytest.mark.parametrize("name,rows", [
    ("mha_fwd_d64", {"O": [3, 17, 40], "LSE": [5, 9]}),  # O's rows and LSE's apart: each its own
    ("mha_fwd_d64", {"O": [3, 17, 40]}),  # LSE not asked for: not returned
    ("mha_bwd_d64", {"dK": [1, 30], "dV": [1, 30], "dQ": [7, 8, 60]}),  # dK, dV on one tensor, then dQ
    ("mha_bwd_d64", {"dV": [2], "dK": [11, 12]}),
])
def test_rows_at_gives_each_output_exactly_its_own_rows(name, rows):
    """rows_at (the failing rows judge_outputs asks about) computes outputs made together (O and LSE; dK
    and dV) once only where they were asked on the very same index tensor; every output asked for gets
    the reference of exactly its rows, and none is returned that was not asked for."""
    from tasks.reference import run_reference, term_scales
    from tasks.sampled import rows_at, view_rows

    task, wl = small(name, 64)
    x = generate_inputs(task, task.axis_values(wl), seed=3)
    full, scales = run_reference(task, x), term_scales(task, x)
    idx = {n: torch.tensor(r) for n, r in rows.items()}
    if name == "mha_bwd_d64" and "dQ" in rows:
        idx["dV"] = idx["dK"]  # the same tensor, as judge_outputs hands over siblings' failing rows
    got = rows_at(task, x, idx)
    assert set(got) == set(rows)
    for n, smp in got.items():
        assert smp.rows.tolist() == rows[n], n
        torch.testing.assert_close(smp.expected, view_rows(full[n])[idx[n]].float(), rtol=2e-5, atol=2e-5)
        if n in scales:
            torch.testing.assert_close(smp.scale, view_rows(scales[n])[idx[n]], rtol=2e-5, atol=2e-5)


def test_rows_at_refuses_an_op_type_without_a_sampler_by_name():
    from tasks import get_task
    from tasks.sampled import rows_at

    task = get_task("gdn_decode_qk4_v8_d128_k_last")
    with pytest.raises(ValueError, match=r"^no sampled reference for op type 'gdn_decode' "
                                         r"\(task gdn_decode_qk4_v8_d128_k_last\)$"):
        rows_at(task, generate_inputs(task, task.axis_values(task.workloads[0]), seed=1), {"o": torch.tensor([0])})
