"""The pure decisions of the counted runs (tools/counted.py) and the timed phase's result
(tools/timed.py), fast and in process (each test well under a second): the launch spacing a kernel
sees, the counted runs' time cap, which pair of each stretch is counted, the cost parts' sum, the
credit op's assembly of its reply (the pair correction of each counted run, a wrong run's failure,
the timed phases' results), and what a timed phase reports (speedup, interval, throughput,
implausible, notes, the baseline cache). The session itself (CUPTI, the passes) is
tests/test_credit_in_process.py's (a stand-in profiler, 1 s a test) and the GPU suite's.
"""
from __future__ import annotations

import math
import random
import statistics

import pytest

from tools import counted, timed
from tools.counted import Counted, cost_parts, launch_gaps, mean_counts, over_cap, pass_bands, workload_ranges
from tools.cupti import Launch
from tools.results import Timing, WorkloadResult
from tools.workspace import Failed


# ---------------------------------------------------------------------------------------
# launch_gaps: the spacing a kernel sees, timed runs against counted ones
# ---------------------------------------------------------------------------------------
def test_each_counted_runs_gap_against_the_timed_runs_gaps():
    """Timed runs let go at 0, 10, 20, 40 ms; counted ones at 25 and 100 ms: the gap before a
    counted run is from the run before it, timed or counted; the timed gaps leave the counted
    runs out (the gap before 40 is from 25, a counted run: not a timed gap)."""
    g = launch_gaps([0.0, 0.010, 0.020, 0.040], [0.025, 0.100])
    assert g["counted"] == [5.0, 60.0]
    assert g["timed_median"] == 10.0 and g["timed_max"] == 15.0  # gaps 10, 10, 15
    assert g["counted_beyond_timed"] == 1  # 60 ms: longer than every timed gap


def test_launch_gaps_every_key_with_pass_boundaries():
    """Every key at once, exact: timed runs let go at 0, 10, 20, 1020, 1030, 1040.0004 ms (1020 follows a
    pass boundary), counted runs at 25 and 1035 ms. The boundary's gap (995 ms, from the counted run
    at 25) is reported apart and left out of the ordinary pool (10, 10, 10, 5.0004 ms: gaps into timed
    runs that neither follow a boundary nor are counted); each counted gap's mid-rank in that pool."""
    timed = [0.0, 0.010, 0.020, 1.020, 1.030, 1.0400004]
    g = launch_gaps(timed, [0.025, 1.035], boundary=[1.020])
    assert g == {"timed_median": 10.0, "timed_max": 995.0, "ordinary_median": 10.0, "ordinary_runs": 4,
                 "boundary": [995.0], "counted": [5.0, 5.0], "counted_rank": [0.0, 0.0],
                 "counted_beyond_timed": 0}
    # a counted gap between the pool's values ranks by how many lie below it, ties counting half
    g = launch_gaps([0.0, 0.002, 0.006, 0.012, 0.020], [0.024, 0.034, 0.045], boundary=[])
    assert g["ordinary_runs"] == 4 and g["ordinary_median"] == 5.0  # gaps 2, 4, 6, 8
    assert g["counted"] == [4.0, 10.0, 11.0] and g["counted_rank"] == [0.375, 1.0, 1.0]
    assert g["counted_beyond_timed"] == 2 and g["timed_max"] == 8.0
    # a boundary run that was counted (never drawn so, but recorded apart) is not a boundary gap
    assert launch_gaps([0.0, 0.01, 0.02], [0.05], boundary=[0.05, 0.02])["boundary"] == [10.0]
    # no ordinary gap: no rank, no median
    g = launch_gaps([0.0, 1.0], [1.5], boundary=[1.0])
    assert g["ordinary_runs"] == 0 and g["ordinary_median"] is None and g["counted_rank"] == [None]


def test_launch_gaps_rounding_and_ties():
    g = launch_gaps([0.0, 0.5, 1.0], [1.5])
    assert g["counted"] == [500.0] and g["timed_max"] == 500.0 and g["timed_median"] == 500.0
    assert launch_gaps([0.0, 0.0012344], [])["timed_max"] == 1.234
    assert g["counted_beyond_timed"] == 0  # equal is not beyond


def test_launch_gaps_without_timed_runs_or_without_counted_ones():
    g = launch_gaps([], [0.0, 0.5, 0.6])
    assert g["counted"] == [500.0, 100.0]  # the first counted run has no run before it
    assert (g["timed_median"], g["timed_max"], g["counted_beyond_timed"]) == (None, None, None)
    g = launch_gaps([0.0, 0.002, 0.006], [])
    assert g["counted"] == [] and g["timed_median"] == 3.0 and g["timed_max"] == 4.0 and g["counted_beyond_timed"] == 0
    assert launch_gaps([], [])["counted"] == []


def test_a_counted_run_after_the_timed_ones_is_timed_from_the_last_timed_run():
    g = launch_gaps([0.0, 0.001], [0.5])
    assert g["counted"] == [499.0] and g["counted_beyond_timed"] == 1


