"""Audit of resume and report against changed inputs: a run continued after its prompt templates or
its docs changed would be two experiments under one name, and a report that pools runs of
different docs versions into one cell would state one number for two.

Real `agent solve` runs (scripted replies, real ptxas, real SQLite checkpoints) are stopped where
they can be resumed (the provider refuses turn 2: stop_reason model_error), their recorded versions are
made to differ from this checkout's, and the resume must be refused with a line that says what
changed and how to start afresh. The report tests read real run folders.
"""
from __future__ import annotations

import json
from pathlib import Path

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (GEMM_TASK, PROVIDER_FAILS, agent_cli, broken_probe_reply, events, probe_reply,
                                write_script)
from trajectory_fixtures import eval_result, kernel, reply_for, write_run

from agent.trajectory import read_config, read_summary


def _stopped_run(tmp_path: Path, context: str = "none") -> tuple[Path, Path, Path]:
    """A run whose provider refused turn 2 (model_error): resumable."""
    script = tmp_path / "script.json"
    model = write_script(script, [broken_probe_reply(), PROVIDER_FAILS])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", context,
                  "--runs-dir", str(runs), "--run-id", "r", "--quiet")
    run_dir = runs / "r"
    summary = read_summary(run_dir)
    assert summary is not None and summary.stop_reason == "model_error", (p.stdout, p.stderr)
    write_script(script, [broken_probe_reply(), PROVIDER_FAILS, probe_reply()])  # the reply turn 2 waits for
    return runs, run_dir, script


def _edit_config(run_dir: Path, **changes) -> None:
    path = run_dir / "config.json"
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data, indent=2))


def test_resume_after_the_prompt_templates_changed_is_refused(tmp_path):
    runs, run_dir, _ = _stopped_run(tmp_path)
    recorded = read_config(run_dir).template_hash
    assert len(recorded) == 64
    _edit_config(run_dir, template_hash="0" * 64)  # as if agent/prompts/*_v1.md were edited since
    n_events = len(events(run_dir))
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode != 0
    err = p.stderr + p.stdout
    assert "prompt templates" in err and "000000000000" in err and recorded[:12] in err, err
    assert "start a new run" in err, err
    assert len(events(run_dir)) == n_events  # nothing was asked or written
    assert read_summary(run_dir).stop_reason == "model_error"


def test_resume_after_the_prompt_version_changed_is_refused(tmp_path):
    runs, run_dir, _ = _stopped_run(tmp_path)
    _edit_config(run_dir, prompt_version="v0")
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode != 0 and "prompt templates" in p.stderr + p.stdout and "v0" in p.stderr + p.stdout


def test_resume_of_a_run_without_a_template_hash_is_refused(tmp_path):
    """Every run `agent solve` started records the hash; a config without one cannot show its prompts."""
    runs, run_dir, _ = _stopped_run(tmp_path)
    _edit_config(run_dir, template_hash="")
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode != 0 and "no prompt template hash" in p.stderr + p.stdout


def test_resume_after_the_docs_changed_is_refused_and_a_run_records_its_docs(tmp_path):
    from knowledge.retriever import knowledge_version

    runs, run_dir, _ = _stopped_run(tmp_path, context="docs")
    assert read_config(run_dir).knowledge_version == knowledge_version()
    _edit_config(run_dir, knowledge_version="f" * 64)
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode != 0
    err = p.stderr + p.stdout
    assert "docs" in err and "ffffffffffff" in err and "start a new run" in err, err


def test_resume_with_unchanged_templates_goes_on(tmp_path):
    runs, run_dir, _ = _stopped_run(tmp_path, context="docs")
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr
    s = read_summary(run_dir)
    assert s.status == "finished" and s.stop_reason == "max_turns" and s.turns == 2


def test_resume_of_a_run_recorded_before_docs_versions_goes_on_and_stays_unknown(tmp_path):
    """A run recorded before configs held the docs version resumes (nothing to compare it with), and
    its config keeps no version: the report counts it under "unknown", never under today's docs."""
    runs, run_dir, _ = _stopped_run(tmp_path, context="docs")
    _edit_config(run_dir, knowledge_version=None)
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr
    assert read_config(run_dir).knowledge_version is None and read_summary(run_dir).turns == 2


