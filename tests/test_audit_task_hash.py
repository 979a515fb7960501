"""A task whose definition changed (workloads, held-out sizes, tolerance, reference, requested
instructions) under the same name is another task: every run records the definition's hash, a
resume under another definition is refused, and reports never pool runs of two definitions.
Real CLI runs (scripted replies), real run folders."""
from __future__ import annotations

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from test_audit_resume_report import _edit_config, _stopped_run
from test_audit_report_ablation import _c, _edit
from trajectory_fixtures import write_run

from agent.report import load_runs, summarise
from agent.run import task_hash
from agent.trajectory import read_config
from agent_loop_helpers import GEMM_TASK, agent_cli, events
from tasks import get_task


def test_a_run_records_its_tasks_definition_and_a_resume_under_another_is_refused(tmp_path):
    runs, run_dir, _ = _stopped_run(tmp_path)
    recorded = read_config(run_dir).task_hash
    assert recorded == task_hash(get_task(GEMM_TASK)) and len(recorded) == 64
    _edit_config(run_dir, task_hash="0" * 64)  # as if its workloads or tolerance were edited since
    n_events = len(events(run_dir))
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    err = p.stderr + p.stdout
    assert p.returncode != 0 and "defines it otherwise" in err and "000000000000" in err, err
    assert len(events(run_dir)) == n_events  # nothing was asked or written


def test_a_run_recorded_before_the_hash_resumes(tmp_path):
    runs, run_dir, _ = _stopped_run(tmp_path)
    _edit_config(run_dir, task_hash=None)
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert "defines it otherwise" not in p.stderr + p.stdout, p.stderr


def test_a_hash_changes_with_what_judges_a_run():
    task = get_task(GEMM_TASK)
    held_out = task.model_copy(deep=True)
    held_out.workloads[-1].axes = {k: v + 1 for k, v in held_out.workloads[-1].axes.items()}
    looser = task.model_copy(deep=True)
    looser.tolerance = looser.tolerance.model_copy(update={"atol": looser.tolerance.atol * 2})
    assert len({task_hash(t) for t in (task, held_out, looser)}) == 3
    assert task_hash(get_task(GEMM_TASK)) == task_hash(task)


def test_reports_never_pool_runs_of_two_definitions(tmp_path):
    root = tmp_path / "runs"
    for k in range(2):
        _edit(write_run(root / "old", f"m/gemm/docs/r{k}", [[_c("correct", f"a{k}", 1.5)]]), task_hash="a" * 64)
        _edit(write_run(root / "new", f"m/gemm/docs/s{k}", [[_c("compile", f"b{k}")]]), task_hash="b" * 64)
    rows = {r.key[0]: r.runs for r in summarise(load_runs([root]), [1])}
    assert len(rows) == 2 and all("task_def=" in m for m in rows) and set(rows.values()) == {2}, rows
    same = tmp_path / "same"
    for k in range(2):
        _edit(write_run(same / "s", f"m/gemm/docs/r{k}", [[_c("correct", f"a{k}", 1.5)]]), task_hash="a" * 64)
    assert [r.runs for r in summarise(load_runs([same]), [1])] == [2]