# ---------------------------------------------------------------------------------------
# over_cap: the counted runs' wall-time bound (COUNTED_CAP_S)
# ---------------------------------------------------------------------------------------
def test_a_counted_run_fits_while_the_time_so_far_plus_its_own_stays_within_the_cap():
    cap = counted.COUNTED_CAP_S
    assert over_cap("w", 0, 1000.0, [], cap - 1.0, False) is None  # at the cap exactly: fits
    assert over_cap("w", 0, 1000.0, [], cap - 0.999, False) == (
        f"not counted: the counted runs would pass their 30 s cap ({cap - 0.999:.1f} s spent; w's run of pass 1 may "
        "take 1.0 s)")


def test_a_sass_patched_pass_may_take_fifty_times_a_plain_run():
    assert over_cap("M8192", 2, 500.0, [], 4.9, True) is None  # 0.5 s x 50 = 25 s; 4.9 + 25 < 30
    why = over_cap("M8192", 2, 500.0, [], 5.1, True)
    assert why == ("not counted: the counted runs would pass their 30 s cap (5.1 s spent; M8192's run of pass 3 may "
                   "take 25.0 s, 50x its 500.0 ms, SASS-patched)")


def test_an_untimed_workload_is_bounded_by_its_slowest_counted_run_so_far():
    assert over_cap("w", 1, None, [100.0, 700.0, 300.0], 29.2, False) is None  # 0.7 s
    assert "may take 0.7 s)" in over_cap("w", 1, None, [100.0, 700.0, 300.0], 29.31, False)
    assert over_cap("w", 0, None, [], 30.0, True) is None  # nothing known yet: 0 s
    assert over_cap("w", 0, 0.0, [900.0], 29.99, False) is None  # the timed median wins over the runs
    assert over_cap("w", 0, None, [], 30.01, False) is not None


def test_the_cap_is_read_when_the_run_is_weighed(monkeypatch):
    """The cap is the module's constant as it stands (tests/test_credit_in_process.py sets it to 0 to
    see every entry of a session `skipped` with this text, never passed)."""
    monkeypatch.setattr(counted, "COUNTED_CAP_S", 0.0)
    assert over_cap("w", 0, 0.001, [], 0.0, False).startswith("not counted: the counted runs would pass their 0 s cap")


# ---------------------------------------------------------------------------------------
# every timed run counted: a workload's ranges, their mean, each pass's band
# ---------------------------------------------------------------------------------------
def test_a_workloads_ranges_are_its_timed_runs_or_its_counted_ones_never_anothers():
    got = [Launch("counted_run_1#0", {}), Launch("counted_run_1#1", {}), Launch("counted_run_1", {}),
           Launch("counted_run_10#0", {}), Launch("counted_run_0#0", {})]
    assert [x.name for x in workload_ranges(got, "counted_run_1", True)] == ["counted_run_1#0", "counted_run_1#1"]
    assert [x.name for x in workload_ranges(got, "counted_run_1", False)] == ["counted_run_1"]
    assert workload_ranges(got, "counted_run_2", True) == []


def test_the_counts_are_the_mean_over_every_ranged_run():
    """Each metric is read in one pass, on every run of that pass's stretch: the sum over the ranges
    divided by their number is the average timed run's count. A run on another path (0 wgmma, all
    SIMT) moves the mean by its share: it is never left out."""
    runs = [Launch(f"k#{j}", {"gmma": g, "simt": t}) for j, (g, t) in enumerate([(10.0, 0.0)] * 3 + [(0.0, 40.0)])]
    assert mean_counts(runs) == {"gmma": 7.5, "simt": 10.0}
    assert mean_counts(runs[:1]) == {"gmma": 10.0, "simt": 0.0}


@pytest.mark.parametrize("bad", [math.nan, math.inf, None, "n/a"])
def test_a_metric_one_range_could_not_read_is_not_measured(bad):
    runs = [Launch("k#0", {"gmma": 1.0, "tma": 2.0}), Launch("k#1", {"gmma": bad, "tma": 2.0})]
    out = mean_counts(runs)
    assert math.isnan(out["gmma"]) and out["tma"] == 2.0
    runs = [Launch("k#0", {"gmma": 1.0}), Launch("k#1", {})]  # absent from one range: not measured either
    assert math.isnan(mean_counts(runs)["gmma"])


def test_each_pass_is_tied_to_the_range_of_the_other_passes_runs():
    """pass_bands: for each pass, [fastest, slowest] of every run of the other passes
    (tools.credit.timed_band); [] where they are fewer than TIE_BAND_RUNS."""
    assert pass_bands([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]) == [[3.0, 6.0], [1.0, 6.0], [1.0, 4.0]]
    assert pass_bands([[1.0], [2.0], [3.0]]) == [[], [], []]  # two other runs: too few for a band
    assert pass_bands([[1.0, 1.1, 1.2, 1.3], [9.0, 9.0, 9.0, 9.0]]) == [[9.0, 9.0], [1.0, 1.3]]
    assert pass_bands([]) == []


