"""Audit of the Fixit data path: what a training example pairs, and what it says.

Each test builds real run folders (the real TrajectoryWriter, hand-made GPU verdicts, as in
tests/trajectory_fixtures.py) and runs the real build, then reads train.jsonl and the data card:
- a candidate's user message carries the feedback about *that* candidate (an evolve run's
  feedback event of turn t describes the parent drawn for turn t+1, not turn t's candidate);
- a correction descends from the failed kernel (a non-chosen sample of best-of-N, or another
  evolve branch, never saw it), and the reply's reasoning is its explanation only when it
  answered the failed kernel itself;
- a kernel that crashed, hung or computed wrong numbers on the GPU is nobody's correction;
- a teacher's cached repair is reused only for the same teacher and the same failed kernel;
- the data folder's own teacher runs are never read back as a student's trajectories;
- the card says which runs the split left out and which models the examples came from.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_loop_helpers import PROBE_CU, PROBE_MANIFEST, broken_probe_reply, probe_reply, reply
from trajectory_fixtures import GEMM, eval_result, kernel, reply_for, write_run

from agent.feedback import candidate_record
from agent.fixit.build import BuildOptions, build, find_pairs, load_attempts
from agent.trajectory import Budget, RunConfig, RunSummary, TrajectoryWriter, TurnRecord, candidate_relpath
from tools.solution import extract_solution


def _sample(kind: str, tag: str, why: str = "", task: str = GEMM):
    s = kernel(tag)
    return s, eval_result(kind, task=task), reply_for(s, why or f"Reasoning for {tag}.")


def write_tree_run(runs_dir: Path, run_id: str, turns: list[dict], *, task: str = GEMM,
                   strategy: str = "linear", samples: int = 1) -> Path:
    """turns: per turn {"samples": [(kind, tag, why)], "chosen": i, "parent": path | None,
    "feedback": (parent path, text)} -- the parent each candidate of the turn answered, and the
    feedback event the loop wrote after the turn (for evolve: about the parent drawn next)."""
    run_dir = runs_dir / run_id
    w = TrajectoryWriter(run_dir)
    w.write_config(RunConfig(run_id=run_id, task=task, arch="sm_90a", model="scripted:weak", context="none",
                             budget=Budget(max_turns=len(turns)), requested_features=["wgmma", "tma"],
                             strategy=strategy, samples=samples))
    per_turn = []
    for t, spec in enumerate(turns, 1):
        records = []
        for s, (kind, tag, why) in enumerate(spec["samples"]):
            solution, ev, text = _sample(kind, tag, why, task)
            cdir = w.candidate_dir(t, s)
            cdir.mkdir(parents=True, exist_ok=True)
            (cdir / "reply.md").write_text(text)
            solution.to_dir(cdir)
            (cdir / "eval.json").write_text(ev.model_dump_json(indent=2))
            rec = candidate_record(t, s, candidate_relpath(t, s), ev)
            rec.parent = spec.get("parent")
            records.append(rec)
        if "feedback" in spec:
            parent, text = spec["feedback"]
            w.event("feedback", turn=t, kind="repair", text=text, parent=parent)
        per_turn.append(TurnRecord(turn=t, candidates=records, chosen=spec.get("chosen", 0), action="repair"))
    w.write_summary(RunSummary(run_id=run_id, task=task, arch="sm_90a", model="scripted:weak", context="none",
                               status="finished", stop_reason="max_turns", turns=len(turns), per_turn=per_turn,
                               evaluation="ok"))
    return run_dir


def _rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "train.jsonl").read_text().splitlines()]


def test_evolve_feedback_goes_with_the_candidate_it_describes(tmp_path):
    """Evolve: after turn 2 the loop drew turn 1's kernel as the parent of turn 3, so the feedback
    event of turn 2 describes candidates/1-0. Turn 2's wrong kernel must not be shown with it."""
    runs = tmp_path / "runs"
    write_tree_run(runs, "evo", strategy="evolve", turns=[
        {"samples": [("numerical", "e1", "")], "feedback": ("candidates/1-0", "FEEDBACK ABOUT 1-0")},
        {"samples": [("numerical", "e2", "")], "parent": "candidates/1-0",
         "feedback": ("candidates/1-0", "FEEDBACK ABOUT 1-0 AGAIN")},
        {"samples": [("correct", "e3", "Reset the accumulator per tile.")], "parent": "candidates/1-0",
         "feedback": ("candidates/3-0", "FEEDBACK ABOUT 3-0")},
    ])
    attempts = {a.record.path: a for a in load_attempts(runs / "evo")}
    assert attempts["candidates/1-0"].feedback == "FEEDBACK ABOUT 1-0"
    assert attempts["candidates/2-0"].feedback is None  # nothing the model was told is about turn 2's kernel
    build([runs], tmp_path / "data", BuildOptions())
    for row in _rows(tmp_path / "data"):
        user = row["messages"][1]["content"]
        if "k_e2" in user:  # turn 2's kernel comes with feedback rendered from its own eval.json
            assert "FEEDBACK ABOUT 1-0" not in user and "feedback" in user.lower()


