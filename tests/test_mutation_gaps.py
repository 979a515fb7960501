"""Tests that fail when a verdict-deciding rule is broken (issue 28's planted bugs, caught here).

Each group names the rule it pins down. Every test was checked by planting the bug in a scratch
copy of the module: it fails with the bug and passes without (docs/BENCHMARKS.md, "Mutation
scores", keeps the score per module).
"""
from __future__ import annotations

import json
import random
import statistics
import time

import pytest
from agent_loop_helpers import NO_CODE, probe_reply

from agent.budget import Clock, Spent, exhausted, recursion_limit
from agent.sweep import load_sweep_config, models_to_run, plan, run_state, run_sweep
from agent.trajectory import Budget, read_summary
from tools import expressions
from tools.expressions import MAX_MAGNITUDE, MAX_NODES, evaluate
from tools.includes import refused_includes
from tools.timing import PairedTimes, geo_spread, geomean, median_ci, plan_pairs, summarize


# ------------------------------------------------------------------ expressions: bounds hold exactly
def _refusal(expr: str, env: dict | None = None) -> str:
    with pytest.raises(ValueError) as info:
        evaluate(expr, env or {})
    return str(info.value)


def test_the_magnitude_bound_is_2_to_the_64_exactly():
    """An intermediate product just past 2**64 is refused; 2**64 itself is the widest u64 argument."""
    assert MAX_MAGNITUDE == 2**64
    assert evaluate("4294967296 * 4294967296", {}) == 2**64
    assert evaluate("-4294967296 * 4294967296", {}) == -(2**64)
    assert "integer overflow" in _refusal("4294967296 * 4294967296 * 2")
    assert "integer overflow" in _refusal("x * x + 1", {"x": 4294967296})
    # Products that stay far below any looser bound (2**128, 2**256) are refused too.
    assert "integer overflow" in _refusal("x * x * x", {"x": 4294967296})  # 2**96
    assert "integer overflow" in _refusal("x * x * x * x * x", {"x": 4294967296})  # 2**160


def test_a_power_is_refused_before_it_is_computed():
    """The pre-check names the power (base**exp) at the 64-bit edge; only the after-the-fact
    magnitude check would say 'an intermediate value', and would let the power be computed."""
    assert evaluate("2**64", {}) == 2**64
    assert evaluate("3**40", {}) == 3**40  # 63.4 bits
    for expr, shown in [("2**65", "2**65"), ("3**41", "3**41"), ("(-2)**65", "-2**65"), ("2**128", "2**128"),
                        ("x**200", "2**200"), ("16**17", "16**17"), ("2**4096", "2**4096"), ("7**500", "7**500")]:
        message = _refusal(expr, {"x": 2})
        assert f"{shown} exceeds 2**64" in message, (expr, message)
    # The pre-check itself, without the evaluator around it.
    with pytest.raises(ValueError, match="exceeds 2"):
        expressions._check_power(2, 65, "'2**65'")
    expressions._check_power(2, 64, "'2**64'")
    expressions._check_power(1, 10**9, "'1**1e9'")  # |base| < 2 never grows
    expressions._check_power(10, -3, "'10**-3'")  # a float between -1 and 1
    with pytest.raises(ValueError, match="division by zero"):
        expressions._check_power(0, -1, "'0**-1'")


def test_the_node_limit_is_400():
    """A flat expression (depth 2, under the character limit) with more than MAX_NODES syntax
    nodes is refused for its size, before anything is evaluated."""
    assert MAX_NODES == 400
    wide = "[" + ",".join(["1"] * 420) + "]"  # 423 nodes, 841 characters
    assert len(wide) < expressions.MAX_CHARS
    assert "too large" in _refusal(wide)
    ok = "[" + ",".join(["1"] * 390) + "]"  # 393 nodes: the shape passes; a list is then unsupported
    assert "unsupported construct List" in _refusal(ok)
    # A sum of 16 balanced terms (47 nodes, depth 10) is well within both limits.
    def balanced(n: int) -> str:
        return "1" if n == 1 else f"({balanced(n // 2)}+{balanced(n - n // 2)})"
    assert evaluate(balanced(16), {}) == 16