# ---------------------------------------------------------------------------------------
# cost_parts: where the credit op's time went
# ---------------------------------------------------------------------------------------
def test_other_is_what_no_part_names_beyond_the_timed_phases():
    spent = dict.fromkeys(counted.COST_PARTS, 0.0)
    spent.update(padding=0.5, cupti=1.25, release=0.25, other=99.0)  # a stale `other` is ignored
    parts = cost_parts(spent, 10.0, 6.0)
    assert parts["other"] == 2.0 and parts["padding"] == 0.5 and set(parts) == set(counted.COST_PARTS)
    assert cost_parts(spent, 7.0, 6.0)["other"] == 0.0  # never below 0
    assert cost_parts({"cupti": 0.123456}, 1.0, 0.0) == {"cupti": 0.1235, "other": 0.8765}
    assert spent["other"] == 99.0  # the caller's dict untouched
    assert counted.COST_PARTS == ("padding", "cupti", "pass_boundaries", "untimed_runs", "instrumented_run",
                                  "exact_count_run", "phase_finish", "between_pairs", "release", "other")


# ---------------------------------------------------------------------------------------
# run_pending: the credit op's reply
# ---------------------------------------------------------------------------------------
class _State:
    device = "cpu"

    def __init__(self, entries, why=None):
        self.pending, self.why, self.restores = list(entries), why, 0

    def restore(self):
        self.restores += 1
        return self.why


class _Module:
    def __init__(self):
        self.unloaded = 0

    def unload(self):
        self.unloaded += 1


def entry(name, out=None, result=None, failed=None, timed_s=0.0, pad_s=0.0, finish_s=0.0) -> Counted:
    e = Counted(label=f"counted_run_{name}", workload=name, task=None, axes={}, ws=object(), bound=object(), limit=1.0,
                judge=True, rng=random.Random(1), lead=0, out=out if out is not None else {"status": "pending", "reason": None},
                module=_Module(), result=result, failed=failed)
    e.timed_s, e.pad_s, e.finish_s = timed_s, pad_s, finish_s
    return e


def base_result(name, **kw):
    return WorkloadResult(workload=name, split="visible", axes={}, status="passed", **kw)


def test_each_pass_of_a_counted_phase_gets_the_band_of_the_other_passes():
    """run_pending gives every workload whose timed runs were counted the band of each pass (the
    range of the other passes' runs, pass_bands): what the tie holds each pass's median to."""
    from types import SimpleNamespace

    pass_ms = [[9.0, 1.0, 1.1], [1.2, 1.3, 5.0], [1.4, 1.0, 1.0]]
    out = {"status": "pending", "run_ms": [x for p in pass_ms for x in p], "pass_ms": pass_ms}
    e = entry("M1", out=out, result=base_result("M1"))
    e.times = SimpleNamespace(warmup=1)
    reply, fatal = counted.run_pending(_State([e]), count=False)
    assert out["pass_band_ms"] == pass_bands(pass_ms) == [[1.0, 5.0], [1.0, 9.0], [1.0, 9.0]]
    assert reply["credits"]["M1"] is out and not fatal


@pytest.mark.parametrize("out,times", [
    ({"status": "pending", "run_ms": [1.0]}, "timed"),  # nothing ranged: no bands
    ({"status": "pending", "run_ms": [1.0], "pass_ms": []}, "timed"),
    ({"status": "pending", "run_ms": [1.0], "pass_ms": [[1.0] * 5] * 3}, None),  # the phase never finished
])
def test_no_band_without_a_finished_counted_phase(out, times):
    from types import SimpleNamespace

    e = entry("M1", out=out, result=base_result("M1"))
    e.times = SimpleNamespace(warmup=0) if times else None
    counted.run_pending(_State([e]), count=False)
    assert "pass_band_ms" not in out and "tie_band_ms" not in out


def test_the_credit_ops_reply_names_failures_and_returns_the_timed_results(monkeypatch):
    from tools.results import Mismatch

    m = Mismatch(output="C", passed=False, max_abs_err=1.0, max_rel_err=1.0, mismatch_frac=0.5)
    wrong = entry("W", result=base_result("W", speedup_ci=(0.9, 1.1)), failed=Failed("wrong_in_timed_run", "run 3", outputs=[m]), timed_s=2.0,
                  pad_s=0.25, finish_s=0.5)
    wrong.times = object()
    unfinished = entry("U", result=base_result("U"), timed_s=1.0)  # its phase never ran to its end
    untimed = entry("N", failed=Failed("incorrect", "counted run 2"))
    state = _State([wrong, unfinished, untimed])
    mods = [e.module for e in state.pending]
    reply, fatal = counted.run_pending(state, count=False)
    assert state.pending == [] and not fatal and state.restores == 1
    assert all(m_.unloaded == 1 for m_ in mods) and all(e.module is e.ws is e.bound is None for e in (wrong, untimed))
    assert reply["failed"] == {"W": {"reason": "wrong_in_timed_run", "detail": "run 3", "outputs": [m.model_dump(mode="json")]},
                               "N": {"reason": "incorrect", "detail": "counted run 2", "outputs": []}}
    w = WorkloadResult.model_validate(reply["results"]["W"])
    assert (w.status, w.reason, w.detail, w.outputs[0].mismatch_frac) == ("failed", "wrong_in_timed_run", "run 3", 0.5)
    assert w.credit == reply["credits"]["W"]
    assert reply["results"]["W"] == wrong.result.model_dump(mode="json")  # JSON as the protocol sends it
    assert isinstance(reply["results"]["W"]["speedup_ci"], list) and 0 <= reply["seconds"] < 5
    u = WorkloadResult.model_validate(reply["results"]["U"])
    assert (u.status, u.reason, u.detail) == ("failed", "harness_error",
                                              (
        "the timed runs did not finish in the executed check's session: not counted: the SASS decided the check"))
    assert "N" not in reply["results"]
    assert reply["timed_s"] == 3.0
    assert reply["cost_parts"]["padding"] == 0.25 and reply["cost_parts"]["phase_finish"] == 0.5
    assert set(reply["cost_parts"]) == set(counted.COST_PARTS) and reply["seconds"] >= 0
    assert reply["credits"]["N"]["status"] == "skipped"  # count=False: the SASS decided the check