def test_a_correction_descends_from_the_failed_kernel(tmp_path):
    """Evolve: turn 1 and turn 2 both compute wrong numbers; turn 3 is turn 1's child and fixes it.
    Turn 2's branch never led to turn 3, so turn 3 is no correction of turn 2's kernel."""
    runs = tmp_path / "runs"
    write_tree_run(runs, "evo", strategy="evolve", turns=[
        {"samples": [("numerical", "t1", "")], "feedback": ("candidates/1-0", "fb 1")},
        {"samples": [("numerical", "t2", "")], "parent": "candidates/1-0", "feedback": ("candidates/1-0", "fb 1")},
        {"samples": [("correct", "t3", "Fixed the row index of turn 1.")], "parent": "candidates/1-0"},
    ])
    pairs, unfixed = find_pairs(load_attempts(runs / "evo"))
    assert [(p.failed.record.path, p.fixed.record.path) for p in pairs] == [("candidates/1-0", "candidates/3-0")]
    assert [(a.record.path, e) for a, e in unfixed] == [("candidates/2-0", "numerical")]


def test_best_of_n_sample_not_continued_has_no_correction(tmp_path):
    """Best-of-2, linear: turn 1's sample 1 was not chosen, so the chat went on from sample 0;
    turn 2 never saw sample 1's kernel and is not its correction."""
    runs = tmp_path / "runs"
    write_tree_run(runs, "bon", samples=2, turns=[
        {"samples": [("numerical", "s0", ""), ("compile", "s1", "")], "chosen": 0,
         "feedback": ("candidates/1-0", "fb about sample 0")},
        {"samples": [("correct", "f0", "Fixed sample 0's indexing."), ("correct", "f1", "")], "chosen": 0,
         "parent": "candidates/1-0"},
    ])
    pairs, unfixed = find_pairs(load_attempts(runs / "bon"))
    assert {(p.failed.record.path, p.error) for p in pairs} == {("candidates/1-0", "numerical")}
    assert [(a.record.path, e) for a, e in unfixed] == [("candidates/1-1", "compile")]


def test_reply_reasoning_explains_only_the_kernel_it_answered(tmp_path):
    """Linear: turn 2 misses the features (correct numbers), turn 3 has them but wrong numbers,
    turn 4 fixes the numbers. Turn 4's reasoning is about turn 3's numbers; it is not the
    explanation of how turn 2's missing features were fixed."""
    runs = tmp_path / "runs"
    write_run(runs, "a", [[_sample("compile", "a1")], [_sample("correct_nofeat", "a2")],
                          [_sample("numerical", "a3")],
                          [_sample("correct", "a4", "Swapped the K loop order so the accumulator is reset.")]])
    build([runs], tmp_path / "data", BuildOptions())
    by_error = {r["meta"]["error"]: r for r in _rows(tmp_path / "data")}
    assert by_error["numerical"]["messages"][2]["content"].startswith("Swapped the K loop order")
    assert by_error["numerical"]["meta"]["explanation_source"] == "reply"
    feat = by_error["features_missing"]
    assert (feat["meta"]["failed_turn"], feat["meta"]["fixed_turn"]) == (2, 4)
    assert "Swapped the K loop order" not in feat["messages"][2]["content"]
    assert feat["meta"]["explanation_source"] == "none"
    assert by_error["compile"]["messages"][2]["content"].startswith("Reasoning for a2.")  # turn 2 answered turn 1


def test_a_kernel_that_failed_on_the_gpu_is_no_correction(tmp_path):
    """GPU run: turn 1 does not compile, turn 2 compiles but crashes, turn 3 is correct. The crash
    is not what the model should learn to answer a compile error with: the correction is turn 3."""
    runs = tmp_path / "runs"
    write_run(runs, "g", [[_sample("compile", "g1")], [_sample("runtime", "g2")], [_sample("correct", "g3")]])
    pairs, _ = find_pairs(load_attempts(runs / "g"))
    assert sorted((p.error, p.failed.record.turn, p.fixed.record.turn) for p in pairs) == \
        [("compile", 1, 3), ("runtime", 2, 3)]
    write_run(runs, "w", [[_sample("compile", "w1")], [_sample("numerical", "w2")], [_sample("timeout", "w3")]])
    pairs, unfixed = find_pairs(load_attempts(runs / "w"))
    assert not pairs and sorted(e for _, e in unfixed) == ["compile", "numerical", "timeout"]