# ------------------------------------------------------------------ budget: a limit hit exactly ends the run
def test_every_limit_is_reached_at_equality():
    b = Budget(max_turns=8, max_tokens=1000, max_cost=0.5, max_time_s=60)
    assert exhausted(b, Spent(turns=7, prompt_tokens=600, completion_tokens=399, cost_usd=0.4999, wall_s=59.9)) is None
    reason, detail = exhausted(b, Spent(turns=1, prompt_tokens=600, completion_tokens=400))
    assert reason == "max_tokens" and detail == "1000 tokens used, limit 1000"
    assert exhausted(b, Spent(turns=1, cost_usd=0.5))[0] == "max_cost"
    assert exhausted(b, Spent(turns=1, wall_s=60.0))[0] == "max_time"
    assert exhausted(b, Spent(turns=8))[0] == "max_turns"
    # The first limit reached is the one named: turns before tokens before cost before time.
    assert exhausted(b, Spent(turns=8, prompt_tokens=1000, cost_usd=1, wall_s=99))[0] == "max_turns"
    assert exhausted(b, Spent(turns=1, prompt_tokens=1000, cost_usd=1, wall_s=99))[0] == "max_tokens"
    assert exhausted(b, Spent(turns=1, cost_usd=1, wall_s=99))[0] == "max_cost"
    # No limit set: only turns count.
    assert exhausted(Budget(max_turns=3), Spent(turns=2, prompt_tokens=10**9, cost_usd=1e9, wall_s=1e9)) is None


def test_a_call_without_a_price_makes_the_cost_unknown_for_good():
    """A self-hosted model litellm has no price for: its call's cost is unknown, so the run's is too,
    from then on (never $0, which would read as free under a cost cap); priced calls add up."""
    s = Spent()
    s.add_cost(0.25)
    s.add_cost(0.5)
    assert s.cost_usd == 0.75  # summed, not subtracted or replaced
    s.add_cost(None)
    assert s.cost_usd is None
    s.add_cost(0.1)
    assert s.cost_usd is None  # a later priced call does not make it known again
    s = Spent(cost_usd=None)
    s.add_cost(None)
    assert s.cost_usd is None


def test_an_unknown_cost_ends_a_run_under_a_cost_cap_and_no_other():
    """Under a cost cap, a run whose cost became unknown stops with max_cost and says why (it cannot
    go on under a cap nobody can check); without a cap an unknown cost stops nothing."""
    b = Budget(max_turns=8, max_cost=0.5)
    reason, detail = exhausted(b, Spent(turns=1, cost_usd=None))
    assert reason == "max_cost" and detail == "cost unknown (a call had no price), limit $0.5000"
    # turns and tokens are still checked first
    assert exhausted(b, Spent(turns=8, cost_usd=None))[0] == "max_turns"
    assert exhausted(Budget(max_turns=8), Spent(turns=1, cost_usd=None)) is None
    assert exhausted(Budget(max_turns=8, max_time_s=60), Spent(turns=1, cost_usd=None, wall_s=60))[0] == "max_time"


def test_the_clock_adds_this_segment_to_what_earlier_segments_used():
    c = Clock(offset=30.0)  # a resumed run that had used 30 s
    first = c.elapsed()
    assert 30.0 <= first < 31.0
    time.sleep(0.05)
    assert 0.05 <= c.elapsed() - first < 1.0
    assert 0.0 <= Clock().elapsed() < 1.0


def test_the_graph_step_limit_is_five_nodes_a_turn_plus_slack():
    """LangGraph's recursion limit: a run of N turns never reaches it, a runaway loop soon does."""
    for turns in (1, 8, 50):
        assert recursion_limit(Budget(max_turns=turns)) == 5 * turns + 10


# ------------------------------------------------------------------ timing: the speedup from pairs
def test_a_faster_candidate_has_a_speedup_above_one():
    """ratios are baseline/candidate per pair: a candidate twice as fast scores 2, not 0.5."""
    t = PairedTimes(candidate_ms=[1.0, 2.0, 0.5, 4.0], baseline_ms=[2.0, 2.0, 2.0, 2.0], warmup=1)
    assert t.ratios == [2.0, 1.0, 4.0, 0.5]
    assert statistics.median(PairedTimes([1.0] * 5, [3.0] * 5, 2).ratios) == 3.0
    # A pair whose candidate time is zero (no timed work) is left out, not divided by.
    assert PairedTimes([0.0, 1.0], [1.0, 1.5], 1).ratios == [1.5]
    assert PairedTimes([1.0, 1.0], [], 1).ratios == []  # no baseline: no ratio