def test_a_context_that_cannot_be_restored_after_the_counted_runs_restarts_the_worker(capsys):
    reply, fatal = counted.run_pending(_State([entry("A")], why="leaked 3 GiB"), count=False)
    assert fatal and capsys.readouterr().err == "[worker] restarting after the counted runs: leaked 3 GiB\n"
    reply, fatal = counted.run_pending(_State([]), count=True)
    assert not fatal and reply["credits"] == {} and reply["timed_s"] == 0


def test_a_workload_that_kept_its_phase_reports_its_own_timed_seconds_less_its_padding(monkeypatch):
    class Phase:
        seconds = 3.0

    e = entry("P", result=base_result("P"))
    e.phase, e.pad_s, e.pad_hidden_s = Phase(), 0.5, 0.125
    e.out["padded_runs"] = 4
    e.times = object()
    monkeypatch.setattr(counted, "time_uncounted", lambda state, entries: None)  # the phase's runs, stood in
    reply, _ = counted.run_pending(_State([e]), count=False)
    assert e.timed_s == 2.5 and e.phase is None and reply["timed_s"] == 2.5
    assert e.out["padding_s"] == [0.5, 0.125]


# ---------------------------------------------------------------------------------------
# defer_counted: what a workload keeps for the credit op
# ---------------------------------------------------------------------------------------
class _Profiler:
    passes = 6


class _DeferState:
    def __init__(self, counters=True):
        self.pending, self.kept = [], 0
        if counters:
            self.counters = lambda metrics: _Profiler()

    def keep_module(self):
        self.kept += 1
        return _Module()


def _defer(state, judge=True, time=True, timing=None):
    result = WorkloadResult(workload="M1", split="visible", axes={}, status="passed", timing=timing)
    req = {"credit": {"seed": 42, "metrics": ["m1"], "evaluation": "ev1"}, "workload": {"name": "M1"}, "time": time}
    kept = counted.defer_counted(state, req, None, {"M": 1}, object(), object(), result, 2.0, judge)
    return kept, result


def test_a_timed_and_judged_workload_counts_timed_runs_others_lead_with_uncounted_ones():
    kept, result = _defer(_DeferState(), timing=Timing(median_ms=1.5, iqr_ms=0, cv=0, runs=5))
    out = result.credit
    assert kept and out["status"] == "pending" and out["lead_runs"] == 0
    assert (out["passes"], out["runs"], out["counted_from"]) == (6, 6, 1)
    for judge, time in ((False, True), (True, False)):
        state = _DeferState()
        kept, result = _defer(state, judge=judge, time=time)
        lead = random.Random(42).randint(*counted.CREDIT_LEAD_RUNS)
        assert result.credit["lead_runs"] == lead and result.credit["runs"] == lead + 6
        assert result.credit["counted_from"] == lead + 1
        (e,) = state.pending
        assert e.lead == lead and e.timed_ms is None and e.evaluation == "ev1" and e.label == "counted_run_0"


def test_the_kept_entry_holds_the_workload_as_its_timed_runs_left_it():
    state = _DeferState()
    state.pending.append("an earlier workload")
    kept, result = _defer(state, timing=Timing(median_ms=1.5, iqr_ms=0, cv=0, runs=5))
    e = state.pending[-1]
    assert e.label == "counted_run_1" and e.timed_ms == 1.5 and e.workload == "M1" and e.limit == 2.0
    assert state.kept == 1 and e.module is not None and e.result is None  # no phase: its result is sent now
    assert e.rng.random() == random.Random(42).random()


def test_no_counters_no_entry_and_the_reason():
    state = _DeferState(counters=False)
    kept, result = _defer(state)
    assert not kept and state.pending == []
    assert (result.credit["status"], result.credit["reason"]) == ("unavailable", "this worker has no hardware counters")


# ---------------------------------------------------------------------------------------
# TimedPhase.finish: what a timed phase reports
# ---------------------------------------------------------------------------------------
class _PTimes:
    def __init__(self, cand, base, **kw):
        self.candidate_ms, self.baseline_ms = cand, base
        self.warmup, self.ungated, self.stop, self.planned = 2, (), "planned", len(cand)
        self.judge_s, self.inputs_s, self.runs_s = 0.5, 0.25, 1.0
        self.__dict__.update(kw)

    @property
    def ratios(self):
        return [b / c for c, b in zip(self.candidate_ms, self.baseline_ms) if c > 0]


class _TState:
    def __init__(self, gpu="NVIDIA H200"):
        self.info = {"gpu": gpu}
        self.gate_error = None

    def gpu_state(self):
        return {"sm_clock": 1980}