def _student(runs: Path, tag: str = "") -> None:
    from tools.results import CompileResult, EvalResult, InspectResult

    broken = broken_probe_reply().replace("First try.", f"First try{tag}.")
    ev = EvalResult(task=GEMM, arch="sm_90a", requested_features=["wgmma", "tma"], run_reason="did not compile",
                    compile=CompileResult(status="failed", arch="sm_90a", language="cuda", error="nvrtc error"),
                    inspect=InspectResult(status="skipped", reason="did not compile", arch="sm_90a"))
    write_run(runs, "student", [[(extract_solution(broken), ev, broken)]], context="none")


def test_a_cached_teacher_repair_is_reused_only_by_the_same_teacher(tmp_path):
    """A second build into the same folder with another --teacher must ask that teacher, not
    reuse the first teacher's repair under the second one's name."""
    runs, data = tmp_path / "runs", tmp_path / "data"
    _student(runs)
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"replies": [reply(PROBE_CU, PROBE_MANIFEST, prose="Teacher A's fix.")]}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"replies": [reply(PROBE_CU + "// teacher B\n", PROBE_MANIFEST,
                                               prose="Teacher B's fix.")]}))
    build([runs], data, BuildOptions(teacher=f"scripted:{a}", teacher_turns=1))
    assert _rows(data)[0]["messages"][2]["content"].startswith("Teacher A's fix.")
    res = build([runs], data, BuildOptions(teacher=f"scripted:{b}", teacher_turns=1))
    assert res.card["options"]["teacher"] == f"scripted:{b}"
    assert _rows(data)[0]["messages"][2]["content"].startswith("Teacher B's fix.")
    # The same teacher again: its finished repair is reused, not run again.
    (teacher_run,) = {p.parent for p in (data / "teacher_runs").rglob("config.json")}
    before = (teacher_run / "config.json").read_text()
    assert build([runs], data, BuildOptions(teacher=f"scripted:{b}", teacher_turns=1)).examples == 1
    assert (teacher_run / "config.json").read_text() == before


def test_a_cached_teacher_repair_belongs_to_the_same_failed_kernel(tmp_path):
    """The student run is recorded again under the same run id (a sweep run once more) with
    another kernel: the cached teacher repair was of the old kernel and must not be reused."""
    runs, data = tmp_path / "runs", tmp_path / "data"
    _student(runs)
    script = tmp_path / "t.json"  # the same teacher spec both times; a new run would get the second script
    script.write_text(json.dumps({"replies": [probe_reply()]}))
    build([runs], data, BuildOptions(teacher=f"scripted:{script}", teacher_turns=1))
    second = reply(PROBE_CU + "// second\n", PROBE_MANIFEST, prose="Second repair.")
    script.write_text(json.dumps({"replies": [second]}))
    import shutil
    shutil.rmtree(runs)
    _student(runs, " again")
    student = runs / "student/candidates/1-0/kernel.cu"
    student.write_text(student.read_text().replace("flaot d0", "flaot  d0 /* other */"))
    build([runs], data, BuildOptions(teacher=f"scripted:{script}", teacher_turns=1))
    assert _rows(data)[0]["messages"][2]["content"].startswith("Second repair.")


def test_the_data_folders_teacher_runs_are_not_read_as_student_runs(tmp_path):
    """`agent fixit build runs --out runs/fixit` twice: the second build must not take the
    teacher's runs under runs/fixit/teacher_runs for the student's own trajectories (they are the
    teacher's mistakes, and their failures would go to the teacher again, build after build)."""
    runs = tmp_path / "runs"
    _student(runs)
    script = tmp_path / "t.json"
    script.write_text(json.dumps({"replies": [broken_probe_reply(), probe_reply()]}))
    first = build([runs], runs / "fixit", BuildOptions(teacher=f"scripted:{script}", teacher_turns=2))
    assert first.card["runs"] == 1 and first.card["by_source"] == {"teacher": 1}
    second = build([runs], runs / "fixit", BuildOptions(teacher=f"scripted:{script}", teacher_turns=2))
    assert second.card["runs"] == 1 and second.card["by_source"] == {"teacher": 1}
    assert second.examples == 1
    # Nor another data folder's teacher runs (a build over the whole tree into a new folder).
    other = build([runs], tmp_path / "other", BuildOptions())
    assert other.card["runs"] == 1 and other.examples == 0 and other.card["unfixed_failures"] == 1


