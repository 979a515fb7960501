"""The tie of each counted run to the timed runs made under its conditions (issue 42, 2026-12-03
night; tools.credit.same_place_medians, pair_corrected, tie_to_timed_run). On the H200 the
attention-backward expert at S=8192 draws the card to its power limit, and whichever side runs
second in a pair runs 7-13% slower: a counted run at that place was refused against the median
of every timed run. Here on CPU: the figures of that evaluation, a bimodal honest series, and the
two-path kernels the tie exists for."""
from __future__ import annotations

import pytest
from test_credit_in_process import META, NO_BULK, WORK, _counted

from tools import credit as rules


def pairs(n: int, first=(29.0, 29.6), second=(33.0, 27.4), slow_at: set[int] = frozenset(), slow: float = 1.0):
    """pair_ms of n pairs as tools.timing.paired_steps orders them: the candidate first in even pairs
    (its time `first[0]`, the library after it `first[1]`), second in odd ones (`second`: the
    library ran first, right before it). Pairs in `slow_at` take the candidate's time times `slow`."""
    out = []
    for i in range(n):
        c, lib = first if i % 2 == 0 else second
        out.append([c * (slow if i in slow_at else 1.0), lib])
    return out


def tied(run_ms, run_pairs, pair_ms, warmup=1, timed_ms=None, library_median=28.5):
    """The workload's credit as the worker and tools.credit make it: tie_ms and tie_ref_ms from the
    pairs, then the verdict with its tie."""
    import statistics

    timed_ms = timed_ms or statistics.median(c for c, _ in pair_ms[warmup:])
    cand, libs = rules.same_place_medians(pair_ms, warmup, run_pairs)
    library = [pair_ms[p][1] if p is not None else None for p in run_pairs]
    credit = {**_counted(run_ms, instrumented_ms=()), "tie_ref_ms": cand,
              "tie_ms": rules.pair_corrected(run_ms, library, [x if x is not None else library_median for x in libs])}
    return rules.credit_in_process(META, credit, ["wgmma"], WORK, timed_ms, module_opcodes=NO_BULK)


def test_same_place_medians_take_the_timed_runs_at_the_counted_runs_place():
    """Odd pairs run the candidate second: a counted run in pair 3 or 5 is held to the odd pairs'
    candidate median (33 ms) and its library run to theirs (27.4 ms, the library first); pairs 8
    and 12 to the even ones'. Warm-up pairs are not timed runs; a run outside the pairs has none."""
    pm = pairs(14)
    pm[0] = [90.0, 90.0]  # the warm-up pair: never a reference
    cand, libs = rules.same_place_medians(pm, 1, [3, 5, 8, 12, None])
    assert cand == [33.0, 33.0, 29.0, 29.0, None] and libs == [27.4, 27.4, 29.6, 29.6, None]
    # fewer than MIN_SAME_PLACE_RUNS timed pairs at a place, or no library beside them: none
    assert rules.same_place_medians(pairs(5), 1, [2, 3]) == ([None, None], [None, None])  # two timed pairs a place
    no_library = [[c, None] for c, _ in pairs(14)]
    assert rules.same_place_medians(no_library, 1, [3, 8]) == ([None, None], [None, None])


def test_the_h200_evaluation_that_refused_the_bwd_expert_at_s8192_is_credited():
    """W1 of 2026-12-03 night, a real evaluation: counted pairs 3, 5, 8, 12; runs 33.50 / 31.68 /
    29.92 / 29.69 ms, their pairs' library runs 27.26 / 27.88 / 28.19 / 28.20; timed median 29.85.
    Against the median the first was 1.15x (refused, as on the H200); against the timed runs at its
    place (candidate second: 33 ms, library first: 27.4) it is the timed kernel."""
    pm = pairs(14)
    run_ms, at = [33.50432, 31.6825, 29.92134, 29.6919], [3, 5, 8, 12]
    for k, p in enumerate(at):
        pm[p] = [run_ms[k], [27.26432, 27.87536, 28.18845, 28.1992][k]]
    old = rules.credit_in_process(META, {**_counted(run_ms, instrumented_ms=()), "tie_ms": rules.pair_corrected(
        run_ms, [pm[p][1] for p in at], 28.2)}, ["wgmma"], WORK, 29.853904724121094, module_opcodes=NO_BULK)
    assert old.carries["wgmma"] is False and "29.85 ms (median)" in old.notes["wgmma"]
    new = tied(run_ms, at, pm, timed_ms=29.853904724121094)
    assert new.carries["wgmma"] is True, new.notes
    assert new.tie_ref_ms[0] == pytest.approx(33.0) and new.tie_ref_ms[2] == pytest.approx(29.0)


def test_an_honest_kernel_slow_at_one_place_of_its_pairs_keeps_its_credit_wherever_its_runs_are_counted():
    """Every draw of four counted pairs, each at either place: the honest bimodal series (13% slower
    second) is credited; against the median of all timed runs it would not be whenever a counted run
    was second."""
    import itertools

    pm = pairs(15)
    refused_by_median = 0
    for at in itertools.product([2, 3], [5, 6], [8, 9], [11, 12]):
        run_ms = [pm[p][0] for p in at]
        assert tied(run_ms, list(at), pm).carries["wgmma"] is True, at
        refused_by_median += any(ms > rules.SAME_RUN_RATIO * 29.0 for ms in run_ms)
    assert refused_by_median == 15  # every draw but the one with all four counted pairs first


def test_a_second_path_the_counted_runs_take_is_refused_at_either_place():
    """A kernel that takes a 20% slower path on a few runs (under a tenth of the timed runs), and
    whose counted runs all fall on that path: refused, wherever they sit in their pairs; one 20%
    faster than its place's runs (the timed runs took the slower path) too."""
    at = [3, 6, 9, 12]
    slow = pairs(30, slow_at=set(at), slow=1.2)
    wc = tied([slow[p][0] for p in at], at, slow)
    assert wc.carries["wgmma"] is False and "at the same place of their pairs" in wc.notes["wgmma"]
    assert "is not the one whose instructions were counted" in wc.notes["wgmma"]
    fast = pairs(30, slow_at=set(at), slow=1 / 1.2)
    wc = tied([fast[p][0] for p in at], at, fast)
    assert wc.carries["wgmma"] is False and "took a slower path" in wc.notes["wgmma"]


def test_runs_outside_the_pairs_are_tied_to_the_timed_median():
    """A counted run made after the timed pairs (the sequence ended before its pair) has no place:
    it is held to the timed median, as before."""
    pm = pairs(14)
    wc = tied([29.3, 33.1], [2, None], pm, timed_ms=30.0)
    assert wc.tie_ref_ms == [29.0, None]
    assert wc.carries["wgmma"] is False and "30 ms (median)" in wc.notes["wgmma"]
    assert tied([29.3, 31.0], [2, None], pm, timed_ms=30.0).carries["wgmma"] is True