def phase(task, base=True, note=None, cache=None, gpu="NVIDIA H200"):
    from tasks.registry import get_task

    task = get_task(task)
    wl = task.workloads[0]
    p = timed.TimedPhase.__new__(timed.TimedPhase)
    p.state, p.req, p.task, p.wl, p.axes = _TState(gpu), {"baseline_cache": cache} if cache else {}, task, wl, task.axis_values(wl)
    p.rng, p.result, p.seconds = random.Random(3), WorkloadResult(workload=wl.name, split="visible", axes={}, status="passed"), 4.0
    p.baseline, p.base_name, p.note = (object() if base else None), "cublas", note
    p.judge = type("J", (), {"full_checks": 2, "marks": type("M", (), {"parts": lambda self, pre: {pre + "runs": 0.5}})()})()
    return p


def test_the_speedup_is_the_median_of_the_pairs_ratios_with_its_interval():
    p = phase("gemm_n7168_k5120")
    cand, base = [2.0, 2.2, 1.8, 2.1, 1.9], [1.0, 1.0, 1.0, 1.1, 0.9]
    p.finish(_PTimes(cand, base))
    r = p.result
    assert r.speedup == statistics.median([b / c for c, b in zip(cand, base)])
    from tools.timing import median_ci, summarize

    assert r.speedup_ci == median_ci([b / c for c, b in zip(cand, base)], random.Random(3))
    assert r.timing == summarize(cand) and r.baseline == summarize(base) and r.baseline_name == "cublas"
    flops = p.task.flop_count(p.axes)
    assert r.tflops == flops / (r.timing.median_ms * 1e-3) / 1e12
    assert r.gbps == p.task.min_bytes(p.axes) / (r.timing.median_ms * 1e-3) / 1e9
    assert (r.timed_runs, r.warmup_runs, r.full_checks, r.timing_stop, r.planned_runs) == (5, 2, 2, "planned", 5)
    assert r.phase_s == {"timed": 4.0, "judge": 0.5, "pair_inputs": 0.25, "pair_runs": 1.0, "gpu_runs": 0.5}
    assert r.gpu_state["end"] == {"sm_clock": 1980} and r.detail is None


def test_a_time_above_the_physical_ceiling_is_implausible():
    p = phase("gemm_n7168_k5120")
    with pytest.raises(Failed) as f:
        p.finish(_PTimes([0.001] * 3, [1.0] * 3))
    assert f.value.reason == "implausible" and "tensor peak" in f.value.detail


def test_notes_say_what_the_timing_could_not_hold():
    p = phase("gemm_n7168_k5120", note="tf32 inside", gpu="NVIDIA RTX 9999")
    p.state.gate_error = "no mapped memory"
    p.finish(_PTimes([2.0] * 3, [1.0] * 3, ungated=("baseline:cublas",)))
    assert p.result.detail == ("baseline:cublas waited for the GPU inside its run: timed with its host time from then "
                               "on; timed without the stream gate (no mapped memory): host issue time included; the "
                               "library (cublas) computes below the task's precision: tf32 inside; implausibility not "
                               "checked: no physical ceiling known for NVIDIA RTX 9999")


def test_without_a_library_no_speedup_and_the_reason_is_the_baseline_name():
    p = phase("gemm_n7168_k5120", base=False, note="no library backend runs this task")
    p.finish(_PTimes([2.0] * 3, []))
    assert p.result.speedup is None and p.result.baseline is None
    assert p.result.baseline_name == "no library backend runs this task" and p.result.detail is None
    p = phase("gemm_n7168_k5120", base=True)
    p.finish(_PTimes([2.0] * 3, []))  # the library never timed
    assert p.result.speedup is None and p.result.baseline_name is None


def test_the_library_time_is_cached_for_the_workload(tmp_path):
    from tools.baseline_cache import BaselineCache, cache_key

    cache = tmp_path / "baselines.json"
    p = phase("gemm_n7168_k5120", cache=str(cache))
    p.finish(_PTimes([2.0, 2.0, 2.0], [1.0, 1.2, 1.1]))
    got = BaselineCache(str(cache)).get(cache_key(p.task.name, p.wl.name, p.axes, p.state.info))
    assert got["best"] == "cublas" and got["last"] == {"median_ms": 1.1, "iqr_ms": p.result.baseline.iqr_ms, "runs": 3}


def test_the_librarys_outputs_are_scrubbed_after_each_run_unless_they_are_an_input():
    import torch

    inputs = {"A": torch.ones(4)}
    out = {"C": torch.ones(4), "A_view": inputs["A"]}

    class Lib:
        prepare = staticmethod(lambda: None)

        def run(self):
            return out

    side = timed.library_side("cublas", Lib(), inputs)
    assert side.name == "baseline:cublas"
    side.run()
    side.finish()
    assert torch.equal(out["C"], torch.zeros(4)) and torch.equal(inputs["A"], torch.ones(4))
    side.finish()  # nothing kept from a run: nothing to do


def test_free_bytes_is_zero_off_the_gpu():
    assert timed._free_bytes(_TState()) == 0


