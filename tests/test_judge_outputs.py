"""Term scales only where the verdict needs them (tools.correctness.judge_outputs, issue 43): the
verdict is the one compare() gives with the whole outputs' term scales, for every honest and wrong
output of the judge-power catalogue, while the costly whole-output term scales are computed only
where an output fails against |ref| and its failing rows' own term scales do not clear it."""
from __future__ import annotations

import pytest
import torch

from tasks.reference import run_reference, term_scales
from tasks.sampled import rows_at, view_rows
from tests.judge_power import as_written, computed_faults, corrupted, honest_variants, run_reference_of
from tests.test_judge_power import reduced
from tools.correctness import ROW_SCALE_MARGIN, compare, judge_outputs, scale_only_loosens


class Calls:
    """The judge's two scale sources, counting what they were asked."""

    def __init__(self, task, x):
        self.task, self.x, self.full, self.rows = task, x, 0, []

    def term_scales(self):
        self.full += 1
        return term_scales(self.task, self.x)

    def row_scales(self, rows):
        self.rows.append({n: len(r) for n, r in rows.items()})
        return {n: s.scale for n, s in rows_at(self.task, self.x, rows).items()}


def setup(name: str):
    from tasks.generators import generate_inputs

    task, wl = reduced(name)
    axes = task.axis_values(wl)
    x = generate_inputs(task, axes, seed=1)
    return task, axes, x, run_reference(task, x), term_scales(task, x)


def verdicts(task, x, expected, full, got):
    calls = Calls(task, x)
    lazy = judge_outputs(got, expected, task.tolerance, calls.term_scales, calls.row_scales)
    eager = [compare(n, got[n], expected[n], task.tolerance, full.get(n)) for n in got]
    return [m.passed for m in lazy], [m.passed for m in eager], calls, lazy


@pytest.mark.parametrize("name", ["mha_bwd_d64", "mha_fwd_d128", "mha_bwd_d128_causal"])
def test_every_catalogue_output_gets_the_whole_term_scales_verdict(name):
    task, axes, x, expected, full = setup(name)
    outputs = {f"honest {k}": f for k, f in honest_variants(task, x).items()}
    outputs.update({f"wrong {k}": f for k, f in computed_faults(task, x).items()})
    good, stale = as_written(task, expected), as_written(task, run_reference_of(task, axes, 2, "cpu"))
    outputs.update({f"wrong {k}": (lambda o=o: o) for k, o in corrupted(task, good, stale, torch.Generator().manual_seed(1))})
    saved = 0
    for label, make in outputs.items():
        got = {n: t.float() for n, t in as_written(task, make()).items()}
        lazy, eager, calls, _ = verdicts(task, x, expected, full, got)
        assert lazy == eager, label
        assert all(lazy) == label.startswith("honest"), label
        saved += calls.full == 0
    assert saved  # the honest ones at least needed no whole-output term scales


def _cancelling_element(expected, scale, name):
    """The flat index of an element of `name` whose |ref| is far below its term scale."""
    ratio = expected[name].abs() / scale[name]
    return int(ratio.reshape(-1).argmin())


def test_an_error_within_the_term_scale_passes_on_its_rows_scales_alone():
    """An element off by 0.5 * rtol * rss where |ref| << rss fails against |ref| and passes against
    its row's own term scale: the whole output's term scales are never computed."""
    task, _, x, expected, full = setup("mha_bwd_d64")
    got = {n: t.clone() for n, t in expected.items()}
    i = _cancelling_element(expected, full, "dK")
    flat = got["dK"].reshape(-1)
    flat[i] += task.tolerance.atol + 0.5 * task.tolerance.rtol * float(full["dK"].reshape(-1)[i])
    assert not compare("dK", got["dK"], expected["dK"], task.tolerance).passed
    lazy, eager, calls, mism = verdicts(task, x, expected, full, got)
    assert lazy == eager == [True, True, True]
    assert calls.full == 0 and calls.rows == [{"dK": 1}]
    assert [m.judged_against for m in mism] == ["ref", "terms_rows", "ref"]


def test_an_error_beyond_the_term_scale_fails_with_the_whole_term_scales():
    task, _, x, expected, full = setup("mha_bwd_d64")
    got = {n: t.clone() for n, t in expected.items()}
    i = _cancelling_element(expected, full, "dQ")
    got["dQ"].reshape(-1)[i] += task.tolerance.atol + 3 * task.tolerance.rtol * float(full["dQ"].reshape(-1)[i])
    lazy, eager, calls, mism = verdicts(task, x, expected, full, got)
    assert lazy == eager == [False, True, True]
    assert calls.full == 1 and mism[0].judged_against == "terms"


def test_a_broken_aggregate_bound_skips_the_rows_scales():
    """No scale moves the relative-L2 bound: an output over it goes straight to the whole term scales
    (for the figures its failure reports)."""
    task, _, x, expected, full = setup("mha_bwd_d64")
    got = {n: t.clone() for n, t in expected.items()}
    got["dV"] *= 1.02
    lazy, eager, calls, _ = verdicts(task, x, expected, full, got)
    assert lazy == eager and not lazy[2]
    assert calls.rows == [] and calls.full == 1


@pytest.mark.parametrize("name", ["mha_bwd_d64", "mha_fwd_d128_causal", "fp8_gemm_nt_1d2d_n4096_k7168"])
def test_rows_scales_stay_far_inside_the_margin_of_the_whole_computation(name):
    """The row-wise term scale (rows_at) and the whole output's (term_scales) sum the same products
    in another order: they agree far closer than ROW_SCALE_MARGIN, so the margin keeps a row's scale
    below the whole computation's."""
    task, _, x, expected, full = setup(name)
    for out, scale in full.items():
        n = view_rows(scale).shape[0]
        idx = torch.arange(n)
        got = rows_at(task, x, {out: idx})[out].scale
        want = view_rows(scale)[idx]
        rel = ((got - want).abs() / want.clamp_min(1e-30)).max()
        assert float(rel) < ROW_SCALE_MARGIN / 20, (out, float(rel))


def test_a_spread_row_bound_gets_the_term_scales_up_front():
    """FP8 attention's LSE bound tightens with its term scale: not monotone, so judged as before."""
    from tasks import get_task

    task = get_task("fp8_mha_with_lse_d128")
    assert not scale_only_loosens(task.tolerance, "LSE") and scale_only_loosens(task.tolerance, "O")
    got = {"O": torch.zeros(2, 3), "LSE": torch.zeros(2, 3, 4)}
    calls = []
    judge_outputs(got, got, task.tolerance, lambda: calls.append(1) or {}, None)
    assert calls == [1]