def test_card_records_runs_left_out_by_the_split_and_the_models(tmp_path):
    runs = tmp_path / "runs"
    for name, task in (("a", "gemm_n5120_k5120"), ("b", "gemm_n4096_k4096")):  # train, held out
        write_run(runs, name, [[_sample("compile", name + "1", task=task)], [_sample("unverified", name + "2",
                                                                                        task=task)]],
                  task=task, evaluation="skipped: no GPU")
    out = tmp_path / "data"
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "fixit", "build", str(runs), "--out", str(out),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    card = json.loads(proc.stdout)
    assert card["runs"] == 1 and card["runs_left_out"] == {"held_out_tasks": 1}
    assert card["by_model"] == {"scripted:weak": 1} and card["options"]["split"] == "train"
    assert "held_out_tasks" in (out / "data_card.md").read_text()


def test_a_kernel_that_failed_held_out_workloads_is_no_correction(tmp_path):
    """GPU run: turn 1 computes wrong numbers; turn 2 passes the visible workloads but fails the
    held-out ones (a kernel fitted to the sizes it was shown); turn 3 passes both. Teaching turn 2
    as the fix would teach the very failure to generalise the experiment then measures."""
    from tools.results import Mismatch, WorkloadResult

    def held_out(ev, ok: bool):
        ev.workloads.append(WorkloadResult(
            workload="h0", split="held_out", axes={"M": 70}, status="passed" if ok else "failed",
            reason=None if ok else "incorrect",
            outputs=[Mismatch(output="C", max_abs_err=0.0 if ok else 3.0, max_rel_err=0.0 if ok else 1.0,
                              mismatch_frac=0.0 if ok else 0.5, passed=ok)]))
        return ev

    runs = tmp_path / "runs"
    turns = []
    for kind, tag, ok in (("numerical", "h1", False), ("correct", "h2", False), ("correct", "h3", True)):
        s = kernel(tag)
        turns.append([(s, held_out(eval_result(kind, speedup=1.0 if kind == "correct" else None), ok),
                       reply_for(s, f"Reasoning for {tag}."))])
    write_run(runs, "h", turns)
    pairs, _ = find_pairs(load_attempts(runs / "h"))
    # (turn 2 is a failure of its own, fitted to the visible sizes: turn 3 fixes that too)
    assert [(p.error, p.failed.record.turn, p.fixed.record.turn) for p in pairs] == [("numerical", 1, 3),
                                                                                   ("held_out", 2, 3)]


def test_real_best_of_two_run_pairs_only_the_continued_sample(tmp_path):
    """The real agent loop (scripted model, real NVRTC/ptxas, no GPU), best-of-2: turn 1's two
    samples do not compile; the chat continues from sample 0, and turn 2 compiles. Only sample 0
    has a correction, and its user message carries the feedback the loop recorded about it."""
    from agent import run as agent_run
    from agent.trajectory import Budget

    other = broken_probe_reply().replace("float d1", "flaot d1").replace("First try.", "Other try.")
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"replies": [broken_probe_reply(), other, probe_reply(), probe_reply()]}))
    agent_run.solve(agent_run.SolveRequest(task=GEMM, model=f"scripted:{script}", context="none", samples=2,
                                           budget=Budget(max_turns=2), runs_dir=tmp_path / "runs",
                                           run_id="bo2", executed_check=False), progress=False)
    attempts = load_attempts(tmp_path / "runs/bo2")
    assert [a.record.path for a in attempts] == ["candidates/1-0", "candidates/1-1", "candidates/2-0",
                                                 "candidates/2-1"]
    assert attempts[2].parent == "candidates/1-0" and attempts[0].feedback and attempts[1].feedback is None
    pairs, unfixed = find_pairs(attempts)
    assert [(p.failed.record.path, p.error, p.fixed.record.path) for p in pairs] == \
        [("candidates/1-0", "compile", "candidates/2-0")]
    assert [(a.record.path, e) for a, e in unfixed] == [("candidates/1-1", "compile")]
    res = build([tmp_path / "runs"], tmp_path / "data", BuildOptions())
    (row,) = _rows(tmp_path / "data")
    assert res.examples == 1 and attempts[0].feedback.strip() in row["messages"][1]["content"]
    assert row["messages"][2]["content"].startswith("Four wgmmas fed by one TMA load.")