def test_median_interval_brackets_the_median():
    rng = random.Random(0)
    ratios = [1.0 + 0.01 * i for i in range(41)]
    lo, hi = median_ci(ratios, rng)
    assert lo < statistics.median(ratios) < hi and 1.1 < lo and hi < 1.3
    assert median_ci([1.5], rng) == (1.5, 1.5)
    assert all(x != x for x in median_ci([], rng))  # NaN: nothing to bound
    wide = median_ci(ratios, random.Random(1), level=0.99)
    narrow = median_ci(ratios, random.Random(1), level=0.5)
    assert wide[0] <= narrow[0] and narrow[1] <= wide[1]
    # Two pairs are resampled too: the medians of [1, 1], [1, 3], [3, 3] span 1..3.
    assert median_ci([1.0, 3.0], random.Random(0)) == (1.0, 3.0)
    # Every pair can be drawn, the first one included (a lone outlier shows in the upper bound).
    assert median_ci([100.0, 1.0, 1.0], random.Random(0))[1] == 100.0
    # The same seed gives the same interval (the bootstrap draws from `rng`, nothing else).
    assert median_ci(ratios, random.Random(7), resamples=50) == median_ci(ratios, random.Random(7), resamples=50)


def test_median_interval_cuts_equal_tails():
    """Symmetric ratios give an interval symmetric about their median: each tail holds (1 - level) / 2."""
    ratios = [1.0 + 0.001 * k for k in range(-200, 201)]
    for level in (0.95, 0.8):
        lo, hi = median_ci(ratios, random.Random(3), resamples=20000, level=level)
        assert abs((1.0 - lo) - (hi - 1.0)) < 5e-4, (level, lo, hi)
    lo95, hi95 = median_ci(ratios, random.Random(3), resamples=20000, level=0.95)
    lo80, hi80 = median_ci(ratios, random.Random(3), resamples=20000, level=0.8)
    # the median of n draws from a uniform of width w has SE w / (2 sqrt(n)); 1.96 and 1.28 SE either side
    se = 0.4 / (2 * len(ratios) ** 0.5)
    assert hi95 - 1.0 == pytest.approx(1.96 * se, rel=0.15) and hi80 - 1.0 == pytest.approx(1.2816 * se, rel=0.15)


def test_summary_of_run_times():
    t = summarize([4.0, 1.0, 3.0, 2.0])
    assert (t.median_ms, t.iqr_ms, t.runs) == (2.5, 1.5, 4)  # inclusive quartiles 1.75 and 3.25
    assert t.cv == pytest.approx(statistics.pstdev([1, 2, 3, 4]) / 2.5)
    t = summarize([3.0, 1.0, 2.0])  # under four runs: the range
    assert (t.median_ms, t.iqr_ms, t.runs) == (2.0, 2.0, 3) and t.cv == pytest.approx(statistics.pstdev([1, 2, 3]) / 2)
    t = summarize([5.0])
    assert (t.median_ms, t.iqr_ms, t.cv, t.runs) == (5.0, 0.0, 0.0, 1)
    assert summarize([0.0, 0.0]).cv == 0.0  # no division by a zero mean
    assert summarize([1.0, 3.0]).cv == pytest.approx(0.5)  # two runs have a spread
    assert summarize([0.25, 0.75]).cv == pytest.approx(0.5)  # and so do sub-millisecond ones
    assert summarize([2.0, 2.0, 2.0, 2.0, 2.0]).cv == 0.0


