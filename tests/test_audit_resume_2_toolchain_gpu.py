"""Audit of resume against a changed toolchain or a GPU found on resume.

- A run's verdicts were drawn by the compilers recorded in its config (`tool_versions`: NVRTC,
  ptxas; and, for a run judged on a GPU, torch, whose cuBLAS/cuDNN are the library a speedup is
  measured against). Resumed under other compilers, one run would hold the verdicts of two
  toolchains: refused, one line naming the old and the new versions, like a change of prompts or
  docs. Versions that draw no verdict (litellm, langgraph, another release of a disassembler) do not
  count, nor does a missing tool (without it a candidate stops the run with infra_error, no verdict
  drawn), nor a run that drew no verdict yet: "fix the toolchain, then resume" goes on.
- A run started without a GPU may go on on a GPU (its later candidates are judged there). Its config
  then says so: `gpu` is the GPU its later turns were judged on and `gpu_from_turn` the first such
  turn (the turns before it are unverified), so a report never files it as a CPU run, nor pools it
  with runs judged on that GPU from their first turn.

Real `agent solve` runs (scripted replies, real ptxas, real SQLite checkpoints); the GPU is the
CPU stand-in worker (tests/fake_worker.py) behind the real Evaluator.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import (PROVIDER_FAILS, REPO, GEMM_TASK, agent_cli, broken_probe_reply, events, probe_reply,
                                write_script)

from agent.run import resume, tool_versions
from agent.trajectory import read_config, read_summary


def _stopped_run(tmp_path: Path, first=broken_probe_reply) -> tuple[Path, Path, Path]:
    """A run whose provider refused turn 2 (model_error): resumable."""
    script = tmp_path / "script.json"
    model = write_script(script, [first(), PROVIDER_FAILS])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "2", "--context", "none",
                  "--runs-dir", str(runs), "--run-id", "r", "--quiet")
    run_dir = runs / "r"
    summary = read_summary(run_dir)
    assert summary is not None and summary.stop_reason == "model_error", (p.stdout, p.stderr)
    write_script(script, [first(), PROVIDER_FAILS, probe_reply()])  # the reply turn 2 waits for
    return runs, run_dir, script


def _edit_config(run_dir: Path, **changes) -> None:
    path = run_dir / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))


# ---------------------------------------------------------------------------------------
# The toolchain
# ---------------------------------------------------------------------------------------
def test_resume_under_another_ptxas_is_refused_naming_both_versions(tmp_path):
    runs, run_dir, _ = _stopped_run(tmp_path)
    recorded = read_config(run_dir).tool_versions
    now = recorded["ptxas"]
    assert now == tool_versions()["ptxas"]
    _edit_config(run_dir, tool_versions={**recorded, "ptxas": "12.8.93"})  # as if turn 1 was compiled by 12.8
    n_events = len(events(run_dir))
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 2, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "ptxas 12.8.93" in err and now in err and "start a new run" in err, err
    assert len(events(run_dir)) == n_events  # nothing asked, nothing written
    assert read_summary(run_dir).stop_reason == "model_error"


def test_resume_under_other_judging_rules_is_refused(tmp_path):
    """The judge's rules are dated (tools.results.RULES_VERSION): a run whose verdicts were drawn
    under other rules, or recorded before rules were (its credit read another way), is another
    judge's: refused as another compiler is, naming both."""
    from tools.results import RULES_VERSION

    runs, run_dir, _ = _stopped_run(tmp_path)
    recorded = read_config(run_dir).tool_versions
    assert recorded["rules"] == RULES_VERSION
    for then, shown in (({**recorded, "rules": "2026-11-30"}, "rules 2026-11-30"),
                        ({k: v for k, v in recorded.items() if k != "rules"}, "rules unversioned")):
        _edit_config(run_dir, tool_versions=then)
        p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
        assert p.returncode == 2 and shown in p.stderr and RULES_VERSION in p.stderr, p.stderr
    _edit_config(run_dir, tool_versions=recorded)
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr


def test_resume_under_another_torch_is_refused_only_for_a_run_judged_on_a_gpu(tmp_path):
    """torch brings the library (cuBLAS, cuDNN) a speedup is measured against: for a run judged on a
    GPU another torch is another baseline. A run that never ran a kernel compared with nothing."""
    runs, run_dir, _ = _stopped_run(tmp_path)
    recorded = read_config(run_dir).tool_versions
    _edit_config(run_dir, tool_versions={**recorded, "torch": "2.11.0+cu130"}, gpu="NVIDIA H200")
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 2 and "torch 2.11.0+cu130" in p.stderr, p.stderr
    _edit_config(run_dir, gpu=None)
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr
    assert read_summary(run_dir).turns == 2