# ---------------------------------------------------------------------------------------
# time_uncounted: the credit op where the SASS decided the check: the timed phases only
# ---------------------------------------------------------------------------------------
class _Phase:
    seconds = 0.0

    def __init__(self, value="times", fail=None, raise_in_steps=None):
        self.value, self.fail, self.raise_in_steps, self.finished = value, fail, raise_in_steps, []

    def steps(self):
        yield (0, 3)
        if self.raise_in_steps:
            raise self.raise_in_steps
        yield (1, 3)
        return self.value

    def finish(self, times):
        self.finished.append(times)
        if self.fail:
            raise self.fail


def test_the_timed_phases_run_to_their_end_with_nothing_counted():
    plain, wrong, none = entry("A"), entry("B"), entry("C")
    plain.phase, wrong.phase = _Phase(), _Phase(fail=Failed("implausible", "3000 TFLOP/s"))
    counted.time_uncounted(None, [plain, wrong, none])
    assert plain.times == "times" and plain.phase.finished == ["times"] and plain.failed is None
    assert wrong.failed.reason == "implausible" and not wrong.failed.fatal
    for e in (plain, wrong, none):
        assert (e.out["status"], e.out["reason"]) == ("skipped", "not counted: the SASS decided the check")
    assert counted._drain(iter(_Phase(value=7).steps())) == 7


@pytest.mark.parametrize("exc,reason,why", [
    ("timeout", "timeout", "timed-phase run: hung"),
    ("cuda", "cuda_error", "timed-phase run: CUDA_ERROR_ILLEGAL_ADDRESS (cuStreamSynchronize)"),
])
def test_a_hang_or_a_dead_context_in_a_timed_phase_is_fatal_and_named(exc, reason, why):
    from tools.launch import CudaError
    from tools.timing import KernelTimeout

    err = KernelTimeout("hung") if exc == "timeout" else CudaError("CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize")
    e = entry("A")
    e.phase = _Phase(raise_in_steps=err)
    with pytest.raises(type(err)):
        counted.time_uncounted(None, [e, entry("B")])
    assert (e.failed.reason, e.failed.detail, e.failed.fatal) == (reason, why, True)
    # through the credit op: the session ends, the worker restarts, every entry says whose run it was
    e2, other = entry("A"), entry("B")
    e2.phase = _Phase(raise_in_steps=err)
    reply, fatal = counted.run_pending(_State([e2, other]), count=False)
    assert fatal and reply["credits"]["B"]["status"] == "failed" == reply["credits"]["A"]["status"]
    assert reply["credits"]["B"]["reason"] == "not counted: A's run ended the session"
    assert reply["credits"]["A"]["reason"] == "not counted: the SASS decided the check"  # its own reason kept
    assert reply["failed"]["A"]["reason"] == reason
    assert e2.module is None


def test_a_fatal_session_leaves_the_modules_loaded_context_alone():
    from tools.timing import KernelTimeout

    e = entry("A")
    mod = e.module
    e.phase = _Phase(raise_in_steps=KernelTimeout("hung"))
    other = entry("B")
    other.out["reason"] = None
    reply, fatal = counted.run_pending(_State([other, e]), count=False)
    assert fatal and mod.unloaded == 0  # the context may be dead: nothing is unloaded in it


# ---------------------------------------------------------------------------------------
# Found by the first mutation run (2026-12-03 night)
# ---------------------------------------------------------------------------------------
def test_the_credit_a_deferred_workload_starts_with():
    state = _DeferState()
    seen = []
    state.counters = lambda metrics: seen.append(metrics) or _Profiler()
    phase = object()
    result = WorkloadResult(workload="M1", split="visible", axes={}, status="passed",
                            timing=Timing(median_ms=1.5, iqr_ms=0, cv=0, runs=5))
    req = {"credit": {"seed": 42, "metrics": ["m1", "m2"], "evaluation": "ev1"}, "workload": {"name": "M1"}, "time": True}
    ws, bound, task = object(), object(), object()
    assert counted.defer_counted(state, req, task, {"M": 1}, ws, bound, result, 2.0, True, phase=phase)
    assert seen == [("m1", "m2")]
    assert result.credit == {"status": "pending", "reason": "its counted runs wait for the evaluation's credit op",
                             "runs": 6, "lead_runs": 0, "passes": 6, "counted_from": 1, "run_ms": [],
                             "instrumented_ms": [], "profile_s": None, "launches": []}
    (e,) = state.pending
    assert (e.task, e.axes, e.ws, e.bound, e.judge, e.phase, e.result) == (task, {"M": 1}, ws, bound, True, phase, result)
    assert e.out is result.credit and isinstance(e.profiler, _Profiler) and e.module is not None
    # no phase: the result goes back with the workload now, not from the credit op
    state = _DeferState()
    kept, result = _defer(state, judge=False)
    assert state.pending[0].result is None and state.pending[0].judge is False
    kept, result = _defer(_DeferState(counters=False))
    assert result.credit == {"status": "unavailable", "reason": "this worker has no hardware counters", "runs": 0,
                             "lead_runs": 0, "passes": None, "counted_from": None, "run_ms": [], "instrumented_ms": [],
                             "profile_s": None, "launches": []}


def test_gaps_are_rounded_to_the_microsecond():
    g = launch_gaps([0.0, 0.00123456, 0.00246912], [0.00370368])
    assert g["timed_median"] == 1.235 and g["counted"] == [1.235]


