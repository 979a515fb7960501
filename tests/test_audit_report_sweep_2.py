"""agent sweep and agent report, audited again for numbers they could get wrong or runs they could lose.

1. A report pooled two different `replay:` recordings that share a folder name (sweep runs are all
   r0, r1 ...) into one row: the report's notion of a model's identity was the file name only.
2. A `replay:` or `scripted:` model sends the same replies in every replica; a sweep's replicas of
   it were reported as independent samples (95% intervals n times too narrow).
3. A run folder whose summary.json could not be read stopped the whole sweep (before any run, or
   from a worker thread), instead of being that one run's recorded failure.
4. A sweep resuming runs whose prompt templates or docs changed showed agent.run.resume's refusal
   as each run's error after the others ran; it is refused up front, naming the runs.

Real sweeps (agent.sweep.run_sweep, the `agent` CLI), scripted replies, real run folders.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import NO_CODE, cli_env, write_script

from agent.sweep import load_sweep_config, run_sweep

CELL = "gemm_n7168_k5120/sm_90a/none"


def _sweep_config(d: Path, extra: str = "", models: str = '[{spec = "scripted:prose.json", name = "prose"}]',
                  contexts: str = '["none"]'):
    (d / "sweep.toml").write_text(
        f'name = "s"\nmodels = {models}\ntasks = ["gemm"]\ncontexts = {contexts}\nconcurrency = 1\n'
        f'executed_check = false\ncheck_models = false\n{extra}\n[budget]\nmax_turns = 1\n')
    return load_sweep_config(d / "sweep.toml", runs_dir=str(d / "runs"))


# ---- 3. an unreadable summary.json ---------------------------------------------------------------
def test_a_run_with_an_unreadable_summary_is_that_runs_failure_not_the_sweeps(tmp_path):
    """r0's summary.json is corrupt (a truncated copy, a disk fault) and its resume is refused (it was
    judged on a GPU this machine lacks). The sweep raised RunFolderError while it planned, so no run
    of the grid could be run or even listed; r1, finished, must be skipped, r0 recorded as an error."""
    write_script(tmp_path / "prose.json", [NO_CODE] * 4)
    cfg = _sweep_config(tmp_path, "replicas = 2")
    assert run_sweep(cfg).succeeded == 2
    r0 = tmp_path / "runs" / "s" / "prose" / CELL / "r0"
    raw = json.loads((r0 / "config.json").read_text())
    (r0 / "config.json").write_text(json.dumps({**raw, "gpu": "NVIDIA H200"}))
    (r0 / "summary.json").write_text('{"run_id": "s/pro')  # cut off

    from agent.sweep import plan

    assert plan(cfg).states[f"s/prose/{CELL}/r0"] == "partial"  # --dry-run lists it
    result = run_sweep(cfg)
    by_id = {o.run_id.rsplit("/", 1)[1]: o for o in result.outcomes}
    assert by_id["r1"].status == "skipped" and by_id["r1"].succeeded
    assert by_id["r0"].status == "error" and "judged on NVIDIA H200" in by_id["r0"].error, by_id["r0"]
    assert "summary.json" in by_id["r0"].error  # what else is wrong with the folder is said too
    assert (result.total, result.failed, result.succeeded) == (2, 1, 1)


def test_an_unreadable_summary_of_a_resumable_run_is_rebuilt_by_its_resume(tmp_path):
    """Without another fault the run's resume goes on from its checkpoint and writes a new summary."""
    from agent.trajectory import read_summary

    write_script(tmp_path / "prose.json", [NO_CODE] * 4)
    cfg = _sweep_config(tmp_path)
    assert run_sweep(cfg).succeeded == 1
    r0 = tmp_path / "runs" / "s" / "prose" / CELL / "r0"
    before = read_summary(r0)
    (r0 / "summary.json").write_text("{ not json")
    [outcome] = run_sweep(cfg).outcomes
    assert outcome.status == "finished" and outcome.succeeded, outcome
    after = read_summary(r0)
    assert (after.turns, after.stop_reason, after.best) == (before.turns, before.stop_reason, before.best)


# ---- 1. two recordings under one folder name -----------------------------------------------------
def _record(tmp_path: Path, run_id: str, replies: list[str]) -> Path:
    """A real one-turn `agent solve` run with scripted replies: what a replay: model reads."""
    from agent.run import SolveRequest, solve
    from agent.trajectory import Budget

    script = write_script(tmp_path / f"{run_id.replace('/', '_')}.json", replies)
    solve(SolveRequest(task="gemm", model=script, context="none", budget=Budget(max_turns=1), executed_check=False,
                       runs_dir=tmp_path / "rec", run_id=run_id), progress=False)
    return tmp_path / "rec" / run_id