def test_geometric_mean_and_spread():
    assert geomean([1.0, 4.0, 16.0]) == pytest.approx(4.0)
    assert geomean([0.5, 2.0]) == pytest.approx(1.0)
    assert geo_spread([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert geo_spread([1.0, 4.0]) == pytest.approx(2.0)  # exp(pstdev([0, ln 4])) = exp(ln 2)
    assert geo_spread([3.0]) == 1.0


def test_pair_counts_follow_the_budget_within_bounds():
    class Fixed:  # the random extra drawn as its largest or as zero
        def __init__(self, top: bool):
            self.top = top

        def randint(self, a, b):
            return b if self.top else a

    assert plan_pairs(0.1, Fixed(False), budget_s=2.0) == 20
    assert plan_pairs(0.1, Fixed(True), budget_s=2.0) == 30  # up to half again, so no kernel knows the last run
    assert plan_pairs(10.0, Fixed(False), budget_s=1.0) == 10  # at least lo
    assert plan_pairs(1e-9, Fixed(False), budget_s=1.0) == 60  # at most hi
    assert plan_pairs(0.5, Fixed(False), budget_s=1.0, lo=1, hi=100) == 2
    # With a real generator, an odd count too: n + a draw from 0..n // 2.
    for seed in range(20):
        assert 15 <= plan_pairs(0.1, random.Random(seed), budget_s=1.5) <= 22


# ------------------------------------------------------------------ includes: `..` and absolute paths
@pytest.mark.parametrize("name, why", [
    ("/usr/include/stdio.h", "absolute paths are not allowed"),
    ("\\\\server\\share\\x.h", "absolute paths are not allowed"),
    ("C:/cuda/include/cuda.h", "absolute paths are not allowed"),
    ("c:x.h", "absolute paths are not allowed"),
    ("../secrets.h", "'..' is not allowed"),
    ("ptxbench/../../etc/passwd", "'..' is not allowed"),
    ("ptxbench\\..\\x.h", "'..' is not allowed"),
    ("..", "'..' is not allowed"),
])
def test_absolute_and_parent_paths_are_refused_by_name(name, why):
    """The reason names the rule broken (not the generic character rule), for both spellings."""
    for src in (f'#include "{name}"\n', f"#include <{name}>\n", f'#if __has_include("{name}")\n#endif\n'):
        [(inc, reason)] = refused_includes(src)
        assert inc.name == name and why in reason, (src, reason)


def test_plain_helper_and_cuda_headers_are_not_refused():
    assert refused_includes('#include <cuda_bf16.h>\n#include "ptxbench/wgmma.cuh"\n#include <cuda/std/cstdint>\n') == []
    assert "longer than" in refused_includes(f'#include "{"a" * 201}.h"\n')[0][1]
    assert "written literally" in refused_includes("#define H <x.h>\n#include H\n")[0][1]
    assert "may only use letters" in refused_includes('#include "a/.hidden.h"\n')[0][1]


# ------------------------------------------------------------------ sweep: --retry-failed redoes failed runs
SWEEP = """\
name = "retry"
models = [{spec = "scripted:prose.json", name = "prose"}]
tasks = ["gemm"]
contexts = ["none"]
replicas = 1
check_models = false
concurrency = 1

[budget]
max_turns = 1
"""


def test_retry_failed_reruns_a_failed_run_and_only_then(tmp_path):
    (tmp_path / "prose.json").write_text(json.dumps({"replies": [NO_CODE]}))
    (tmp_path / "sweep.toml").write_text(SWEEP)
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    [run_id] = list(plan(cfg).states)
    run_dir = tmp_path / "runs" / run_id
    assert plan(cfg).states == {run_id: "new"} and models_to_run(plan(cfg)) == {"prose"}
    seen = []
    first = run_sweep(cfg, progress=lambda o, n, total: seen.append((o.run_id, o.status, n, total)))
    assert seen == [(run_id, "finished", 1, 1)]
    assert (first.total, first.ran, first.skipped, first.resumed, first.failed, first.succeeded) == (1, 1, 0, 0, 0, 1)
    assert first.executor.startswith("local") and first.sweep == "retry" and not first.interrupted
    assert first.outcomes[0].state_before == "new" and first.outcomes[0].turns == 1
    sweep_json = (tmp_path / "runs" / "retry" / "sweep.json").read_text()
    assert json.loads(sweep_json) == {"config": json.loads(cfg.model_dump_json()), "runs": [run_id]}
    assert sweep_json.startswith('{\n  "config": {') and sweep_json.endswith("}\n")  # indented, for people
    assert first.runs_dir == str(tmp_path / "runs") and 0 < first.seconds < 600 and first.warnings == []
    assert first.infra_errors == 0
    assert read_summary(run_dir).status == "finished" and run_state(run_dir) == "done"
    # The run recorded its own crash (a ptxbench bug): a failed run counts as done...
    s = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**s, "status": "failed", "stop_reason": "error",
                                                      "stop_detail": "RuntimeError: a bug"}))
    assert run_state(run_dir) == "done"
    assert models_to_run(plan(cfg)) == set()
    seen.clear()
    again = run_sweep(cfg, progress=lambda o, n, total: seen.append((o.run_id, o.status, n, total)))
    assert (again.ran, again.skipped, again.resumed, again.succeeded) == (0, 1, 0, 0)
    assert again.executor == "none (all done)" and seen == [(run_id, "skipped", 1, 1)]
    o = again.outcomes[0]
    assert o.status == "skipped" and o.error == "RuntimeError: a bug" and o.stop_reason == "error" and o.seconds == 0
    assert read_summary(run_dir).status == "failed"
    # ...unless the sweep is asked to retry failed runs: then it is resumed and finishes.
    assert models_to_run(plan(cfg), retry_failed=True) == {"prose"}
    retried = run_sweep(cfg, retry_failed=True)
    assert (retried.ran, retried.skipped, retried.resumed, retried.failed, retried.succeeded) == (1, 0, 1, 0, 1)
    assert retried.outcomes[0].status == "finished" and retried.outcomes[0].state_before == "partial"
    assert read_summary(run_dir).status == "finished"
    # A finished run is not redone by --retry-failed, so its model needs no check (read from the sweep's runs_dir)
    assert models_to_run(plan(cfg), retry_failed=True) == set()
    # A finished run is not redone by --retry-failed; the caller's model check is passed through.
    done = run_sweep(cfg, retry_failed=True, models_checked=["prose: slow to answer"])
    assert done.ran == 0 and done.warnings == ["prose: slow to answer"]
    # A run killed before its summary is partial (resumed by the next sweep); one never started is new.
    (run_dir / "summary.json").unlink()
    assert run_state(run_dir) == "partial" and run_state(tmp_path / "runs" / "nothing") == "new"
    assert models_to_run(plan(cfg)) == {"prose"}


