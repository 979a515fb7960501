"""`agent replay`: re-evaluate a recorded run with today's tools; drive the graph again with
the recorded responses and compare the decisions."""
from __future__ import annotations

import json

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (GEMM_TASK, NO_CODE, REPO, agent_cli, broken_probe_reply, events, probe_reply,
                                write_script)

from agent import replay
from agent.run import SolveRequest, solve
from agent.trajectory import Budget


def recorded_run(tmp_path, replies, **kw):
    model = write_script(tmp_path / "script.json", replies)
    s = solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=tmp_path / "runs", context="none",
                           budget=Budget(max_turns=kw.pop("max_turns", len(replies))), **kw), progress=False)
    return tmp_path / "runs" / s.run_id, s


def test_reevaluate_same_tools_same_verdicts(tmp_path):
    run_dir, _ = recorded_run(tmp_path, [broken_probe_reply(), probe_reply(), NO_CODE])
    report = replay.reevaluate(run_dir)
    assert [(c.path, c.before, c.after) for c in report.candidates] == [
        ("candidates/1-0", "compile_error", "compile_error"), ("candidates/2-0", "unverified", "unverified"),
        ("candidates/3-0", "format_error", "format_error")]
    assert report.match and report.evaluation.startswith("skipped: no GPU")
    p = agent_cli("replay", str(run_dir))
    assert p.returncode == 0, p.stderr
    assert "candidates/2-0: same (unverified)" in p.stdout and "no verdict changed" in p.stdout


def test_reevaluate_reports_each_changed_verdict(tmp_path):
    run_dir, _ = recorded_run(tmp_path, [probe_reply()])
    # As if an older inspector had missed the wgmma in the SASS.
    path = run_dir / "candidates/1-0/eval.json"
    ev = json.loads(path.read_text())
    ev["inspect"]["features"]["wgmma"]["present"] = False
    path.write_text(json.dumps(ev))
    report = replay.reevaluate(run_dir)
    [c] = report.candidates
    assert (c.before, c.after) == ("arch_missing", "unverified")
    assert [(x.verdict, x.before, x.after) for x in c.changes] == [("arch_sass", False, True)]
    p = agent_cli("replay", str(run_dir), "--json")
    assert p.returncode == 1  # like diff: 1 when something changed
    assert json.loads(p.stdout)["candidates"][0]["changes"] == [
        {"verdict": "arch_sass", "before": False, "after": True}]


