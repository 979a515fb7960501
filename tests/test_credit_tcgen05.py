"""Issue 41: tcgen05.mma earns credit by the same work-share rule as wgmma (at least 90% of the
task's matrix FLOPs, at most 2.5x them in whole tiles, at least 85% of all the math), checked on
synthetic counters; where no tcgen05 FLOP counter was read (every machine today) the verdict says
"unverified on this GPU" and gives no credit, where before executing once was enough."""
from __future__ import annotations

import pytest

from tools.credit import MMA_FLOPS, WORK_SHARE, TaskWork, carries, mma_carries, verdict

WORK = TaskWork(flops=1e12, read_bytes=1e9)


@pytest.mark.parametrize("feature", sorted(MMA_FLOPS))
def test_both_matrix_instructions_share_one_rule(feature):
    m = lambda x, other=0.0: {MMA_FLOPS[feature]: x * WORK.flops, "other_flops": other}  # noqa: E731
    assert WORK_SHARE[feature] == WORK_SHARE["wgmma"]
    assert carries(feature, m(1.0), WORK) == (True, None)
    ok, why = carries(feature, m(0.05), WORK)  # a decoy: a few MMAs beside a SIMT kernel
    assert not ok and why == f"{feature} carried 5.0% of the task's matrix FLOPs (needs 90%)"
    ok, why = carries(feature, m(3.0), WORK)  # garbage MMAs beside the real math
    assert not ok and "3.0x the task's matrix FLOPs" in why
    ok, why = carries(feature, m(1.0, other=0.5 * WORK.flops), WORK)  # the math done on FFMA beside it
    assert not ok and "66.7% of the math the kernels did" in why
    ok, why = carries(feature, {MMA_FLOPS[feature]: WORK.flops}, WORK)
    assert not ok and why == (f"the math done outside {feature} (other tensor-pipe, thread, uniform and reduction "
                              "instructions) could not be measured")


def test_the_rule_function_is_the_same_for_both():
    for share, other in ((1.0, 0.0), (3.0, 0.0), (1.0, 2e12), (1.0, None)):
        a = mma_carries("wgmma", share, share * WORK.flops, other, WORK)
        b = mma_carries("tcgen05_mma", share, share * WORK.flops, other, WORK)
        assert (a is None) == (b is None) and (a or "").replace("wgmma", "X") == (b or "").replace("tcgen05_mma", "X")


def test_tcgen05_without_its_counters_is_unverified_and_not_credited():
    """What a B200 run gets today: tcgen05.mma executed (SASS opcode counts), no FLOP counter."""
    ex = verdict(["tcgen05_mma", "tmem"], {"tcgen05_mma": 64, "tmem": 8}, {}, {"other_flops": 0.0}, WORK)
    assert ex.executed == {"tcgen05_mma": True, "tmem": True}
    assert ex.carries == {"tcgen05_mma": False, "tmem": True}
    assert "unverified on this GPU" in ex.notes["tcgen05_mma"] and ex.shares == {"tcgen05_mma": None}
    # with its FLOPs counted, the same verdict as wgmma's
    ex = verdict(["tcgen05_mma"], {"tcgen05_mma": 64}, {}, {"tcgen05_flops": 1.02e12, "other_flops": 1e9}, WORK)
    assert ex.carries == {"tcgen05_mma": True} and ex.shares["tcgen05_mma"] == pytest.approx(1.02)