def test_the_sweep_counts_what_failed_then_and_now_and_its_cost(tmp_path):
    """A run that failed in an earlier invocation and is skipped now still counts as failed (as
    `succeeded` counts runs done before); the result carries the GPU cost of every run it lists."""
    from agent.cost import sweep_cost

    (tmp_path / "prose.json").write_text(json.dumps({"replies": [NO_CODE]}))
    (tmp_path / "sweep.toml").write_text(SWEEP)
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    first = run_sweep(cfg)
    [run_id] = [o.run_id for o in first.outcomes]
    assert first.cost == sweep_cost(tmp_path / "runs", [run_id]).model_dump() and first.cost is not None
    run_dir = tmp_path / "runs" / run_id
    s = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**s, "status": "failed", "stop_reason": "error"}))
    again = run_sweep(cfg)
    assert again.outcomes[0].status == "skipped" and (again.failed, again.succeeded) == (1, 0)


def test_a_partial_run_asked_with_other_prompts_stops_the_sweep_before_anything_runs(tmp_path):
    """Only runs to be resumed are held to their recorded prompts (a new run starts with this
    checkout's): one whose templates changed is named, and nothing runs."""
    from agent.sweep import SweepError

    (tmp_path / "prose.json").write_text(json.dumps({"replies": [NO_CODE]}))
    (tmp_path / "sweep.toml").write_text(SWEEP)
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    [run_id] = [o.run_id for o in run_sweep(cfg).outcomes]
    run_dir = tmp_path / "runs" / run_id
    (run_dir / "summary.json").unlink()  # killed before its summary: partial, to be resumed
    conf = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**conf, "template_hash": "0" * 64}))
    why = f"1 unfinished run would go on with other prompts or docs than it started with: {run_id}: run .* was asked"
    with pytest.raises(SweepError, match=why):
        run_sweep(cfg)
    with pytest.raises(SweepError, match=why):  # and `agent sweep --plan` says so before a sweep is started
        plan(cfg)


def test_a_runs_dir_that_is_a_file_stops_the_sweep_naming_the_flag(tmp_path):
    from agent.sweep import SweepError

    (tmp_path / "prose.json").write_text(json.dumps({"replies": [NO_CODE]}))
    (tmp_path / "sweep.toml").write_text(SWEEP)
    (tmp_path / "runs").write_text("a file")
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    with pytest.raises(SweepError, match=r"^runs_dir .*runs"):
        run_sweep(cfg)