def test_through_graph_reproduces_the_decisions(tmp_path):
    run_dir, recorded = recorded_run(tmp_path, [broken_probe_reply(), probe_reply(), NO_CODE])
    assert recorded.decisions == ["repair", "optimise", "stop"]
    report = replay.through_graph(run_dir, runs_dir=tmp_path / "replays")
    assert report.match and report.replayed == recorded.decisions
    assert [t.replayed for t in report.turns] == ["repair (compile_error)", "optimise (unverified)",
                                                  "stop (format_error)"]
    p = agent_cli("replay", str(run_dir), "--through-graph", "--runs-dir", str(tmp_path / "replays2"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "match: decision sequence reproduced" in p.stdout


def test_through_graph_with_samples_and_a_mismatch(tmp_path):
    run_dir, recorded = recorded_run(tmp_path, [broken_probe_reply(), probe_reply(), NO_CODE, NO_CODE],
                                     max_turns=2, samples=2)
    assert replay.through_graph(run_dir, runs_dir=tmp_path / "a").match
    # A record whose decisions differ from what today's loop decides is caught.
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["decisions"][0] = "repair"
    (run_dir / "summary.json").write_text(json.dumps(summary))
    report = replay.through_graph(run_dir, runs_dir=tmp_path / "b")
    assert not report.match and report.turns[0].recorded.startswith("repair")
    p = agent_cli("replay", str(run_dir), "--through-graph", "--runs-dir", str(tmp_path / "c"))
    assert p.returncode == 1 and "MISMATCH" in p.stdout and "DIFFERENT" in p.stdout


def test_replay_of_a_non_run_is_one_line(tmp_path):
    p = agent_cli("replay", str(tmp_path))
    message = " ".join(p.stderr.split())  # rich may wrap the one message when stderr is not a terminal
    assert p.returncode == 2 and "not a recorded run" in message and "Traceback" not in p.stderr


def test_the_shipped_example_runs_the_whole_loop_on_cpu(tmp_path):
    example = REPO / "runs" / "examples" / "attn_bwd_human"
    assert "--model human" in (example / "README.md").read_text()
    s = solve(SolveRequest(task="attn_bwd", model=f"replay:{example}", runs_dir=tmp_path), progress=False)
    assert s.status == "finished" and s.stop_reason == "replay_end" and s.turns == 2
    run_dir = tmp_path / s.run_id
    kinds = {e["type"] for e in events(run_dir)}
    assert {"retrieval", "llm_request", "llm_response", "compile", "inspect", "run", "decision", "feedback"} <= kinds
    [simt] = s.per_turn[0].candidates
    assert simt.outcome == "arch_missing" and simt.verdicts.compiled and simt.verdicts.correct is None
    [expert] = s.per_turn[1].candidates  # wgmma + TMA present, but nothing ran: unverified, never correct
    assert expert.verdicts.arch_sass and expert.verdicts.correct is None and not expert.verified
    assert s.evaluation.startswith("skipped: no GPU")
    assert replay.through_graph(example, runs_dir=tmp_path / "replays").match


@pytest.mark.gpu
def test_the_shipped_example_evaluates_and_times_on_a_gpu(tmp_path):
    from tools.results import EvalResult

    example = REPO / "runs" / "examples" / "attn_bwd_human"
    s = solve(SolveRequest(task="attn_bwd", model=f"replay:{example}", runs_dir=tmp_path), progress=False)
    assert len(s.per_turn) == 2, f"{s.status}: {s.stop_reason}: {s.stop_detail}"  # say why a run ended early
    [c] = s.per_turn[0].candidates
    assert s.evaluation == "ok" and c.verified
    assert c.verdicts.correct is True and c.verdicts.arch_sass is False and c.outcome == "arch_missing"
    ev = EvalResult.model_validate_json((tmp_path / s.run_id / c.path / "eval.json").read_text())
    assert ev.gpu and all(w.timing is not None for w in ev.workloads if w.split == "visible")
    fb1 = events(tmp_path / s.run_id, "feedback")[0]
    assert "Correctness: passed" in fb1["text"] and "### Speed" in fb1["text"] and "`wgmma`: MISSING" in fb1["text"]
    [expert] = s.per_turn[1].candidates  # the expert kernel: correct with the requested instructions, timed
    assert expert.verified and expert.verdicts.correct is True and expert.verdicts.arch_sass is True
    assert expert.verdicts.speedup and expert.verdicts.speedup > 0.5


def test_the_replay_runs_with_every_recorded_setting(tmp_path, monkeypatch):
    """A replay through the graph runs with the recorded run's settings, those that shape the
    prompts (history, docs per turn, model parameters) and the evaluation (memcheck) included:
    otherwise its config mislabels the replay and its prompts differ from the recorded ones."""
    import shutil

    import agent.run

    src = tmp_path / "run"
    shutil.copytree(REPO / "runs" / "examples" / "attn_bwd_human", src)
    config = json.loads((src / "config.json").read_text())
    changed = dict(history="latest", context_turn_tokens=500, memcheck=False, model_params={"max_tokens": 900},
                   hints=["warp_specialization"], require="off", context="full", context_tokens=3000, samples=2,
                   strategy="best-of-n", population=3, profile_feedback=False, seed=7, temperature=0.5,
                   executed_check=False, lang="ptx", arch="sm_90a")
    config.update(changed)
    (src / "config.json").write_text(json.dumps(config))
    seen = {}

    def capture(req, progress=False):
        seen["req"] = req
        raise RuntimeError("captured")

    monkeypatch.setattr(agent.run, "solve", capture)
    with pytest.raises(RuntimeError, match="captured"):
        replay.through_graph(src, runs_dir=tmp_path / "replays")
    req = seen["req"]
    assert {k: getattr(req, k) for k in changed} == changed
    # Every setting a run records and a request takes is checked above, or replayed otherwise on
    # purpose: a new one added to both fails here until it is carried over (--hint once was not).
    from dataclasses import fields

    from agent.run import SolveRequest
    on_purpose = {"model": "replay:<folder>", "runs_dir": "--runs-dir", "run_id": "a fresh id",
                  "command": "the replay's own", "api_base": "no provider", "model_options": "no provider",
                  "model_name": "the replay's", "budget": "no time limit (wall time is not reproducible)",
                  "task": "the same task, checked by load_recorded"}
    both = {f.name for f in fields(SolveRequest)} & set(config)
    assert both - set(on_purpose) == set(changed), both - set(on_purpose) ^ set(changed)
    assert req.task == config["task"] and req.budget.max_turns == config["budget"]["max_turns"]