# ---------------------------------------------------------------------------------------
# Report: docs versions are never pooled
# ---------------------------------------------------------------------------------------
def _c(kind: str, tag: str, speedup: float | None = None):
    s = kernel(tag)
    return (s, eval_result(kind, speedup=speedup), reply_for(s, f"why {tag}"))


def _runs_with_docs(root: Path, versions: dict[str, str | None], context: str = "docs") -> Path:
    for run_id, version in versions.items():
        kind = "correct" if run_id.startswith("good") else "numerical"
        run_dir = write_run(root, run_id, [[_c(kind, run_id, 1.2 if kind == "correct" else None)]], context=context)
        _edit_config(run_dir, knowledge_version=version)
    return root


def test_report_never_pools_runs_of_different_docs_versions(tmp_path):
    from agent.report import cell_key, load_runs, summarise

    root = _runs_with_docs(tmp_path / "runs", {"good1": "a" * 64, "good2": "a" * 64, "bad1": "b" * 64,
                                               "bad2": None})
    runs = load_runs([root])
    keys = {r.config.run_id: cell_key(r) for r in runs}
    assert keys["good1"] == keys["good2"]
    assert len({keys["good1"], keys["bad1"], keys["bad2"]}) == 3
    labels = {r.config.run_id: keys[r.config.run_id][0] for r in runs}
    assert "aaaaaaaaaaaa" in labels["good1"] and "bbbbbbbbbbbb" in labels["bad1"] and "unknown" in labels["bad2"]
    rows = {r.key[0]: r for r in summarise(runs, (1,))}
    assert rows[labels["good1"]].runs == 2 and rows[labels["good1"]].metrics["correct"].successes == 2
    assert rows[labels["bad1"]].runs == 1 and rows[labels["bad1"]].metrics["correct"].successes == 0
    # the CLI's table says the same
    p = agent_cli("report", str(root), "--out", str(tmp_path / "rep"))
    assert p.returncode == 0, p.stderr
    csv_text = (tmp_path / "rep" / "report.csv").read_text()
    assert "aaaaaaaaaaaa" in csv_text and "bbbbbbbbbbbb" in csv_text and "unknown" in csv_text


def test_report_of_one_docs_version_is_not_split(tmp_path):
    from agent.report import cell_key, load_runs

    root = _runs_with_docs(tmp_path / "runs", {"good1": "a" * 64, "bad1": "a" * 64})
    runs = load_runs([root])
    assert len({cell_key(r) for r in runs}) == 1 and all(r.label is None for r in runs)


def test_report_splits_runs_of_different_prompt_templates(tmp_path):
    from agent.report import cell_key, load_runs

    root = tmp_path / "runs"
    for run_id, h in (("good1", "c" * 64), ("bad1", "d" * 64)):
        _edit_config(write_run(root, run_id, [[_c("correct" if run_id == "good1" else "numerical", run_id, 1.0)]]),
                     template_hash=h)
    runs = load_runs([root])
    assert len({cell_key(r) for r in runs}) == 2


def test_docs_version_does_not_split_the_none_arm(tmp_path):
    """The none arm sends no docs: its runs are one experiment whatever the docs were."""
    from agent.report import cell_key, load_runs

    root = _runs_with_docs(tmp_path / "runs", {"good1": "a" * 64, "bad1": "b" * 64}, context="none")
    runs = load_runs([root])
    assert len({cell_key(r) for r in runs}) == 1


