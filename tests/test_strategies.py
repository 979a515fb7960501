"""Search strategies (linear, best-of-n, evolve) and the --profile-feedback ablation, on CPU
with a scripted model (the only fake: the model's judgement). Compile, SASS inspection and
SQLite checkpoints are real."""
from __future__ import annotations

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import GEMM_TASK, NO_CODE, broken_probe_reply, events, probe_reply, write_script

from agent import feedback as fb
from agent import replay
from agent.commands.solve import candidate_tree
from agent.run import SolveError, SolveRequest, settings_problem, solve
from agent.trajectory import Budget, CandidateRecord, RunConfig, Verdicts, read_config


def run(tmp_path, replies, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    model = write_script(tmp_path / "script.json", replies)
    budget = Budget(max_turns=kw.pop("max_turns", 4))
    summary = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp_path / "runs", budget=budget,
                                 context="none", **kw), progress=False)
    return summary, tmp_path / "runs" / summary.run_id


def test_evolve_branches_from_drawn_parents_and_replays(tmp_path):
    replies = [broken_probe_reply(), probe_reply(), broken_probe_reply(), probe_reply(), NO_CODE]
    summary, run_dir = run(tmp_path, replies, strategy="evolve", population=2, max_turns=5)
    assert summary.strategy == "evolve" and summary.turns == 5
    cands = [c for t in summary.per_turn for c in t.candidates]
    assert cands[0].parent is None and all(c.parent for c in cands[1:])
    decisions = events(run_dir, "decision")
    for d in decisions[:-1]:
        # the parent of the next turn is drawn from the population, which holds the best so far
        assert d["parent"] in d["population"] and len(d["population"]) <= 2
        assert d["population"][0] == fb.population(
            [c for c in cands if c.turn <= d["turn"]], 2)[0].path
    by_path = {c.path: c for c in cands}
    for d, c in zip(decisions, cands[1:]):
        assert c.parent == d["parent"]  # each candidate answered the parent drawn before its turn
    # each later turn is a branch: turn 1's prompt, the parent's reply, the parent's feedback
    for req in events(run_dir, "llm_request")[1:]:
        parent = by_path[next(d["parent"] for d in decisions if d["turn"] == req["turn"] - 1)]
        msgs = req["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
        assert msgs[2]["content"] == (run_dir / parent.path / "reply.md").read_text()
        assert f"## Result of turn {parent.turn}" in msgs[3]["content"]
    # a compile error is never drawn once compiled candidates fill the population
    assert by_path[decisions[-2]["parent"]].outcome == "unverified"
    tree = candidate_tree(summary)
    assert tree[0].startswith("1-0 compile error") and all(line.startswith("  ") for line in tree[1:2])
    assert summary.best_path in ("candidates/2-0", "candidates/4-0")
    # the same replies through the graph draw the same parents
    report = replay.through_graph(run_dir, runs_dir=tmp_path / "replays")
    assert report.match, report


def test_linear_records_a_chain_of_parents(tmp_path):
    summary, run_dir = run(tmp_path, [broken_probe_reply(), probe_reply()], max_turns=2)
    assert summary.strategy == "linear"
    c1, c2 = (t.candidates[0] for t in summary.per_turn)
    assert c1.parent is None and c2.parent == c1.path
    assert [len(r["messages"]) for r in events(run_dir, "llm_request")] == [2, 4]


def test_best_of_n_is_samples(tmp_path):
    summary, _ = run(tmp_path, [broken_probe_reply(), probe_reply()], max_turns=1, samples=2)
    assert summary.strategy == "best-of-n" and len(summary.per_turn[0].candidates) == 2
    with pytest.raises(SolveError, match="best-of-n needs samples"):
        run(tmp_path, [probe_reply()], strategy="best-of-n")


def test_settings_and_old_configs():
    assert settings_problem(strategy="annealing") and "unknown strategy" in settings_problem(strategy="annealing")
    assert "linear drafts one" in settings_problem(strategy="linear", samples=3)
    assert "population" in settings_problem(strategy="evolve", population=0)
    assert settings_problem(strategy="evolve", samples=3) is None
    old = RunConfig.model_validate({"run_id": "x", "task": "t", "model": "m", "samples": 4})
    assert old.strategy == "best-of-n" and old.profile_feedback is False
    assert RunConfig.model_validate({"run_id": "x", "task": "t", "model": "m"}).strategy == "linear"


def test_parent_draw_is_seeded_and_favours_the_best():
    pop = [CandidateRecord(turn=i, sample=0, path=f"candidates/{i}-0", outcome="unverified",
                           verdicts=Verdicts(compiled=True, arch_sass=True, speedup=float(i))) for i in range(1, 5)]
    ranked = fb.population(pop, 3)
    assert [c.turn for c in ranked] == [4, 3, 2]
    draws = [fb.draw_parent(ranked, seed=0, turn=t).turn for t in range(200)]
    assert draws == [fb.draw_parent(ranked, seed=0, turn=t).turn for t in range(200)]
    assert draws.count(4) > draws.count(3) > draws.count(2) > 0


def test_profile_feedback_on_and_off(tmp_path):
    on, run_on = run(tmp_path / "on", [probe_reply(), NO_CODE], max_turns=2, profile_feedback=True)
    off, run_off = run(tmp_path / "off", [probe_reply(), NO_CODE], max_turns=2, profile_feedback=False)
    assert read_config(run_on).profile_feedback and not read_config(run_off).profile_feedback
    [fb_on], [fb_off] = events(run_on, "feedback"), events(run_off, "feedback")
    # no GPU here: the block is one line saying why, never invented figures
    assert "### Profile" in fb_on["text"] and "No profile: no GPU" in fb_on["text"]
    assert "Profile" not in fb_off["text"]


# ---- sweeps: strategies and profile feedback as dimensions --------------------------------
def test_sweep_dimensions_name_their_runs():
    from agent.sweep import SweepConfig, expand

    cfg = SweepConfig(name="x", tasks=["gemm"], contexts=["docs"], models=["openai/a"], samples=3,
                      strategies=["linear", "best-of-n", "evolve"], profile_feedback=["off", "on"])
    ids = [r.run_id for r in expand(cfg)]
    base = "x/openai-a/gemm_n7168_k5120/sm_90a/docs/"
    assert ids == [base + s for s in ("linear/r0", "linear+profile-on/r0", "r0", "profile-on/r0", "evolve/r0",
                                      "evolve+profile-on/r0")]
    reqs = [r.request(cfg, cfg.runs_dir) for r in expand(cfg)]
    assert [(q.strategy, q.samples, q.profile_feedback) for q in reqs[::2]] == [
        ("linear", 1, False), ("best-of-n", 3, False), ("evolve", 3, False)]
    # a plain sweep keeps the ids it always had
    plain = SweepConfig(name="x", tasks=["gemm"], contexts=["docs"], models=["openai/a"], samples=2)
    assert [r.run_id for r in expand(plain)] == [base + "r0"] and expand(plain)[0].strategy == "best-of-n"
    with pytest.raises(ValueError, match="best-of-n needs samples"):
        SweepConfig(name="x", tasks=["gemm"], models=["openai/a"], strategies=["best-of-n"])


def test_report_keeps_the_profile_ablation_apart_and_averages_sol_scores(tmp_path):
    from agent.report import KEY_NAMES, RunRecord, csv_rows, summarise
    from agent.trajectory import RunSummary, TurnRecord

    def record(i: int, profile: bool, sol: float | None) -> RunRecord:
        cfg = RunConfig(run_id=f"r{i}", task=GEMM_TASK, model="openai/m", profile_feedback=profile)
        cand = CandidateRecord(turn=1, sample=0, path="candidates/1-0", outcome="correct_with_arch", verified=True,
                               verdicts=Verdicts(compiled=True, arch_sass=True, correct=True, correct_with_arch=True,
                                                 arch_executed=True, speedup=1.0, sol_score=sol))
        summary = RunSummary(run_id=cfg.run_id, task=cfg.task, arch=cfg.arch, model=cfg.model, status="finished",
                             per_turn=[TurnRecord(turn=1, candidates=[cand], chosen=0, best=cand)])
        return RunRecord(tmp_path, cfg, summary)

    rows = summarise([record(0, True, 0.4), record(1, True, 0.6), record(2, False, None)], [1])
    by_profile = {r.key[KEY_NAMES.index("profile")]: r for r in rows}
    assert set(by_profile) == {"on", "off"} and by_profile["on"].runs == 2
    assert by_profile["on"].sol_score == pytest.approx(0.5) and by_profile["off"].sol_score is None
    csv = {r["profile"]: r for r in csv_rows(rows)}
    assert csv["on"]["sol_score_mean"] == 0.5 and csv["off"]["sol_score_mean"] == "n/a"


def test_profile_feedback_default_agrees_everywhere():
    from agent.sweep import SweepConfig
    from agent.trajectory import PROFILE_FEEDBACK_DEFAULT

    assert SolveRequest(task="gemm", model="x").profile_feedback is PROFILE_FEEDBACK_DEFAULT
    assert SweepConfig(name="x", models=["openai/a"], tasks=["gemm"]).profile_feedback == [
        "on" if PROFILE_FEEDBACK_DEFAULT else "off"]
