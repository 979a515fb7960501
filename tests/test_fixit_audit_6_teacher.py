"""Audit 6 of Fixit's teacher: a teacher's repair is the correction of the kernel it was asked about,
on the task and arch that kernel was written for.

A teacher run is kept under the student's run id and reused by later builds when the teacher, its
turns, the failed kernel and its feedback are the same. Run ids repeat (an explicit --run-id used for
two experiments, a sweep run again on another task list): a student run of another task (or arch)
with the same kernel and feedback got the cached repair, verified on the first task's workloads and
compiled for its arch, as its correction. The task, arch, language and task definition are part of
what a cached repair must match.

Run folders written with the real TrajectoryWriter (tests/trajectory_fixtures.py), the real agent
loop for the teacher (scripted replies, real NVRTC/ptxas, no GPU).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from agent_loop_helpers import cpu_only  # noqa: F401  (autouse fixture)
from agent_loop_helpers import PROBE_CU, PROBE_MANIFEST, broken_probe_reply, reply
from trajectory_fixtures import write_run

from agent.fixit.build import BuildOptions, build
from agent.trajectory import read_config
from tools.results import CompileResult, EvalResult, InspectResult
from tools.solution import extract_solution


def _student(runs: Path, task: str) -> None:
    broken = broken_probe_reply()
    ev = EvalResult(task=task, arch="sm_90a", requested_features=["wgmma", "tma"], run_reason="did not compile",
                    compile=CompileResult(status="failed", arch="sm_90a", language="cuda", error="nvrtc error"),
                    inspect=InspectResult(status="skipped", reason="did not compile", arch="sm_90a"))
    write_run(runs, "student", [[(extract_solution(broken), ev, broken)]], task=task, context="none")


def test_a_cached_teacher_repair_is_reused_only_for_the_same_task(tmp_path):
    runs, data = tmp_path / "runs", tmp_path / "data"
    script = tmp_path / "teacher.json"
    script.write_text(json.dumps({"replies": [reply(PROBE_CU, PROBE_MANIFEST, prose="Repair for the first task.")]}))
    options = BuildOptions(teacher=f"scripted:{script}", teacher_turns=1)
    _student(runs, "gemm_n7168_k5120")
    assert build([runs], data, options).card["by_source"] == {"teacher": 1}
    (teacher_run,) = {p.parent for p in (data / "teacher_runs").rglob("config.json")}
    assert read_config(teacher_run).task == "gemm_n7168_k5120"

    # the same run id, another task, the same kernel and feedback
    shutil.rmtree(runs)
    _student(runs, "gemm_n5120_k5120")
    script.write_text(json.dumps({"replies": [reply(PROBE_CU + "// second\n", PROBE_MANIFEST,
                                                    prose="Repair for the second task.")]}))
    res = build([runs], data, options)
    (row,) = [json.loads(x) for x in (data / "train.jsonl").read_text().splitlines()]
    assert row["meta"]["task"] == "gemm_n5120_k5120"
    assert read_config(teacher_run).task == "gemm_n5120_k5120"  # asked again, on this task
    assert row["messages"][2]["content"].startswith("Repair for the second task.")
    assert res.card["by_source"] == {"teacher": 1}