def test_report_never_pools_runs_judged_on_different_gpus(tmp_path):
    """A speedup is against the library on the GPU that timed it (resume refuses another GPU for the
    same reason): runs judged on an H100 and on an H200 are two rows, not one geometric mean."""
    from agent.report import cell_key, load_runs, summarise

    root = tmp_path / "runs"
    for run_id, gpu, speedup in (("h100a", "NVIDIA H100 80GB HBM3", 0.5), ("h100b", "NVIDIA H100 80GB HBM3", 0.5),
                                 ("h200", "NVIDIA H200", 2.0)):
        _edit_config(write_run(root, run_id, [[_c("correct", run_id, speedup)]]), gpu=gpu)
    runs = load_runs([root])
    keys = {r.config.run_id: cell_key(r) for r in runs}
    assert keys["h100a"] == keys["h100b"] != keys["h200"]
    speed = {r.key[0]: r.speedup for r in summarise(runs, (1,))}
    assert sorted(round(v, 3) for v in speed.values()) == [0.5, 2.0]
    assert any("H200" in k for k in speed)


def test_report_never_pools_runs_of_different_cost_token_or_time_caps(tmp_path):
    """The turn limits are the report's axis for max_turns; the other caps are not: a run a $0.05 cap
    stopped after one turn, pooled with uncapped runs, would read as the model failing in 8 turns."""
    from agent.report import cell_key, load_runs

    root = tmp_path / "runs"
    for run_id, budget in (("a", {"max_turns": 1}), ("b", {"max_turns": 1}),
                           ("c", {"max_turns": 1, "max_cost": 0.05}), ("d", {"max_turns": 1, "max_tokens": 9000}),
                           ("e", {"max_turns": 1, "max_time_s": 60.0})):
        _edit_config(write_run(root, run_id, [[_c("numerical", run_id)]]), budget=budget)
    keys = {r.config.run_id: cell_key(r) for r in load_runs([root])}
    assert keys["a"] == keys["b"] and len({keys[k] for k in "acde"}) == 4
    assert "max_cost=0.05" in keys["c"][0]


def test_report_leaves_out_fixit_teacher_runs(tmp_path):
    """A Fixit data folder inside the runs reported holds the teacher's repair runs: each opened with
    a student's kernel and its feedback, they are no benchmark runs of the teacher model."""
    from agent.fixit.build import BuildOptions, build
    from agent.report import load_runs
    from agent_loop_helpers import write_script

    from tools.results import CompileResult, EvalResult, InspectResult
    from tools.solution import extract_solution

    root = tmp_path / "runs"
    broken = broken_probe_reply()
    ev = EvalResult(task=GEMM_TASK, arch="sm_90a", requested_features=["wgmma", "tma"], run_reason="did not compile",
                    compile=CompileResult(status="failed", arch="sm_90a", language="cuda", error="nvrtc error"),
                    inspect=InspectResult(status="skipped", reason="did not compile", arch="sm_90a"))
    write_run(root, "student", [[(extract_solution(broken), ev, broken)]], context="none")
    teacher = write_script(tmp_path / "teacher.json", [probe_reply()])
    res = build([root], root / "fixit-data", BuildOptions(teacher=teacher, teacher_turns=1))
    assert res.card["by_source"] == {"teacher": 1}
    assert read_config(root / "fixit-data/teacher_runs/teacher/student/1-0").repair_run is True
    assert [r.config.run_id for r in load_runs([root])] == ["student"]
    # also when the teacher's runs were moved out of the data folder
    moved = tmp_path / "elsewhere"
    (root / "fixit-data/teacher_runs/teacher/student/1-0").rename(moved)
    assert [r.config.run_id for r in load_runs([root, moved])] == ["student"]


def test_a_run_is_not_measured_past_its_own_turn_budget(tmp_path):
    """Reported together, a sweep of 1-turn runs and one of 2-turn runs: at turn limit 2 the 1-turn
    runs had no second turn to fix anything in, so they are not counted as runs that failed there."""
    from agent.report import load_runs, summarise

    root = tmp_path / "runs"
    write_run(root, "short", [[_c("numerical", "s1")]])  # max_turns 1, stopped by it
    write_run(root, "long", [[_c("numerical", "l1")], [_c("correct", "l2", 1.1)]])  # max_turns 2
    rows = {r.turn_limit: r for r in summarise(load_runs([root]), (1, 2))}
    assert rows[1].runs == 2 and rows[1].metrics["correct"].successes == 0
    assert rows[2].runs == 1 and rows[2].unfinished == 1 and rows[2].metrics["correct"].rate == 1.0
