"""Every timed run counted (issue 42 items 3 and 7; tools.counted.run_counted): the credit describes
the runs whose median is reported, all of them, so a kernel that takes its credited path on only a
share p of its runs is judged on the mix. CPU: the stand-in worker of tests/test_credit_in_process.py
(real timed phases, the counted-run code, fake CUPTI that sums each range's runs as CUPTI does)."""
from __future__ import annotations

import random

import pytest
from test_credit_in_process import HONEST, META, NO_BULK, WORK, CountedState, FakeProfiler, request, with_counted_runs
from test_evaluator_cpu import gemm

from tools import credit as rules

# one run of each path, as the hardware counts it: the expert's wgmma + TMA run (HONEST), and a SIMT
# run of the same product (every FMA a thread instruction, every operand byte a global load)
WGMMA_RUN = {m: v for m, v in HONEST.items() if m in rules.credit_metrics()}
SIMT_RUN = {m: 0.0 for m in rules.credit_metrics()} | {rules.THREAD_INST_METRIC: WORK.flops / 2,
                                                        rules.OTHER_READ_METRICS[0]: WORK.read_bytes * 2}


def two_path(p: float, seed: int = 0) -> CountedState:
    """A kernel that takes the wgmma path on a share p of its launches (drawn at random, so no place
    or pause decides it) and the SIMT path on the rest, equally fast; the fake CUPTI sums the counts
    of each range's run in the pass that reads each metric."""
    paths: dict[int, bool] = {}
    draw = random.Random(seed)

    def kernel(ws, n):
        paths[n] = draw.random() < p
        return gemm(ws, n)

    def metrics_of(runs):  # one range: its run in each pass; as CUPTI, each metric read in one pass only
        by_pass = sorted(runs, key=lambda r: r["pass"])
        return {m: (WGMMA_RUN if paths[by_pass[k % len(by_pass)]["launch"]] else SIMT_RUN)[m]
                for k, m in enumerate(rules.credit_metrics())}
    return CountedState(kernel, metrics_of=metrics_of, passes=4, instrumented=())


@pytest.mark.parametrize("p,credited", [(1.0, True), (0.8, False), (0.5, False), (0.0, False)])
def test_a_kernel_on_its_credited_path_on_a_share_p_of_its_runs(p, credited):
    """Its SIMT runs' math lands in the counts: wgmma's share of the task's FLOPs is about p, so below
    WORK_SHARE (0.9) it earns nothing, whichever runs took which path; at p = 1 it is credited."""
    for seed in range(3):
        state = two_path(p, seed)
        result, fatal = with_counted_runs(state, request(seed, timing_seed=seed))
        assert result["status"] == "passed" and not fatal, result
        credit = result["credit"]
        assert credit["status"] == "ran" and len(credit["run_ms"]) == result["warmup_runs"] + result["timed_runs"]
        wc = rules.credit_in_process(META, credit, ["wgmma", "tma"], WORK, result["timing"]["median_ms"],
                                     module_opcodes=NO_BULK)
        assert wc.status == "ok" and wc.carries["wgmma"] is credited, (p, wc.shares, wc.notes)


class DroppingProfiler(FakeProfiler):
    """CUPTI returning fewer ranges of a workload than were pushed (one dropped)."""

    def profile_passes(self, run_pass, name, max_ranges=None):
        return super().profile_passes(run_pass, name, max_ranges)[:-1]


def test_counts_of_fewer_runs_than_were_ranged_are_not_credited():
    """The mean is over every ranged run of a pass: where CUPTI returns fewer ranges than a pass held,
    the counts would describe some runs only, so the workload is not counted (never credited)."""
    state = CountedState(gemm, metrics_of=lambda runs: dict(WGMMA_RUN), passes=4, instrumented=())
    state.profiler = DroppingProfiler(state, 4, (), None)
    result, _ = with_counted_runs(state, request(2))
    credit = result["credit"]
    assert credit["status"] == "failed" and "ranges of 'counted_run_0' where" in credit["reason"], credit
    assert rules.credit_in_process(META, credit, ["wgmma"], WORK, 1.0).status == "skipped"