def test_resume_goes_on_when_only_versions_that_judge_nothing_changed(tmp_path):
    """litellm and langgraph judge nothing; another release of a disassembler prints the same cubin
    (this project's CPU machines have 13.2 wheels of cuobjdump and nvdisasm, its GPU machine 13.0)."""
    runs, run_dir, _ = _stopped_run(tmp_path)
    recorded = read_config(run_dir).tool_versions
    _edit_config(run_dir, tool_versions={**recorded, "litellm": "0.0.1", "langgraph": "0.0.1",
                                         "cuobjdump": "12.9.1", "nvdisasm": "12.9.1"})
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr
    assert read_summary(run_dir).turns == 2


def test_resume_of_a_run_recorded_without_tool_versions_goes_on(tmp_path):
    runs, run_dir, _ = _stopped_run(tmp_path)
    _edit_config(run_dir, tool_versions={})
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr
    assert read_config(run_dir).tool_versions == {}  # which tools judged turn 1 stays unknown, not today's


# ---------------------------------------------------------------------------------------
# A GPU found on resume
# ---------------------------------------------------------------------------------------
def _fake_gpu(tmp_path: Path, monkeypatch):
    from tools.evaluator import Evaluator

    (tmp_path / "mode").write_text("pass")
    monkeypatch.setenv("PTXBENCH_FAKE_WORKER_MODE", str(tmp_path / "mode"))
    return Evaluator(gpus=[0], worker_cmd=[sys.executable, str(REPO / "tests" / "fake_worker.py")],
                     cache_dir=tmp_path / "cache")


def test_a_cpu_run_resumed_on_a_gpu_records_the_gpu_and_the_turn_it_started(tmp_path, monkeypatch):
    runs, run_dir, _ = _stopped_run(tmp_path, first=probe_reply)
    assert read_config(run_dir).gpu is None
    [run1] = events(run_dir, "run")
    assert run1["gpu"] is None and run1["run_status"] == "skipped"  # turn 1: unverified, no GPU
    # a CPU machine's torch (no GPU: its version compared with nothing so far)
    _edit_config(run_dir, tool_versions={**read_config(run_dir).tool_versions, "torch": "2.0.0+cpu"})
    with _fake_gpu(tmp_path, monkeypatch) as ev:
        summary = resume(run_dir, progress=False, evaluator=ev)
    assert summary.turns == 2, (summary.status, summary.stop_reason, summary.stop_detail)
    config = read_config(run_dir)
    # the GPU its later turns were judged on, and from which turn: turn 1 stays unverified
    assert config.gpu == "Fake H200" and config.gpu_from_turn == 2
    # the torch its GPU speedups are measured with, so a later resume on this machine compares with it
    assert config.tool_versions["torch"] == tool_versions()["torch"]
    assert summary.per_turn[0].candidates[0].outcome == "unverified"
    assert [e["gpu"] for e in events(run_dir, "run")] == [None, "Fake H200"]
    start = events(run_dir, "run_start")[-1]
    assert start["resumed"] and start["gpu"] == "Fake H200" and start["gpu_from_turn"] == 2
    # and from now on it is a run judged on that GPU: resumed without one it is refused, as any such run
    assert "was judged on Fake H200" in _resume_refusal(runs)


def _resume_refusal(runs: Path) -> str:
    summary = json.loads((runs / "r" / "summary.json").read_text())
    summary["status"], summary["stop_reason"] = "interrupted", "interrupted"  # as if stopped by Ctrl-C
    (runs / "r" / "summary.json").write_text(json.dumps(summary))
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 2, (p.stdout, p.stderr)
    return p.stderr


def test_a_run_with_no_turn_judged_before_the_gpu_is_a_plain_gpu_run(tmp_path, monkeypatch):
    """Stopped before any turn was evaluated (the model failed on turn 1): nothing unverified, so no
    turn to name; the run is one judged on that GPU from its start."""
    script = tmp_path / "s.json"
    model = write_script(script, [PROVIDER_FAILS])
    runs = tmp_path / "runs"
    agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
              "--runs-dir", str(runs), "--run-id", "r", "--quiet")
    assert read_summary(runs / "r").stop_reason == "model_error"
    write_script(script, [PROVIDER_FAILS, probe_reply()])
    with _fake_gpu(tmp_path, monkeypatch) as ev:
        summary = resume(runs / "r", progress=False, evaluator=ev)
    assert summary.turns == 1
    config = read_config(runs / "r")
    assert config.gpu == "Fake H200" and config.gpu_from_turn is None