@pytest.mark.parametrize("models,replicas,warning", [
    ('[{spec = "scripted:prose.json", name = "prose"}]', 2,
     "prose sends the same replies in every replica: `agent report` counts its 2 replicas of a cell as one sample"),
    ('[{spec = "scripted:prose.json", name = "prose"}, {spec = "scripted:prose.json", name = "echo"}]', 3,
     "prose, echo send the same replies in every replica: `agent report` counts their 3 replicas of a cell as one "
     "sample"),
    ('[{spec = "scripted:prose.json", name = "prose"}]', 1, None),
])
def test_replicas_of_a_model_that_answers_alike_are_one_sample_and_the_sweep_says_so(tmp_path, models, replicas,
                                                                                      warning):
    """A scripted or replayed model sends the same replies in every replica: its replicas are not
    independent samples, and the sweep warns (singular and plural spelt out); one replica, nothing to say."""
    (tmp_path / "prose.json").write_text(json.dumps({"replies": [NO_CODE]}))
    toml = SWEEP.replace('models = [{spec = "scripted:prose.json", name = "prose"}]', f"models = {models}")
    (tmp_path / "sweep.toml").write_text(toml.replace("replicas = 1", f"replicas = {replicas}"))
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    result = run_sweep(cfg)
    assert result.warnings == ([warning] if warning else [])


class _EvaluatorWithoutEvaluate:
    """An executor whose evaluator is broken: the run that reaches an evaluation crashes (a ptxbench bug)."""

    closed = False

    def evaluator(self):
        return object()

    def close(self):
        self.closed = True

    def describe(self):
        return "broken: an evaluator without evaluate()"


def test_a_crashed_run_is_recorded_failed_and_counted(tmp_path):
    (tmp_path / "probe.json").write_text(json.dumps({"replies": [probe_reply()]}))
    (tmp_path / "sweep.toml").write_text(SWEEP.replace("prose.json", "probe.json"))
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    executor = _EvaluatorWithoutEvaluate()
    result = run_sweep(cfg, executor)
    [o] = result.outcomes
    assert o.status == "failed" and o.stop_reason == "error" and o.error.startswith("AttributeError: ")
    assert (result.ran, result.failed, result.succeeded, result.infra_errors) == (1, 1, 0, 0)
    assert result.executor == executor.describe() and not executor.closed  # the caller's executor stays open
    assert run_state(tmp_path / "runs" / o.run_id) == "done"


def test_ctrl_c_in_a_sweep_stops_runs_resumably(tmp_path):
    """Ctrl-C (here raised by the progress callback, in the sweep's own thread, after the first
    run): the run in flight stops at its next step and says so, runs not started stay new, the
    sweep says it was interrupted, and the next sweep resumes what is left."""
    (tmp_path / "prose.json").write_text(json.dumps({"replies": [NO_CODE]}))
    (tmp_path / "sweep.toml").write_text(SWEEP.replace("replicas = 1", "replicas = 3"))
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    seen, told = [], []

    def progress(o, n, total):
        seen.append((o.run_id, o.status))
        if len(seen) == 1:
            raise KeyboardInterrupt

    result = run_sweep(cfg, progress=progress, on_interrupt=told.append)
    ids = [r for r in plan(cfg).states]
    assert result.interrupted and result.ran == len(result.outcomes) and result.outcomes[0].status == "finished"
    in_flight = [o for o in result.outcomes if o.status == "interrupted"]
    assert told == [len(in_flight)] and len(result.outcomes) == 1 + len(in_flight) <= 2
    assert [s for _, s in seen[1:]] == ["finished"] + ["interrupted"] * len(in_flight)  # each recorded once more
    states = plan(cfg).states
    assert states[ids[0]] == "done" and states[ids[1]] in ("partial", "new") and states[ids[2]] == "new"
    assert result.succeeded == 1 and result.failed == 0
    resumed = run_sweep(cfg)
    assert not resumed.interrupted and (resumed.ran, resumed.skipped) == (2, 1)
    assert [o.status for o in resumed.outcomes] == ["skipped", "finished", "finished"]
