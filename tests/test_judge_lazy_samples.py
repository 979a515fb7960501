"""A timed run's sampled verdict computes its rows' term scales only where the verdict needs them
(tools.workspace.judge_run: the rows drawn without scales, tools.workspace.lazy_sample_scales, then
tools.correctness.judge_outputs), and answers exactly as the same rows judged with every scale
computed up front: on the judge-power catalogue (tests/judge_power.py: every honest variant, every
computed fault, every row and element fault) of each family with a sampler, at reduced size, every
row drawn so that the faults are on the rows judged. The cheap path is taken only where it is exact:
a pass without scales or with the failing rows' own scales only, and every failure is reported from
the exact scales, figure for figure as before."""
from __future__ import annotations

import pytest
import torch

from tasks import get_task
from tasks.generators import generate_inputs
from tasks.sampled import draw_rows, has_sampler, rows_at
from tests.judge_power import Judge, as_written, computed_faults, corrupted, honest_variants, run_reference_of
from tests.test_judge_power import REPRESENTATIVES, reduced
from tools.correctness import scale_only_loosens
from tools.workspace import lazy_sample_scales

SAMPLED = sorted(name for name in REPRESENTATIVES.values() if has_sampler(reduced(name)[0]))
# FP8 attention's LSE bound tightens with the scale, so judge_outputs computes every scale up front there:
# the eager verdict by construction (and 200 s of CPU for its catalogues), so it is left out here
LAZY = [n for n in SAMPLED if all(scale_only_loosens(get_task(n).tolerance, o) for o in get_task(n).outputs)]


def test_every_family_with_a_sampler_is_here():
    assert {reduced(n)[0].op_type for n in SAMPLED} == {"gemm", "fp8_gemm", "mha_fwd", "fp8_mha_fwd", "mha_bwd"}
    assert {reduced(n)[0].op_type for n in LAZY} == {"gemm", "fp8_gemm", "mha_fwd", "mha_bwd"}


@pytest.mark.parametrize("name", LAZY)
def test_lazy_scales_judge_the_catalogue_as_the_eager_ones(name):
    torch.manual_seed(0)
    task, wl = reduced(name)
    axes = task.axis_values(wl)
    x = generate_inputs(task, axes, seed=1)
    judge = Judge(task, x, "cpu")
    drawn = draw_rows(task, x, torch.Generator().manual_seed(2), 1 << 30)  # every row
    eager, plain = rows_at(task, x, drawn), rows_at(task, x, drawn, terms=False)
    terms = task.tolerance.scale == "terms"
    for n in task.outputs:  # the very same expected rows, and scales only where asked for
        assert torch.equal(eager[n].expected, plain[n].expected)
        assert plain[n].scale is None
    calls: dict[str, int] = {}
    every, some = lazy_sample_scales(task, x, drawn)
    assert (every is not None) == terms

    def counted(fn, key):
        def call(*a):
            calls[key] = calls.get(key, 0) + 1
            return fn(*a)
        return call

    stale = as_written(task, run_reference_of(task, axes, 2, "cpu"))
    variants = [("honest", v, make()) for v, make in honest_variants(task, x).items()]
    variants += [("wrong", v, make()) for v, make in computed_faults(task, x).items()]
    variants += [("wrong", v, out) for v, out in corrupted(task, as_written(task, judge.expected), stale,
                                                          torch.Generator().manual_seed(3))]
    cheap = 0
    for kind, variant, out in variants:
        for n, t in judge.ws.outputs.items():
            t.copy_(as_written(task, out)[n].to(t.dtype))
        calls.clear()
        old = judge.ws.verdict(None, task.tolerance, inputs=x, samples=eager)
        new = judge.ws.verdict(None, task.tolerance, counted(every, "every") if terms else None, inputs=x,
                               samples=plain, row_scales=counted(some, "some") if terms else None)
        assert (old[0], old[1]) == (new[0], new[1]), (kind, variant)
        assert (old[0] is None) == (kind == "honest"), (kind, variant, old[1])
        if old[0] is not None and old[2]:  # a failure: reported from the exact scales, as before
            assert not terms or calls.get("every") == 1, (variant, calls)
            assert [m.model_dump() for m in new[2]] == [m.model_dump() for m in old[2]], variant
        cheap += old[0] is None and not calls.get("every")
    if terms:
        assert cheap, "no honest variant passed without computing every scale: the cheap path never ran"


def test_rows_moved_for_the_host_compare_keep_their_values_and_verdicts():
    """tools.workspace.rows_to_judge (attention's small samples are compared on the host on a GPU):
    each output's rows, expected values and scales come back whole, in place, as fp32 with the same
    bits, and compare() says the same of them."""
    from tasks.sampled import Sample
    from tools.correctness import compare
    from tools.workspace import rows_to_judge

    gen = torch.Generator().manual_seed(0)
    got = {"dQ": torch.randn(5, 8, generator=gen).bfloat16(), "LSE": torch.randn(5, 1, generator=gen)}
    samples = {"dQ": Sample(torch.arange(5), got["dQ"].float() + 1e-3, torch.rand(5, 8, generator=gen)),
               "LSE": Sample(torch.arange(5), got["LSE"] * 1.5, None)}
    moved, want, given, on = rows_to_judge(got, samples, host=True)
    assert set(given) == {"dQ"} and list(moved) == list(got)
    for n in got:
        assert moved[n].dtype == torch.float32 and torch.equal(moved[n], got[n].float())
        assert torch.equal(want[n], samples[n].expected)
    assert torch.equal(given["dQ"], samples["dQ"].scale)
    assert on({"dQ": samples["dQ"].scale, "LSE": None})["LSE"] is None
    task = get_task("mha_bwd_d128")
    for n in got:
        a = compare(n, got[n], samples[n].expected, task.tolerance, samples[n].scale)
        b = compare(n, moved[n], want[n], task.tolerance, given.get(n))
        assert a.model_dump() == b.model_dump()
    same = rows_to_judge(got, samples)  # on the CPU nothing moves
    assert same[0] is got