def test_the_cap_weighs_milliseconds_as_thousandths_of_a_second():
    assert over_cap("w", 0, 10000.0, [], 20.0, False) is None  # 20 s + 10 s: at the cap
    assert over_cap("w", 0, 10000.0, [], 20.005, False) is not None


class _Boom(_Module):
    def unload(self):
        raise RuntimeError("context gone")


def test_the_credit_op_counts_through_run_counted_and_its_cost_parts(monkeypatch):
    seen = []

    def run_counted(state, entries, sites):
        seen.append((state, [e.workload for e in entries], sites))
        return {**dict.fromkeys(counted.COST_PARTS, 0.0), "cupti": 1.5, "release": 5.0}

    monkeypatch.setattr(counted, "run_counted", run_counted)
    e = entry("A")
    e.module = _Boom()  # a module that cannot unload: best effort, never an error
    e.pad_s, e.pad_hidden_s = 0.123456, 0.0654321
    e.out["padded_runs"] = 2
    state = _State([e])
    reply, fatal = counted.run_pending(state, {"k": {"16": "UTMALDG", "32": "UBLKCP"}})
    assert seen == [(state, ["A"], {"k": {16: "UTMALDG", 32: "UBLKCP"}})] and not fatal
    assert reply["op"] == "credits" and reply["cost_parts"]["cupti"] == 1.5
    assert 5.0 <= reply["cost_parts"]["release"] < 5.5
    assert e.out["padding_s"] == [0.1235, 0.0654]
    reply, _ = counted.run_pending(_State([entry("B")]))
    assert seen[-1][2] is None
    monkeypatch.setattr(counted, "run_counted", lambda state, entries, sites: None)  # nothing spent reported
    reply, _ = counted.run_pending(_State([entry("C")]))
    assert reply["cost_parts"]["cupti"] == 0.0


def test_a_session_ended_by_a_hang_nobody_owns_names_a_workload(monkeypatch):
    from tools.timing import KernelTimeout

    def run_counted(state, entries, sites):
        raise KernelTimeout("the GPU did not finish")

    monkeypatch.setattr(counted, "run_counted", run_counted)
    reply, fatal = counted.run_pending(_State([entry("A")]))
    assert fatal and reply["credits"]["A"]["reason"] == "not counted: a workload's run ended the session"


def test_free_device_memory_is_read_on_the_gpu_only(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (5 << 30, 80 << 30))
    gpu = _TState()
    gpu.device = "cuda"
    assert timed._free_bytes(gpu) == 5 << 30  # free, not total
    assert timed._free_bytes(_TState()) == 0  # no device: a CPU stand-in


def test_a_library_output_that_cannot_be_scrubbed_is_said(capsys):
    import torch

    inputs = {"A": torch.ones(4)}

    class Lib:
        prepare = staticmethod(lambda: None)

        def run(self):
            return {"C": object()}  # not a tensor: nothing to zero

    side = timed.library_side("cublas", Lib(), inputs)
    side.run()
    side.finish()
    err = capsys.readouterr().err
    assert err.startswith("[worker] could not scrub the library's output: AttributeError: ")


def test_throughput_only_where_the_work_and_the_time_are_known():
    from types import SimpleNamespace as NS

    p = phase("gemm_n7168_k5120", gpu="NVIDIA RTX 9999")  # no ceiling: the figures alone
    for flops, want in ((0, None), (1, 1 / 2e-3 / 1e12)):
        p.task = NS(name="t", flop_count=lambda axes, f=flops: f, min_bytes=lambda axes: 8e6,
                    tolerance=None, op_type="gemm", inputs={}, outputs={})
        p.result = WorkloadResult(workload="w", split="visible", axes={}, status="passed")
        p.finish(_PTimes([2.0] * 3, [1.0] * 3))
        assert p.result.tflops == want and p.result.gbps == 8e6 / 2e-3 / 1e9
    p.result = WorkloadResult(workload="w", split="visible", axes={}, status="passed")
    p.finish(_PTimes([0.0] * 3, []))  # a zero median (a timer's floor): no throughput, no division
    assert p.result.tflops is None and p.result.gbps is None


def test_stretch_boundaries_are_the_release_times_of_each_later_stretchs_first_pair():
    """launch_gaps keeps the gap before each pass boundary apart from the ordinary ones (the passes'
    Start and Stop sit there): the boundary runs are the first pairs of stretches 2..n, by index
    into the candidate's release times; the first stretch's start and the end are no boundaries."""
    from types import SimpleNamespace as NS

    from tools.counted import stretch_boundaries

    released = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0]  # a later run after the phase's last
    e = NS(phase=NS(candidate=NS(released=released)), stretch_ends=[2, 4, 6, 8])
    assert stretch_boundaries(e) == [12.0, 14.0, 16.0]  # the last stretch's end is no boundary
    e.stretch_ends = [2, 4, 20, 30]  # a phase that ended early: boundaries it never reached are absent
    assert stretch_boundaries(e) == [12.0, 14.0]
    e.stretch_ends = [2, 4, 9, 10]  # a boundary at the last run's end: no run follows it
    assert stretch_boundaries(e) == [12.0, 14.0]
    assert stretch_boundaries(NS(phase=None, stretch_ends=[2, 4])) == []
    assert stretch_boundaries(NS(phase=e.phase, stretch_ends=None)) == []
    assert stretch_boundaries(NS(phase=e.phase, stretch_ends=[])) == []


