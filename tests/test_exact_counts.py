"""The exact counts of issue 42, item 4, in the worker on CPU (tools.counted.exact_counts): where the
credit op names sites (tools.credit.exact_count_sites: the TMA-pipe instructions of a module that holds
a plain bulk load beside its tensor-map loads), each workload gets one more counted run, under CUPTI's
SASS metrics (tools.cupti.SassCounter, a stand-in here), after the hardware passes: on fresh inputs,
ungated, timed as an instrumented run (never tied) and judged; its per-site records become the
launch's `opcodes`, or `opcodes_missing` where a site had no record or CUPTI refused. The real API is
read in tests/gpu/test_sass_counts_gpu.py."""
from __future__ import annotations

from test_credit_in_process import CountedState, _deferred
from test_evaluator_cpu import gemm

from tools import counted
from tools.cupti import CuptiError, SassRecord, SASS_INST_EXECUTED

SITES = {"gemm": {0x100: "UTMALDG.2D", 0x200: "UBLKCP.S.G"}}
OP_SITES = {"gemm": {"256": "UTMALDG.2D", "512": "UBLKCP.S.G"}}  # as the credit op carries them (JSON)


class FakeSass:
    """SassCounter.collect: the launches inside are counted (the stand-in's `inside`); each returns
    records for the sites it is given: the tensor-map load `per_launch` times per launch, the bulk
    load never (a dead branch), or no record of the bulk load at all (`drop`)."""

    def __init__(self, state, per_launch: int = 4, drop: bool = False, fail: str | None = None):
        self.state, self.per_launch, self.drop, self.fail, self.calls = state, per_launch, drop, fail, 0

    def collect(self, run):
        self.calls += 1
        if self.fail:
            raise CuptiError(self.fail)
        before = len(self.state.counted)
        self.state.inside, self.state.pass_index, self.state.label = True, "exact", "exact"
        try:
            run()
        finally:
            self.state.inside = False
        n = len(self.state.counted) - before
        records = [SassRecord("gemm", 0x100, {SASS_INST_EXECUTED: self.per_launch * n})]
        if not self.drop:
            records.append(SassRecord("gemm", 0x200, {SASS_INST_EXECUTED: 0}))
        return records


def _state(kernel=gemm, **kw):
    state = CountedState(kernel)
    fake = FakeSass(state, **kw)
    state.sass_counter = lambda: fake
    return state, fake


def test_each_workload_gets_one_exact_run_after_the_passes():
    state, fake = _state()
    _deferred(state)
    reply, fatal = counted.run_pending(state, OP_SITES)
    assert not fatal and not reply["failed"] and fake.calls == 2
    passes = [c["pass"] for c in state.counted]
    assert passes[-4:] == [2, 2, "exact", "exact"] and sorted(passes[:-4]) == passes[:-4]  # after every pass
    for name in ("M128", "M70"):
        credit = reply["credits"][name]
        launch = credit["launches"][0]
        assert launch["opcodes"] == {"UTMALDG.2D": 4, "UBLKCP.S.G": 0} and "opcodes_missing" not in launch
        assert credit["exact_runs"] == 1 and len(credit["instrumented_ms"]) == 2
        assert len(credit["run_ms"]) == 2 * credit["ranged_runs"]  # every timed run of the two hardware passes
        assert credit["runs"] == len(credit["run_ms"]) + 2  # and the SASS-patched pass's run, the exact run
    exact = [c for c in state.counted if c["pass"] == "exact"]
    assert all(c["prepared"] for c in exact)  # prepared as every counted run: fresh inputs, outputs filled afresh
    first = [c for c in state.counted if c["pass"] == 0]
    assert not any(e["A"].shape == f["A"].shape and bool((e["A"] == f["A"]).all()) for e in exact for f in first)


def test_no_sites_no_exact_run():
    state, fake = _state()
    _deferred(state)
    reply, _ = counted.run_pending(state)
    assert fake.calls == 0 and "opcodes" not in reply["credits"]["M128"]["launches"][0]


def test_a_site_without_a_record_or_a_refusing_cupti_is_missing():
    state, _ = _state(drop=True)
    _deferred(state)
    reply, _ = counted.run_pending(state, OP_SITES)
    launch = reply["credits"]["M128"]["launches"][0]
    assert launch["opcodes_missing"] == ["gemm+0x200"]
    state, _ = _state(fail="CUPTI_ERROR_NOT_SUPPORTED")
    _deferred(state)
    reply, _ = counted.run_pending(state, OP_SITES)
    launch = reply["credits"]["M70"]["launches"][0]
    assert "opcodes" not in launch and "NOT_SUPPORTED" in launch["opcodes_missing"][0]
    assert reply["credits"]["M70"]["status"] == "ran"  # the hardware passes' counts stand; TMA is refused by the SASS


def test_a_wrong_answer_on_the_exact_run_fails_the_workload():
    def wrong_when_exact(ws, launch):
        out = gemm(ws, launch)
        if state.pass_index == "exact":  # right in every hardware pass, wrong when instrumented
            ws.outputs["C"].mul_(1.5)
        return out

    state, _ = _state(wrong_when_exact)
    _deferred(state)
    reply, _ = counted.run_pending(state, OP_SITES)
    assert reply["failed"]["M128"]["reason"] == "wrong_in_timed_run", reply["failed"]