def test_report_files_a_run_resumed_on_a_gpu_apart(tmp_path, monkeypatch):
    """In one report with a run judged on the GPU from its first turn, the resumed run is its own row,
    labelled with the turn its GPU verdicts start at (never pooled, never filed as a CPU run)."""
    from agent.run import SolveRequest, solve
    from agent.trajectory import Budget

    runs, run_dir, _ = _stopped_run(tmp_path, first=probe_reply)
    with _fake_gpu(tmp_path, monkeypatch) as ev:
        resume(run_dir, progress=False, evaluator=ev)
        (tmp_path / "g").mkdir()  # the same script name: the same model, one cell
        model = write_script(tmp_path / "g" / "script.json", [probe_reply(), probe_reply()])
        solve(SolveRequest(task=GEMM_TASK, model=model, runs_dir=runs, run_id="g", context="none",
                           budget=Budget(max_turns=2)), progress=False, evaluator=ev)
    assert read_config(runs / "g").gpu == "Fake H200" and read_config(runs / "g").gpu_from_turn is None
    out = tmp_path / "report"
    p = agent_cli("report", str(runs), "--out", str(out))
    assert p.returncode == 0, p.stderr
    md = (out / "report.md").read_text()
    assert "gpu=Fake H200 from turn 2" in md and "gpu=Fake H200)" in md, md


def test_a_teacher_run_of_such_a_run_does_not_inherit_its_gpu_turn(tmp_path):
    """A Fixit teacher run starts from the student's config (agent.run.repair): the machine it runs on
    says its GPU, and its own turns were all judged there: no `gpu_from_turn` of the student's."""
    from agent_loop_helpers import probe_reply

    from agent.fixit.build import BuildOptions, build

    runs, run_dir, _ = _stopped_run(tmp_path)  # turn 1 failed to compile: a failure for the teacher
    _edit_config(run_dir, gpu="NVIDIA H200", gpu_from_turn=2)
    script = tmp_path / "teacher.json"
    script.write_text(json.dumps({"replies": [probe_reply()]}))
    res = build([runs], tmp_path / "data", BuildOptions(teacher=f"scripted:{script}", teacher_turns=1, split=None))
    assert res.card["by_source"] == {"teacher": 1}
    teacher = read_config(tmp_path / "data/teacher_runs/teacher/r/1-0")
    assert teacher.repair_run and teacher.gpu is None and teacher.gpu_from_turn is None


def test_a_run_stopped_by_a_missing_ptxas_resumes_once_it_is_installed(tmp_path):
    """The documented recovery of an infrastructure fault: fix it, then resume. A run whose ptxas was
    missing drew no verdict (its candidate stopped the run with infra_error), so the toolchain it
    goes on with is its first; its config records that one."""
    script = tmp_path / "s.json"
    model = write_script(script, [probe_reply()])
    runs = tmp_path / "runs"
    p = agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
                  "--runs-dir", str(runs), "--run-id", "r", "--quiet",
                  env={"PTXBENCH_PTXAS": str(tmp_path / "no-such-ptxas")})
    summary = read_summary(runs / "r")
    assert summary.stop_reason == "infra_error", (p.stdout, p.stderr)
    assert "ptxas" not in read_config(runs / "r").tool_versions
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr
    assert read_summary(runs / "r").turns == 1
    assert read_config(runs / "r").tool_versions["ptxas"] == tool_versions()["ptxas"]


def test_a_run_with_no_verdict_yet_resumes_under_another_compiler(tmp_path):
    """Nothing judged yet (the model failed on turn 1): no two toolchains can meet in it."""
    script = tmp_path / "s.json"
    model = write_script(script, [PROVIDER_FAILS])
    runs = tmp_path / "runs"
    agent_cli("solve", "--task", GEMM_TASK, "--model", model, "--max-turns", "1", "--context", "none",
              "--runs-dir", str(runs), "--run-id", "r", "--quiet")
    assert read_summary(runs / "r").stop_reason == "model_error"
    _edit_config(runs / "r", tool_versions={**read_config(runs / "r").tool_versions, "ptxas": "12.8.93"})
    write_script(script, [PROVIDER_FAILS, probe_reply()])
    p = agent_cli("solve", "--resume", "r", "--runs-dir", str(runs), "--quiet")
    assert p.returncode == 0, p.stderr
    assert read_config(runs / "r").tool_versions["ptxas"] == tool_versions()["ptxas"]