def test_a_report_keeps_two_recordings_of_one_folder_name_apart(tmp_path):
    """Sweeps s1 and s2 replay model `rep` from a/r0 (a kernel that compiles) and from b/r0 (prose).
    The report pooled both into one row: compiled 50% (1/2) for a model that is two models."""
    from agent.report import write_report
    from agent_loop_helpers import probe_reply

    a, b = _record(tmp_path, "a/r0", [probe_reply()]), _record(tmp_path, "b/r0", [NO_CODE])
    for name, rec in (("s1", a), ("s2", b)):
        cfg = _sweep_config(tmp_path, models=f'[{{spec = "replay:{rec}", name = "rep"}}]')
        assert run_sweep(cfg.model_copy(update={"name": name})).succeeded == 1
    report = write_report([tmp_path / "runs"], tmp_path / "report", turn_limits=[1])
    compiled = sorted((r.metrics["compiled"].successes, r.metrics["compiled"].n) for r in report.rows)
    assert compiled == [(0, 1), (1, 1)], [(r.key[0], r.metrics["compiled"]) for r in report.rows]
    labels = sorted(r.key[0] for r in report.rows)
    assert "a/r0" in labels[0] + labels[1] and "b/r0" in labels[0] + labels[1], labels


# ---- 4. runs to resume whose prompts or docs changed ---------------------------------------------
def _as_if_recorded_with(run_dir: Path, **fields) -> None:
    """The run was started from another checkout (other prompt templates or docs) and killed before
    its summary: what agent.run.resume refuses to go on with here."""
    raw = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**raw, **fields}))
    (run_dir / "summary.json").unlink()


def test_a_sweep_refuses_up_front_to_resume_runs_whose_prompts_or_docs_changed(tmp_path):
    """Each such run was resumed in turn and failed with resume's refusal, after the others ran: a
    sweep half run, and the refusal one error line among many. Refused before any run starts now,
    naming each run and what changed; runs that ended (nothing to resume) are no reason to refuse."""
    import pytest

    from agent.sweep import SweepError, plan

    write_script(tmp_path / "prose.json", [NO_CODE] * 8)
    cfg = _sweep_config(tmp_path, "replicas = 2", contexts='["none", "docs"]')
    assert run_sweep(cfg).succeeded == 4
    runs = tmp_path / "runs" / "s" / "prose" / "gemm_n7168_k5120" / "sm_90a"
    _as_if_recorded_with(runs / "none" / "r0", template_hash="0" * 64)
    _as_if_recorded_with(runs / "docs" / "r1", knowledge_version="f" * 64)
    (runs / "docs" / "r0" / "summary.json").unlink()  # killed, same checkout: resumable
    finished = json.loads((runs / "none" / "r1" / "config.json").read_text())
    (runs / "none" / "r1" / "config.json").write_text(json.dumps({**finished, "template_hash": "1" * 64}))
    events_before = {p: p.read_text() for p in runs.rglob("events.jsonl")}

    for attempt in (lambda: plan(cfg), lambda: run_sweep(cfg)):
        with pytest.raises(SweepError) as refused:
            attempt()
        message = str(refused.value)
        assert "s/prose/gemm_n7168_k5120/sm_90a/none/r0" in message and "prompt templates" in message, message
        assert "s/prose/gemm_n7168_k5120/sm_90a/docs/r1" in message and "docs version" in message, message
        assert "/docs/r0" not in message and "/none/r1" not in message, message
    cli = subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "sweep.toml"], cwd=tmp_path, env=cli_env(),
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr, cli.stderr[-2000:]
    assert " ".join(cli.stderr.split()).startswith("error:") and "2 unfinished runs" in cli.stderr, cli.stderr
    assert {p: p.read_text() for p in runs.rglob("events.jsonl")} == events_before, "a run went on"
    assert not (runs / "docs" / "r0" / "summary.json").exists()


# ---- 2. replicas of a model that sends the same replies in every replica -------------------------
def test_replicas_of_a_scripted_model_are_one_sample_in_the_report(tmp_path):
    """Three replicas of a scripted model send the same kernel: one draw of the model, not three. The
    report counted 3/3 compiled (Wilson 44%-100%) as if three independent runs had compiled."""
    from agent.report import write_report
    from agent_loop_helpers import probe_reply

    write_script(tmp_path / "probe.json", [probe_reply()])
    cfg = _sweep_config(tmp_path, "replicas = 3", models='[{spec = "scripted:probe.json", name = "probe"}]')
    result = run_sweep(cfg)
    assert result.succeeded == 3
    assert any("probe sends the same replies in every replica" in w for w in result.warnings), result.warnings
    report = write_report([tmp_path / "runs"], tmp_path / "report", turn_limits=[1])
    [row] = report.rows
    assert (row.runs, row.samples) == (3, 1)
    assert (row.metrics["compiled"].successes, row.metrics["compiled"].n) == (1, 1)
    assert row.metrics["compiled"].wilson()[0] < 0.25  # one sample's interval, not three's
    md = report.files["md"].read_text()
    assert "| 3 (as 1 sample: same replies) |" in md and "count as one sample" in md, md
    csv_row = (tmp_path / "report" / "report.csv").read_text().splitlines()
    assert "samples" in csv_row[0].split(",")


