"""The attention references on tensor cores (tasks.families.attention.exact_reference, issue 43) compute
the task's own source to fp32 accuracy: checked on the CPU, where the same split runs with exact products
and fp32 sums, against the source run in IEEE fp32 and both against float64; and it applies only where
its arithmetic is the source's (the text, bf16 inputs), the source runs everywhere else."""
from __future__ import annotations

import pytest
import torch

from tasks import get_task
from tasks.families.attention import _split3, exact_reference
from tasks.generators import generate_inputs
from tasks.reference import run_reference, term_scales


def small(name: str, S: int):
    task = get_task(name).model_copy(deep=True)
    task.axes["B"].value, task.axes["H"].value = 1, 2
    return task, generate_inputs(task, {"S": S}, seed=9, fast=True)


def _float64_backward(x, causal: bool, sm_scale: float) -> dict:
    q, k, v, o, do = (x[n].double() for n in ("Q", "K", "V", "O", "dO"))
    p = torch.exp(q @ k.transpose(-1, -2) * sm_scale - x["LSE"].double()[..., None])
    if causal:
        S = q.shape[2]
        p = p.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), 0.0)
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    return {"dQ": ds @ k * sm_scale, "dK": ds.transpose(-1, -2) @ q * sm_scale, "dV": p.transpose(-1, -2) @ do}


def test_the_split_is_exact():
    x = torch.randn(4096, dtype=torch.float32) * torch.logspace(-30, 30, 4096)
    parts = _split3(x)
    assert all(p.dtype == torch.bfloat16 for p in parts)
    assert torch.equal(parts[0].float() + parts[1].float() + parts[2].float(), x)


@pytest.mark.parametrize("name", ["mha_bwd_d128", "mha_bwd_d64_causal", "mha_fwd_d128", "mha_fwd_d128_causal"])
def test_as_accurate_as_the_source_in_ieee_fp32(name):
    """Against the term scale s (the judge's): the two fp32 computations differ by a few fp32 roundings of
    s (the order of the sums), a ten-thousandth of the tolerance; against float64 neither is better."""
    task, x = small(name, 300)
    ieee, fast, scales = run_reference(task, x), exact_reference(task, x, allow_cpu=True), term_scales(task, x)
    assert set(fast) == set(ieee)
    for n in ieee:
        s = ieee[n].abs() if scales.get(n) is None else torch.maximum(ieee[n].abs(), scales[n])
        diff = (fast[n] - ieee[n]).abs()
        assert float((diff / (task.tolerance.atol + task.tolerance.rtol * s)).max()) < 1e-3
        assert float((diff / s.clamp_min(1e-30)).max()) < 2e-5
    if task.op_type == "mha_bwd":
        exact = _float64_backward(x, "causal" in task.tags, x["Q"].shape[-1] ** -0.5)
        for n in ("dK", "dV"):  # dQ's term scale is 0 on causal rows that see one key: compared elsewhere
            s = torch.maximum(ieee[n].abs(), scales[n]).double()
            err_ieee = float(((ieee[n].double() - exact[n]).abs() / s).max())
            err_fast = float(((fast[n].double() - exact[n]).abs() / s).max())
            assert err_fast < 2 * err_ieee + 1e-6


def test_it_applies_only_where_its_arithmetic_is_the_sources():
    task, x = small("mha_bwd_d128", 64)
    assert exact_reference(task, x) is None  # no GPU here: the source runs
    assert exact_reference(task, x, allow_cpu=True) is not None
    other = task.model_copy(deep=True)
    other.reference = task.reference.replace("sm_scale", "sm_scale ")  # another text, same function
    assert exact_reference(other, x, allow_cpu=True) is None
    widened = {**x, "Q": x["Q"].float()}  # an fp32 input: its products are not exact in bf16
    assert exact_reference(task, widened, allow_cpu=True) is None
    gemm = get_task("gemm_n7168_k5120")
    assert gemm.op_type not in ("mha_fwd", "mha_bwd")


def test_run_reference_uses_the_source_on_a_cpu():
    task, x = small("mha_fwd_d128", 64)
    from tasks.reference import reference_function

    source = reference_function(task)(**{n: x[n].float() for n in ("Q", "K", "V")}, sm_scale=128 ** -0.5)
    got = run_reference(task, x)
    assert all(torch.equal(got[n], source[n].float()) for n in got)
