"""Audit 6: the sweep's bookkeeping across invocations (scripted models, real compile + inspect on CPU).

1. `failed` in the summary (and `--json`) counted only the runs that failed in this invocation, while
   `succeeded` counts runs finished now or before: a second `agent sweep` over a sweep with a failed
   run said 0 failed, 1 succeeded of 2, and no line named the run that did not succeed.
2. A run that --retry-failed resumed, whose driver was then killed mid-run, kept the summary.json of
   its earlier end (model_error at turn 1): the next plain `agent sweep` took that stale summary for
   the run's end and skipped it, and `agent report` measured it at its old turns, though its
   checkpoint had gone on. A run being resumed has no end recorded until it ends again.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import NO_CODE, cli_env, probe_reply, write_script

from agent.executors import SharedEvaluator
from agent.sweep import load_sweep_config, run_state, run_sweep
from agent.trajectory import read_summary


class _Executor:
    """A sweep executor whose evaluations all do `evaluate` (the local evaluator's no-GPU path otherwise)."""

    def __init__(self, evaluate):
        self._shared = SharedEvaluator(evaluate, None, "test executor")

    def evaluator(self):
        return self._shared

    def describe(self) -> str:
        return "test executor"

    def close(self) -> None:
        pass


def _config(tmp_path: Path, script: list, *, replicas: int = 1, max_turns: int = 1):
    write_script(tmp_path / "m.json", script)
    (tmp_path / "sweep.toml").write_text(
        f'name = "s"\nmodels = [{{spec = "scripted:m.json", name = "m"}}]\ntasks = ["gemm"]\n'
        f'contexts = ["none"]\nreplicas = {replicas}\nconcurrency = 1\nexecuted_check = false\n'
        f'[budget]\nmax_turns = {max_turns}\n')
    return load_sweep_config(tmp_path / "sweep.toml", runs_dir=str(tmp_path / "runs"))


# ---- 1. failed runs are counted whenever they failed -------------------------------------------
def test_a_run_that_failed_before_is_counted_failed_by_the_next_sweep(tmp_path):
    cfg = _config(tmp_path, [probe_reply()], replicas=2)
    calls = []

    def evaluate_failing_first(solution, task, arch, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the evaluator")
        from tools.evaluator import Evaluator
        return Evaluator(gpus=[]).evaluate(solution, task, arch, **kw)

    first = run_sweep(cfg, _Executor(evaluate_failing_first))
    assert (first.total, first.failed, first.succeeded) == (2, 1, 1), first
    again = run_sweep(cfg)  # nothing left to run: both are skipped
    assert (again.skipped, again.ran) == (2, 0)
    assert (again.failed, again.succeeded) == (1, 1), again
    assert again.failed + again.succeeded == again.total

    # the CLI names the run that did not succeed, not only "1 run of 2 did not succeed"
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "sweep.toml", "--runs-dir", "runs"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    out = " ".join((proc.stdout + proc.stderr).split())
    failed_id = next(o.run_id for o in first.outcomes if o.status == "failed")
    assert "1 failed" in out and failed_id in out and "a bug in the evaluator" in out, out


# ---- 2. a resumed run's old end is not its end -------------------------------------------------
class _Killed(BaseException):
    """The driver killed mid-run (SIGKILL, a second Ctrl-C, a job's time limit): no code of the run's
    own runs after it, as after a kill; what is on disk is what a kill leaves."""


def test_a_retried_run_killed_midway_is_resumed_not_taken_as_ended(tmp_path):
    # turn 1: a candidate; turn 2: the provider refuses (model_error); then two more candidates
    cfg = _config(tmp_path, [probe_reply(), {"fault": "bad_request"}, probe_reply(), NO_CODE], max_turns=3)
    first = run_sweep(cfg)
    run_dir = tmp_path / "runs" / first.outcomes[0].run_id
    ended = read_summary(run_dir)
    assert (ended.status, ended.stop_reason, ended.turns) == ("finished", "model_error", 1)

    def killed(solution, task, arch, **kw):
        raise _Killed()

    try:  # --retry-failed resumes it: turn 2 asked again, then the driver dies in its evaluation
        run_sweep(cfg, _Executor(killed), retry_failed=True)
    except _Killed:
        pass
    else:
        raise AssertionError("the kill did not reach the sweep")
    # The stale summary (turn 1, model_error) is not this run's end: the next plain sweep resumes it.
    assert run_state(run_dir) == "partial"
    again = run_sweep(cfg)
    assert (again.ran, again.resumed, again.skipped) == (1, 1, 0), again
    summary = read_summary(run_dir)
    assert (summary.status, summary.stop_reason, summary.turns) == ("finished", "max_turns", 3), summary
    assert json.loads((run_dir / "summary.json").read_text())["turns"] == 3


# ---- 3. a run this sweep could not drive is this sweep's error, not its old record -------------
@pytest.mark.parametrize("stale", [("interrupted", "interrupted"), ("failed", "infra_error")])
def test_a_run_another_process_drives_is_an_error_of_this_sweep_not_its_stale_summary(tmp_path, stale):
    """A second `agent sweep` over runs a first one is still driving: each such run's resume is refused
    (the run folder is in use). The outcome took the status of the summary on disk (interrupted, from an
    earlier stop), so `--json` said status interrupted and failed 0 for runs this sweep could not run;
    and a stale infra_error summary counted as an infrastructure fault of this sweep (exit 3)."""
    from agent.run import run_folder_lock

    cfg = _config(tmp_path, [probe_reply()])
    [o] = run_sweep(cfg).outcomes
    run_dir = tmp_path / "runs" / o.run_id
    s = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**s, "status": stale[0], "stop_reason": stale[1]}))
    with run_folder_lock(run_dir):  # another process drives it now
        second = run_sweep(cfg)
    [o] = second.outcomes
    assert o.status == "error" and "in use" in o.error, o
    assert (second.ran, second.failed, second.succeeded, second.infra_errors) == (1, 1, 0, 0), second
    assert read_summary(run_dir).status == stale[0]  # its record is the other process's business


# ---- 4. --retry-failed checks only the models it will run --------------------------------------
def test_retry_failed_does_not_stop_on_a_model_whose_runs_all_succeeded(tmp_path):
    """`agent sweep --retry-failed` checked every model of the config before any run (its runs might have
    failed): a model whose runs had all succeeded and that can no longer be built (its endpoint gone, its
    script moved) stopped the whole sweep, and the other model's failed runs could not be retried."""
    write_script(tmp_path / "done.json", [probe_reply()])
    write_script(tmp_path / "flaky.json", [{"fault": "bad_request"}, probe_reply()])
    (tmp_path / "sweep.toml").write_text(
        'name = "s"\nmodels = [{spec = "scripted:done.json", name = "done"}, '
        '{spec = "scripted:flaky.json", name = "flaky"}]\ntasks = ["gemm"]\ncontexts = ["none"]\n'
        'concurrency = 1\nexecuted_check = false\nruns_dir = "runs"\n[budget]\nmax_turns = 1\n')

    def sweep(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agent.cli", "sweep", "sweep.toml", "--json", *args],
                              cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)

    first = sweep()
    assert first.returncode == 1 and json.loads(first.stdout)["succeeded"] == 1, first.stderr[-2000:]
    (tmp_path / "done.json").unlink()  # its runs are over; the model is gone
    retried = sweep("--retry-failed")
    assert retried.returncode == 0, retried.stderr[-2000:]
    result = json.loads(retried.stdout)
    assert (result["ran"], result["skipped"], result["succeeded"]) == (1, 1, 2), result
