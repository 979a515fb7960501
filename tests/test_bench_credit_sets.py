"""scripts/bench_credit.py's --metric-sets arms say how many passes they cost; the next H200
measurement of the counted run's cost rests on that (CUPTI's host API, the real library, no GPU)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tools import credit as ncu, cupti

ROOT = Path(__file__).resolve().parents[1]


def _sets() -> dict[str, tuple[str, ...]]:
    spec = importlib.util.spec_from_file_location("bench_credit", ROOT / "scripts" / "bench_credit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.METRIC_SETS


# (the check reads hardware counters only since 2026-12-03, evening: "no_sass" is the whole set, 4 passes)
@pytest.mark.parametrize("name,passes", [("no_sass", 4), ("gmma_only", 1), ("hw_one_pass", 4), ("sass_one_pass", 1)])
def test_each_arm_costs_the_passes_it_is_named_for(name, passes):
    try:
        cupti.library()
    except cupti.CuptiError as exc:
        pytest.fail(f"libcupti is a dev dependency (nvidia-cuda-cupti): {exc}")
    assert cupti.passes("GH100", list(_sets()[name])) == passes


def test_the_two_one_pass_halves_cover_the_checks_counters_but_the_ones_they_trade():
    """Together they read every counter of the check except the mma.sync ops (0 where the module's
    SASS has no warp-level MMA), tf32 wgmma ops and the LSU read bytes (read by the SASS half as
    instruction bytes instead)."""
    sets = _sets()
    covered = set(sets["hw_one_pass"]) | set(sets["sass_one_pass"])
    traded = set(ncu.CUPTI_METRICS) - covered
    assert traded == {ncu.HGMMA_OPS_METRICS[2], ncu.OTHER_READ_METRICS[0]}, traded