def test_a_later_stretch_may_start_where_it_fits_the_counted_cap():
    """tools.counted.stretch_over_cap: the time spent plus what the first pass's stretch took, at most
    COUNTED_CAP_S (at the bound it fits); past it, one line with the figures."""
    cap = counted.COUNTED_CAP_S
    assert counted.stretch_over_cap("M128", 1, 5, 2.0, cap - 2.0) is None
    assert counted.stretch_over_cap("M128", 1, 5, 0.0, cap) is None
    why = counted.stretch_over_cap("M128", 1, 5, 2.5, cap - 2.0)
    assert why == (f"not counted: the counted runs would pass their {cap:.0f} s cap ({cap - 2.0:.1f} s spent; "
                   "M128's 5 timed pairs of pass 2 may take 2.5 s, as its first pass's did)")
    assert counted.stretch_over_cap("M70", 2, 3, 0.0, cap + 0.1).startswith("not counted:")


# ---------------------------------------------------------------------------------------
# Found by mutation pass 6 (2026-12-04, issue 46)
# ---------------------------------------------------------------------------------------
def test_each_pass_is_banded_by_the_runs_first_in_their_pair_which_decides_the_tie():
    """run_pending bands each pass by the runs made first in their pair (pass_first_ms,
    tools.credit.pass_tie_runs), as the tie takes each pass's median: not by all of them, whose slow
    second places (the power cap) widen the band. A kernel on another path in pass 4 (34 ms first in
    its pairs, the other passes' first places 29.0-29.4 ms) is refused so; banded by every run
    (up to 34.2 ms: the others' second places), it would keep its credit."""
    from types import SimpleNamespace

    from tools import credit
    from tools.results import WorkloadCredit

    pass_ms = [[29.0, 34.0, 29.2], [34.1, 29.1, 34.2], [29.3, 34.0, 29.4], [34.0, 34.2, 34.5]]
    first = [[29.0, 29.2], [29.1], [29.3, 29.4], [34.0, 34.5]]
    out = {"status": "pending", "run_ms": [x for p in pass_ms for x in p], "pass_ms": pass_ms, "pass_first_ms": first}
    e = entry("M1", out=out, result=base_result("M1"))
    e.times = SimpleNamespace(warmup=1)
    counted.run_pending(_State([e]), count=False)
    assert out["pass_band_ms"] == pass_bands(first) != pass_bands(pass_ms)

    def carries(bands) -> bool:
        wc = WorkloadCredit(workload="M1", status="ok", carries={"wgmma": True},
                            pass_ms=[statistics.median(r) for r in credit.pass_tie_runs(pass_ms, first)],
                            pass_band_ms=bands)
        credit.tie_to_timed_run(wc, 29.5)
        return wc.carries["wgmma"]

    assert carries(out["pass_band_ms"]) is False
    assert carries(pass_bands(pass_ms)) is True  # what a band of every run would decide


class _Slow(_Module):
    def unload(self):
        import time

        time.sleep(0.02)
        super().unload()


class _SlowRestore(_State):
    def restore(self):
        import time

        time.sleep(0.02)
        return super().restore()


def test_letting_the_modules_go_and_the_restore_are_the_release_part():
    """cost_parts' `release`: the kept modules unloaded (0.02 s here) and the context restored after
    the counted runs (0.02 s), both added: never subtracted from what the op reports."""
    e = entry("A")
    e.module = _Slow()
    reply, fatal = counted.run_pending(_SlowRestore([e]), count=False)
    assert not fatal and e.module is None
    assert reply["cost_parts"]["release"] >= 0.04


def test_a_counter_set_up_that_fails_otherwise_leaves_the_credit_failed():
    """An error other than CuptiError while the counters are set up (a bug, a broken library)
    propagates to the worker, and the workload's credit says `failed`: never pending, never passed."""
    state = _DeferState()

    def broken(metrics):
        raise RuntimeError("libcupti: symbol not found")

    state.counters = broken
    result = WorkloadResult(workload="M1", split="visible", axes={}, status="passed")
    req = {"credit": {"seed": 42, "metrics": ["m1"]}, "workload": {"name": "M1"}, "time": True}
    with pytest.raises(RuntimeError):
        counted.defer_counted(state, req, None, {}, object(), object(), result, 2.0, True)
    assert result.credit["status"] == "failed" and state.pending == []


def test_launch_gaps_reports_each_figure_to_its_places():
    """Gaps in ms to the microsecond (3 places: the ordinary median and the boundary's gap too), the
    counted gaps' ranks to 4 places. Timed gaps 1.0001234, 2.4567891, 3.1 ms, a counted run 1.5 ms
    after the last, a pass boundary 991.94 ms later."""
    t = [0.0]
    for gap in (1.0001234e-3, 2.4567891e-3, 3.1e-3):
        t.append(t[-1] + gap)
    g = launch_gaps(t + [1.0], [t[-1] + 1.5e-3], boundary=[1.0])
    assert g["ordinary_median"] == 2.457 and g["boundary"] == [991.943]
    assert g["counted"] == [1.5] and g["counted_rank"] == [0.3333]  # one ordinary gap of three below it