def test_replicas_of_a_scripted_model_with_other_replies_stay_apart(tmp_path):
    """Runs of one scripted model name that got different replies (its file rewritten between two
    sweeps) are different draws: both are counted, and copies are merged only within the same replies."""
    from agent.report import write_report
    from agent_loop_helpers import probe_reply

    write_script(tmp_path / "probe.json", [probe_reply()])
    cfg = _sweep_config(tmp_path, "replicas = 2", models='[{spec = "scripted:probe.json", name = "probe"}]')
    assert run_sweep(cfg).succeeded == 2
    write_script(tmp_path / "probe.json", [NO_CODE])
    assert run_sweep(cfg.model_copy(update={"name": "s2"})).succeeded == 2
    [row] = write_report([tmp_path / "runs"], tmp_path / "report", turn_limits=[1]).rows
    assert (row.runs, row.samples) == (4, 2)
    assert (row.metrics["compiled"].successes, row.metrics["compiled"].n) == (1, 2)


# ---- 5. a replay that ran out of recorded replies ------------------------------------------------
def test_a_replay_is_not_measured_past_the_turns_it_had_replies_for(tmp_path):
    """A one-turn recording replayed under a 3-turn budget ends at turn 2 with replay_end (no reply
    left). At turn limit 3 the report counted it as a run that failed in 3 turns, though the recorded
    model never had turns 2 and 3. It is a finished run (issue 45): counted there with what it reached
    by its last turn, and n/a for what it did not (here: nothing compiled, so compiled is unknown)."""
    from agent.report import write_report

    rec = _record(tmp_path, "a/r0", [NO_CODE])
    (tmp_path / "sweep.toml").write_text(
        f'name = "s"\nmodels = [{{spec = "replay:{rec}", name = "rep"}}]\ntasks = ["gemm"]\ncontexts = ["none"]\n'
        f'executed_check = false\ncheck_models = false\n[budget]\nmax_turns = 3\n')
    cfg = load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))
    [outcome] = run_sweep(cfg).outcomes
    assert (outcome.stop_reason, outcome.turns) == ("replay_end", 1), outcome
    report = write_report([tmp_path / "runs"], tmp_path / "report", turn_limits=[1, 3])
    at = {r.turn_limit: r for r in report.rows}
    assert (at[1].runs, at[1].metrics["compiled"].n) == (1, 1)
    compiled = at[3].metrics["compiled"]
    assert (at[3].runs, at[3].unfinished, compiled.n, compiled.unknown) == (1, 0, 0, 1), at[3]


# ---- 6. runs asked for other instructions --------------------------------------------------------
def test_runs_asked_for_other_features_are_not_pooled(tmp_path):
    """A task's requested features are what `arch (SASS)` and correct+arch check. Runs recorded when
    the task asked for wgmma only, reported with runs asked for wgmma + TMA, were pooled into one row:
    the arch rate mixed two different questions."""
    from agent.report import write_report

    write_script(tmp_path / "prose.json", [NO_CODE] * 4)
    cfg = _sweep_config(tmp_path)
    for name in ("s1", "s2"):
        assert run_sweep(cfg.model_copy(update={"name": name})).succeeded == 1
    old = next((tmp_path / "runs" / "s1").rglob("config.json")).parent
    raw = json.loads((old / "config.json").read_text())
    assert sorted(raw["requested_features"]) == ["tma", "wgmma"], raw["requested_features"]
    (old / "config.json").write_text(json.dumps({**raw, "requested_features": ["wgmma"]}))
    rows = write_report([tmp_path / "runs"], tmp_path / "report", turn_limits=[1]).rows
    assert sorted(r.runs for r in rows) == [1, 1], [(r.key[0], r.runs) for r in rows]
    assert any("wgmma" in r.key[0] and "tma" not in r.key[0] for r in rows), [r.key[0] for r in rows]

    # another task of the family asking for other instructions is no reason to split the model's label
    (old / "config.json").write_text(json.dumps(raw))
    other = cfg.model_copy(update={"name": "s3", "tasks": ["gemm_n128_k2048"]})
    assert run_sweep(other).succeeded == 1
    third = next((tmp_path / "runs" / "s3").rglob("config.json")).parent
    raw3 = json.loads((third / "config.json").read_text())
    (third / "config.json").write_text(json.dumps({**raw3, "requested_features": ["wgmma"]}))
    report = write_report([tmp_path / "runs"], tmp_path / "report", turn_limits=[1])
    assert {r.key[0] for r in report.rows} == {"prose"}, [r.key for r in report.rows]
    assert [r.runs for r in report.families] == [3]
